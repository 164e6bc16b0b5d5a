"""The fixes to SGLang's own code (``upstream/fixes/``): every patch applies with ``git apply``
to the pristine release it names (``NN-name.patch``: 0.5.17 and 0.5.23;
``NN-name-<version>.patch``: that one), every fix has its pull-request text in the sections of
SGLang's pull-request template (``generate.PR_SECTIONS``), and on pristine 0.5.17 each bug
shows and each fix removes it, on the CPU without SGLang installed: the patched functions are
compiled from the patched files (as ``conftest.pristine_functions`` does).

Pristine sources as ``upstream/generate.py`` finds them, without downloading: ``--sglang-src`` /
``$SGLANG_DDTREE_SGLANG_SRC``, an installed sglang, or a wheel cached in
``.upstream-cache/sglang-<version>/`` (``make upstream-patch`` caches both releases', and so
do the 0.5.23 tests of ``test_upstream_patch.py``). Without them the tests skip.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import interpreter_bounds_loops_by_loads, pristine_functions

REPO = Path(__file__).resolve().parents[2]
FIXES = REPO / "upstream" / "fixes"
VERSIONS = ("0.5.17", "0.5.23")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _patches() -> dict[str, list[Path]]:
    """{version: its patches}; a patch without a version suffix is for every version."""
    out = {v: [] for v in VERSIONS}
    for p in sorted(FIXES.glob("*.patch")):
        m = re.fullmatch(r"(\d\d-[a-z0-9-]+?)(?:-(\d+\.\d+\.\d+))?\.patch", p.name)
        assert m, f"{p.name}: name it NN-name.patch or NN-name-<version>.patch"
        assert m.group(2) in (None, *VERSIONS), p.name
        for v in [m.group(2)] if m.group(2) else VERSIONS:
            out[v].append(p)
    return out


def _patch(name: str, version: str) -> Path:
    """The patch of fix ``name`` (``NN-name``) for ``version``."""
    for p in _patches()[version]:
        if p.name in (f"{name}.patch", f"{name}-{version}.patch"):
            return p
    raise AssertionError(f"no patch of {name} for {version}")


@pytest.fixture(scope="module")
def sglang_0517(pristine):
    return pristine("0.5.17")


class _Tree:
    """Pristine files with a patch applied (``git apply``), read like a `Source`."""

    def __init__(self, gen, src, patch: Path, root: Path):
        text = patch.read_text()
        edited = set(re.findall(r"^--- a/(\S+)$", text, re.M))
        for path in edited:
            gen._write(root, path, src.read(path))
        gen.git(root, "init", "-q")
        gen.git(root, "apply", str(patch))
        self.root = root

    def read(self, path: str) -> bytes:
        return (self.root / path).read_bytes()


def _before_after(gen, src, name, tmp_path, path, functions):
    """The named functions of ``path`` in pristine 0.5.17 and with fix ``name`` applied."""
    tree = _Tree(gen, src, _patch(name, "0.5.17"), tmp_path / name)
    return pristine_functions(src, path, functions), pristine_functions(tree, path, functions)


# --- the files -----------------------------------------------------------------------------
def test_every_fix_has_its_patches_and_its_text(gen):
    names = sorted(
        {re.sub(r"(-\d+\.\d+\.\d+)?\.patch$", "", p.name) for p in FIXES.glob("*.patch")}
    )
    assert len(names) >= 3, names
    readme = (FIXES / "README.md").read_text()
    for name in names:
        _patch(name, "0.5.17")  # the series' base; 0.5.23 where the bug is still there
        text = (FIXES / f"{name}.md").read_text()
        assert text.startswith("# "), name  # the pull request's title
        headings = [line for line in text.splitlines() if line.startswith("## ")]
        assert headings == list(gen.PR_SECTIONS), f"{name}.md: the template's sections, in order"
        positions = [text.index(s) for s in gen.PR_SECTIONS]
        assert positions == sorted(positions), f"{name}.md: the template's order"
        assert len(text.splitlines()) <= 90, f"{name}.md is long"
        assert f"`{name}" in readme, f"README.md does not list {name}"


@pytest.mark.parametrize("version", VERSIONS)
def test_patches_apply_to_pristine_sglang(gen, pristine, version):
    src = pristine(version)
    patches = _patches()[version]
    assert patches
    for patch in patches:
        ok, report = gen.apply_check(patch, src)
        assert ok, f"{patch.name} against SGLang {version} ({src.label}):\n{report}"


# --- 01: input_embeds in the model's dtype ---------------------------------------------------
def test_input_embeds_reach_a_float16_model_in_its_dtype(gen, sglang_0517, tmp_path):
    before, after = _before_after(
        gen, sglang_0517, "01-input-embeds-dtype", tmp_path,
        "python/sglang/srt/model_executor/model_runner.py", ["ModelRunner._extend_forward_kwargs"],
    )  # fmt: skip
    runner = types.SimpleNamespace(
        dtype=torch.float16, is_generation=True, _pp_kwargs=lambda pp_proxy_tensors: {}
    )
    batch = types.SimpleNamespace(
        input_embeds=torch.randn(3, 8, dtype=torch.float16),
        replace_embeds=None,
        replace_positions=None,
    )
    proj = torch.nn.Linear(8, 4, bias=False, dtype=torch.float16)  # the model's first projection
    embeds = before["ModelRunner._extend_forward_kwargs"](runner, batch, None)["input_embeds"]
    assert embeds.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="same dtype"):
        proj(embeds)
    embeds = after["ModelRunner._extend_forward_kwargs"](runner, batch, None)["input_embeds"]
    assert embeds.dtype == torch.float16 and proj(embeds).shape == (3, 4)


# --- 02: req_to_token rows hold the speculative decode reservation ---------------------------
CONTEXT_LEN = 4096
BLOCK = 16
# The scheduler clips max_new_tokens to context_len - 2 - input_len; a request decodes while it
# has fewer outputs, so its committed KV length (its tokens but the last) is <= context_len - 4.
MAX_RUNNING_COMMITTED = CONTEXT_LEN - 4


def _dflash_args(page_size: int = 1):
    """Server args as DFLASH's argument handling leaves them (one step, top-k 1, B tokens)."""
    return types.SimpleNamespace(
        speculative_algorithm="DFLASH",
        speculative_num_steps=1,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=BLOCK,
        max_speculative_num_draft_tokens=BLOCK,
        page_size=page_size,
    )


