"""MLA's latent prefix on FlashMLA's pages as a warp-specialized Gluon kernel for Hopper
(``prefix_gluon`` of `core.tree_attention.prefix_attention_part`, the hook's choice where
`gluon_prefix_runs`): the two warpgroups of a 64-row tile take the key tiles in turns, so one's
softmax runs under the other's matrix products (FlashMLA's schedule for its decode kernel).

Terms: a **pair** is two consecutive 64-key tiles of a share, the first in buffer 0 (its score
product by warpgroup 0), the second in buffer 1 (by warpgroup 1; past the share's keys it is
read from the request's first page and masked). Each warpgroup holds half of the value columns
(``DV / 2``) of the output accumulator, so both take both tiles' value products. Per pair:

1. warpgroup 0: scores of tile 0, the running max ``m0``, ``P0 = exp2(S0 - m0)``; ``P0`` into
   shared memory over tile 0's rope keys (its score product has read them), ``m0`` beside it;
   its half ``+= P0 V0`` with ``P0`` from registers.
2. warpgroup 1 (its scores of tile 1 computed meanwhile): its half ``+= P0 V0`` (``P0`` from
   shared memory, at scale ``m0``) issued, and under it ``m1 = max(m0, rowmax S1)``,
   ``P1 = exp2(S1 - m1)`` into shared memory; its half rescaled to ``m1``, ``+= P1 V1``.
3. warpgroup 0: its half rescaled to ``m1``, ``+= P1 V1`` (``P1`` from shared memory).

Each warpgroup keeps the sum of its own tiles' ``P`` at the same running max; the two are added at
the end. A key tile arrives in two copies of ``DV / 2`` latent columns, each with its mbarrier, the
rope columns with the second, so the score product starts on the first half while the second arrives
(copies of FlashMLA's 64 columns, each with its barrier, were no faster). Each half of a tile (left:
latent columns ``[0, DV / 2)``; right: the rest and the rope) is refilled with the tile two ahead by
the warpgroup that reads it last, as soon as its value product is done (warpgroup 0 the left halves,
warpgroup 1 the right halves and the rope, where ``P0`` sat); ``P1`` has its own buffer, since
warpgroup 0 reads it after warpgroup 1 is done with its tile. Warpgroup 1 reads its own ``P1`` from
shared memory too (from registers, the converted copy spilled more); warpgroup 0 its ``P0`` from
registers, since warpgroup 1 refills the buffer that holds it without waiting for warpgroup 0.
Rounding: ``P`` in bfloat16 relative to the running max of its tile, float32 accumulators and sums,
the output float32 for the merge.

Gluon's API moves between Triton releases: the TMA copy and the CTA barrier are looked up under
both names (3.6's ``async_copy_global_to_shared`` / ``thread_barrier``, later ``async_load`` /
``barrier``)."""

from __future__ import annotations

import inspect

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
if next(iter(inspect.signature(gl.warp_specialize).parameters)) != "functions_and_args":
    raise ImportError("the Gluon prefix kernel needs warp_specialize over (function, args) pairs")

# mbarriers of one program, by index (a key tile's two halves have theirs in ``ready``:
# ``2 * buffer + half``).
P0_READY = gl.constexpr(0)
P1_READY = gl.constexpr(1)
SUM0_READY = gl.constexpr(2)
SUM1_READY = gl.constexpr(3)
# Registers a thread of warpgroup 1 (its half of the accumulator is 128 of them); warpgroup 0
# gets what the kernel's ``maxnreg`` leaves.
WARPGROUP1_REGS = gl.constexpr(256)


