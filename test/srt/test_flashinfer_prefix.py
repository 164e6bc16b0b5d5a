"""The tree verify of an MHA target on FlashInfer's prefix part: FlashInfer's paged batch prefill
over each request's cached prefix (W query rows a request, ``causal=False``; a token-major output
and a base-2 log-sum-exp), then the ancestor block and the merge in the tree kernel
(``core.tree_attention_with_prefix`` with ``prefix_lse_log2``, over `token_major_prefix_part`'s
views).

CPU: the views; the merge of a token-major, base-2 prefix part under Triton's interpreter, the
prefix part from torch, against the masked reference; calibrated (the same part read as a
natural log fails); the benchmark's FlashInfer glue (page tables, plan) over a stand-in that
follows FlashInfer's documented paged layout.

GPU (``gpu`` marker; skipped without FlashInfer): FlashInfer's fa2 kernels (the JIT SGLang's
flashinfer backend builds for Qwen3-8B: bf16, 32 query heads over 8 KV heads, 128 wide) on
ragged prefixes of 1 to 8,192 tokens in 1- and 16-slot pages, bs 1-32, W 8-33, under the
CUDA-graph plan and the exact plan; FlashInfer's lse checked to be base 2; a CUDA-graph replay
equal to the eager call; a base-2 lse read as natural caught. And the verify SGLang's
flashinfer backend runs for DDTREE (one prefill over prefix and nodes under the verify mask),
which the benchmark times beside the split, against the same reference.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_ddtree.core.tree_attention import token_major_prefix_part, tree_attention_reference

QWEN3_8B_HEADS = (32, 8, 128)  # Hq, Hkv, D


def test_token_major_prefix_part_is_a_view():
    """Row ``b * W + i`` of a token-major part is node i of request b: the output as
    [bs, W, Hq, Dv], the lse as [bs, Hq, W], on the same memory."""
    bs, w, hq, dv = 2, 3, 4, 5
    out = torch.randn(bs * w, hq, dv)
    lse = torch.randn(bs * w, hq)
    got_out, got_lse = token_major_prefix_part(out, lse, w)
    assert got_out.shape == (bs, w, hq, dv) and got_lse.shape == (bs, hq, w)
    assert got_out.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    for b in range(bs):
        for i in range(w):
            assert torch.equal(got_out[b, i], out[b * w + i])
            assert torch.equal(got_lse[b, :, i], lse[b * w + i])


_INTERPRETED_CHECK = """
import math
import torch
from test_tree_attention import random_case
from test_flashmla_verify import prefix_part_reference
from sglang_ddtree.core.tree_attention import (
    token_major_prefix_part, tree_attention_reference, tree_attention_with_prefix,
)

cases = [
    dict(bs=3, w=5, hq=4, hkv=2, d=32, dv=32, prefix=[1, 16, 37], seed=1),  # grouped heads
    dict(bs=2, w=17, hq=4, hkv=1, d=16, dv=16, prefix=[15, 2], seed=2),  # W > 16: two row tiles
]
for case in cases:
    args, scale = random_case(**case)
    q, k, v, indptr, indices, loc, mask = args
    w, hq = mask.shape[1], q.shape[1]
    out, lse = prefix_part_reference(q, k, v, indptr, indices, w, scale)
    # As FlashInfer returns it: token-major rows (b * W + i), the log-sum-exp in base 2.
    out_rows = out.reshape(-1, hq, out.shape[-1])
    lse2_rows = (lse / math.log(2)).transpose(1, 2).reshape(-1, hq).contiguous()
    prefix_out, prefix_lse = token_major_prefix_part(out_rows, lse2_rows, w)
    want = tree_attention_reference(*args, scale)
    got = tree_attention_with_prefix(q, k, v, loc, mask, scale, prefix_out, prefix_lse,
                                     prefix_lse_log2=True)
    err = (got - want).abs().max().item()
    assert err < 1e-4, (case, err)
    # Calibration: the base-2 lse read as a natural log is far from the reference.
    bad = tree_attention_with_prefix(q, k, v, loc, mask, scale, prefix_out, prefix_lse)
    assert (bad - want).abs().max().item() > 1e-2, case
print("interpreted base-2 prefix merge OK")
"""


def test_base2_token_major_prefix_merge_interpreted(run_interpreted):
    run_interpreted(_INTERPRETED_CHECK, "interpreted base-2 prefix merge OK")


_FAKE_FLASHINFER_CHECK = """
import math
import sys
import types
import torch
from conftest import _load_benchmark
from sglang_ddtree.core.tree_attention import tree_attention_reference

plans = []


