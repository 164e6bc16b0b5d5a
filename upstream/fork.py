"""The in-tree fork: pristine SGLang of a release with the DDTREE series applied, as a git
repository (``make fork BASE=0.5.17 DIR=/path``).

    python upstream/fork.py --base 0.5.17 --dir /path
    python upstream/fork.py --base 0.5.17 --dir /path --install-over   # the in-tree image's step

The first commit is the pristine ``sglang`` Python package of the release, laid out as in
SGLang's repository (``python/sglang/``): the package of the release's wheel, or of an installed
copy of that release. It is not SGLang's full git repository (no history, no ``sgl-kernel/``,
``docs/`` or ``test/`` of its own). Then one commit per part of the base's series
(``upstream/series/``, or ``upstream/<base>/series/``), each applied with ``git apply``; the
part's title is the commit's subject and its text the body. The tests, docs and benchmarks the
parts add sit beside ``python/`` as in SGLang's repository. Sources are found as
``upstream/generate.py`` finds them (``--sglang-src``, ``$SGLANG_DDTREE_SGLANG_SRC``, an
installed copy of the release, the ``.upstream-cache/`` wheel, else ``pip download``); commits
carry a fixed author and date, so the same sources give the same commits.

``--install-over``: then copy the forked ``python/sglang/`` over the ``sglang`` package this
interpreter imports, which must be the same release (new files added, edited ones replaced).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

GENERATE = Path(__file__).resolve().parent / "generate.py"


def generator():
    """``upstream/generate.py`` as a module (sources, bases, series and git settings)."""
    spec = importlib.util.spec_from_file_location("ddtree_upstream_generate", GENERATE)
    gen = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, gen)
    spec.loader.exec_module(gen)
    return gen


def _git(gen, root: Path, *args: str, stdin: bytes | None = None) -> str:
    env = {**gen._git_env(), "GIT_AUTHOR_NAME": "sglang-ddtree", "GIT_COMMITTER_NAME":
           "sglang-ddtree"}  # fmt: skip
    r = subprocess.run(["git", "-c", "core.autocrlf=false", *args], cwd=root, env=env,
                       input=stdin, capture_output=True)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"fork: git {' '.join(args)} failed in {root}:\n{r.stderr.decode()}")
    return r.stdout.decode()


def part_message(patch: Path) -> str:
    """The commit message of a part: its text's title line as the subject, the text as the
    body (``NN-name.md`` beside ``NN-name.patch``)."""
    text = patch.with_suffix(".md").read_text()
    title, _, body = text.partition("\n")
    return title.lstrip("# ").strip() + "\n\n" + body.strip() + "\n"


def fork(gen, src, dest: Path) -> list[str]:
    """Write the fork of ``src`` (pristine SGLang ``src.base``) into ``dest``, a new or empty
    directory; returns the commits' subjects, oldest first."""
    dest = Path(dest)
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"fork: {dest} exists and is not empty; remove it or pick another DIR")
    series = sorted(gen.series_dir(src.base).glob("[0-9][0-9]-*.patch"))
    if not series:
        raise SystemExit(f"fork: no series for SGLang {src.base} ({gen.series_dir(src.base)})")
    gen.edited_files(src)  # the files the series edits are pristine (pinned sha256), or stop
    dest.mkdir(parents=True, exist_ok=True)
    _git(gen, dest, "init", "-q")
    files = src.package_files()
    for path in files:
        gen._write(dest, path, src.read(path))
    _git(gen, dest, "add", "-A")
    first = f"SGLang {src.base}: the pristine sglang package ({src.label})"
    _git(gen, dest, "commit", "-q", "-F", "-", stdin=(
        f"{first}\n\nThe Python package of SGLang {src.base}'s release, laid out as in its "
        f"repository (python/sglang/, {len(files)} files); not SGLang's full git repository.\n"
    ).encode())  # fmt: skip
    subjects = [first]
    for patch in series:
        _git(gen, dest, "apply", str(patch))
        _git(gen, dest, "add", "-A")
        message = part_message(patch)
        _git(gen, dest, "commit", "-q", "-F", "-", stdin=message.encode())
        subjects.append(message.splitlines()[0])
    return subjects


def install_over(forked: Path, package_dir: Path) -> int:
    """Copy every file of the fork's ``python/sglang/`` over ``package_dir`` (an installed
    ``sglang`` package); returns how many files were written."""
    source = Path(forked) / "python" / "sglang"
    count = 0
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        target = Path(package_dir) / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        count += 1
    return count


def installed_package(version: str) -> Path:
    """The ``sglang`` package directory this interpreter imports; it must be ``version``."""
    try:
        found = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        found = None
    spec = importlib.util.find_spec("sglang")
    if found != version or spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"fork: --install-over needs sglang {version} installed here (found "
                         f"{found or 'none'})")  # fmt: skip
    return Path(list(spec.submodule_search_locations)[0])


def main(argv: list[str] | None = None) -> int:
    gen = generator()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", choices=gen.BASES, default=gen.BASES[0], help="the SGLang release")
    ap.add_argument("--dir", required=True, type=Path, help="the fork's directory (new or empty)")
    ap.add_argument("--sglang-src", help="pristine SGLang: DIR/sglang, the sglang dir, or a .whl")
    ap.add_argument("--no-download", action="store_true", help="never run pip download")
    ap.add_argument(
        "--install-over",
        action="store_true",
        help="then copy the forked package over the installed sglang of the same release",
    )
    args = ap.parse_args(argv)
    src = gen.find_source(args.sglang_src, version=args.base, download=not args.no_download)
    subjects = fork(gen, src, args.dir)
    for subject in subjects:
        print(f"  {subject}")
    print(f"fork of SGLang {args.base} with {len(subjects) - 1} parts: {args.dir.resolve()}")
    if args.install_over:
        package = installed_package(args.base)
        count = install_over(args.dir, package)
        print(f"installed the fork over {package} ({count} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
