"""MLA's latent prefix on FlashMLA's pages as a Gluon kernel for Hopper (``prefix_gluon`` of
`core.tree_attention.prefix_attention_part`, the hook's choice where `gluon_prefix_runs`): the
Triton latent variant's loop with each key tile's TMA copy issued as soon as its buffer is
free. Tile i sits in buffer i % 2; waiting for tile i's scores also completes tile i - 1's value
product, the last reader of the other buffer, so tile i + 1's copy starts there and runs under
tile i's softmax and value product (Triton's pipeline issues it after the value product, and
the next iteration waits on it). Gluon's API moves between Triton releases: the TMA copy and the
CTA barrier are looked up under both names (3.6's ``async_copy_global_to_shared`` /
``thread_barrier``, later ``async_load`` / ``barrier``)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _next_tile(
    k_lat_desc, k_rope_desc, k_lat, k_rope, ready, table, slot_next, i, n_tiles, n0, hi,
    TILE_BYTES: gl.constexpr, DV: gl.constexpr, BLOCK_N: gl.constexpr, PAGE: gl.constexpr,
):  # fmt: skip
    """Tile i + 1's copy into the buffer tile i - 1 held (once both warpgroups are past their
    last read of it), and the slot of tile i + 2, read now so that copy need not wait on the
    block table: returned."""
    _thread_barrier()  # both warpgroups past the wait: no reader left of that buffer
    other = 1 - i % 2
    if i + 1 < n_tiles:
        mbarrier.expect(ready.index(other), TILE_BYTES)
        _tma_load(k_lat_desc, [slot_next, 0], ready.index(other), k_lat.index(other))
        _tma_load(k_rope_desc, [slot_next, DV], ready.index(other), k_rope.index(other))
    after = n0 + 2 * BLOCK_N
    page = gl.load(table + after // PAGE, mask=after < hi, other=0).to(gl.int32)
    return page * PAGE + after % PAGE


@gluon.jit
def _program_start(
    Q, KvIndptr, stride_qt, stride_qh,
    W: gl.constexpr, G: gl.constexpr, DV: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLITS: gl.constexpr,
    MIN_SHARE: gl.constexpr, WARPS: gl.constexpr,
):  # fmt: skip
    """A program's request ``b``, share ``split`` and first query row ``m0`` (from its grid
    position), its ``BLOCK_M`` query rows loaded once into shared memory, latent and rope
    columns apart (the score product's A operand, by ``WARPS`` warps), and its share's keys
    ``[lo, hi)``: ``(b, split, m0, q_lat, q_rope, lo, hi)``."""
    q_load: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
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
def _latent_prefix_gluon(
    Q, k_lat_desc, k_rope_desc, KvIndptr, Table, Out, Lse, sm_scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_lt, stride_os, stride_ls, stride_bt,
    W: gl.constexpr, G: gl.constexpr, DV: gl.constexpr, ROPE: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, SPLITS: gl.constexpr,
    MIN_SHARE: gl.constexpr, PAGE: gl.constexpr,
):  # fmt: skip
    # Layouts: two warpgroups split the N of both products (S: 64 x 64, O: 64 x DV).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, DV // 2, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    lat_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, DV], gl.bfloat16)
    rope_smem: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, ROPE], gl.bfloat16)
    b, split, m0, q_lat, q_rope, lo, hi = _program_start(
        Q, KvIndptr, stride_qt, stride_qh, W, G, DV, ROPE, BLOCK_M, BLOCK_N, SPLITS, MIN_SHARE,
        8,
    )  # fmt: skip
    n_tiles = gl.maximum(hi - lo + BLOCK_N - 1, 0) // BLOCK_N

    # Two key buffers, each with its barrier: tile i in buffer i % 2.
    k_lat = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, DV], lat_smem)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, ROPE], rope_smem)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(ready.index(0), count=1)
    mbarrier.init(ready.index(1), count=1)
    hopper.fence_async_shared()
    tile_bytes: gl.constexpr = BLOCK_N * (DV + ROPE) * 2
    table = Table + b * stride_bt
    if n_tiles > 0:
        slot = gl.load(table + lo // PAGE).to(gl.int32) * PAGE + lo % PAGE
        mbarrier.expect(ready.index(0), tile_bytes)
        _tma_load(k_lat_desc, [slot, 0], ready.index(0), k_lat.index(0))
        _tma_load(k_rope_desc, [slot, DV], ready.index(0), k_rope.index(0))

    nxt = lo + BLOCK_N
    slot_next = (
        gl.load(table + nxt // PAGE, mask=nxt < hi, other=0).to(gl.int32) * PAGE + nxt % PAGE
    )
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = hopper.warpgroup_mma_init(gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    qk_scale = sm_scale * 1.4426950408889634
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for i in range(n_tiles):
        buf = i % 2
        n0 = lo + i * BLOCK_N
        mbarrier.wait(ready.index(buf), (i // 2) & 1)
        s = hopper.warpgroup_mma(
            q_lat, k_lat.index(buf).permute((1, 0)), s_zero, use_acc=False, is_async=True
        )
        s = hopper.warpgroup_mma(q_rope, k_rope.index(buf).permute((1, 0)), s, is_async=True)
        # Waiting for the scores also completes the previous tile's value product, which
        # frees the other buffer: the next tile's copy starts now, under this tile's softmax
        # and value product. (Issuing it before the scores, two copies in flight, measured
        # within -3 to +7 % of this, mixed in sign: not kept.)
        s, acc = hopper.warpgroup_mma_wait(0, deps=[s, acc])
        slot_next = _next_tile(
            k_lat_desc, k_rope_desc, k_lat, k_rope, ready, table, slot_next, i, n_tiles,
            n0, hi, tile_bytes, DV, BLOCK_N, PAGE,
        )  # fmt: skip
        s = gl.where((n0 + keys < hi)[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
        acc = hopper.warpgroup_mma(p_op, k_lat.index(buf), acc, is_async=True)
    acc = hopper.warpgroup_mma_wait(0, deps=[acc])

    has = l_i > 0
    lse = gl.where(
        has, (m_i + gl.log2(gl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf")
    )
    rows_s = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    written = (rows_s < W * G) & (rows_s * 0 + lo < hi)
    gl.store(
        Lse + split * stride_ls + (b * W + rows_s // G) * stride_lt + rows_s % G, lse, mask=written
    )
    out = acc / gl.convert_layout(gl.where(has, l_i, 1.0), gl.SliceLayout(1, o_layout))[:, None]
    rows_o = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    cols_o = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
    o_ok = (rows_o < W * G) & (rows_o * 0 + lo < hi)
    o_rows = Out + split * stride_os + (b * W + rows_o // G) * stride_ot + rows_o % G * stride_oh
    gl.store(o_rows[:, None] + cols_o[None, :], out, mask=o_ok[:, None])


def cache_descriptors(k_buffer, dv: int, block_n: int, lat_cols: int | None = None) -> tuple:
    """Two TMA descriptors of the ``[slots, 1, D]`` latent cache as a ``[slots, D]`` matrix of
    its row stride: ``[block_n, lat_cols]`` blocks of the latent columns (``lat_cols``: all
    ``dv`` by default) and ``[block_n, D - dv]`` blocks of the rope columns (from column
    ``dv``), bfloat16, each with Gluon's default swizzled shared layout for that block. Built
    on the host from the buffer's address and strides: the same at every call on a fixed pool,
    so a captured graph replays them."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    slots, _, d = k_buffer.shape
    cache = k_buffer[:, 0]  # [slots, D], row stride k_buffer.stride(0)
    descs = []
    for cols in (lat_cols or dv, d - dv):
        layout = gl.NVMMASharedLayout.get_default_for([block_n, cols], gl.bfloat16)
        descs.append(
            TensorDescriptor(cache, [slots, d], [cache.stride(0), 1], [block_n, cols], layout)
        )
    return tuple(descs)


def launch_latent_prefix(
    kernel, k_buffer, descs, grid, q, kv_indptr, table, o1, lse1, sm_scale, w, g, block_m,
    block_n, splits, page_size, min_share, **options,
) -> None:  # fmt: skip
    """``kernel[grid]`` (this file's kernel's signature) over ``descs``, `cache_descriptors` of
    ``k_buffer``, with ``o1`` / ``lse1`` as `prefix_attention_part` allocates them;
    ``options``: the launch's warps and register bound."""
    kernel[grid](
        q, *descs, kv_indptr, table, o1, lse1, sm_scale,
        q.stride(0), q.stride(1), o1.stride(1), o1.stride(2), lse1.stride(1), o1.stride(0),
        lse1.stride(0), table.stride(0),
        W=w, G=g, DV=o1.shape[-1], ROPE=k_buffer.shape[-1] - o1.shape[-1], BLOCK_M=block_m,
        BLOCK_N=block_n, SPLITS=splits, MIN_SHARE=min_share, PAGE=page_size, **options,
    )  # fmt: skip


def latent_prefix_gluon(
    grid, q, k_buffer, kv_indptr, table, o1, lse1, sm_scale, w, g, block_m, block_n, splits,
    page_size, min_share,
) -> None:  # fmt: skip
    """The kernel's launch (``o1`` / ``lse1`` as `prefix_attention_part` allocates them) over
    `cache_descriptors`."""
    launch_latent_prefix(
        _latent_prefix_gluon, k_buffer, cache_descriptors(k_buffer, o1.shape[-1], block_n), grid,
        q, kv_indptr, table, o1, lse1, sm_scale, w, g, block_m, block_n, splits, page_size,
        min_share, num_warps=8,
    )  # fmt: skip
