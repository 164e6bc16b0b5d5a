"""Move the accepted path's target KV to contiguous slots: one Triton launch, no host sync.

Terms (as in `commit`): the verify wrote node ``i`` of request ``b``'s tree (W nodes) into KV
slot ``verify_loc[b * W + i]``, and ``verify_loc[b * W + d]`` is also the slot of position
``prefix_len + d``. The accepted path keeps node ``keep_index[b, d]`` (global id ``b * W + i``)
at depth ``d``; its KV belongs at position ``prefix_len + d``. Only rows with ``i != d`` move:
the root (d = 0) never does, nor a path node that is already its depth's slot.

Why not SGLang's `move_accept_tokens_to_target_kvcache`: it moves ``bs x S`` rows whether or
not they are accepted or already in place, and its copy kernel loads up to 256 slot rows per
program; on the Qwen3-8B shape that took 0.77 ms per 256 rows (3.1 ms of a 48 ms step at bs 64
on the H200), while a step with accept length ~3 has ~3 rows per request to move.

Ordering: within a request, depths are copied in increasing order by one program per
(request, buffer, byte tile). Path node ids grow with depth (parents precede children), so
node ``i_e >= e``: the read at depth ``e`` (slot of node ``i_e``) is never a slot written at an
earlier depth ``d < e`` (slot of node ``d < e <= i_e``). Requests own disjoint slots.

Layout assumptions, checked by the caller (``ddtree_kv_commit``): SGLang's
slot-major KV buffers (row ``slot`` of a buffer is ``row_bytes`` contiguous bytes), described by
the pool's ``data_ptrs`` (base address per buffer) and ``data_strides`` (bytes per row).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

TILE_BYTES = 2048


@triton.jit
def _move_accepted_kv_kernel(
    data_ptrs,  # [L] uint64: base address of each KV buffer
    row_bytes_ptr,  # [L] int64: bytes per slot row of each buffer
    keep_ptr,  # [bs, S] int64: global node ids of the accepted path, -1 past its end
    loc_ptr,  # [bs * W] int64: KV slot of each node
    S,
    N,
    TILE: tl.constexpr,
):
    b = tl.program_id(0)
    buf = tl.program_id(1)
    t = tl.program_id(2)
    row_bytes = tl.load(row_bytes_ptr + buf).to(tl.int64)
    base = tl.cast(tl.load(data_ptrs + buf), tl.pointer_type(tl.uint8))
    offs = t * TILE + tl.arange(0, TILE)
    in_row = offs < row_bytes
    for d in range(1, S):
        g = tl.load(keep_ptr + b * S + d)
        move = (g >= 0) & (g != b * N + d)
        src = tl.load(loc_ptr + tl.maximum(g, 0))
        dst = tl.load(loc_ptr + b * N + d)
        m = in_row & ((offs * 0 + move.to(tl.int32)) != 0)  # explicit broadcast (interpreter)
        vals = tl.load(base + src * row_bytes + offs, mask=m)
        tl.store(base + dst * row_bytes + offs, vals, mask=m)
        tl.debug_barrier()  # this depth's stores before the next depth's loads (see docstring)


def move_accepted_kv(
    data_ptrs: torch.Tensor,  # [L] uint64 (or int64): base address of each KV buffer
    row_bytes: torch.Tensor,  # [L] int: bytes per slot row of each buffer
    keep_index: torch.Tensor,  # [bs, S] int64: global node ids (b * W + i), -1 past the path
    verify_loc: torch.Tensor,  # [bs * W] int64: KV slot of each node = of position prefix + i
    num_nodes: int,  # W
    max_row_bytes: int,  # max(row_bytes), a host int (sizes the grid)
) -> None:
    """Copy each accepted node's KV row (every buffer) to the slot of its depth, in place."""
    assert keep_index.dim() == 2 and keep_index.dtype == torch.int64
    assert verify_loc.dtype == torch.int64 and verify_loc.numel() == keep_index.shape[0] * num_nodes
    assert data_ptrs.numel() == row_bytes.numel()
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # CPU tests run the interpreter
    assert keep_index.is_cuda or interpreted, "move_accepted_kv needs CUDA tensors"
    bs, s = keep_index.shape
    if bs == 0 or s <= 1:
        return
    grid = (bs, data_ptrs.numel(), triton.cdiv(int(max_row_bytes), TILE_BYTES))
    _move_accepted_kv_kernel[grid](
        data_ptrs,
        row_bytes.to(torch.int64) if row_bytes.dtype != torch.int64 else row_bytes,
        keep_index.contiguous(),
        verify_loc.contiguous(),
        s,
        num_nodes,
        TILE=TILE_BYTES,
    )


def move_accepted_kv_reference(
    buffers: list[torch.Tensor],  # each [slots, ...]: row `slot` is one token's KV
    keep_index: torch.Tensor,  # [bs, S] int64
    verify_loc: torch.Tensor,  # [bs * W] int64
    num_nodes: int,
) -> None:
    """Plain torch, one row at a time in depth order: what the kernel must equal (tests)."""
    bs, s = keep_index.shape
    for b in range(bs):
        for d in range(1, s):
            g = int(keep_index[b, d])
            if g < 0 or g == b * num_nodes + d:
                continue
            src, dst = int(verify_loc[g]), int(verify_loc[b * num_nodes + d])
            for buf in buffers:
                buf[dst] = buf[src]