class PagedPrefill:
    # FlashInfer's paged batch prefill as its documentation defines it (NHD pages; request b's
    # keys: its pages kv_indices[kv_indptr[b]:kv_indptr[b + 1]], the last one holding
    # last_page_len[b]), non-causal, returning the output and a base-2 log-sum-exp token-major.
    def __init__(self, workspace, kv_layout, use_cuda_graph=False, backend="auto", **buffers):
        assert kv_layout == "NHD" and backend == "fa2" and bool(buffers) == use_cuda_graph
        self.use_cuda_graph = use_cuda_graph

    def plan(self, qo_indptr, kv_indptr, kv_indices, last_page_len, hq, hkv, d, page, *,
             causal, sm_scale, q_data_type, kv_data_type, custom_mask=None):
        assert not causal and kv_indptr.dtype == kv_indices.dtype == torch.int32
        plans.append((page, self.use_cuda_graph, custom_mask is not None))
        self.plan_args = (qo_indptr, kv_indptr, kv_indices, last_page_len, hq, hkv, page, sm_scale)
        self.custom_mask = custom_mask  # flat bool: request by request, its rows x its keys

    def run(self, q, kv_cache, *, out, lse=None, return_lse=False):
        qo_indptr, kv_indptr, kv_indices, last_page_len, hq, hkv, page, scale = self.plan_args
        k_pages, v_pages = kv_cache
        assert return_lse == (lse is not None) and k_pages.shape[1:] == (page, hkv, q.shape[-1])
        heads = torch.arange(hq) // (hq // hkv)
        cell = 0
        for b in range(len(qo_indptr) - 1):
            pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
            keys = (len(pages) - 1) * page + int(last_page_len[b])
            slots = (pages[:, None] * page + torch.arange(page)).flatten()[:keys]
            k = k_pages.flatten(0, 1)[slots][:, heads].float()
            v = v_pages.flatten(0, 1)[slots][:, heads].float()
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            s = torch.einsum("ihd,jhd->ihj", q[rows].float(), k) * scale
            if self.custom_mask is not None:
                n_rows = rows.stop - rows.start
                allowed = self.custom_mask[cell : cell + n_rows * keys].view(n_rows, 1, keys)
                s = s.masked_fill(~allowed, float("-inf"))
                cell += n_rows * keys
            out[rows] = torch.einsum("ihj,jhd->ihd", s.softmax(-1), v).to(out.dtype)
            if lse is not None:
                lse[rows] = torch.logsumexp(s, -1) / math.log(2)
        return (out, lse) if return_lse else out


sys.modules["flashinfer"] = types.SimpleNamespace(BatchPrefillWithPagedKVCacheWrapper=PagedPrefill)
bench = _load_benchmark("bench_tree_attention")
w, scale = 5, 32 ** -0.5
for page, prefix in ((1, [1, 16, 37]), (4, [1, 4, 5]), (16, [15, 16, 17])):
    for graph_plan in (True, False):
        t = bench.random_verify(3, w, prefix, 4, 2, 32, seed=page, page=page if page > 1 else None,
                                device="cpu")
        for name in ("q", "k", "v"):  # float32 under the interpreter
            t[name] = t[name].float()
        prefix_part, split = bench.flashinfer_split(t, w, scale, page, graph_plan)
        want = tree_attention_reference(t["q"], t["k"], t["v"], t["kv_indptr"], t["kv_indices"],
                                         t["node_loc"], t["mask"], scale)
        err = (split() - want).abs().max().item()
        assert err < 1e-4, (page, prefix, graph_plan, err)
    # SGLang's flashinfer verify: prefix and nodes in one prefill under the verify mask.
    err = (bench.flashinfer_masked_verify(t, w, scale)() - want).abs().max().item()
    assert err < 1e-4, (page, prefix, "masked", err)
