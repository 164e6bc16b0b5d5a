"""The committed SGLang pull request (``upstream/sglang-ddtree.patch``) is what
``upstream/generate.py`` makes from this tree, and it applies to pristine SGLang 0.5.17; the
committed series (``upstream/series/NN-<name>.patch``) is regenerated too, applies part by part
in order, ends at the single patch's tree, keeps every part small, and no part's tree imports a
DDTREE module that only a later part adds. The same for every other base of the generator
(``upstream/0.5.23/``: the patch and the series for SGLang 0.5.23), each test once per base.

Pristine sources come as in the generator (``$SGLANG_DDTREE_SGLANG_SRC`` when it holds that
release, an installed sglang of it, the ``.upstream-cache/sglang-<version>/`` wheel, else ``pip
download`` into that cache); without them (no network, nothing cached) the tests of that base
skip and say why. CPU only; about 5-15 s a base with a download, a few seconds cached.
"""

from __future__ import annotations

import ast
import collections
import difflib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import top_level_names

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "upstream" / "sglang-ddtree.patch"
SERIES_DIR = REPO / "upstream" / "series"
PR_OVERVIEW = REPO / "upstream" / "PR.md"
UPSTREAM_README = REPO / "upstream" / "README.md"
# The generator's bases (``generate.BASES``; `test_bases_are_the_generators` keeps them equal).
BASES = ("0.5.17", "0.5.23")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_bases_are_the_generators(gen):
    assert gen.BASES == BASES and gen.SGLANG_VERSION == BASES[0]
    assert gen.patch_path(BASES[0]) == PATCH and gen.series_dir(BASES[0]) == SERIES_DIR
    for base in BASES[1:]:
        assert gen.series_dir(base) == REPO / "upstream" / base / "series"