@pytest.fixture
def spec_info_stub(monkeypatch):
    """``sglang.srt.speculative.spec_info`` as `get_alloc_len_per_decode` imports it."""
    mod = types.ModuleType("sglang.srt.speculative.spec_info")
    algo = types.SimpleNamespace(has_draft_kv=lambda: True)
    mod.SpeculativeAlgorithm = types.SimpleNamespace(from_string=lambda name: algo)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)


def _row_headroom(functions, args) -> int:
    return functions["get_req_to_token_extra_context_len"](args)


def test_dflash_rows_hold_the_decode_reservation(gen, sglang_0517, tmp_path, spec_info_stub):
    """DFLASH reserves committed + 2 B columns per decode step (dflash_info_v2); at page 1 the
    pristine row headroom is 4 + B, 8 columns short for B = 16."""
    names = [
        "get_alloc_len_per_decode",
        "get_alloc_reserve_per_decode",
        "get_req_to_token_extra_context_len",
    ]
    before, after = _before_after(
        gen, sglang_0517, "02-spec-decode-row-headroom", tmp_path,
        "python/sglang/srt/mem_cache/allocation_sizing.py", names,
    )  # fmt: skip
    reserved = MAX_RUNNING_COMMITTED + 2 * BLOCK
    assert before["get_alloc_reserve_per_decode"](_dflash_args()) == 2 * BLOCK
    assert CONTEXT_LEN + _row_headroom(before, _dflash_args()) == reserved - 8
    for page_size in (1, 16, 64):  # paged rows also round up by page_size - 1
        assert CONTEXT_LEN + _row_headroom(after, _dflash_args(page_size)) >= reserved
    no_spec = types.SimpleNamespace(
        speculative_algorithm=None, max_speculative_num_draft_tokens=None, page_size=1
    )
    assert _row_headroom(before, no_spec) == _row_headroom(after, no_spec) == 4


_ASSIGN = """
import ast, sys, torch, triton, triton.language as tl
node = next(n for n in ast.parse(open(sys.argv[1]).read()).body
            if isinstance(n, ast.FunctionDef) and n.name == "assign_req_to_token_pool")
scope = {"triton": triton, "tl": tl}
exec(compile(ast.Module([node], []), "allocation.py", "exec"), scope)
ctx, block, width = (int(a) for a in sys.argv[2:])
req_to_token = torch.full((2, width), -1, dtype=torch.int32)  # row 1: the next request's
start = torch.tensor([ctx - 4], dtype=torch.int32)
locs = torch.arange(1000, 1000 + 2 * block)
scope["assign_req_to_token_pool"][(1,)](
    torch.tensor([0]), req_to_token, start, start + 2 * block, locs, width, 1)
print("next row:", req_to_token[1].tolist())
"""


