"""Per-depth top-K of the draft logits in one pass over the vocabulary (Triton, no host sync).

Same contract as ``tree.select_candidates(logits, K, normalize=True)``: for every row (request,
depth) the K largest logits, sorted descending, minus the row's full-vocabulary logsumexp.

Why: the torch path upcasts ``[bs, D, V]`` draft logits to float32, runs a radix-select
``torch.topk`` over them and a logsumexp, several passes over ``bs x D x V`` values; on the
Qwen3-8B shape that is ~0.76 ms per step at bs 8 (run 9 profile), growing with bs. Here
stage 1 reads each bf16 logit once: one program per (row, vocabulary chunk) keeps the chunk in
registers, writes its max, its sum of ``exp(x - max)`` and its own top-K (K rounds of
argmax, lowest index first on ties); stage 2 (torch, on ``[rows, chunks x K]``) merges the
chunks' candidates with one small ``topk`` and their partial sums into the logsumexp.

Not yet the default: `tree.select_candidates` picks it with ``backend="triton"``
(``SGLANG_DDTREE_DRAFT_TOPK=triton`` in the worker) until an H200 measurement says it is faster.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

DEFAULT_BLOCK = 4096


@triton.jit
def _chunk_topk_kernel(
    x_ptr,  # [R, V] logits (any float dtype), row stride `stride_row`
    vals_ptr,  # [R, C, K] float32 out: the chunk's top-K logits, descending
    idx_ptr,  # [R, C, K] int64 out: their vocabulary ids
    max_ptr,  # [R, C] float32 out: the chunk's max logit
    sum_ptr,  # [R, C] float32 out: the chunk's sum of exp(x - max)
    stride_row,
    V,
    C,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    c = tl.program_id(1)
    lane = tl.arange(0, BLOCK)
    offs = c * BLOCK + lane
    ok = offs < V
    x = tl.load(x_ptr + r * stride_row + offs, mask=ok, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    s = tl.sum(tl.where(ok, tl.exp(x - m), 0.0), axis=0)
    out = r * C + c
    tl.store(max_ptr + out, m)
    tl.store(sum_ptr + out, s)
    for k in tl.static_range(K):
        # One (value, index) reduction per round; the lowest index wins a tie.
        v, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
        tl.store(vals_ptr + out * K + k, v)
        tl.store(idx_ptr + out * K + k, (c * BLOCK + i).to(tl.int64))
        x = tl.where(lane == i, float("-inf"), x)


def select_candidates_triton(
    logits: torch.Tensor,  # [bs, D, V] float (bf16 or float32), finite
    topk: int,
    block: int = DEFAULT_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cand_logprobs [bs, D, K] float32, cand_tokens [bs, D, K] int64)``, K = min(topk, V):
    the K largest logits per row, descending, minus the row's logsumexp (clamped at 0)."""
    assert logits.dim() == 3, "logits must be [bs, depth, vocab]"
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # CPU tests run the interpreter
    assert logits.is_cuda or interpreted, "the triton top-K needs CUDA tensors"
    assert topk >= 1 and block & (block - 1) == 0, "topk >= 1, block a power of two"
    bs, depth, vocab = logits.shape
    k = min(topk, vocab)
    block = min(block, triton.next_power_of_2(vocab))
    assert k <= block, "K must fit in one chunk"
    rows = logits.reshape(bs * depth, vocab)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    r, chunks = rows.shape[0], triton.cdiv(vocab, block)
    dev = logits.device
    vals = torch.empty(r, chunks, k, dtype=torch.float32, device=dev)
    idx = torch.empty(r, chunks, k, dtype=torch.int64, device=dev)
    cmax = torch.empty(r, chunks, dtype=torch.float32, device=dev)
    csum = torch.empty(r, chunks, dtype=torch.float32, device=dev)
    _chunk_topk_kernel[(r, chunks)](
        rows, vals, idx, cmax, csum, rows.stride(0), vocab, chunks,
        K=k, BLOCK=block, num_warps=8 if block >= 4096 else 4,
    )  # fmt: skip
    # A chunk shorter than K pads with -inf; those never reach the top K (V >= K finite logits).
    top, pos = torch.topk(vals.view(r, chunks * k), k, dim=-1)
    tokens = idx.view(r, chunks * k).gather(-1, pos)
    lse = torch.logsumexp(cmax + torch.log(csum), dim=-1, keepdim=True)
    values = (top - lse).clamp(max=0.0)  # rounding can leave a log-prob a hair above 0
    return values.view(bs, depth, k), tokens.view(bs, depth, k)
