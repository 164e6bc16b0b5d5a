"""The best-first DDTree heap as one Triton kernel: one program per request, no host sync.

Same contract, order and tie-breaking as `tree.build_tree_from_candidates` (see its module
docstring); this is the GPU fast path. The torch builder takes ``D`` rounds of sorts over
``budget x K`` candidates (about 15 small kernels per round); this kernel keeps the frontier
and the output rows in registers, reads two candidate log-probs a pop and pops ``budget``
times, so a whole tree costs one launch.

Frontier entry ``j`` is the next untaken child of output slot ``j`` (entry 0: the root's), so
a pop needs no free-entry search and the popped entry's parent is its index. Per pop: one
max-reduction over the packed keys (score desc, then depth, parent slot and rank asc) yields
the entry, decoded from the key, together with its parent's score; the entry is replaced by
its next sibling and the new slot's entry takes its first child. At most ``budget + 1``
entries are ever live.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sglang_ddtree.core.tree import MAX_BUDGET, MAX_DEPTH, DraftTree

# Key of an empty frontier entry: below every live key (live scores are finite).
_DEAD = tl.constexpr(-9223372036854775807)


@triton.jit
def _and(mask, cond):
    """``mask & cond`` for a scalar ``cond``, broadcast explicitly (also runs in the
    interpreter, which cannot `&` a tensor with a scalar bool)."""
    return mask & ((mask.to(tl.int32) * 0 + cond.to(tl.int32)) != 0)


@triton.jit
def _larger_key(key_a, value_a, key_b, value_b):
    """Combine of a max-reduction that carries one value along with the key."""
    take_a = key_a > key_b
    return tl.where(take_a, key_a, key_b), tl.where(take_a, value_a, value_b)


@triton.jit
def _ddtree_heap_kernel(
    lp_ptr,  # [bs, D, K] float32, sorted descending along K
    tok_ptr,  # [bs, D, K] int64
    root_ptr,  # [bs] int64
    parents_ptr,  # [bs, W] int64 out
    depths_ptr,  # [bs, W] int64 out
    tokens_ptr,  # [bs, W] int64 out
    logw_ptr,  # [bs, W] float32 out
    valid_ptr,  # [bs, W] bool (int8) out
    D: tl.constexpr,
    K: tl.constexpr,
    BUDGET: tl.constexpr,
    N_PAD: tl.constexpr,  # power of two >= BUDGET + 1: output slots, one frontier entry each
):
    b = tl.program_id(0)
    N: tl.constexpr = BUDGET + 1
    neg_inf = float("-inf")
    lp = lp_ptr + b * D * K  # candidate (depth d, rank r) at lp[(d - 1) * K + r]

    o = tl.arange(0, N_PAD)
    # Frontier, entry j = the next untaken child of slot j (its depth, rank and score).
    seed = tl.load(lp) + 0.0  # depth 1, rank 0; + 0.0 turns -0.0 into the key's 0.0
    f_score = tl.where(o == 0, seed, tl.full([N_PAD], neg_inf, tl.float32))
    f_depth = tl.full([N_PAD], 1, tl.int32)
    f_rank = tl.zeros([N_PAD], tl.int32)
    f_live = _and(o == 0, seed > neg_inf)
    # Output slots.
    o_parent = tl.full([N_PAD], -1, tl.int32)
    o_depth = tl.zeros([N_PAD], tl.int32)
    o_rank = tl.zeros([N_PAD], tl.int32)
    o_logw = tl.where(o == 0, 0.0, tl.full([N_PAD], neg_inf, tl.float32))
    o_valid = o == 0

    for i in range(BUDGET):
        # Pack (score desc, depth asc, parent asc, rank asc) into one int64; larger = better.
        bits = (f_score + 0.0).to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
        sec = (f_depth.to(tl.int64) << 26) | (o.to(tl.int64) << 13) | f_rank.to(tl.int64)
        key = (ordered << 32) | (0x7FFFFFFF - sec)  # sec < 2**31: depth 5, parent 13, rank 13 bits
        key = tl.where(f_live, key, _DEAD)
        best, parent_score = tl.reduce((key, o_logw), 0, _larger_key)
        live = best > _DEAD
        # Decode the popped entry from its key.
        hi = (best >> 32).to(tl.int32)
        score = tl.where(hi < 0, hi ^ 0x7FFFFFFF, hi).to(tl.float32, bitcast=True)
        sec_best = 0x7FFFFFFF - (best & 0xFFFFFFFF)
        depth = (sec_best >> 26).to(tl.int32)
        parent = ((sec_best >> 13) & 0x1FFF).to(tl.int32)
        rank = (sec_best & 0x1FFF).to(tl.int32)

        slot = i + 1
        put = _and(o == slot, live)
        o_parent = tl.where(put, parent, o_parent)
        o_depth = tl.where(put, depth, o_depth)
        o_rank = tl.where(put, rank, o_rank)
        o_logw = tl.where(put, score, o_logw)
        o_valid = o_valid | put

        # Next sibling (same parent and depth, rank + 1) replaces the popped entry.
        has_sib = live & (rank + 1 < K)
        sib_lp = tl.load(lp + (depth - 1) * K + rank + 1, mask=has_sib, other=neg_inf)
        sib_score = parent_score + sib_lp
        sib_ok = has_sib & (sib_score > neg_inf)
        sel = _and(o == parent, live)
        f_score = tl.where(sel, sib_score, f_score)
        f_rank = tl.where(sel, rank + 1, f_rank)
        f_live = tl.where(_and(sel, sib_ok), True, tl.where(sel, False, f_live))

        # First child (depth + 1, rank 0): the new slot's own entry.
        has_child = live & (depth < D)
        child_lp = tl.load(lp + depth * K, mask=has_child, other=neg_inf)
        child_score = score + child_lp
        child_ok = has_child & (child_score > neg_inf)
        f_score = tl.where(put, child_score, f_score)
        f_depth = tl.where(put, depth + 1, f_depth)
        f_live = f_live | _and(put, child_ok)

    # Tokens: one gather for all slots once their (depth, rank) are known.
    body = o_valid & (o > 0)
    tok = tl.load(tok_ptr + b * D * K + (o_depth - 1) * K + o_rank, mask=body, other=0)
    root = tl.load(root_ptr + b)
    tok = tl.where(o == 0, root, tok)
    out = b * N + o
    m = o < N
    tl.store(parents_ptr + out, o_parent.to(tl.int64), mask=m)
    tl.store(depths_ptr + out, o_depth.to(tl.int64), mask=m)
    tl.store(tokens_ptr + out, tok, mask=m)
    tl.store(logw_ptr + out, o_logw, mask=m)
    tl.store(valid_ptr + out, o_valid.to(tl.int8), mask=m)


def build_tree_triton(
    cand_logprobs: torch.Tensor,  # [bs, D, K] float32, sorted descending along K
    cand_tokens: torch.Tensor,  # [bs, D, K] int64
    root_tokens: torch.Tensor,  # [bs] int64
    budget: int,
) -> DraftTree:
    """`build_tree_from_candidates` on CUDA in one kernel launch (same output, bit for bit)."""
    bs, depth, k = cand_logprobs.shape
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # CPU tests run the interpreter
    assert cand_logprobs.is_cuda or interpreted, "the triton builder needs CUDA tensors"
    assert cand_tokens.shape == (bs, depth, k)
    assert budget <= MAX_BUDGET and depth <= MAX_DEPTH, "the packed key's budget and depth bits"
    n = budget + 1
    dev = cand_logprobs.device
    parents = torch.empty(bs, n, dtype=torch.int64, device=dev)
    depths = torch.empty_like(parents)
    tokens = torch.empty_like(parents)
    logw = torch.empty(bs, n, dtype=torch.float32, device=dev)
    valid = torch.empty(bs, n, dtype=torch.bool, device=dev)
    _ddtree_heap_kernel[(bs,)](
        cand_logprobs.float().contiguous(),
        cand_tokens.to(torch.int64).contiguous(),
        root_tokens.to(torch.int64).contiguous(),
        parents,
        depths,
        tokens,
        logw,
        valid.view(torch.int8),
        D=depth,
        K=k,
        BUDGET=budget,
        N_PAD=triton.next_power_of_2(n),
        num_warps=1 if n <= 1024 else 4,
    )
    return DraftTree(parents, depths, tokens, logw, valid)
