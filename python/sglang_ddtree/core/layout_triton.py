"""`tree_to_retrieve_arrays` as one Triton kernel: one program per request, no host sync.

The torch layout takes about 25 small launches (scatter-min, an W x W sibling search, pointer
jumping over W x W masks). Here every row is independent, so nothing waits on the row before:

- first child of p: the smallest child slot whose parent is p; next sibling of i: the
  smallest later child slot with i's parent. Both are min-reductions over an W x W compare,
  done ``ROWS`` rows at a time.
- ancestors: every row walks its parent chain at once, ``STEPS`` gathers, collecting the
  slots it meets as bits of 64-bit words; the words are then expanded into the bool mask.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sglang_ddtree.core.tree import DraftTree


@triton.jit
def _layout_kernel(
    parents_ptr,  # [bs, W] int64
    valid_ptr,  # [bs, W] int8
    depths_ptr,  # [bs, W] int64
    prefix_ptr,  # [bs] int64
    next_token_ptr,  # [bs, W] int64 out
    next_sibling_ptr,  # [bs, W] int64 out
    positions_ptr,  # [bs, W] int64 out
    retrieve_index_ptr,  # [bs, W] int64 out
    words_ptr,  # [bs, N, W_PAD] int64 out (ancestor bitsets, scratch)
    mask_ptr,  # [bs, W, W] int8 out
    N: tl.constexpr,
    N_PAD: tl.constexpr,
    W_PAD: tl.constexpr,
    ROWS: tl.constexpr,
    STEPS: tl.constexpr,  # slots on the longest parent chain walked, the row's own included
):
    b = tl.program_id(0)
    o = tl.arange(0, N_PAD)
    m = o < N
    par = tl.load(parents_ptr + b * N + o, mask=m, other=-1)
    child = (tl.load(valid_ptr + b * N + o, mask=m, other=0) != 0) & (par >= 0)

    # First child and next sibling, ROWS rows at a time (N_PAD = none).
    for r0 in tl.static_range(0, N_PAD, ROWS):
        r = r0 + tl.arange(0, ROWS)
        r_ok = r < N
        par_r = tl.load(parents_ptr + b * N + r, mask=r_ok, other=-1)
        child_r = (tl.load(valid_ptr + b * N + r, mask=r_ok, other=0) != 0) & (par_r >= 0)
        kids = (par[None, :] == r[:, None]) & child[None, :]  # [ROWS, N_PAD]
        first = tl.min(tl.where(kids, o[None, :], N_PAD), axis=1)
        first = tl.where(first == N_PAD, -1, first).to(tl.int64)
        sibs = (par[None, :] == par_r[:, None]) & child[None, :] & child_r[:, None]
        sibs = sibs & (o[None, :] > r[:, None])
        nsib = tl.min(tl.where(sibs, o[None, :], N_PAD), axis=1)
        nsib = tl.where(nsib == N_PAD, -1, nsib).to(tl.int64)
        tl.store(next_token_ptr + b * N + r, first, mask=r_ok)
        tl.store(next_sibling_ptr + b * N + r, nsib, mask=r_ok)

    out = b * N + o
    depth = tl.load(depths_ptr + out, mask=m, other=0)
    tl.store(positions_ptr + out, tl.load(prefix_ptr + b) + depth, mask=m)
    tl.store(retrieve_index_ptr + out, out.to(tl.int64), mask=m)

    # Ancestor-or-self bitsets: all rows walk their parent chains together.
    wcol = tl.arange(0, W_PAD)[None, :]
    ancestors = tl.zeros([N_PAD, W_PAD], tl.int64)
    cur = tl.where(m, o, -1).to(tl.int64)
    for _ in range(STEPS):
        bit = tl.full([N_PAD], 1, tl.int64) << (tl.maximum(cur, 0) % 64)
        ancestors |= tl.where((wcol == (cur // 64)[:, None]) & (cur >= 0)[:, None], bit[:, None], 0)
        cur = tl.load(parents_ptr + b * N + cur, mask=cur >= 0, other=-1)

    # Expand the bitsets into the bool mask, ROWS rows at a time (via scratch memory).
    rows = o[:, None]
    wbase = words_ptr + b * N * W_PAD
    tl.store(wbase + rows * W_PAD + wcol, ancestors, mask=rows < N)
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


def tree_layout_triton(tree: DraftTree, prefix_lens: torch.Tensor, max_depth: int | None = None):
    """(retrieve_index, next_token, next_sibling, positions, tree_mask) in one launch.

    ``max_depth`` bounds the tree depth as in `layout.ancestor_mask` (default W - 1): each row
    collects itself and ``2 ** bit_length(max_depth)`` ancestors, the distance that function's
    pointer jumping covers, so both give the same mask on any tree."""
    bs, n = tree.parents.shape
    depth_bound = n - 1 if max_depth is None else int(max_depth)
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
        STEPS=(1 << max(1, depth_bound.bit_length())) + 1,
        num_warps=4,
    )
    return retrieve_index, next_token, next_sibling, positions, mask