@pytest.fixture(scope="module", params=BASES)
def base(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def src(gen, base):
    """Pristine SGLang ``base``'s sources as the generator finds them (downloaded into
    ``.upstream-cache/`` where there is network), with the formatters it writes SGLang's code
    with (made with pip into ``.upstream-cache/`` where missing), or a skip naming why not."""
    try:
        source = gen.find_source(version=base)
    except (Exception, SystemExit) as e:  # no network, no cache, no installed copy
        pytest.skip(
            f"pristine SGLang {base} sources unavailable (no installed sglang {base}, no wheel "
            f"in .upstream-cache/sglang-{base}/, pip download failed): {e}"
        )
    formatters(gen, base)
    return source


def formatters(gen, base: str) -> str:
    """The interpreter with SGLang ``base``'s formatters (``gen.formatter_python``), or a skip
    naming why there is none."""
    try:
        return gen.formatter_python(base)
    except (Exception, SystemExit) as e:  # no network, nothing cached
        pytest.skip(f"SGLang {base}'s formatters unavailable ({gen.FORMATTERS[base]}): {e}")


def _patch(gen, base: str) -> Path:
    return gen.patch_path(base)


def test_committed_patch_is_regenerated_byte_for_byte(gen, src, tmp_path):
    fresh = gen.build_patch(src)
    committed = _patch(gen, src.base).read_bytes()
    if fresh != committed:
        out = tmp_path / "fresh.patch"
        out.write_bytes(fresh)
        pytest.fail(
            f"{_patch(gen, src.base).relative_to(REPO)} is stale (fresh copy: {out}); "
            "run `make upstream-patch` and commit the result."
        )


def test_committed_patch_applies_to_pristine_sglang(gen, src):
    ok, report = gen.apply_check(_patch(gen, src.base), src)
    assert ok, f"git apply --check against SGLang {src.base} failed:\n{report}"


def test_generator_refuses_unmapped_imports(gen, tmp_path, monkeypatch):
    """A mapped module importing tooling that stays out of SGLang fails the generator loudly."""
    pkg = tmp_path / "python" / "sglang_ddtree"
    shutil.copytree(gen.PKG_DIR, pkg, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    budget = pkg / "srt" / "ddtree_budget.py"
    budget.write_text(budget.read_text() + "\nfrom sglang_ddtree import serve  # noqa\n")
    monkeypatch.setattr(gen, "PKG_DIR", pkg)
    monkeypatch.setattr(gen, "REPO", tmp_path)
    with pytest.raises(SystemExit, match=r"ddtree_budget\.py:\d+: imports sglang_ddtree\.serve"):
        gen.check_imports()


def test_generator_refuses_from_a_stand_in_what_sglang_lacks(gen, tmp_path, monkeypatch):
    """A mapped module importing from the plugin's table of variables anything but ``envs``
    (SGLang's ``environ`` has no ``Knob``) fails the generator loudly."""
    pkg = tmp_path / "python" / "sglang_ddtree"
    shutil.copytree(gen.PKG_DIR, pkg, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    budget = pkg / "srt" / "ddtree_budget.py"
    budget.write_text(
        budget.read_text() + "\nfrom sglang_ddtree.srt.ddtree_envs import Knob  # noqa\n"
    )
    monkeypatch.setattr(gen, "PKG_DIR", pkg)
    monkeypatch.setattr(gen, "REPO", tmp_path)
    with pytest.raises(SystemExit, match=r"ddtree_budget\.py:\d+: imports Knob from .*ddtree_envs"):
        gen.check_imports()


def _added_lines(patch_text: str) -> str:
    return "\n".join(
        line[1:] for line in patch_text.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )  # fmt: skip


def test_in_tree_envs_are_fields_of_sglangs_envs(gen, src):
    """In SGLang's tree, DDTREE's environment variables are fields of SGLang's ``Envs``
    (``environ.py``): one per knob of the plugin's table, of SGLang's type for it (``EnvInt``,
    ``EnvStr``) with the same default; every in-tree module that reads one imports SGLang's
    ``envs`` and reads declared fields only; no file the patch adds defines a ``Knob`` class or
    names the plugin's table, and no committed patch (single or series, either base) adds one."""
    from sglang_ddtree.srt.ddtree_envs import KNOBS

    pristine, patched = gen.final_tree(src)
    environ = ast.parse(patched[gen.ENVIRON].decode())
    envs_class = next(n for n in environ.body if isinstance(n, ast.ClassDef) and n.name == "Envs")
    fields = {
        n.targets[0].id: (n.value.func.id, ast.literal_eval(n.value.args[0]))
        for n in envs_class.body
        if isinstance(n, ast.Assign) and n.targets[0].id.startswith("SGLANG_DDTREE_")
    }
    kinds = {int: "EnvInt", str: "EnvStr"}
    assert fields == {k.name: (kinds[k.type], k.default) for k in KNOBS}
    assert not [
        p for p in pristine if p != gen.ENVIRON and "SGLANG_DDTREE_" in pristine[p].decode()
    ]
    added = {path: data.decode() for path, data in patched.items() if path not in pristine}
    readers = []
    for path, text in sorted(added.items()):
        if not path.endswith(".py"):
            continue
        tree = ast.parse(text)
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Knob"]
        assert not re.search(r"\bKnob\(|DDTreeEnvs|ddtree_envs|\bKNOBS\b", text), path
        reads = gen.envs_reads(text, path)
        if reads and path.startswith("python/"):
            readers.append(path)
            assert "from sglang.srt.environ import envs" in text, path
            assert {name for _, name in reads} <= set(fields), path
    assert len(readers) >= 2, readers  # ddtree_args, ddtree_budget
    patches = [PATCH, REPO / "upstream" / "0.5.23" / "sglang-ddtree.patch"]
    patches += sorted(SERIES_DIR.glob("*.patch"))
    patches += sorted((REPO / "upstream" / "0.5.23" / "series").glob("*.patch"))
    for patch in patches:
        added_text = _added_lines(patch.read_text())
        assert not re.search(r"^\s*class Knob\b|DDTreeEnvs|ddtree_envs", added_text, re.M), patch


def _removed_lines(before: str, after: str) -> collections.Counter:
    """The lines of ``before`` that ``after`` no longer has, as ``difflib.ndiff`` finds them."""
    diff = difflib.ndiff(before.splitlines(), after.splitlines())
    return collections.Counter(line[2:] for line in diff if line.startswith("- "))


def test_in_tree_files_are_as_sglangs_hooks_leave_them(gen, src):
    """The files the patch adds are as SGLang's pre-commit hooks of that base leave them: the
    Python ones unchanged when its isort and formatter run on them again (``gen.FORMATTERS``),
    none with a misspelling its codespell finds, trailing whitespace or no final newline; and
    in the files the patch edits the hooks change no line the edits add, only lines they would
    change in pristine SGLang too (its own files predate some of the pins)."""
    pristine, patched = gen.final_tree(src)
    added = {path: data.decode() for path, data in patched.items() if path not in pristine}
    python = {path: text for path, text in added.items() if path.endswith(".py")}
    assert len(python) >= 50
    again = gen.format_python(python, src.base)
    assert [path for path in python if again[path] != python[path]] == []
    assert gen.misspellings(added, src.base) == []
    for path, text in added.items():
        assert text.endswith("\n") and not text.endswith("\n\n"), path
        assert not [n for n, line in enumerate(text.splitlines(), 1) if line != line.rstrip()], path
    edited = sorted(path for path in pristine if path.endswith(".py"))
    before = {path: pristine[path].decode() for path in edited}
    after = {path: patched[path].decode() for path in edited}
    fixed = gen.format_python({f"a/{p}": t for p, t in before.items()}, src.base)
    fixed.update(gen.format_python({f"b/{p}": t for p, t in after.items()}, src.base))
    ours = {
        path: sorted(
            _removed_lines(after[path], fixed[f"b/{path}"])
            - _removed_lines(before[path], fixed[f"a/{path}"])
        )
        for path in edited
    }
    assert {path: lines for path, lines in ours.items() if lines} == {}
    # The check sees an added line the formatter would wrap.
    long_line = "        self.ddtree_takes_verify = takes_ddtree_verify(model_runner, FlashMLASplitVerify)\n"
    path = "python/sglang/srt/layers/attention/flashmla_backend.py"
    bad = after[path].replace(
        "        self.is_draft_runner = model_runner.is_draft_worker\n",
        "        self.is_draft_runner = model_runner.is_draft_worker\n" + long_line,
    )
    bad_fixed = gen.format_python({"c": bad}, src.base)["c"]
    assert long_line.rstrip("\n") in _removed_lines(bad, bad_fixed) - _removed_lines(
        before[path], fixed[f"a/{path}"]
    )


def test_in_tree_kernels_are_as_sglangs_clang_format_leaves_them(gen, src):
    """The CUDA sources the patch adds are unchanged by SGLang's clang-format hook
    (``gen.CLANG_FORMAT``, ``--style=file`` under the base's JIT ``.clang-format``); a line
    indented off its block is caught."""
    try:
        gen.clang_format_binary()
    except (Exception, SystemExit) as e:  # no network, nothing cached
        pytest.skip(f"clang-format {gen.CLANG_FORMAT} unavailable: {e}")
    pristine, patched = gen.final_tree(src)
    kernels = {
        path: data.decode()
        for path, data in patched.items()
        if path not in pristine and path.endswith((".cu", ".cuh"))
    }
    assert kernels, "the patch adds no CUDA source"
    assert gen.clang_formatted(kernels, src) == kernels
    path, text = next(iter(kernels.items()))
    line = next(ln for ln in text.splitlines() if ln.startswith("  ") and ln.strip().endswith(";"))
    bad = text.replace(line + "\n", " " + line + "\n", 1)
    assert gen.clang_formatted({path: bad}, src)[path] != bad


def test_generator_refuses_a_read_of_an_undeclared_env_field(gen, src):
    """A tree where a DDTREE module reads ``envs.SGLANG_DDTREE_*`` but ``environ.py`` lacks the
    field (the edit left out, or a part before it) fails the import check, naming both."""
    pristine, patched = gen.final_tree(src)
    assert gen.missing_imports(patched) == []
    without = {**patched, gen.ENVIRON: pristine[gen.ENVIRON]}
    missing = gen.missing_imports(without)
    assert any(
        "ddtree_args.py" in m and "reads envs.SGLANG_DDTREE_TOPK" in m and gen.ENVIRON in m
        for m in missing
    ), missing


def _sampling_param_fields(source) -> set[str]:
    """The request-facing fields of SGLang's ``SamplingParams`` (its annotated class body)."""
    text = source.read("python/sglang/srt/sampling/sampling_params.py").decode()
    cls = next(
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.ClassDef) and n.name == "SamplingParams"
    )
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}


@pytest.mark.parametrize("template", ["test_ddtree.py", "test_ddtree_refusals.py"])
def test_templates_send_only_sampling_params_sglang_knows(gen, src, template):
    """SGLang builds ``SamplingParams(**sampling_params)``, which rejects an unknown key: every
    flat dict literal of a test template (values neither dicts nor tuples: not a table of
    cases) with a sampling-parameter key has only such keys."""
    fields = _sampling_param_fields(src)
    assert {"temperature", "top_p", "sampling_seed"} <= fields and "seed" not in fields
    tree = ast.parse(gen.new_files(src.base)[dict(gen.TEMPLATE_FILES)[template]])
    unknown = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict) or any(
            isinstance(v, (ast.Dict, ast.Tuple)) for v in node.values
        ):
            continue
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
        if any(k in fields for k in keys):
            unknown += [(node.lineno, k) for k in keys if k not in fields]
    assert unknown == [], f"{template}: keys SamplingParams does not take: {unknown}"


@pytest.fixture(scope="module")
def near_tie(gen):
    """The in-tree greedy test's ``near_tie`` and its margin, run without SGLang."""
    tree = ast.parse(gen.render_template("test_ddtree.py"))
    keep = [
        n
        for n in tree.body
        if (isinstance(n, ast.FunctionDef) and n.name == "near_tie")
        or (isinstance(n, ast.Assign) and any(t.id == "NEAR_TIE_NATS" for t in n.targets))
    ]
    scope: dict = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "test_ddtree.py", "exec"), scope)
    return scope["near_tie"], scope["NEAR_TIE_NATS"]


