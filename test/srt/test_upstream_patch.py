"""The committed SGLang pull request (``upstream/sglang-ddtree.patch``) is what
``upstream/generate.py`` makes from this tree, and it applies to pristine SGLang 0.5.17.

Pristine sources come as in the generator (``$SGLANG_DDTREE_SGLANG_SRC``, an installed sglang
0.5.17, the ``.upstream-cache/`` wheel, else ``pip download``); without them (no network) both
tests skip and say why. CPU only; about 5-15 s with a download, under 2 s cached.
"""

from __future__ import annotations

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
