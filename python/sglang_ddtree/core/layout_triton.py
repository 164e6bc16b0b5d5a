"""`tree_to_retrieve_arrays` as one Triton kernel: one program per request, no host sync.

The torch layout takes about 25 small launches (scatter-min, an N x N sibling search, pointer
jumping over N x N masks). Because parents precede children, one pass over the slots suffices:
slot i is appended to its parent's child list (first child / next sibling, in slot order) and
its ancestor set is its parent's set plus itself, kept as 64-bit words in registers. The words
are then expanded into the bool mask.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sglang_ddtree.core.tree import DraftTree


@triton.jit
def _and(mask, cond):
    """``mask & cond`` for a scalar ``cond`` (explicit broadcast; interpreter-safe)."""
    return mask & ((mask.to(tl.int32) * 0 + cond.to(tl.int32)) != 0)


@triton.jit
def _layout_kernel(
    parents_ptr,  # [bs, N] int64
    valid_ptr,  # [bs, N] int8
    depths_ptr,  # [bs, N] int64
    prefix_ptr,  # [bs] int64
    next_token_ptr,  # [bs, N] int64 out
    next_sibling_ptr,  # [bs, N] int64 out
    positions_ptr,  # [bs, N] int64 out
    retrieve_index_ptr,  # [bs, N] int64 out
    words_ptr,  # [bs, N, W_PAD] int64 out (ancestor bitsets, scratch)
    mask_ptr,  # [bs, N, N] int8 out
    N: tl.constexpr,
    N_PAD: tl.constexpr,
    W_PAD: tl.constexpr,
    ROWS: tl.constexpr,
):
    b = tl.program_id(0)
    o = tl.arange(0, N_PAD)
    m = o < N
    par = tl.load(parents_ptr + b * N + o, mask=m, other=-1).to(tl.int32)
    val = tl.load(valid_ptr + b * N + o, mask=m, other=0) != 0
    is_child = (val & (par >= 0)).to(tl.int32)

    first = tl.full([N_PAD], -1, tl.int32)
    last = tl.full([N_PAD], -1, tl.int32)
    nsib = tl.full([N_PAD], -1, tl.int32)
    rows = o[:, None]
    wcol = tl.arange(0, W_PAD)[None, :]
    anc = tl.where((rows == 0) & (wcol == 0), 1, 0).to(tl.int64)  # the root sees itself

    for i in range(1, N):
        sel = o == i
        p = tl.max(tl.where(sel, par, -1), axis=0)
        ok = tl.max(tl.where(sel, is_child, 0), axis=0) > 0
        prev = tl.max(tl.where(o == p, last, -1), axis=0)  # p's last child so far
        first = tl.where(_and(o == p, ok & (prev < 0)), i, first)
        nsib = tl.where(_and(o == prev, ok & (prev >= 0)), i, nsib)
        last = tl.where(_and(o == p, ok), i, last)
        # Ancestors of i = ancestors of its parent, plus i (padding: just i).
        row_p = tl.sum(tl.where(rows == p, anc, 0), axis=0)  # [W_PAD]
        shift = tl.zeros([W_PAD], tl.int64) + (i % 64)
        bit = tl.where(tl.arange(0, W_PAD) == i // 64, tl.full([W_PAD], 1, tl.int64) << shift, 0)
        anc = tl.where(rows == i, (row_p | bit)[None, :], anc)

    out = b * N + o
    tl.store(next_token_ptr + out, first.to(tl.int64), mask=m)
    tl.store(next_sibling_ptr + out, nsib.to(tl.int64), mask=m)
    depth = tl.load(depths_ptr + out, mask=m, other=0)
    tl.store(positions_ptr + out, tl.load(prefix_ptr + b) + depth, mask=m)
    tl.store(retrieve_index_ptr + out, out.to(tl.int64), mask=m)

    # Expand the bitsets into the bool mask, ROWS rows at a time (via scratch memory).
    wbase = words_ptr + b * N * W_PAD
    tl.store(wbase + rows * W_PAD + wcol, anc, mask=rows < N)
    tl.debug_barrier()
    j = tl.arange(0, 64)
    for r0 in tl.static_range(0, N_PAD, ROWS):
        r = r0 + tl.arange(0, ROWS)
        for w in tl.static_range(W_PAD):
            word = tl.load(wbase + r * W_PAD + w, mask=r < N, other=0)
            bits = (word[:, None] >> j[None, :].to(tl.int64)) & 1
            col = w * 64 + j
            ptrs = mask_ptr + b * N * N + r[:, None] * N + col[None, :]
            tl.store(ptrs, bits.to(tl.int8), mask=(r[:, None] < N) & (col[None, :] < N))


def tree_layout_triton(tree: DraftTree, prefix_lens: torch.Tensor):
    """(retrieve_index, next_token, next_sibling, positions, tree_mask) in one launch."""
    bs, n = tree.parents.shape
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    assert tree.parents.is_cuda or interpreted, "the triton layout needs CUDA tensors"
    dev = tree.parents.device
    w_pad = triton.next_power_of_2(-(-n // 64))
    next_token = torch.empty(bs, n, dtype=torch.int64, device=dev)
    next_sibling = torch.empty_like(next_token)
    positions = torch.empty_like(next_token)
    retrieve_index = torch.empty_like(next_token)
    words = torch.empty(bs, n, w_pad, dtype=torch.int64, device=dev)
    mask = torch.empty(bs, n, n, dtype=torch.bool, device=dev)
    n_pad = triton.next_power_of_2(n)
    _layout_kernel[(bs,)](
        tree.parents.contiguous(),
        tree.valid.contiguous().view(torch.int8),
        tree.depths.contiguous(),
        prefix_lens.to(torch.int64).contiguous(),
        next_token,
        next_sibling,
        positions,
        retrieve_index,
        words,
        mask.view(torch.int8),
        N=n,
        N_PAD=n_pad,
        W_PAD=w_pad,
        ROWS=min(32, n_pad),
        num_warps=4,
    )
    return retrieve_index, next_token, next_sibling, positions, mask