def test_in_tree_greedy_check_passes_near_ties_only(near_tie):
    judge, nats = near_tie
    ref = [5, 6, 7, 8]
    top2 = [[(-0.1, t), (-3.0, 99)] for t in ref]
    top2[2] = [(-0.70, 7), (-0.70 - nats / 2, 40)]  # 7 and 40 nearly tied at position 2
    assert judge(ref, top2, [5, 6, 40, 1])["near_tie"]  # later tokens do not matter
    assert judge(ref, top2, [5, 6, 40])["position"] == 2
    assert not judge(ref, top2, [5, 6, 41, 8])["near_tie"]  # not the reference's top two
    assert not judge(ref, top2, [5, 99, 7, 8])["near_tie"]  # top two, but far apart
    wide = [row[:] for row in top2]
    wide[2] = [(-0.70, 7), (-0.70 - 2 * nats, 40)]
    assert not judge(ref, wide, [5, 6, 40, 8])["near_tie"]
    assert not judge(ref, top2, [5, 6])["near_tie"]  # another length is never a tie


# --- the series ---------------------------------------------------------------------------------
def _committed_parts(series: Path = SERIES_DIR) -> list[Path]:
    return sorted(series.glob("[0-9][0-9]-*.patch"))


def _git_apply(gen, root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "apply", *args], cwd=root, env=gen._git_env(), capture_output=True, text=True
    )


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_committed_series_is_regenerated_byte_for_byte(gen, src, tmp_path):
    fresh = gen.series_files(src)
    series = gen.series_dir(src.base)
    committed = {p.name: p.read_bytes() for p in series.iterdir() if p.is_file()}
    stale = sorted(n for n in set(fresh) | set(committed) if fresh.get(n) != committed.get(n))
    if stale:
        for name, data in fresh.items():
            (tmp_path / name).write_bytes(data)
        pytest.fail(
            f"{series.relative_to(REPO)}/ is stale in {stale} (fresh copies: {tmp_path}); run "
            "`make upstream-patch` and commit the result."
        )


@pytest.fixture(scope="module")
def applied_series(gen, src, tmp_path_factory):
    """Pristine SGLang's files that the patch edits with the committed parts applied one by one:
    ``[(part file, git apply --check report or None when it applied, tree after it)]`` up to the
    first part that does not apply, and the tree of the single patch applied the same way."""
    pristine = {path: src.read(path) for path in gen.PRISTINE_SHA256[src.base]}
    root = tmp_path_factory.mktemp("series")
    for path, data in pristine.items():
        gen._write(root, path, data)
    steps = []
    for patch in _committed_parts(gen.series_dir(src.base)):
        check = _git_apply(gen, root, "--check", "-v", str(patch))
        if check.returncode != 0:
            steps.append((patch.name, (check.stdout + check.stderr).strip(), None))
            break
        assert _git_apply(gen, root, str(patch)).returncode == 0
        steps.append((patch.name, None, _tree(root)))
    single = tmp_path_factory.mktemp("single")
    for path, data in pristine.items():
        gen._write(single, path, data)
    assert _git_apply(gen, single, str(_patch(gen, src.base))).returncode == 0
    return steps, _tree(single)


def test_series_is_the_defined_parts(gen, base):
    names = [p.name for p in _committed_parts(gen.series_dir(base))]
    assert names == [f"{gen.part_file_name(i, p)}.patch" for i, p in enumerate(gen.SERIES, 1)]
    assert len(names) >= 2


def test_series_applies_in_order_to_pristine_sglang(gen, src, applied_series):
    steps, _ = applied_series
    failed = [(name, report) for name, report, _ in steps if report is not None]
    assert failed == [], f"git apply --check in order on pristine SGLang {src.base}: {failed}"
    assert len(steps) == len(_committed_parts(gen.series_dir(src.base)))


def test_series_ends_at_the_single_patch(applied_series):
    steps, single = applied_series
    final = steps[-1][2]
    assert final is not None
    differ = sorted(p for p in set(final) | set(single) if final.get(p) != single.get(p))
    assert differ == [], f"the series' tree differs from the single patch's in {differ}"


def _part_sizes(gen, root: Path, base: str = BASES[0]) -> dict[str, int]:
    """Changed lines (added + deleted) of each committed part of ``base``, as ``git apply
    --numstat`` counts them."""
    sizes = {}
    for patch in _committed_parts(gen.series_dir(base)):
        counts = _git_apply(gen, root, "--numstat", str(patch))
        assert counts.returncode == 0, counts.stderr
        rows = [line.split("\t", 2) for line in counts.stdout.splitlines()]
        sizes[patch.stem] = sum(int(a) + int(d) for a, d, _ in rows)
    return sizes


def test_series_parts_are_small(gen, base, tmp_path):
    sizes = _part_sizes(gen, tmp_path, base)
    print(sizes)
    big = {name: n for name, n in sizes.items() if n > gen.MAX_PART_LINES}
    assert big == {}, f"parts over {gen.MAX_PART_LINES} changed lines: {big}"


def test_series_imports_resolve_at_every_part(gen, applied_series):
    """In the tree after each part, every import of an in-tree DDTREE module (module-level or
    nested, in new and edited files) names a file present, and a kernel's loading module comes
    with its source."""
    steps, _ = applied_series
    missing = {name: gen.missing_imports(tree) for name, _, tree in steps if tree is not None}
    assert {name: m for name, m in missing.items() if m} == {}
    # The check can fail: the last tree without a module that others import.
    final = dict(steps[-1][2])
    del final["python/sglang/srt/speculative/ddtree/layout.py"]
    assert any(
        "imports sglang.srt.speculative.ddtree.layout" in m for m in gen.missing_imports(final)
    )
    del final["python/sglang/kernels/jit/csrc/ddtree/top_p_radix.cuh"]
    assert any("loads the kernel source" in m for m in gen.missing_imports(final))


def _importable_without_sglang(gen, tree: dict[str, bytes]) -> list[str]:
    """The in-tree DDTREE modules of ``tree`` that import no other SGLang module at module
    level, directly or through a DDTREE module that does."""
    known = {gen.in_tree_name(target) for target in gen.MODULE_MAP.values()}
    needs = {}
    for path, data in tree.items():
        name = gen.in_tree_name(path) if path.endswith(".py") else ""
        if not name.startswith(gen.IN_TREE_PREFIX):
            continue
        needs[name] = set()
        for node in ast.parse(data.decode()).body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names]
                names = [n if n in known else node.module for n in names]
            else:
                continue
            needs[name] |= {n for n in names if n.split(".")[0] == "sglang"}
    ok: set[str] = set()
    while more := {m for m, n in needs.items() if m not in ok and n <= ok}:
        ok |= more
    return sorted(ok)


