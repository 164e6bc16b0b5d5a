"""The committed SGLang pull request (``upstream/sglang-ddtree.patch``) is what
``upstream/generate.py`` makes from this tree, and it applies to pristine SGLang 0.5.17.

Pristine sources come as in the generator (``$SGLANG_DDTREE_SGLANG_SRC``, an installed sglang
0.5.17, the ``.upstream-cache/`` wheel, else ``pip download``); without them (no network) both
tests skip and say why. CPU only; about 5-15 s with a download, under 2 s cached.
"""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "upstream" / "generate.py"
PATCH = REPO / "upstream" / "sglang-ddtree.patch"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("ddtree_upstream_generate", GENERATOR)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def source(gen):
    try:
        return gen.find_source()
    except Exception as e:  # no network, no cache, no installed sglang 0.5.17
        pytest.skip(f"pristine SGLang {gen.SGLANG_VERSION} sources unavailable: {e}")


def test_committed_patch_is_regenerated_byte_for_byte(gen, source, tmp_path):
    fresh = gen.build_patch(source)
    committed = PATCH.read_bytes()
    if fresh != committed:
        out = tmp_path / "fresh.patch"
        out.write_bytes(fresh)
        pytest.fail(
            f"upstream/sglang-ddtree.patch is stale (fresh copy: {out}); "
            "run `make upstream-patch` and commit the result."
        )


def test_committed_patch_applies_to_pristine_sglang(gen, source):
    ok, report = gen.apply_check(PATCH, source)
    assert ok, f"git apply --check against SGLang {gen.SGLANG_VERSION} failed:\n{report}"


def test_generator_refuses_unmapped_imports(gen, tmp_path, monkeypatch):
    """A mapped module importing tooling that stays out of SGLang fails the generator loudly."""
    pkg = tmp_path / "python" / "sglang_ddtree"
    shutil.copytree(gen.PKG_DIR, pkg, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    budget = pkg / "srt" / "ddtree_budget.py"
    budget.write_text(budget.read_text() + "\nfrom sglang_ddtree import step_timing  # noqa\n")
    monkeypatch.setattr(gen, "PKG_DIR", pkg)
    monkeypatch.setattr(gen, "REPO", tmp_path)
    with pytest.raises(
        SystemExit, match=r"ddtree_budget\.py:\d+: imports sglang_ddtree\.step_timing"
    ):
        gen.check_imports()


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
def test_templates_send_only_sampling_params_sglang_knows(gen, source, template):
    """SGLang builds ``SamplingParams(**sampling_params)``, which rejects an unknown key: every
    flat dict literal of a test template (values neither dicts nor tuples: not a table of
    cases) with a sampling-parameter key has only such keys."""
    fields = _sampling_param_fields(source)
    assert {"temperature", "top_p", "sampling_seed"} <= fields and "seed" not in fields
    tree = ast.parse(gen.render_template(template))
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
