"""``make fork`` (``upstream/fork.py``): pristine SGLang 0.5.17's package and the series as a git
repository, a commit per part, ending at the single patch's tree; the install step of the
in-tree image. CPU, no download (pristine sources as the generator finds them, else a skip)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("make") is None, reason="needs git and make"
)


@pytest.fixture(scope="module")
def fork_module():
    spec = importlib.util.spec_from_file_location(
        "ddtree_upstream_fork", REPO / "upstream" / "fork.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def forked(gen, source, tmp_path_factory):
    """``make fork BASE=0.5.17 DIR=...`` into a temporary directory: (its output, the dir)."""
    dest = tmp_path_factory.mktemp("fork") / "sglang-fork"
    env_src = [f"SGLANG_SRC={source.where}"]
    r = subprocess.run(["make", "-s", "fork", f"BASE={gen.BASES[0]}", f"DIR={dest}", *env_src],
                       cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout, dest


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_make_fork_commits_pristine_sglang_then_each_part(gen, forked):
    out, dest = forked
    assert f"fork of SGLang {gen.BASES[0]} with {len(gen.SERIES)} parts: {dest}" in out
    subjects = _git(dest, "log", "--reverse", "--format=%s").splitlines()
    assert len(subjects) == 1 + len(gen.SERIES)
    assert subjects[0].startswith(f"SGLang {gen.BASES[0]}: the pristine sglang package")
    total = sum(not p.prelude for p in gen.SERIES)
    for i, (subject, part) in enumerate(zip(subjects[1:], gen.SERIES), 1):
        number = gen.part_number(i)
        want = "DFLASH" if part.prelude else f"DDTREE {number}/{total}"
        assert subject == f"[Spec] {want}: {part.title}"
    assert _git(dest, "status", "--porcelain") == ""


def test_fork_ends_at_the_single_patch_on_the_pristine_package(gen, source, forked):
    """Every file the patch touches holds the patched bytes, every other file of the package
    the pristine ones; the first commit is the package alone."""
    _, dest = forked
    _, patched = gen.final_tree(source)
    for path, data in patched.items():
        assert (dest / path).read_bytes() == data, path
    package = source.package_files()
    first = _git(dest, "rev-list", "--max-parents=0", "HEAD").strip()
    assert sorted(_git(dest, "ls-tree", "-r", "--name-only", first).splitlines()) == package
    untouched = [p for p in package if p not in patched]
    assert untouched and all((dest / p).read_bytes() == source.read(p) for p in untouched[::50])
    tracked = set(_git(dest, "ls-files").splitlines())
    assert tracked == set(package) | set(patched)


def test_fork_refuses_a_directory_that_is_not_empty(gen, source, fork_module, tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit, match="not empty"):
        fork_module.fork(gen, source, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_install_over_replaces_and_adds_the_forked_files(fork_module, forked, tmp_path):
    """The in-tree image's install step: the forked package over an installed copy."""
    _, dest = forked
    installed = tmp_path / "site" / "sglang"
    shutil.copytree(dest / "python" / "sglang", installed,
                    ignore=shutil.ignore_patterns("ddtree*"))  # fmt: skip
    spec_info = installed / "srt" / "speculative" / "spec_info.py"
    spec_info.write_text("# pristine\n")
    count = fork_module.install_over(dest, installed)
    forked_files = [p for p in (dest / "python" / "sglang").rglob("*") if p.is_file()]
    assert count == len(forked_files)
    assert "    DDTREE = auto()\n" in spec_info.read_text()
    assert (installed / "srt" / "speculative" / "ddtree_worker_v2.py").is_file()
    assert (installed / "kernels" / "jit" / "csrc" / "ddtree" / "top_p_radix.cuh").is_file()


def test_install_over_needs_the_same_release_installed(fork_module):
    with pytest.raises(SystemExit, match="needs sglang 0.0.0 installed here"):
        fork_module.installed_package("0.0.0")