# After each part (argv: its python/ directory, then the modules to import; "step": also one
# CPU step's pure half through the in-tree modules, equal to this repository's), with the
# in-tree modules dropped between parts.
_IMPORT_PARTS = """
import importlib, json, sys
import torch
from sglang_ddtree.core import accept as accept0, commit as commit0, layout as layout0, tree as tree0

def step(tree, layout, accept, commit):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 17, generator=g)
    lp, tok = tree.select_candidates(logits, 4, normalize=True)
    t = tree.build_tree_from_candidates(lp, tok, torch.tensor([1, 2, 3]), 9, backend="torch")
    prefix = torch.tensor([4, 0, 7])
    lay = layout.tree_to_retrieve_arrays(t, prefix, max_depth=5, backend="torch")
    target = torch.where(torch.rand(t.tokens.shape, generator=g) < 0.7, t.tokens.roll(-1, 1), 0)
    res = accept.accept_greedy(lay, t.tokens, target, 6, backend="torch")
    return [*t, *lay, *res, *commit.commit_accepted(res, prefix, 10)]

for root, modules, run_step in json.loads(sys.argv[1]):
    sys.path.insert(0, root)
    for name in modules:
        importlib.import_module(name)
    if run_step:
        d = "sglang.srt.speculative.ddtree."
        mods = [importlib.import_module(d + m) for m in ("tree", "layout", "accept", "commit")]
        got, want = step(*mods), step(tree0, layout0, accept0, commit0)
        assert len(got) == len(want) > 0
        assert all(torch.equal(a, b) for a, b in zip(got, want)), root
    sys.path.remove(root)
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    print(root, len(modules), "modules", "and a CPU step" if run_step else "")
"""