@gluon.jit
def _program_start(
    Q, KvIndptr, stride_qt, stride_qh,
    W: gl.constexpr, G: gl.constexpr, DV: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLITS: gl.constexpr,
    MIN_SHARE: gl.constexpr,
):  # fmt: skip
    """A program's request ``b``, share ``split`` and first query row ``m0`` (from its grid
    position), its ``BLOCK_M`` query rows loaded once into shared memory, latent and rope
    columns apart (the score products' A operands, by four warps), and its share's keys
    ``[lo, hi)``: ``(b, split, m0, q_lat, q_rope, lo, hi)``."""
    q_load: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    lat_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DV], gl.bfloat16)
    rope_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, ROPE], gl.bfloat16)

    b = gl.program_id(0)
    tiles: gl.constexpr = (W * G + BLOCK_M - 1) // BLOCK_M
    split = gl.program_id(2) // tiles
    m0 = gl.program_id(2) % tiles * BLOCK_M

    rows_q = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_load))
    q_ptrs = Q + (b * W + rows_q // G)[:, None] * stride_qt + (rows_q % G)[:, None] * stride_qh
    q_ok = (rows_q < W * G)[:, None]
    cols_lat = gl.arange(0, DV, layout=gl.SliceLayout(0, q_load))
    cols_rope = DV + gl.arange(0, ROPE, layout=gl.SliceLayout(0, q_load))
    q_rows = gl.load(q_ptrs + cols_lat[None, :], mask=q_ok, other=0.0)
    q_lat = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, DV], lat_smem, q_rows)
    q_rows = gl.load(q_ptrs + cols_rope[None, :], mask=q_ok, other=0.0)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, ROPE], rope_smem, q_rows)

    # 32-bit key positions (TMA coordinates are 32-bit; the indptr may be int64).
    length = (gl.load(KvIndptr + b + 1) - gl.load(KvIndptr + b)).to(gl.int32)
    share = gl.maximum((length + SPLITS - 1) // SPLITS, MIN_SHARE)
    share = (share + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    lo = split * share
    hi = gl.minimum(lo + share, length)
    return b, split, m0, q_lat, q_rope, lo, hi


@gluon.jit
def _load_half(
    half_desc, rope_desc, k_lat, k_rope, ready, table, pos, hi,
    BUF: gl.constexpr, RIGHT: gl.constexpr, DV: gl.constexpr, BLOCK_N: gl.constexpr,
    ROPE: gl.constexpr, PAGE: gl.constexpr,
):  # fmt: skip
    """The TMA copy of one half of the 64-key tile at key position ``pos`` into buffer
    ``BUF``, with its mbarrier ``ready[2 * BUF + RIGHT]``: the left latent half, or
    (``RIGHT``) the right one and the rope columns. A position past the share's keys reads the
    request's first page, whose keys are finite: its scores are masked and its values meet zero
    weights."""
    HALF: gl.constexpr = DV // 2
    pos = gl.where(pos < hi, pos, 0)
    slot = gl.load(table + pos // PAGE).to(gl.int32) * PAGE + pos % PAGE
    bar = ready.index(2 * BUF + RIGHT)
    if RIGHT:
        mbarrier.expect(bar, BLOCK_N * (HALF + ROPE) * 2)
        _tma_load(rope_desc, [slot, DV], bar, k_rope.index(BUF))
    else:
        mbarrier.expect(bar, BLOCK_N * HALF * 2)
    _tma_load(
        half_desc, [slot, RIGHT * HALF], bar, k_lat.index(BUF).slice(RIGHT * HALF, HALF, dim=1)
    )


@gluon.jit
def _scores(q_lat, q_rope, k_lat, k_rope, ready, n0, hi, qk_scale, phase, BUF: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DV: gl.constexpr,
            s_layout: gl.constexpr):  # fmt: skip
    """``[BLOCK_M, BLOCK_N]`` base-2 scores of the tile in buffer ``BUF`` (first key ``n0``),
    keys at or past ``hi`` at -inf: each half's product issued as soon as the half has
    arrived, the rope's with the second."""
    HALF: gl.constexpr = DV // 2
    keys = k_lat.index(BUF)
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    for c in gl.static_range(2):
        mbarrier.wait(ready.index(2 * BUF + c), phase)
        s = hopper.warpgroup_mma(
            q_lat.slice(c * HALF, HALF, dim=1),
            keys.slice(c * HALF, HALF, dim=1).permute((1, 0)),
            s,
            use_acc=c > 0,
            is_async=True,
        )
    s = hopper.warpgroup_mma(q_rope, k_rope.index(BUF).permute((1, 0)), s, is_async=True)
    s = hopper.warpgroup_mma_wait(0, deps=[s])
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    return gl.where((n0 + cols < hi)[None, :], s * qk_scale, float("-inf"))


@gluon.jit
def _publish(p_buf, m_buf, p16, m, bar):
    """``P`` and the running max it is relative to into shared memory, then the mbarrier."""
    p_buf.store(p16)
    m_buf.store(m)
    hopper.fence_async_shared()  # each thread's writes, before the matrix products read P
    _thread_barrier()  # every warp of this warpgroup has written and fenced
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _epilogue(
    acc, m, l_sum, s_sum, bars, Out, Lse, b, split, m0_row, lo, hi,
    stride_ot, stride_oh, stride_lt, stride_os, stride_ls,
    MINE: gl.constexpr, W: gl.constexpr, G: gl.constexpr, HALF: gl.constexpr,
    BLOCK_M: gl.constexpr, WRITE_LSE: gl.constexpr, s_layout: gl.constexpr,
    o_layout: gl.constexpr,
):  # fmt: skip
    """Both warpgroups' sums added, this half of the output divided by it and stored (float32,
    as `prefix_attention_part` allocates it), the log-sum-exp by warpgroup 0."""
    s_sum.index(MINE).store(l_sum)
    _thread_barrier()
    mbarrier.arrive(bars.index(SUM0_READY + MINE), count=1)
    mbarrier.wait(bars.index(SUM1_READY - MINE), 0)
    l_sum = l_sum + s_sum.index(1 - MINE).load(gl.SliceLayout(1, s_layout))
    has = l_sum > 0
    rows_s = m0_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    if WRITE_LSE:
        lse = gl.where(
            has, (m + gl.log2(gl.where(has, l_sum, 1.0))) * 0.6931471805599453, float("-inf")
        )
        written = (rows_s < W * G) & (rows_s * 0 + lo < hi)
        gl.store(
            Lse + split * stride_ls + (b * W + rows_s // G) * stride_lt + rows_s % G,
            lse,
            mask=written,
        )
    den = gl.convert_layout(gl.where(has, l_sum, 1.0), gl.SliceLayout(1, o_layout))
    out = acc / den[:, None]
    rows_o = m0_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    cols_o = MINE * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(0, o_layout))
    o_ok = (rows_o < W * G) & (rows_o * 0 + lo < hi)
    o_rows = Out + split * stride_os + (b * W + rows_o // G) * stride_ot + rows_o % G * stride_oh
    gl.store(o_rows[:, None] + cols_o[None, :], out, mask=o_ok[:, None])


@gluon.jit
def _warpgroup0(
    q_lat, q_rope, k_lat, k_rope, p1_buf, ready, bars, s_max, s_sum, half_desc, rope_desc,
    table, lo, hi, n_pairs, qk_scale, Out, Lse, b, split, m0_row,
    stride_ot, stride_oh, stride_lt, stride_os, stride_ls,
    W: gl.constexpr, G: gl.constexpr, DV: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PAGE: gl.constexpr,
    s_layout: gl.constexpr, o_layout: gl.constexpr,
):  # fmt: skip
    HALF: gl.constexpr = DV // 2
    # P0 from registers: warpgroup 1 refills its buffer once its own value product is done.
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_sum = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, layout=o_layout)
    for k in range(n_pairs):
        phase = k & 1
        n0 = lo + 2 * k * BLOCK_N
        s = _scores(
            q_lat, q_rope, k_lat, k_rope, ready, n0, hi, qk_scale, phase, 0, BLOCK_M, BLOCK_N,
            DV, s_layout,
        )  # fmt: skip
        m0 = gl.maximum(m, gl.max(s, axis=1))
        p = gl.exp2(s - m0[:, None])
        alpha0 = gl.exp2(m - m0)
        l_sum = l_sum * alpha0 + gl.sum(p, axis=1)
        p16 = p.to(gl.bfloat16)
        # P0 over tile 0's rope keys, which its score product has read.
        _publish(k_rope.index(0), s_max.index(0), p16, m0, bars.index(P0_READY))
        acc = acc * gl.convert_layout(alpha0, rows_o)[:, None]
        acc = hopper.warpgroup_mma(
            gl.convert_layout(p16, p_layout), k_lat.index(0).slice(0, HALF, dim=1), acc,
            is_async=True,
        )  # fmt: skip
        acc = hopper.warpgroup_mma_wait(0, deps=[acc])
        # Tile 0's left half is read (its scores and this value product): the tile two ahead,
        # issued before waiting for warpgroup 1's P1.
        if k + 1 < n_pairs:
            _load_half(
                half_desc, rope_desc, k_lat, k_rope, ready, table, n0 + 2 * BLOCK_N, hi,
                0, 0, DV, BLOCK_N, ROPE, PAGE,
            )  # fmt: skip
        mbarrier.wait(bars.index(P1_READY), phase)
        m1 = s_max.index(1).load(gl.SliceLayout(1, s_layout))
        alpha1 = gl.exp2(m0 - m1)
        acc = acc * gl.convert_layout(alpha1, rows_o)[:, None]
        l_sum = l_sum * alpha1
        acc = hopper.warpgroup_mma(p1_buf, k_lat.index(1).slice(0, HALF, dim=1), acc, is_async=True)
        acc = hopper.warpgroup_mma_wait(0, deps=[acc])
        # Tile 1's left half is read (warpgroup 1's scores came before P1): the tile two ahead.
        if k + 1 < n_pairs:
            _load_half(
                half_desc, rope_desc, k_lat, k_rope, ready, table, n0 + 3 * BLOCK_N, hi,
                1, 0, DV, BLOCK_N, ROPE, PAGE,
            )  # fmt: skip
        m = m1
    _epilogue(
        acc, m, l_sum, s_sum, bars, Out, Lse, b, split, m0_row, lo, hi,
        stride_ot, stride_oh, stride_lt, stride_os, stride_ls,
        0, W, G, HALF, BLOCK_M, True, s_layout, o_layout,
    )  # fmt: skip


@gluon.jit
def _warpgroup1(
    q_lat, q_rope, k_lat, k_rope, p1_buf, ready, bars, s_max, s_sum, half_desc, rope_desc,
    table, lo, hi, n_pairs, qk_scale, Out, Lse, b, split, m0_row,
    stride_ot, stride_oh, stride_lt, stride_os, stride_ls,
    W: gl.constexpr, G: gl.constexpr, DV: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, PAGE: gl.constexpr,
    s_layout: gl.constexpr, o_layout: gl.constexpr,
):  # fmt: skip
    HALF: gl.constexpr = DV // 2
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_prev = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_sum = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, HALF], gl.float32, layout=o_layout)
    for k in range(n_pairs):
        phase = k & 1
        n1 = lo + (2 * k + 1) * BLOCK_N
        s = _scores(
            q_lat, q_rope, k_lat, k_rope, ready, n1, hi, qk_scale, phase, 1, BLOCK_M, BLOCK_N,
            DV, s_layout,
        )  # fmt: skip
        mbarrier.wait(bars.index(P0_READY), phase)
        m0 = s_max.index(0).load(gl.SliceLayout(1, s_layout))
        # The value product of P0 runs under this tile's softmax.
        acc = acc * gl.convert_layout(gl.exp2(m_prev - m0), rows_o)[:, None]
        acc = hopper.warpgroup_mma(
            k_rope.index(0), k_lat.index(0).slice(HALF, HALF, dim=1), acc, is_async=True
        )
        m1 = gl.maximum(m0, gl.max(s, axis=1))
        p = gl.exp2(s - m1[:, None])
        l_sum = l_sum * gl.exp2(m_prev - m1) + gl.sum(p, axis=1)
        p16 = p.to(gl.bfloat16)
        _publish(p1_buf, s_max.index(1), p16, m1, bars.index(P1_READY))
        acc = hopper.warpgroup_mma_wait(0, deps=[acc])
        # Tile 0's right half and rope (P0) are read: the tile two ahead.
        if k + 1 < n_pairs:
            _load_half(
                half_desc, rope_desc, k_lat, k_rope, ready, table, n1 + BLOCK_N, hi,
                0, 1, DV, BLOCK_N, ROPE, PAGE,
            )  # fmt: skip
        acc = acc * gl.convert_layout(gl.exp2(m0 - m1), rows_o)[:, None]
        acc = hopper.warpgroup_mma(
            p1_buf, k_lat.index(1).slice(HALF, HALF, dim=1), acc,
            is_async=True,
        )  # fmt: skip
        acc = hopper.warpgroup_mma_wait(0, deps=[acc])
        # Tile 1's right half and rope are read: the tile two ahead.
        if k + 1 < n_pairs:
            _load_half(
                half_desc, rope_desc, k_lat, k_rope, ready, table, n1 + 2 * BLOCK_N, hi,
                1, 1, DV, BLOCK_N, ROPE, PAGE,
            )  # fmt: skip
        m_prev = m1
    _epilogue(
        acc, m_prev, l_sum, s_sum, bars, Out, Lse, b, split, m0_row, lo, hi,
        stride_ot, stride_oh, stride_lt, stride_os, stride_ls,
        1, W, G, HALF, BLOCK_M, False, s_layout, o_layout,
    )  # fmt: skip


@gluon.jit
def _latent_prefix_gluon(
    Q, half_desc, rope_desc, KvIndptr, Table, Out, Lse, sm_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_os, stride_ls, stride_bt,
    W: gl.constexpr, G: gl.constexpr, DV: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLITS: gl.constexpr,
    MIN_SHARE: gl.constexpr, PAGE: gl.constexpr,
):  # fmt: skip
    # Each warpgroup's layouts: the scores of a whole tile, half of the value columns.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DV // 2, 16]
    )
    lat_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DV], gl.bfloat16)
    rope_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, ROPE], gl.bfloat16)
    b, split, m0_row, q_lat, q_rope, lo, hi = _program_start(
        Q, KvIndptr, stride_qt, stride_qh, W, G, DV, ROPE, BLOCK_M, BLOCK_N, SPLITS, MIN_SHARE
    )
    n_tiles = gl.maximum(hi - lo + BLOCK_N - 1, 0) // BLOCK_N
    n_pairs = (n_tiles + 1) // 2

    k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, DV], lat_smem)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, ROPE], rope_smem)
    p_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.bfloat16)
    p1_buf = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_N], p_smem)
    s_max = gl.allocate_shared_memory(
        gl.float32, [2, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    )
    s_sum = gl.allocate_shared_memory(
        gl.float32, [2, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    )
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(4):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(4):
        mbarrier.init(bars.index(i), count=1)
    hopper.fence_async_shared()
    table = Table + b * stride_bt
    if n_pairs > 0:  # the first pair, both halves of both tiles
        for buf in gl.static_range(2):
            for right in gl.static_range(2):
                _load_half(
                    half_desc, rope_desc, k_lat, k_rope, ready, table, lo + buf * BLOCK_N, hi,
                    buf, right, DV, BLOCK_N, ROPE, PAGE,
                )  # fmt: skip
    qk_scale = sm_scale * 1.4426950408889634
    # The argument tuples are written out in the call: a tuple built first would turn the
    # constexprs into tensors.
    gl.warp_specialize(
        [
            (_warpgroup0, (
                q_lat, q_rope, k_lat, k_rope, p1_buf, ready, bars, s_max, s_sum, half_desc,
                rope_desc, table, lo, hi, n_pairs, qk_scale, Out, Lse, b, split, m0_row,
                stride_ot, stride_oh, stride_lt, stride_os, stride_ls,
                W, G, DV, ROPE, BLOCK_M, BLOCK_N, PAGE, s_layout, o_layout,
            )),
            (_warpgroup1, (
                q_lat, q_rope, k_lat, k_rope, p1_buf, ready, bars, s_max, s_sum, half_desc,
                rope_desc, table, lo, hi, n_pairs, qk_scale, Out, Lse, b, split, m0_row,
                stride_ot, stride_oh, stride_lt, stride_os, stride_ls,
                W, G, DV, ROPE, BLOCK_M, BLOCK_N, PAGE, s_layout, o_layout,
            )),
        ],
        [4],
        [WARPGROUP1_REGS],
    )  # fmt: skip


def cache_descriptors(k_buffer, dv: int, block_n: int) -> tuple:
    """Two TMA descriptors of the ``[slots, 1, D]`` latent cache as a ``[slots, D]`` matrix of
    its row stride: ``[block_n, dv / 2]`` blocks of the latent columns (a key tile's half) and
    ``[block_n, D - dv]`` blocks of the rope columns (from column ``dv``), bfloat16, each with
    Gluon's default swizzled shared layout for that block. Built on the host from the buffer's
    address and strides: the same at every call on a fixed pool, so a captured graph replays
    them."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    slots, _, d = k_buffer.shape
    cache = k_buffer[:, 0]  # [slots, D], row stride k_buffer.stride(0)
    descs = []
    for cols in (dv // 2, d - dv):
        layout = gl.NVMMASharedLayout.get_default_for([block_n, cols], gl.bfloat16)
        descs.append(
            TensorDescriptor(cache, [slots, d], [cache.stride(0), 1], [block_n, cols], layout)
        )
    return tuple(descs)


def latent_prefix_gluon(
    grid, q, k_buffer, kv_indptr, table, o1, lse1, sm_scale, w, g, block_m, block_n, splits,
    page_size, min_share,
) -> None:  # fmt: skip
    """The kernel's launch (``o1`` / ``lse1`` as `prefix_attention_part` allocates them) over
    `cache_descriptors`: four warps a program, plus warpgroup 1's."""
    dv = o1.shape[-1]
    _latent_prefix_gluon[grid](
        q, *cache_descriptors(k_buffer, dv, block_n), kv_indptr, table, o1, lse1, sm_scale,
        q.stride(0), q.stride(1), o1.stride(1), o1.stride(2), lse1.stride(1), o1.stride(0),
        lse1.stride(0), table.stride(0),
        W=w, G=g, DV=dv, ROPE=k_buffer.shape[-1] - dv, BLOCK_M=block_m, BLOCK_N=block_n,
        SPLITS=splits, MIN_SHARE=min_share, PAGE=page_size, num_warps=4,
        maxnreg=WARPGROUP1_REGS.value,
    )  # fmt: skip