# Each page size: the split's two plans, then the masked verify's (slot-addressed: page 1).
assert plans == [
    plan for page in (1, 4, 16) for plan in ((page, True, False), (page, False, False),
                                             (1, False, True))
], plans
# The check can fail: the same prefill with every cell allowed (no ancestor mask) is far off.
t["full_mask"] = torch.ones_like(t["full_mask"])
err = (bench.flashinfer_masked_verify(t, w, scale)() - want).abs().max().item()
assert err > 0.05, err
print("flashinfer glue OK")
"""


def test_flashinfer_split_glue_interpreted(run_interpreted):
    """The benchmark's FlashInfer split on the CPU: a stand-in for FlashInfer's paged prefill that
    follows its documented page layout, so the page indptr, indices and last-page lengths built
    from the block table (pages of 1, 4 and 16 slots; a prefix ending on, before and after a page
    boundary) select each request's prefix exactly; both plans; the merge under the interpreter.
    And the masked verify (SGLang's flashinfer backend: prefix and nodes in one prefill, the
    verify mask as its custom mask), whose check fails without the ancestor mask."""
    run_interpreted(_FAKE_FLASHINFER_CHECK, "flashinfer glue OK")


def _flashinfer_verify(load_benchmark, bs, w, prefix, page, seed):
    """``(bench module, verify inputs, scale)`` at Qwen3-8B's heads: slot-addressed for page 1,
    else paged (request b's prefix in the first pages of its block table, its nodes after)."""
    pytest.importorskip("flashinfer")
    bench = load_benchmark("bench_tree_attention")
    t = bench.random_verify(
        bs, w, prefix, *QWEN3_8B_HEADS, seed=seed, page=page if page > 1 else None
    )
    return bench, t, QWEN3_8B_HEADS[2] ** -0.5


def _reference(t, scale):
    return tree_attention_reference(
        t["q"], t["k"], t["v"], t["kv_indptr"], t["kv_indices"], t["node_loc"], t["mask"], scale
    )


RAGGED = [1, 15, 16, 17, 1000, 8192]  # a page of 16 and either side of it, a long prompt


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "bs,w,prefix,page,graph_plan",
    [
        (1, 16, [8192], 1, True),
        (6, 8, RAGGED, 1, True),
        (6, 33, RAGGED, 16, True),  # on and across a page boundary; nodes in the last page
        (4, 17, [16, 1, 8192, 17], 1, False),
        (32, 8, RAGGED * 5 + [2, 3], 1, True),
        (32, 32, [37 + 255 * i for i in range(32)], 16, False),
    ],
)
def test_flashinfer_split_equals_reference(bs, w, prefix, page, graph_plan, load_benchmark):
    """FlashInfer's prefix part merged with the ancestor block equals the masked reference within
    bf16 rounding; FlashInfer's lse is token-major ([bs * W, Hq]) and base 2 (what the merge is
    told); a CUDA-graph replay gives the same bits as the eager call."""
    from conftest import graph_replayed
    from test_flashmla_verify import prefix_part_reference

    bench, t, scale = _flashinfer_verify(load_benchmark, bs, w, prefix, page, seed=bs + w)
    prefix_part, split = bench.flashinfer_split(t, w, scale, page, graph_plan)
    got = split()
    torch.testing.assert_close(got.float(), _reference(t, scale).float(), atol=2e-2, rtol=2e-2)
    out, lse = prefix_part()
    out_ref, lse_ref = prefix_part_reference(
        t["q"].cpu(), t["k"].cpu(), t["v"].cpu(), t["kv_indptr"].cpu(), t["kv_indices"].cpu(),
        w, scale,
    )  # fmt: skip
    hq, dv = QWEN3_8B_HEADS[0], t["v"].shape[-1]
    lse_rows = lse_ref.transpose(1, 2).reshape(bs * w, hq)  # natural log, token-major
    torch.testing.assert_close(lse.cpu() * math.log(2), lse_rows, atol=2e-2, rtol=1e-3)
    torch.testing.assert_close(
        out.cpu().float(), out_ref.reshape(bs * w, hq, dv).float(), atol=2e-2, rtol=2e-2
    )
    replayed, _graph = graph_replayed(split)
    assert torch.equal(replayed, got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "bs,w,prefix", [(1, 16, [8192]), (6, 33, RAGGED), (32, 8, RAGGED * 5 + [2, 3])]
)
def test_flashinfer_masked_verify_equals_reference(bs, w, prefix, load_benchmark):
    """The verify as SGLang's flashinfer backend runs it for DDTREE (prefix and nodes in one
    FlashInfer prefill, SGLang's verify mask as the custom mask) equals the masked reference
    within bf16 rounding: the benchmark's column times a correct kernel."""
    bench, t, scale = _flashinfer_verify(load_benchmark, bs, w, prefix, 1, seed=bs * w)
    got = bench.flashinfer_masked_verify(t, w, scale)()
    torch.testing.assert_close(got.float(), _reference(t, scale).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_flashinfer_lse_read_in_the_wrong_base_is_caught(load_benchmark):
    """Calibration: FlashInfer's lse merged as a natural log (short prefixes, where the ancestor
    block weighs most) is far outside the tolerance the right base meets."""
    from sglang_ddtree.core.tree_attention import tree_attention_with_prefix

    w = 33
    bench, t, scale = _flashinfer_verify(load_benchmark, 5, w, [1, 2, 15, 16, 17], 1, seed=7)
    prefix_part, split = bench.flashinfer_split(t, w, scale)
    want = _reference(t, scale).float()
    assert (split().float() - want).abs().max().item() < 2e-2
    prefix_out, prefix_lse = token_major_prefix_part(*prefix_part(), w)
    wrong = tree_attention_with_prefix(
        t["q"], t["k"], t["v"], t["node_loc"], t["mask"].contiguous(), scale, prefix_out, prefix_lse
    )
    assert (wrong.float() - want).abs().max().item() > 0.1