def test_series_parts_import_and_run_without_sglang(gen, applied_series, tmp_path):
    """After each part, every in-tree DDTREE module that needs no other SGLang module imports
    from the applied files alone (their parent packages empty); from the part that adds the
    accept and the commit on, one CPU step through them equals this repository's modules."""
    steps, _ = applied_series
    parts = []
    for name, _, tree in steps:
        root = tmp_path / name
        for path, data in tree.items():
            gen._write(root, path, data)
        for package in ("sglang", "sglang/srt", "sglang/srt/speculative"):
            gen._write(root, f"python/{package}/__init__.py", b"")
        modules = _importable_without_sglang(gen, tree)
        if name.startswith("00-"):  # the refactor of SGLang's own code: no DDTREE module yet
            assert modules == [], (name, modules)
            continue
        assert len(modules) >= 2, (name, modules)
        run_step = f"{gen.IN_TREE_PREFIX}.commit" in modules
        parts.append((str(root / "python"), modules, run_step))
    assert sum(p[2] for p in parts) >= 2
    r = subprocess.run(
        [sys.executable, "-c", _IMPORT_PARTS, json.dumps(parts)],
        env={**os.environ, "PYTHONPATH": str(REPO / "python")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout)


def test_generator_refuses_a_part_before_what_it_imports(gen, src, monkeypatch):
    """The accept part before the top-p kernel it imports lazily: the generator fails loudly."""
    by_name = {p.name: p for p in gen.SERIES}
    order = [p.name for p in gen.SERIES]
    i, j = order.index("top-p-radix"), order.index("tree-accept")
    order[i], order[j] = order[j], order[i]
    monkeypatch.setattr(gen, "SERIES", [by_name[n] for n in order])
    with pytest.raises(
        SystemExit, match=r"sampling\.py:\d+ imports sglang\.srt\.speculative\.ddtree\.topp_radix"
    ):
        gen.series_states(src)


def test_generator_refuses_an_incomplete_series(gen, monkeypatch):
    monkeypatch.setattr(gen, "SERIES", gen.SERIES[:-1])
    with pytest.raises(
        SystemExit, match=r"module sglang_ddtree\.srt\.ddtree_worker_v2 is in no part"
    ):
        gen.check_series()


def test_a_later_part_can_add_a_function_to_an_earlier_parts_module(gen, src, monkeypatch):
    """``LATER_ITEMS`` cuts a definition out of the trees before the part that adds it: the
    layout module's ``verify_mask_numel`` (read first by the glue part's step) moved to that
    part leaves the draft-tree part without it and the glue part adding it to the layout
    module, the series still ending at the single patch's tree (`series_states`); a cut that an
    earlier tree still reads, a part before the module's own and an unknown name are refused."""
    layout = gen.MODULE_MAP["sglang_ddtree.core.layout"]
    item = ("sglang_ddtree.core.layout", "verify_mask_numel")
    monkeypatch.setattr(gen, "LATER_ITEMS", {"glue": (item,)})
    parts = {part.name: diff.decode() for part, diff, _ in gen.build_series(src)}

    def added_defs(diff: str, path: str) -> list[str]:
        body = diff.split(f"+++ b/{path}\n", 1)[1].split("\ndiff --git ", 1)[0] if (
            f"+++ b/{path}\n" in diff) else ""  # fmt: skip
        return re.findall(r"^\+def (\w+)\(", body, flags=re.M)

    assert "verify_mask_numel" not in added_defs(parts["draft-tree"], layout)
    assert "scatter_verify_mask" in added_defs(parts["draft-tree"], layout)
    assert added_defs(parts["glue"], layout) == ["verify_mask_numel"]
    monkeypatch.setattr(gen, "LATER_ITEMS", {"worker": (item,)})
    with pytest.raises(
        SystemExit, match=r"(?s)part glue's tree still reads .*imports verify_mask_numel"
    ):
        gen.series_states(src)
    method = ("sglang_ddtree.srt.ddtree_step", "DDTreeStep._check_ranks_agree")
    monkeypatch.setattr(gen, "LATER_ITEMS", {"worker": (method,)})
    with pytest.raises(SystemExit, match=r"(?s)part glue's tree still reads .*_check_ranks_agree"):
        gen.series_states(src)
    monkeypatch.setattr(gen, "LATER_ITEMS", {"draft-tree": (item,)})
    with pytest.raises(SystemExit, match=r"verify_mask_numel not after it"):
        gen.check_series()
    monkeypatch.setattr(gen, "LATER_ITEMS", {"glue": (("sglang_ddtree.core.layout", "nope"),)})
    with pytest.raises(SystemExit, match=r"defines no one nope"):
        gen.series_states(src)


def test_pr_overview_lists_every_part_with_its_size(gen, tmp_path):
    """upstream/PR.md's table of the series: a row per part, ``| `NN-name` | adds | lines on
    the first base | ... |``, a lines column per base in ``BASES`` order."""
    rows = {}
    for line in PR_OVERVIEW.read_text().splitlines():
        if line.startswith("| `") and line.count("|") == 3 + len(BASES):
            cells = [c.strip() for c in line.strip(" |").split("|")]
            rows[line.split("`")[1]] = tuple(cells[-len(BASES) :])
    sizes = [_part_sizes(gen, tmp_path, base) for base in BASES]
    want = {name: tuple(str(s[name]) for s in sizes) for name in sizes[0]}
    assert rows == want, "upstream/PR.md's table of parts is out of date"


# --- the pull-request texts -------------------------------------------------------------------
# What a text for SGLang must not carry: this project's run numbers, result folders, issue
# numbers or internal notebook; a ``#123`` only as one of the SGLang pull requests the cover
# text compares against.
FOREIGN_PULL_REQUESTS = {"#29907", "#31069", "#36196"}
NOT_IN_PR_TEXT = (
    re.compile(r"\bruns? \d+", re.I),
    re.compile(r"\bresults/run"),
    re.compile(r"\bissues? #?\d+", re.I),
    re.compile(r"\bNOTEBOOK\b"),
)


def pr_texts() -> list[Path]:
    """Every pull-request text: the cover, the fixes' and each base's parts'."""
    texts = [PR_OVERVIEW, *sorted((REPO / "upstream" / "fixes").glob("[0-9][0-9]-*.md"))]
    for base in BASES:
        series = SERIES_DIR if base == BASES[0] else REPO / "upstream" / base / "series"
        texts += sorted(series.glob("[0-9][0-9]-*.md"))
    return texts


def pr_text_problems(text: str) -> list[str]:
    """What ``text`` holds that a pull-request text must not (``NOT_IN_PR_TEXT``)."""
    found = [m.group(0) for pat in NOT_IN_PR_TEXT for m in pat.finditer(text)]
    return found + [n for n in re.findall(r"#\d+\b", text) if n not in FOREIGN_PULL_REQUESTS]


def test_pr_texts_name_no_run_issue_or_internal_tool():
    assert len(pr_texts()) == 1 + 3 + 10 * len(BASES)
    bad = {
        str(p.relative_to(REPO)): found
        for p in pr_texts()
        if (found := pr_text_problems(p.read_text()))
    }
    assert bad == {}
    assert pr_text_problems("run 123; runs 26-29; results/run5/; issue #7; #12; NOTEBOOK") == [
        "run 123", "runs 26", "results/run", "issue #7", "NOTEBOOK", "#7", "#12"
    ]  # fmt: skip
    assert pr_text_problems("see #31069; pre-commit#format; a run of 3") == []


def test_pr_texts_are_in_the_templates_sections(gen):
    """The cover and every part's text: a title, then exactly the sections of SGLang's template
    in order (subsections allowed), at most about 150 lines."""
    for path in [PR_OVERVIEW, *(p for p in pr_texts() if "series" in p.parts)]:
        text = path.read_text()
        headings = [line for line in text.splitlines() if line.startswith("## ")]
        assert text.startswith("# "), path
        assert headings == list(gen.PR_SECTIONS), path
        assert len(text.splitlines()) <= gen.MAX_PART_TEXT_LINES, path


def test_generator_refuses_a_part_template_out_of_the_sections(gen, monkeypatch):
    monkeypatch.setattr(gen, "render_template", lambda name, base=None: "## Motivation\n\nx\n")
    with pytest.raises(SystemExit, match="sections"):
        gen.part_text(1, gen.SERIES[0], [(1, 0, "x.py")])


# SGLang's test harness, stubbed for the series' unit tests on a tree without the rest of SGLang
# (in SGLang, `register_cuda_ci` is an AST marker and `CustomTestCase` a `unittest.TestCase`),
# and the one SGLang module the edited ``environ.py`` imports (0.5.17, at its end: the CUDA
# coredump helper, which sets CUDA variables when asked to).
_HARNESS_STUBS = {
    "python/sglang/test/__init__.py": b"",
    "python/sglang/test/ci/__init__.py": b"",
    "python/sglang/test/ci/ci_register.py": b"def register_cuda_ci(*args, **kwargs):\n    pass\n",
    "python/sglang/test/test_utils.py": b"from unittest import TestCase as CustomTestCase\n",
    "python/sglang/srt/debug_utils/__init__.py": b"",
    "python/sglang/srt/debug_utils/cuda_coredump.py": b"",
}


def test_series_unit_tests_pass_on_their_part(gen, applied_series, tmp_path):
    """Each part's own unit tests (the in-tree templates of a part that does not serve yet) pass
    on the tree that part leaves, on the CPU, with only SGLang's test harness stubbed: a part
    is merged with tests that run. Their CUDA-only cases (kernels against references) skip
    here and run on a GPU."""
    steps, _ = applied_series
    targets = dict(gen.TEMPLATE_FILES)
    ran = []
    for (name, _, tree), part in zip(steps, gen.SERIES):
        # A prelude's test reads SGLang's own modules beyond the part's files: the series CPU
        # smoke runs it with the base's SGLang around it.
        if part.serves or part.prelude:
            continue
        tests = [targets[t] for t in part.templates if t.startswith("test_")]
        if not tests:
            continue
        root = tmp_path / name
        for path, data in {**tree, **_HARNESS_STUBS}.items():
            gen._write(root, path, data)
        for package in ("sglang", "sglang/srt", "sglang/srt/speculative"):
            gen._write(root, f"python/{package}/__init__.py", b"")
        for test in tests:
            r = subprocess.run(
                [sys.executable, "-m", "unittest", "-v", Path(test).stem],
                cwd=root / Path(test).parent,
                # The part's tree first; after it the rest of the path (sgl_kernel on a GPU).
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(
                        [str(root / "python"), *filter(None, [os.environ.get("PYTHONPATH")])]
                    ),
                },
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert r.returncode == 0 and "OK" in r.stderr, (name, test, r.stderr[-3000:])
            count = re.search(r"Ran (\d+) tests?", r.stderr)
            skipped = re.search(r"skipped=(\d+)", r.stderr)  # CUDA-only tests, on a GPU run
            passed = int(count.group(1)) - (int(skipped.group(1)) if skipped else 0)
            assert passed >= 1, r.stderr
            ran.append((test, passed))
    print(ran)
    assert len(ran) >= 7, ran


def _pristine_site(source, tmp_path) -> Path:
    """A directory holding a copy of pristine SGLang's ``sglang`` package (``--site``)."""
    site = tmp_path / "site"
    if source.where.is_dir():
        shutil.copytree(source.where / "sglang", site / "sglang")
    else:
        import zipfile

        with zipfile.ZipFile(source.where) as whl:
            whl.extractall(site, [n for n in whl.namelist() if n.startswith("sglang/")])
    return site


def test_series_smoke_applies_every_part_to_a_copy_of_sglang(gen, src, tmp_path):
    """``upstream/smoke_series.py --apply-only`` (the GPU smoke's first half, which runs
    anywhere): every committed part applies in order to a copy of pristine SGLang's package,
    and the unit tests each part adds are found for it to run."""
    site = _pristine_site(src, tmp_path)
    r = subprocess.run(
        [sys.executable, str(REPO / "upstream" / "smoke_series.py"), "--site", str(site),
         "--base", src.base, "--apply-only", "--keep", str(tmp_path / "tree")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    steps = [json.loads(line) for line in r.stdout.splitlines()]
    parts, summary = steps[:-1], steps[-1]
    assert summary["ok"] and len(parts) == len(_committed_parts(gen.series_dir(src.base)))
    assert all(p["applied"] for p in parts)
    with_tests = [p["part"] for p in parts if p["tests_added"]]
    # Every part adds its tests (part 00 its fused-KV helper's; its move is checked by
    # test_upstream_dflash_methods).
    assert with_tests == [p["part"] for p in parts], with_tests
    # The kernel parts add their benchmarks: the draft tree's, the radix top-p's, the accept
    # side's and the verify attention's (part 4's Gluon kernel is timed by part 5's).
    benchmarks = {p["part"]: p["benchmarks_added"] for p in parts if p["benchmarks_added"]}
    bench = "benchmark/kernels/ddtree/bench_ddtree_"
    assert benchmarks == {
        "01-draft-tree.patch": [bench + "draft_tree.py"],
        "02-top-p-radix.patch": [bench + "top_p_radix.py"],
        "03-tree-accept.patch": [bench + "accept.py"],
        "05-tree-verify-attention.patch": [bench + "tree_attention.py"],
    }
    assert not any(p["checked"] or p["checks"] for p in parts)


def test_series_smoke_from_a_later_part_applies_the_earlier_ones_unchecked(source, tmp_path):
    """``--from N`` (a smoke split over several calls): every part is applied in order, the
    parts before N run no check and report so; ``--parts`` still stops the run."""
    site = _pristine_site(source, tmp_path)
    n = len(_committed_parts())
    last = int(_committed_parts()[-1].name[:2])  # parts are numbered from 00
    r = subprocess.run(
        [sys.executable, str(REPO / "upstream" / "smoke_series.py"), "--site", str(site),
         "--from", str(last + 1), "--parts", str(last - 1)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    steps = [json.loads(line) for line in r.stdout.splitlines()]
    parts, summary = steps[:-1], steps[-1]
    assert summary["ok"] and len(parts) == n - 1  # stopped before the last part
    assert all(p["applied"] and not p["checked"] and not p["checks"] for p in parts)


def _smoke_module():
    path = REPO / "upstream" / "smoke_series.py"
    spec = importlib.util.spec_from_file_location("smoke_series", path)
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    return smoke


def test_series_smoke_stands_the_shipped_pair_in_for_the_server_tests_hub_models(tmp_path):
    """The smoke's model stand-ins: links at the hub names SGLang's test utilities give
    ``DEFAULT_TARGET_MODEL_DFLASH`` and its drafter, each a local directory holding the shipped
    pair's model (what a server launched from that directory loads); a missing constant stops
    the smoke naming it."""
    smoke = _smoke_module()
    tree = tmp_path / "python"
    (tree / "sglang" / "test").mkdir(parents=True)
    (tree / "sglang" / "test" / "test_utils.py").write_text(
        'DEFAULT_TARGET_MODEL_DFLASH = "org/Target-8B"\n'
        'DEFAULT_DRAFT_MODEL_DFLASH = "lab/Target-8B-DFlash"\n'
    )
    work = tmp_path / "models"
    work.mkdir()
    names = smoke.model_stand_ins(tree, work)
    assert set(names) == {"org/Target-8B", "lab/Target-8B-DFlash"}
    assert (work / "org" / "Target-8B" / "tokenizer.json").is_file()  # the pair's target
    drafter = json.loads((work / "lab" / "Target-8B-DFlash" / "config.json").read_text())
    assert drafter == json.loads((smoke.PAIR / "drafter" / "config.json").read_text())
    assert smoke.model_stand_ins(tree, work) == names  # idempotent (a second server test)
    (tree / "sglang" / "test" / "test_utils.py").write_text('DEFAULT_TARGET_MODEL_DFLASH = "a/b"\n')
    with pytest.raises(SystemExit, match="DEFAULT_DRAFT_MODEL_DFLASH"):
        smoke.model_stand_ins(tree, tmp_path / "other")


def test_series_smoke_stops_when_the_pairs_weights_are_missing(tmp_path, monkeypatch):
    """Without the shipped pair's weights the stand-ins would point the server tests at
    directories no server can load (each dies at start naming the hub model): the smoke stops
    first, naming the missing file."""
    smoke = _smoke_module()
    tree = tmp_path / "python"
    (tree / "sglang" / "test").mkdir(parents=True)
    (tree / "sglang" / "test" / "test_utils.py").write_text(
        'DEFAULT_TARGET_MODEL_DFLASH = "org/T"\nDEFAULT_DRAFT_MODEL_DFLASH = "lab/D"\n'
    )
    pair = tmp_path / "pair"
    for model in ("target", "drafter"):
        (pair / model).mkdir(parents=True)
        (pair / model / "config.json").write_text("{}")
    (pair / "target" / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(smoke, "PAIR", pair)
    with pytest.raises(SystemExit, match="drafter weights are missing"):
        smoke.model_stand_ins(tree, tmp_path / "models")
    (pair / "drafter" / "model.safetensors").write_bytes(b"")
    assert set(smoke.model_stand_ins(tree, tmp_path / "models")) == {"org/T", "lab/D"}


def test_series_smoke_serves_the_patched_tree_through_its_sglang_command(tmp_path):
    """SGLang's test utilities launch ``sglang serve``; an unpacked site has no console script,
    so the smoke writes one for its own interpreter: run with the patched tree first on the
    path, it is that tree's ``sglang.cli.main`` that receives the arguments, and a child it
    spawns (the server's schedulers) starts without running the command again."""
    smoke = _smoke_module()
    cli = tmp_path / "python" / "sglang" / "cli"
    cli.mkdir(parents=True)
    (cli.parent / "__init__.py").write_text("")
    (cli / "__init__.py").write_text("")
    (cli / "main.py").write_text(  # spawns a child, as the server spawns its schedulers
        "import multiprocessing, sys\n"
        "def child():\n    pass\n"
        "def main():\n"
        "    p = multiprocessing.get_context('spawn').Process(target=child)\n"
        "    p.start(); p.join()\n"
        "    print('patched', sys.argv[1:], p.exitcode)\n    return 3\n"
    )
    bindir = smoke.sglang_command(tmp_path)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(tmp_path / "python")}  # fmt: skip
    r = subprocess.run(["sglang", "serve", "--port", "1"], env=env, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 3 and r.stdout.strip() == "patched ['serve', '--port', '1'] 0", r


def test_series_smoke_keeps_each_checks_whole_output(tmp_path):
    """A check's whole output (a launched server's log lines included) is kept in its log;
    the JSON line carries its last 600 characters and whether it passed, or timed out."""
    smoke = _smoke_module()
    noisy = "import sys\nprint('server: first line')\nprint('x' * 2000)\nsys.exit('failed')\n"
    log = tmp_path / "logs" / "part.check.log"
    res = smoke.run([sys.executable, "-c", noisy], dict(os.environ), tmp_path, 60, log)
    text = log.read_text()
    assert not res["ok"] and res["log"] == str(log)
    assert text.startswith("server: first line") and text.rstrip().endswith("failed")
    assert res["tail"] == text[-600:] and len(text) > 2000
    slow = smoke.run([sys.executable, "-c", "print('up', flush=True)\nimport time\n"
                      "time.sleep(30)"], dict(os.environ), tmp_path, 2, log)  # fmt: skip
    assert not slow["ok"] and slow["why"] == "timeout 2 s" and "up" in slow["tail"]


def test_series_smoke_runs_only_the_named_checks(source, tmp_path, monkeypatch, capsys):
    """``--only``: of a checked part's tests and benchmarks only the named ones run, and no
    engine or in-tree smoke (a part checked with nothing named runs nothing). The plugin is
    installed on this machine, so its check is stood in for (the next test covers it)."""
    site = _pristine_site(source, tmp_path)
    smoke = _smoke_module()
    monkeypatch.setattr(smoke, "visible_plugins", lambda env: [])
    monkeypatch.setattr(sys, "argv", ["smoke_series.py", "--site", str(site), "--parts", "1",
                                      "--only", "no_such_test.py"])  # fmt: skip
    assert smoke.main() == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()[:-1]]
    assert [p["part"] for p in lines] == ["00-dflash-draft-block.patch", "01-draft-tree.patch"]
    part = lines[1]
    assert part["applied"] and part["checked"] and part["checks"] == [], part
    assert part["tests_added"] and part["benchmarks_added"]  # there was something to skip


def test_series_smoke_refuses_to_run_beside_the_plugin(source, tmp_path, monkeypatch):
    """With the plugin's entry point visible the smoke stops before any check (DDTREE would be
    registered twice), naming the fix; its own path never shows an editable install's
    ``egg-info``: the helpers directory holds the package alone."""
    site = _pristine_site(source, tmp_path)
    smoke = _smoke_module()
    monkeypatch.setattr(sys, "argv", ["smoke_series.py", "--site", str(site), "--parts", "1"])
    monkeypatch.setattr(smoke, "visible_plugins", lambda env: ["ddtree"])
    with pytest.raises(SystemExit, match="pip uninstall sglang-ddtree"):
        smoke.main()
    helpers = smoke.helpers_path(tmp_path)
    assert [p.name for p in helpers.iterdir()] == ["sglang_ddtree"]
    assert (helpers / "sglang_ddtree" / "pair").is_dir()


def test_series_benchmarks_import_what_their_parts_define(gen, applied_series):
    """The kernel parts' in-tree benchmarks (GPU scripts, not run here) import from the
    DDTREE modules only names the tree of their part defines (that the modules themselves are
    there, `missing_imports` checks for every file of the tree)."""
    steps, _ = applied_series
    checked = 0
    for name, _, tree in steps:
        for path in sorted(p for p in tree if p.startswith("benchmark/kernels/ddtree/")):
            for node in ast.walk(ast.parse(tree[path])):
                if not (isinstance(node, ast.ImportFrom) and node.module):
                    continue
                if not node.module.startswith("sglang.srt.speculative.ddtree"):
                    continue
                module = gen.module_path(node.module, tree)  # present: `missing_imports`
                missing = {a.name for a in node.names} - top_level_names(tree[module])
                assert not missing, (name, path, node.module, missing)
                checked += 1
    assert checked >= 8  # the four benchmarks' imports of DDTREE modules


# --- the bases ----------------------------------------------------------------------------------
def test_bases_differ_only_where_the_tables_say(gen):
    """Every file the patch adds is the same on every base but the ones ``BASE_REWRITES``
    names for that base (before each base's formatting, ``FORMATTERS``); an edit differs only
    where ``BASE_EDITS`` names it; every difference is in upstream/README.md's table of base
    differences."""
    first = gen.new_files(BASES[0], formatted=False)
    targets = {**gen.MODULE_MAP, **dict(gen.TEMPLATE_FILES)}
    targets.update((k, t) for k, t, _ in gen.KERNEL_FILES)
    readme = UPSTREAM_README.read_text()
    table = readme[readme.index("## What differs between the bases") :]
    for base in BASES[1:]:
        files = gen.new_files(base, formatted=False)
        assert set(files) == set(first)
        rewritten = {targets[f] for f, _, _ in gen.BASE_REWRITES[base]}
        assert {p for p in files if files[p] != first[p]} == rewritten, base
        same = [e.name for e in gen.edits(base) if e.name not in gen.BASE_EDITS[base]]
        assert same == [e.name for e in gen.EDITS if e.name not in gen.BASE_EDITS[base]]
        for name in gen.BASE_EDITS[base]:
            assert f"`{name}`" in table, f"README's table of base differences lacks edit {name}"
        for path in rewritten:
            assert f"`{Path(path).name}`" in table, f"README's table lacks {Path(path).name}"
        for tool, version in gen.FORMATTERS[base].items():
            assert f"{tool} {version}" in table, f"README's table lacks {tool} {version}"


def test_generator_refuses_a_rewrite_that_no_longer_matches(gen, monkeypatch):
    """A base's rewrite whose line the module no longer holds fails the generator loudly."""
    file, old, new = gen.BASE_REWRITES["0.5.23"][0]
    bad = (file, old + "# not there\n", new)
    monkeypatch.setitem(gen.BASE_REWRITES, "0.5.23", (bad, *gen.BASE_REWRITES["0.5.23"][1:]))
    with pytest.raises(SystemExit, match="BASE_REWRITES.*0 times"):
        gen.new_files("0.5.23")


def _smoke_python() -> str:
    """The interpreter for the CPU smoke: ``$SGLANG_DDTREE_SMOKE_PYTHON`` (one where a base's
    SGLang imports, e.g. a virtual environment with its torch) or this one."""
    return os.environ.get(_smoke_module().SMOKE_PYTHON_ENV) or sys.executable


# CUDA extensions that SGLang's edited files import at module level and that cannot load
# without a GPU driver: the CPU smoke stands them in where they do not import.
CUDA_EXTENSIONS = ("flash_mla",)


def test_smoke_import_check_reports_failures_and_stands_in(tmp_path):
    smoke = _smoke_module()
    (tmp_path / "broken_mod.py").write_text("raise ImportError('broken here')\n")
    (tmp_path / "uses_ext.py").write_text(
        "import ext_standin\nfrom ext_standin.sub import Meta\nx = ext_standin.anything\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    targets = smoke.import_targets(
        ["python/sglang/srt/x/__init__.py", "python/sglang/srt/y.py", "a.cuh", "test/t.py"]
    )
    assert targets == ["sglang.srt.x", "sglang.srt.y", "test/t.py"]
    res = smoke.import_check(["json", "broken_mod", "uses_ext"], env, tmp_path, [])
    assert res["imported"] == 1 and set(res["failed"]) == {"broken_mod", "uses_ext"}
    assert "broken here" in res["failed"]["broken_mod"]
    res = smoke.import_check(["json", "uses_ext"], env, tmp_path, ["ext_standin"])
    assert res == {"imported": 2, "failed": {}}


def _torch_pin(src) -> str:
    """The torch requirement of ``src``'s wheel (``torch==...``), or "its torch"."""
    if src.where.suffix == ".whl":
        import zipfile

        with zipfile.ZipFile(src.where) as whl:
            meta = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
            text = whl.read(meta[0]).decode() if meta else ""
        pin = re.search(r"^Requires-Dist: (torch==[^;\s]+)", text, re.M)
        if pin:
            return pin.group(1)
    return "its torch"


def _imports_pristine(python: str, site: Path) -> str | None:
    """None where ``python`` imports the pristine SGLang in ``site`` (its server args and the
    DFLASH worker), else why not (the last line of the error and that interpreter's torch)."""
    probe = (
        "import torch; print(torch.__version__); "
        "import sglang.srt.server_args, sglang.srt.speculative.dflash_worker_v2"
    )
    r = subprocess.run([python, "-c", probe], env={**os.environ, "PYTHONPATH": str(site)},
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    if r.returncode == 0:
        return None
    torch_version = (r.stdout.strip().splitlines() or ["no torch"])[0]
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    return f"{python} (torch {torch_version}) does not import it: {last}"


def test_series_cpu_smoke_imports_and_unit_tests_at_every_part(gen, src, tmp_path):
    """``smoke_series.py --cpu`` on a copy of pristine SGLang's package: after every part each
    module the series has added or edited so far (new modules, SGLang's edited files, the
    tests and benchmarks) imports with the real SGLang of that base around it, the unit tests
    the part adds pass (CUDA cases skip), and from the part that registers DDTREE on, DDTREE
    resolves to the in-tree spec class and SGLang's parser takes the two flags. It needs an
    interpreter where that SGLang imports (SGLang 0.5.23 needs torch 2.14):
    ``$SGLANG_DDTREE_SMOKE_PYTHON``, else this one; a skip names why not."""
    site = _pristine_site(src, tmp_path)
    python = _smoke_python()
    why_not = _imports_pristine(python, site)
    if why_not is not None:
        pytest.skip(
            f"pristine SGLang {src.base} (which pins {_torch_pin(src)}) does not import here: "
            f"{why_not}; set SGLANG_DDTREE_SMOKE_PYTHON to an interpreter where it does"
        )
    stand_ins = []
    for ext in CUDA_EXTENSIONS:
        r = subprocess.run([python, "-c", f"import {ext}"], capture_output=True, timeout=300)
        stand_ins += [] if r.returncode == 0 else ["--stand-in", ext]
    r = subprocess.run(
        [python, str(REPO / "upstream" / "smoke_series.py"), "--site", str(site), "--base",
         src.base, "--cpu", *stand_ins, "--keep", str(tmp_path / "tree")],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    steps = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert steps, r.stderr[-3000:]
    parts, summary = steps[:-1], steps[-1]
    failed = {p["part"]: (p.get("imports"), [c for c in p["checks"] if not c["ok"]])
              for p in parts if not p["ok"]}  # fmt: skip
    assert failed == {} and r.returncode == 0, failed
    assert len(parts) == len(_committed_parts(gen.series_dir(src.base)))
    # Cumulative: each part imports every module the series has touched so far (the first
    # part edits DFLASH's worker alone), the DDTREE parts ten or more.
    counts = [p["imports"]["imported"] for p in parts]
    assert counts[0] >= 1 and counts == sorted(counts) and counts[1] >= 10, counts
    serving = [p for p in parts if any("registered" in c["log"] for c in p["checks"])]
    assert serving and serving[0]["part"].endswith("worker.patch")
    print(summary, [(p["part"], p["imports"]["imported"], len(p["checks"])) for p in parts])


def _tvm_ffi_include(python: str) -> str | None:
    r = subprocess.run([python, "-c", "import tvm_ffi.libinfo as l; print(l.find_include_path())"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def test_kernel_sources_compile_against_each_bases_jit_headers(gen, src, tmp_path):
    """Every CUDA source the patch adds, as the base's patch carries it, compiles with nvcc
    against that base's JIT headers (``sglang/kernels/jit/include``) and tvm-ffi's, exported
    as SGLang's JIT loader exports it (inside ``namespace sglang``). Needs nvcc and tvm-ffi's
    headers (``$SGLANG_DDTREE_SMOKE_PYTHON`` or this interpreter); no GPU."""
    nvcc = shutil.which("nvcc")
    include = _tvm_ffi_include(_smoke_python())
    if nvcc is None or include is None:
        pytest.skip(f"needs nvcc ({nvcc}) and tvm-ffi's headers ({include}) to compile CUDA")
    site = _pristine_site(src, tmp_path)
    added = gen.new_files(src.base)
    exports = {"python/sglang/kernels/jit/csrc/ddtree/top_p_radix.cuh": (
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_p_radix, (TopPRadix<4>::run));\n"
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(top_p_softmax_radix, (TopPSoftmaxRadix<4>::run));\n")}  # fmt: skip
    assert sorted(exports) == sorted(target for _, target, _ in gen.KERNEL_FILES)
    for target, export in exports.items():
        kernel = tmp_path / Path(target).name
        kernel.write_text(added[target])
        unit = tmp_path / f"{kernel.stem}_wrapper.cu"
        unit.write_text(
            "#include <tvm/ffi/container/tensor.h>\n#include <tvm/ffi/function.h>\n"
            f'#include "{kernel}"\nnamespace sglang {{\n{export}}}  // namespace sglang\n'
        )
        r = subprocess.run(
            [nvcc, "-std=c++20", "-O0", "-arch=sm_90", "-DSGL_CUDA_ARCH=900",
             "--expt-relaxed-constexpr", "-c", str(unit), "-o", str(tmp_path / "k.o"),
             "-I", str(site / "sglang" / "kernels" / "jit" / "include"), "-I", include],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        assert r.returncode == 0, f"{target} on SGLang {src.base}:\n{r.stderr[-3000:]}"


# What the in-tree text must not name: the plugin (its hooks, its registration), this
# repository by name or package, or this repository's docs.
NOT_IN_TREE = (
    re.compile(r"\bplugins?\b", re.I),
    re.compile(r"sglang-ddtree|sglang_ddtree"),
    re.compile(r"\bdocs/(?!advanced_features/)[\w./-]+\.md\b"),
)


def not_in_tree_lines(patch_text: str) -> list[str]:
    """The lines a patch adds that name what ``NOT_IN_TREE`` lists."""
    return [
        line
        for line in patch_text.splitlines()
        if line.startswith("+") and not line.startswith("+++")
        and any(p.search(line) for p in NOT_IN_TREE)
    ]  # fmt: skip


def test_in_tree_text_names_no_plugin_repository_or_its_docs():
    patches = [PATCH, REPO / "upstream" / "0.5.23" / "sglang-ddtree.patch"]
    patches += sorted(SERIES_DIR.glob("*.patch"))
    patches += sorted((REPO / "upstream" / "0.5.23" / "series").glob("*.patch"))
    found = {
        str(p.relative_to(REPO)): lines
        for p in patches
        if (lines := not_in_tree_lines(p.read_text()))
    }
    assert found == {}, "the in-tree text names the plugin, this repository or its docs"
    # The check itself sees each kind.
    assert len(not_in_tree_lines(
        "+# the plugin's hook\n+see docs/integration.md\n+pip install sglang-ddtree\n"
        "+++ b/x.py\n+SGLANG_DDTREE_TOPK = 8\n+docs/advanced_features/ddtree.md\n"
    )) == 3  # fmt: skip