def test_the_reservation_lands_in_the_next_row(gen, sglang_0517, tmp_path, spec_info_stub):
    """SGLang's `assign_req_to_token_pool` kernel (Triton's interpreter, on the CPU) writes a
    reservation past the row end into the next request's row, which the fixed width holds."""
    if not interpreter_bounds_loops_by_loads():
        pytest.skip("this Triton's interpreter cannot bound a loop by a loaded value")
    path = "python/sglang/srt/mem_cache/allocation_sizing.py"
    before, after = _before_after(
        gen, sglang_0517, "02-spec-decode-row-headroom", tmp_path, path,
        ["get_alloc_len_per_decode", "get_alloc_reserve_per_decode",
         "get_req_to_token_extra_context_len"],
    )  # fmt: skip
    kernel_file = tmp_path / "allocation.py"
    kernel_file.write_bytes(sglang_0517.read("python/sglang/srt/mem_cache/allocation.py"))
    ctx = 64
    rows = {}
    for label, functions in (("before", before), ("after", after)):
        width = ctx + _row_headroom(functions, _dflash_args())
        out = subprocess.run(
            [sys.executable, "-c", _ASSIGN, str(kernel_file), str(ctx), str(BLOCK), str(width)],
            env={**os.environ, "TRITON_INTERPRET": "1"},
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        rows[label] = ast.literal_eval(out.stdout.split("next row:")[1].strip())
    assert rows["before"][:8] == list(range(1024, 1032))  # 8 columns of the reservation
    assert rows["before"][8:] == [-1] * (len(rows["before"]) - 8)
    assert set(rows["after"]) == {-1}


# --- 03: DFLASH's sampled verify applies top-k and top-p jointly ------------------------------
def _top_k_renorm_torch(probs, top_ks):
    ranks = probs.argsort(dim=-1, descending=True).argsort(dim=-1)
    kept = probs.masked_fill(ranks >= top_ks.view(-1, 1), 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_p_renorm_torch(probs, top_ps):
    """Keep a token when the mass ranked above it is <= top_p (the sampler's torch rule)."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sort[(probs_sort.cumsum(dim=-1) - probs_sort) > top_ps.view(-1, 1)] = 0.0
    kept = torch.zeros_like(probs).scatter_(-1, probs_idx, probs_sort)
    return kept / kept.sum(dim=-1, keepdim=True)


def _sampling_info(top_k: int, top_p: float):
    return types.SimpleNamespace(
        temperatures=torch.ones(1, 1),
        top_ks=torch.tensor([top_k], dtype=torch.int32),
        top_ps=torch.tensor([top_p]),
        need_top_k_sampling=True,
        need_top_p_sampling=True,
        need_min_p_sampling=False,
        sampling_mask_max_top_k=top_k,
    )


def test_dflash_verify_targets_the_samplers_law(gen, sglang_0517, tmp_path):
    """Five tokens, p = (.3, .25, .2, .15, .1), top_k 2, top_p 0.5: the non-speculative
    sampler keeps the top two (the mass above the second, .3, is <= .5), law (6/11, 5/11);
    pristine DFLASH renormalizes the top two to (.545, .455) first and then keeps only the first.
    The fixed function gives the sampler's law on both its sparse and its dense path."""
    before, after = _before_after(
        gen, sglang_0517, "03-dflash-joint-top-k-top-p", tmp_path,
        "python/sglang/srt/speculative/dflash_utils.py", ["build_dflash_verify_target_probs"],
    )  # fmt: skip
    (sampler_mask,) = pristine_functions(
        sglang_0517, "python/sglang/srt/layers/sampler.py",
        ["Sampler._compute_sampling_mask_from_probs"],
    ).values()  # fmt: skip
    probs = torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1]])
    info = _sampling_info(2, 0.5)
    idx, probs_sort, keep, _ = sampler_mask(None, probs, info)  # the sampler's joint support
    law = torch.zeros_like(probs).scatter_(1, idx, probs_sort * keep)
    law /= law.sum()
    torch.testing.assert_close(law, torch.tensor([[6 / 11, 5 / 11, 0.0, 0.0, 0.0]]))

    def target(functions, sparse):
        fn = functions["build_dflash_verify_target_probs"]
        fn.__globals__.update(
            F=torch.nn.functional,
            top_k_renorm_prob=_top_k_renorm_torch,
            top_p_renorm_prob=_top_p_renorm_torch,
        )
        kwargs = dict(draft_token_num=1, bs=1, use_sparse_topk=sparse)
        return fn(next_token_logits=probs.log(), sampling_info=info, **kwargs).view(1, 5)

    for sparse in (True, False):
        assert math.isclose(target(before, sparse)[0, 0].item(), 1.0, rel_tol=1e-6)
        torch.testing.assert_close(target(after, sparse), law)
