"""Tree-verify attention in two parts merged by log-sum-exp.

Terms: ``bs`` requests, ``W`` tree nodes each (node 0 the root), ``Hq`` query heads over ``Hkv``
KV heads (``G = Hq / Hkv`` queries share a KV head), key width ``D``, value width ``Dv``. The KV
cache is slot-addressed (page size 1): request ``b``'s cached prefix is the slots
``kv_indices[kv_indptr[b] : kv_indptr[b + 1]]``, its nodes' KV (written by this verify) the
slots ``node_loc[b * W : (b + 1) * W]``. Node ``i`` attends the whole prefix and the nodes ``j``
with ``tree_mask[b, i, j]`` (its ancestors and itself).

A custom-mask extend kernel reads the prefix once per query row and masks every cell. Here:

- the prefix part (``_prefix_attention_kernel``): all ``W x G`` query rows of a request and KV
  head against the prefix, with no mask, so each prefix tile is read once for all of them (a
  multi-query decode); on a small batch the prefix is shared by ``prefix_splits`` programs
  (consecutive shares of key tiles, each with its own output and log-sum-exp), as split-K
  decoding kernels do, so that no program walks a long prefix alone;
- the tree part (``_tree_attention_kernel``): ``TREE_ROWS`` query nodes a program against the
  request's ``W`` nodes under the ancestor mask, and in its epilogue the merge
  ``o = sum_i o_i e^{l_i} / sum_i e^{l_i}`` over the tree part and the prefix shares, ``l`` each
  part's log-sum-exp (natural log) of its scaled scores (``merge_attention_states`` is its
  torch twin for two parts). The prefix shares stay float32 until the merge. Two launches per
  layer (a merge in torch kernels cost more than the split saved; its own kernel, a launch).
  Row tiles keep the epilogue small (65 rows in one program spilled) and feed small batches.

``tree_attention_reference`` is the plain-torch twin over the same inputs. The target verify
runs ``tree_attention`` through the split verify backends of ``srt/ddtree_attention/`` (triton's
and flashmla's).
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU machines without triton: the reference still works
    triton = None


def tree_attention_reference(
    q: torch.Tensor,  # [bs * W, Hq, D]
    k_buffer: torch.Tensor,  # [slots, Hkv, D]
    v_buffer: torch.Tensor,  # [slots, Hkv, Dv]
    kv_indptr: torch.Tensor,  # [bs + 1] int, prefix offsets into kv_indices
    kv_indices: torch.Tensor,  # [sum(prefix)] int, prefix KV slots
    node_loc: torch.Tensor,  # [bs * W] int, the nodes' KV slots
    tree_mask: torch.Tensor,  # [bs, W, W] bool, ancestor-or-self
    sm_scale: float,
) -> torch.Tensor:
    """[bs * W, Hq, Dv] in q's dtype: softmax over [prefix ; allowed nodes], float32 math."""
    bs, w, _ = tree_mask.shape
    hq, hkv = q.shape[1], k_buffer.shape[1]
    out = torch.empty(q.shape[0], hq, v_buffer.shape[-1], dtype=q.dtype, device=q.device)
    heads = torch.arange(hq, device=q.device) // (hq // hkv)
    for b in range(bs):
        pre = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        slots = torch.cat([pre, node_loc[b * w : (b + 1) * w].long()])
        k = k_buffer[slots][:, heads].float()  # [P + W, Hq, D]
        v = v_buffer[slots][:, heads].float()
        qb = q[b * w : (b + 1) * w].float()  # [W, Hq, D]
        scores = torch.einsum("ihd,jhd->hij", qb, k) * sm_scale  # [Hq, W, P + W]
        allowed = torch.cat(
            [torch.ones(w, len(pre), dtype=torch.bool, device=q.device), tree_mask[b]], dim=1
        )
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[b * w : (b + 1) * w] = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).to(q.dtype)
    return out


def merge_attention_states(
    o1: torch.Tensor,  # [N, H, Dv] normalized output of part 1
    lse1: torch.Tensor,  # [N, H] float32, its log-sum-exp; -inf where it saw no key
    o2: torch.Tensor,  # [N, H, Dv]
    lse2: torch.Tensor,  # [N, H] float32, finite
) -> torch.Tensor:
    """The attention output over both parts' keys, [N, H, Dv] in o2's dtype."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m), torch.exp(lse2 - m)
    out = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]
    return out.to(o2.dtype)


if triton is not None:

    @triton.jit
    def _share_keys(length, SPLITS: tl.constexpr, MIN_SHARE: tl.constexpr, BLOCK_N: tl.constexpr):
        """Keys a share of a ``length``-key prefix walks: SPLITS consecutive shares of whole
        BLOCK_N tiles, each at least MIN_SHARE keys (on a short prefix the last ones are empty)."""
        share = tl.maximum((length + SPLITS - 1) // SPLITS, MIN_SHARE)
        return (share + BLOCK_N - 1) // BLOCK_N * BLOCK_N

    @triton.jit
    def _share_range(
        length, split, SPLITS: tl.constexpr, MIN_SHARE: tl.constexpr, BLOCK_N: tl.constexpr
    ):
        """Keys ``[lo, hi)`` of a ``length``-key prefix that share ``split`` walks (an empty
        share, ``lo >= hi``, writes nothing: the merge skips it)."""
        share = _share_keys(length, SPLITS, MIN_SHARE, BLOCK_N)
        return split * share, tl.minimum(split * share + share, length)

    @triton.jit
    def _latent_and_rope(rows, ok, offs_lat, offs_rope, D: tl.constexpr):
        """An MLA row tile's latent [R, DV] and rope [R, BLOCK_ROPE] columns (zero past D)."""
        lat = tl.load(rows + offs_lat[None, :], mask=ok[:, None], other=0.0)
        rope_ok = ok[:, None] & (offs_rope < D)[None, :]
        return lat, tl.load(rows + offs_rope[None, :], mask=rope_ok, other=0.0)

    @triton.jit
    def _softmax_tile(s, n_ok, qk_scale, m_i, l_i, acc, v):
        """One key tile of the online softmax: the scores ``s`` [M, N] of the keys ``n_ok``
        scaled into base 2 (``qk_scale`` holds log2 e: exp2 is the hardware's exp), the
        accumulator rescaled and the tile's values ``v`` [N, DV] added. ``(acc, l_i, m_i)``."""
        s = tl.where(n_ok[None, :], s * qk_scale, float("-inf"))  # [M, N]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None])
        return acc, l_i * alpha + tl.sum(p, 1), m_new

    @triton.jit
    def _normalized(acc, l_i, m_i):
        """``(out, lse)``: a share's normalized output and its log-sum-exp in natural log
        (zero and -inf where no key was seen)."""
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse2 = m_i + tl.log2(tl.where(has, l_i, 1.0))
        return out, tl.where(has, lse2 * 0.6931471805599453, float("-inf"))  # natural: ln 2

    @triton.jit
    def _prefix_attention_kernel(
        Q, K, V, KvIndptr, KvIndices, Out, Lse,
        sm_scale,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_ot, stride_oh, stride_lt, stride_os, stride_ls, stride_bt,
        W: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_DK: tl.constexpr, D_TILES: tl.constexpr, BLOCK_DV: tl.constexpr,
        DV_TILES: tl.constexpr, SPLITS: tl.constexpr, MIN_SHARE: tl.constexpr,
        PAGE: tl.constexpr, LATENT: tl.constexpr, BLOCK_ROPE: tl.constexpr,
        INDEX_AHEAD: tl.constexpr, Q_ONCE: tl.constexpr,
    ):  # fmt: skip
        # PAGE = 0: KvIndices holds every prefix key's slot, request b's from KvIndptr[b].
        # PAGE > 0: KvIndices is a block table [bs, pages] (row stride stride_bt) of
        # PAGE-slot pages: key n of request b at slot table[b, n // PAGE] * PAGE + n % PAGE.
        # INDEX_AHEAD: a key tile's slots (PAGE = 0) or page (PAGE a multiple of BLOCK_N: one
        # scalar) read a tile early, so its copy need not wait on the table (Triton 3.6's
        # pipeline; read two tiles early by hand, Triton dropped the asynchronous copies).
        # LATENT (MLA): the values are the keys' first DV columns (V a view of K, DV a power of
        # two) and the remaining D - DV <= BLOCK_ROPE are the rope part; the queries are loaded
        # once, before the key loop, and a key tile serves both products (with value tiles,
        # DV_TILES > 1, the tile's own value columns are read again, from cache).
        # Q_ONCE (MHA, the key width in one tile, D_TILES = 1): the queries are loaded once,
        # before the key loop, as for LATENT, instead of once a key tile.
        b = tl.program_id(0)
        hkv = tl.program_id(1)
        # The share is the slowest index of the grid: every request's first share is dispatched
        # before any second one, so on a short prefix the empty shares, dispatched last, exit
        # while the first ones run.
        tiles: tl.constexpr = (W * G + BLOCK_M - 1) // BLOCK_M * DV_TILES
        split = tl.program_id(2) // tiles  # this program's share of the prefix
        m_tile = tl.program_id(2) % tiles // DV_TILES
        dv_tile = tl.program_id(2) % DV_TILES
        rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # node * G + head in group
        row_ok = rows < W * G
        token = b * W + rows // G
        head = hkv * G + rows % G
        offs_dk = tl.arange(0, BLOCK_DK)
        offs_dv = dv_tile * BLOCK_DV + tl.arange(0, BLOCK_DV)
        q_rows = Q + token[:, None] * stride_qt + head[:, None] * stride_qh
        start = tl.load(KvIndptr + b)
        length = tl.load(KvIndptr + b + 1) - start
        lo, hi = _share_range(length, split, SPLITS, MIN_SHARE, BLOCK_N)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        qk_scale = sm_scale * 1.4426950408889634  # log2 e
        if LATENT:
            offs_lat = tl.arange(0, DV)
            offs_rope = DV + tl.arange(0, BLOCK_ROPE)
            q_lat, q_rope = _latent_and_rope(q_rows, row_ok, offs_lat, offs_rope, D)
        if Q_ONCE:
            q_all = tl.load(
                q_rows + offs_dk[None, :], mask=row_ok[:, None] & (offs_dk[None, :] < D), other=0.0
            )
        if INDEX_AHEAD and PAGE > 0:
            table = KvIndices + b * stride_bt
            page_next = tl.load(table + lo // PAGE, mask=lo < hi, other=0)
        elif INDEX_AHEAD:
            first = lo + tl.arange(0, BLOCK_N)
            slots_next = tl.load(KvIndices + start + first, mask=first < hi, other=0)
        for n0 in range(lo, hi, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_ok = offs_n < hi
            if INDEX_AHEAD and PAGE > 0:
                page = page_next
                page_next = tl.load(table + (n0 + BLOCK_N) // PAGE, mask=n0 + BLOCK_N < hi, other=0)
                slot = page.to(tl.int64) * PAGE + offs_n % PAGE
            elif INDEX_AHEAD:
                slot = slots_next.to(tl.int64)
                following = offs_n + BLOCK_N
                slots_next = tl.load(KvIndices + start + following, mask=following < hi, other=0)
            elif PAGE > 0:
                page = tl.load(KvIndices + b * stride_bt + offs_n // PAGE, mask=n_ok, other=0)
                slot = page.to(tl.int64) * PAGE + offs_n % PAGE
            else:
                slot = tl.load(KvIndices + start + offs_n, mask=n_ok, other=0).to(tl.int64)
            k_rows = K + slot[:, None] * stride_kt + hkv * stride_kh
            if LATENT:
                k_lat, k_rope = _latent_and_rope(k_rows, n_ok, offs_lat, offs_rope, D)
                s = tl.dot(q_lat, tl.trans(k_lat))
                s = tl.dot(q_rope, tl.trans(k_rope), acc=s)  # accumulated in the MMA
                if DV_TILES == 1:
                    v = k_lat
                else:
                    v = tl.load(k_rows + offs_dv[None, :], mask=n_ok[:, None], other=0.0)
            else:
                if Q_ONCE:
                    k = tl.load(
                        k_rows + offs_dk[None, :],
                        mask=n_ok[:, None] & (offs_dk[None, :] < D),
                        other=0.0,
                    )
                    s = tl.dot(q_all, tl.trans(k))
                else:
                    s = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                    for t in tl.static_range(D_TILES):  # scores over the key width in tiles
                        d_ok = (t * BLOCK_DK + offs_dk) < D
                        q = tl.load(
                            q_rows + t * BLOCK_DK + offs_dk[None, :],
                            mask=row_ok[:, None] & d_ok[None, :],
                            other=0.0,
                        )
                        k = tl.load(
                            k_rows + t * BLOCK_DK + offs_dk[None, :],
                            mask=n_ok[:, None] & d_ok[None, :],
                            other=0.0,
                        )
                        s = tl.dot(q, tl.trans(k), acc=s)
                v = tl.load(
                    V + slot[:, None] * stride_vt + hkv * stride_vh + offs_dv[None, :],
                    mask=n_ok[:, None] & (offs_dv[None, :] < DV),
                    other=0.0,
                )
            acc, l_i, m_i = _softmax_tile(s, n_ok, qk_scale, m_i, l_i, acc, v)
        out, lse = _normalized(acc, l_i, m_i)
        tl.store(
            Out + split * stride_os + token[:, None] * stride_ot + head[:, None] * stride_oh
            + offs_dv[None, :],
            out.to(Out.dtype.element_ty),
            mask=(row_ok & (rows * 0 + lo < hi))[:, None] & (offs_dv[None, :] < DV),
        )  # fmt: skip
        first_tile = (rows * 0 + dv_tile) == 0  # one value tile writes the (shared) lse
        written = row_ok & first_tile & (rows * 0 + lo < hi)
        tl.store(Lse + split * stride_ls + token * stride_lt + head, lse, mask=written)

    @triton.jit
    def _tree_attention_kernel(
        Q, K, V, NodeLoc, Mask, MaskIndptr, KvIndptr, O1, Lse1, Out,
        sm_scale,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_ot, stride_oh,
        stride_pb, stride_pr, stride_ph, stride_ps,
        stride_lb, stride_lr, stride_lh, stride_ls,
        W: tl.constexpr, G: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
        BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_DK: tl.constexpr,
        D_TILES: tl.constexpr, BLOCK_DV: tl.constexpr, DV_TILES: tl.constexpr,
        FULL_MASK: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
        MIN_SHARE: tl.constexpr, BLOCK_N: tl.constexpr, GIVEN_PREFIX: tl.constexpr,
        LSE_LOG2: tl.constexpr, MERGE_CHUNK: tl.constexpr,
    ):  # fmt: skip
        # O1 / Lse1: the prefix part, addressed per (request, node, head, share): this file's
        # prefix kernel writes it token-major, FlashMLA's decode kernel as [bs, W, Hq, Dv] /
        # [bs, Hq, W]. GIVEN_PREFIX: one part covering the whole prefix, always nonempty.
        # LSE_LOG2: Lse1 is a base-2 log-sum-exp (FlashInfer's), turned natural as it is read.
        b = tl.program_id(0)
        head = tl.program_id(1)
        hkv = head // G
        offs_r = tl.program_id(2) // DV_TILES * BLOCK_R + tl.arange(0, BLOCK_R)  # query nodes
        r_ok = offs_r < W
        offs_w = tl.arange(0, BLOCK_W)  # key nodes: all W of the request
        w_ok = offs_w < W
        offs_dk = tl.arange(0, BLOCK_DK)
        offs_dv = tl.program_id(2) % DV_TILES * BLOCK_DV + tl.arange(0, BLOCK_DV)
        token = b * W + offs_r
        slot = tl.load(NodeLoc + b * W + offs_w, mask=w_ok, other=0).to(tl.int64)
        s = tl.zeros([BLOCK_R, BLOCK_W], tl.float32)
        for t in tl.static_range(D_TILES):  # scores over the key width in tiles
            d_ok = (t * BLOCK_DK + offs_dk) < D
            q = tl.load(
                Q + token[:, None] * stride_qt + head * stride_qh + t * BLOCK_DK + offs_dk[None, :],
                mask=r_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            k = tl.load(
                K + slot[:, None] * stride_kt + hkv * stride_kh + t * BLOCK_DK + offs_dk[None, :],
                mask=w_ok[:, None] & d_ok[None, :],
                other=0.0,
            )
            s += tl.dot(q, tl.trans(k)).to(tl.float32)
        s = s * sm_scale  # [BLOCK_R, BLOCK_W]
        prefix = tl.load(KvIndptr + b + 1) - tl.load(KvIndptr + b)
        if FULL_MASK:  # SGLang's verify mask: per request W rows of (prefix + W) columns
            cell = tl.load(MaskIndptr + b) + offs_r[:, None] * (prefix + W) + prefix
            cell = cell + offs_w[None, :]
        else:
            cell = b * W * W + offs_r[:, None] * W + offs_w[None, :]
        allowed = tl.load(Mask + cell, mask=r_ok[:, None] & w_ok[None, :], other=0)
        s = tl.where(allowed != 0, s, float("-inf"))
        m = tl.max(s, 1)
        m = tl.where(r_ok, m, 0.0)  # padded rows: no allowed key
        p = tl.exp(s - m[:, None])
        l_sum = tl.sum(p, 1)
        v = tl.load(
            V + slot[:, None] * stride_vt + hkv * stride_vh + offs_dv[None, :],
            mask=w_ok[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        lse2 = m + tl.log(tl.where(r_ok, l_sum, 1.0))
        # Merge with the prefix part's shares: only the nonempty ones, as the prefix kernel
        # cut them, are read (one on a prefix shorter than MIN_SHARE, none on an empty one).
        if GIVEN_PREFIX:
            shares = 1
        else:
            share = _share_keys(prefix, SPLITS, MIN_SHARE, BLOCK_N)
            shares = (prefix + share - 1) // share
        splits = tl.arange(0, BLOCK_S)
        lse_rows = Lse1 + b * stride_lb + offs_r * stride_lr + head * stride_lh
        lse1 = tl.load(
            lse_rows[:, None] + splits[None, :] * stride_ls,
            mask=r_ok[:, None] & (splits[None, :] < shares),
            other=float("-inf"),
        )  # [BLOCK_R, BLOCK_S]
        if LSE_LOG2:
            lse1 = lse1 * 0.6931471805599453  # ln 2
        top = tl.maximum(lse2, tl.max(lse1, 1))
        w2 = tl.exp(lse2 - top)
        acc = tl.dot(p.to(v.dtype), v).to(tl.float32) * (w2 / tl.where(r_ok, l_sum, 1.0))[:, None]
        den = w2 + tl.sum(tl.exp(lse1 - top[:, None]), 1)
        out_ok = r_ok[:, None] & (offs_dv[None, :] < DV)
        o1_rows = O1 + b * stride_pb + offs_r[:, None] * stride_pr + head * stride_ph
        if MERGE_CHUNK == 1:
            for sp in range(shares):
                lse_sp = tl.load(lse_rows + sp * stride_ls, mask=r_ok, other=0.0)
                if LSE_LOG2:
                    lse_sp = lse_sp * 0.6931471805599453
                wt = tl.exp(lse_sp - top)
                o1 = tl.load(o1_rows + sp * stride_ps + offs_dv[None, :], mask=out_ok, other=0.0)
                acc += o1.to(tl.float32) * wt[:, None]
        else:  # MERGE_CHUNK shares' loads in flight at once: many shares are latency-bound
            offs_c = tl.arange(0, MERGE_CHUNK)
            for sp0 in range(0, shares, MERGE_CHUNK):
                sp = sp0 + offs_c
                c_ok = sp < shares
                lse_c = tl.load(lse_rows[None, :] + sp[:, None] * stride_ls,
                                mask=c_ok[:, None] & r_ok[None, :], other=float("-inf"))  # fmt: skip
                if LSE_LOG2:
                    lse_c = lse_c * 0.6931471805599453
                wt = tl.exp(lse_c - top[None, :])  # 0 where masked
                o1 = tl.load(
                    o1_rows[None, :, :] + sp[:, None, None] * stride_ps
                    + offs_dv[None, None, :],
                    mask=c_ok[:, None, None] & out_ok[None, :, :],
                    other=0.0,
                )  # [MERGE_CHUNK, BLOCK_R, BLOCK_DV]  # fmt: skip
                acc += tl.sum(o1.to(tl.float32) * wt[:, :, None], axis=0)
        out_offs = token[:, None] * stride_ot + head * stride_oh + offs_dv[None, :]
        tl.store(Out + out_offs, (acc / den[:, None]).to(Out.dtype.element_ty), mask=out_ok)


VALUE_TILE = 128  # value columns per program where values are wider (MLA's 512-wide latent)
PREFIX_BLOCK_N = 32  # prefix keys per iteration of the prefix kernel
MAX_PREFIX_SPLITS = 16  # a long prompt at bs 1: K2.6 at TP 8 has 9-33 prefix programs a layer
LATENT_MAX_SPLITS = 128  # the latent variant at bs 1: a share per SM for one 64-row tile
# From 32 shares the tree kernel merges over 32 value columns, 8 shares a load (one K2.6 rank
# at bs 4's 32 shares: 2-3 % less than 128 columns one share at a time).
LATENT_MERGE = (32, 32, 8)
MHA_WIDE_DV = 128  # MHA values (and keys) at most this wide take `_wide_mha_prefix`
MIN_SHARE_KEYS = 256  # a share walks at least this many keys: a short prefix takes few shares
PROGRAMS_PER_SM = 4  # the prefix kernel's grid with shares, per SM, at most
# The same for `_wide_mha_prefix`'s 8-warp programs of <= 64 / 128 rows: more shares were
# slower from bs 4 (Qwen3-8B heads, W 8-32: twice the shares at <= 64 rows 1.02-1.19x the
# time, four times at 128 rows 1.12-1.46x).
WIDE_MHA_PROGRAMS_PER_SM = (2, 1)
TREE_ROWS = 16  # the tree kernel's query nodes per program (all W key nodes in one tile)
# The latent variant's 64-row key tile on a paged cache (FlashMLA's pages), keywords over
# `_latent_prefix`'s. Where the Gluon kernel runs (Hopper, bf16; `launch_settings`' ``gluon``)
# it takes the tile: its two warpgroups take the key tiles in turns, one's softmax under the
# other's products, and each buffer half is refilled as soon as its last reader is done (one
# K2.6 rank, 8K-64K keys, bs 1-32, W 8-32, the whole verify attention: 0.61-1.17x FlashMLA's
# prefix part with the ancestor block merged; an earlier Gluon kernel that split each tile's
# scores between the warpgroups took 1.21-1.44x at W 16 / 32, and it was 0.57-0.83x the
# Triton kernel's time). Elsewhere a tile's page is read a tile ahead at bs >= 2
# (2-9 % faster at bs 8-32, within 2.5 % at bs 4); from ``PAGED_MANY_SHARES`` shares (bs 1)
# that gained nothing, nor did half-page tiles in three or four stages anywhere.
PAGED_LATENT_TILE_GLUON: dict = {"prefix_gluon": True}
# Where a request's W x G rows take two or more 64-row tiles (W 16 / 32 on a K2.6 rank) the
# Gluon kernel takes them too, with the same shares: about one wave of programs (at bs 1 half
# as many were 1-8 % faster at 16K keys and up to 23 % slower at 64K). W 64 untimed.
PAGED_LATENT_TILE: dict = {"prefix_index_ahead": True}
PAGED_LATENT_TILE_MANY_SHARES: dict = {}
PAGED_MANY_SHARES = 64


def _rows_per_program(w: int, g: int, dv: int) -> int:
    """The prefix kernel's query rows per program (node x head-in-group rows, W * G of them):
    16 for values wider than 256 (MLA's 512-wide latent: 32 rows' accumulator spilled)."""
    return 16 if w * g <= 16 or dv > 256 else 32


def kernel_warps(block_r: int, block_w: int, block_dv: int, d_tiles: int) -> tuple[int, int]:
    """``(prefix_warps, tree_warps)``: warps per program of the two kernels. A tree kernel
    program holds all ``block_w`` nodes' keys (``d_tiles`` tiles of 64) and values
    (``block_dv`` wide) besides its ``block_r`` rows' tiles: past 16,384 elements (MLA's wide
    keys) it spilled at 4 warps, so it takes 8; over 128-wide heads 4 (faster on short
    prefixes, within 2 % on long ones). The prefix kernel takes 4: its 16-row programs over
    576-wide keys spill a little at 4 warps yet ran faster than at 8 (every K2.6 shape timed)."""
    tree = 8 if d_tiles > 2 and block_w * (d_tiles * 64 + block_dv) > 16384 else 4
    return 4, tree


def value_tiling(dv: int) -> tuple:
    """``(prefix_dv_block, tree_dv_block)`` for `tree_attention` (None: all of Dv in one
    program). Values wider than ``VALUE_TILE`` go to the tree kernel in tiles: one program
    would hold a ``[W, Dv]`` accumulator. The prefix kernel keeps its values whole: tiling them
    would recompute its scores (576 wide for MLA) per tile, and shares of the prefix
    (`prefix_splits`) fill a small batch's SMs at no such cost."""
    if dv <= VALUE_TILE:
        return None, None
    return None, VALUE_TILE


def prefix_splits(
    bs: int,
    w: int,
    hq: int,
    hkv: int,
    dv: int,
    prefix_dv_block: int | None,
    num_sms: int,
    rows: int | None = None,
) -> int:
    """How many programs share each request's prefix in `tree_attention`'s prefix kernel (a
    power of two, at most ``MAX_PREFIX_SPLITS``): the most that keep the grid within
    ``PROGRAMS_PER_SM`` programs per SM. Each program walks its prefix one key tile after
    another, so with one program per prefix a small batch leaves SMs idle and a long prefix
    is walked alone. The grid is fixed at capture while prefix lengths vary between graph
    replays (no host sync), so the shares are launched whatever the length: on a prefix
    shorter than ``MIN_SHARE_KEYS`` all but the first exit at once, and still cost their
    dispatch, which bounds the grid. ``rows``: query rows per program (None: by W * G)."""
    g = hq // hkv
    dv_tiles = 1 if prefix_dv_block is None else -(-dv // prefix_dv_block)
    programs = bs * hkv * -(-w * g // (rows or _rows_per_program(w, g, dv))) * dv_tiles
    per_sm = PROGRAMS_PER_SM if rows is None else WIDE_MHA_PROGRAMS_PER_SM[rows == 128]
    splits = 1
    while splits < MAX_PREFIX_SPLITS and programs * splits * 2 <= per_sm * num_sms:
        splits *= 2
    return splits


def launch_settings(
    bs: int,
    w: int,
    hq: int,
    hkv: int,
    dv: int,
    num_sms: int,
    latent_d: int = 0,
    page_size: int = 0,
    gluon: bool = False,
) -> dict:
    """`tree_attention`'s launch keywords for a verify of this shape, as the attention hook
    passes them: the value tiles (`value_tiling`), the prefix shares (`prefix_splits`) and,
    for MHA heads, the wide row tile (`_wide_mha_prefix`).
    From shapes only, so the same launch replays in a graph whatever the prefix lengths.

    ``latent_d``: the key width where the values are the keys' first ``dv`` columns (MLA's
    latent): the prefix kernel's latent variant (a key tile loaded once for both products; up
    to 64 query rows, all of a K2.6 rank's W 8 x 8 heads; 64 keys; 8 warps), the fastest
    setting `bench_tree_attention.py --sweep` timed at bs >= 8 (2.2-2.7x the general ones),
    best at about one program per SM: its shares fill one wave, up to ``LATENT_MAX_SPLITS``
    (bs 1: 128 shares 0.67-0.77x the time of 64 at 64K-128K keys, 1.03-1.06x at 8K-16K), two
    stages (2-4 % faster than three at bs >= 8), many shares merged as ``LATENT_MERGE`` says.
    ``page_size``: the prefix is read through a block table of such pages (FlashMLA's 64):
    there the 64-row latent tile takes ``PAGED_LATENT_TILE`` (``..._MANY_SHARES`` from
    ``PAGED_MANY_SHARES`` shares on), or with ``gluon`` (`gluon_prefix_runs`: the Gluon kernel
    runs on this device and dtype) ``PAGED_LATENT_TILE_GLUON`` at every batch size where one
    64-row tile holds a request's W x G rows (a K2.6 TP-8 rank at W 8) or two or more tiles
    (W 16 / 32), with the same shares and merge."""
    prefix_dv_block, tree_dv_block = value_tiling(dv)
    latent = _latent_prefix(w * (hq // hkv), dv, latent_d)
    if latent:
        rows = latent["prefix_rows"]
        programs = bs * hkv * -(-w * (hq // hkv) // rows)
        splits = 1  # about one wave of programs: more shares were slower at bs 8
        while splits < LATENT_MAX_SPLITS and programs * splits * 2 <= num_sms:
            splits *= 2
        if splits >= LATENT_MERGE[0]:  # the merge of many shares: latency-bound
            tree_dv_block, latent["tree_merge_chunk"] = LATENT_MERGE[1:]
        if page_size and rows == 64 and gluon and latent_d - dv == 64 and hkv == 1:
            latent.update(PAGED_LATENT_TILE_GLUON)
        elif page_size and rows == 64:
            many = splits >= PAGED_MANY_SHARES
            latent.update(PAGED_LATENT_TILE_MANY_SHARES if many else PAGED_LATENT_TILE)
        return dict(
            prefix_dv_block=None, tree_dv_block=tree_dv_block, prefix_splits=splits, **latent
        )
    wide = _wide_mha_prefix(w * (hq // hkv), dv, latent_d)
    splits = prefix_splits(
        bs, w, hq, hkv, dv, prefix_dv_block, num_sms, rows=wide.get("prefix_rows")
    )
    return dict(
        prefix_dv_block=prefix_dv_block, tree_dv_block=tree_dv_block, prefix_splits=splits, **wide
    )


@functools.cache
def gluon_prefix_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the Gluon prefix kernel (`tree_attention_gluon`) runs for this device and KV
    dtype: a Hopper GPU (compute capability 9.0; its warpgroup MMA and TMA), bfloat16 keys, and
    a Triton with Gluon's Hopper API and its ``warp_specialize`` over (function, arguments)
    pairs (3.6, SGLang 0.5.17's)."""
    if device.type != "cuda" or dtype != torch.bfloat16:
        return False
    if torch.cuda.get_device_capability(device) != (9, 0):
        return False
    try:
        import sglang_ddtree.core.tree_attention_gluon  # noqa: F401
    except ImportError:
        return False
    return True


def _wide_mha_prefix(rows: int, dv: int, latent_d: int) -> dict:
    """The prefix kernel's keywords for MHA heads of at most ``MHA_WIDE_DV`` values (keys as
    wide) with more than 16 query rows per KV head (W x G), or {}: all of a KV head's rows in
    one program up to 128 (the prefix is read W x G / 128 times, not W x G / 32), 8 warps,
    64-key tiles, the queries loaded once and a tile's slots read a tile ahead, with shares
    for about two programs per SM (one at 128 rows: `WIDE_MHA_PROGRAMS_PER_SM`). The fastest
    setting `bench_tree_attention.py --sweep` timed on Qwen3-8B's heads (prefix 8,192, bs
    1-32, W 8-33): 0.32-0.91x the time of 32-row tiles at 4 warps, and 0.71-1.24x
    FlashInfer's paged prefill as the prefix part with the ancestor block merged."""
    if latent_d or dv > MHA_WIDE_DV or rows <= 16:
        return {}
    return dict(
        prefix_rows=min(128, triton.next_power_of_2(rows)) if rows > 32 else 32,
        prefix_keys=64,
        warps=(8, None),
        prefix_q_once=True,
        prefix_index_ahead=True,
    )


def _latent_prefix(rows: int, dv: int, d: int) -> dict:
    """The latent variant's prefix-kernel keywords for ``rows`` query rows per KV head, or {}
    where it does not apply (values not a power-of-two latent, or a rope part over 64)."""
    if not (0 < d - dv <= 64 and dv >= 16 and dv & (dv - 1) == 0):
        return {}
    wide = rows >= 64
    return dict(
        prefix_latent=True,
        prefix_rows=64 if wide else 32,
        prefix_keys=64,
        warps=(8 if wide else 4, None),
        **({"prefix_stages": 2} if wide else {}),
    )


def tree_attention(
    q: torch.Tensor,  # [bs * W, Hq, D]
    k_buffer: torch.Tensor,  # [slots, Hkv, D]
    v_buffer: torch.Tensor,  # [slots, Hkv, Dv] (may be a view of k_buffer, as in MLA)
    kv_indptr: torch.Tensor,  # [bs + 1] int
    kv_indices: torch.Tensor,  # [sum(prefix)] int; or the block table, with page_size
    node_loc: torch.Tensor,  # [bs * W] int
    tree_mask: torch.Tensor | None,  # [bs, W, W] bool; or None with the two below
    sm_scale: float,
    *,
    page_size: int = 0,  # > 0: kv_indices is a [bs, pages] block table of such pages
    full_mask: torch.Tensor | None = None,  # SGLang's verify mask (FULL_MASK layout), bool
    mask_indptr: torch.Tensor | None = None,  # [bs + 1] int, its per-request offsets
    num_nodes: int | None = None,  # W, with full_mask
    prefix_dv_block: int | None = None,  # prefix kernel: value columns per program (None: all)
    tree_dv_block: int | None = None,  # tree kernel: value columns per program (None: all)
    prefix_splits: int = 1,  # prefix kernel: programs sharing each request's prefix
    tree_rows: int | None = None,  # tree kernel: query nodes per program (None: TREE_ROWS)
    prefix_rows: int | None = None,  # prefix kernel: query rows per program (None: by W * G)
    prefix_keys: int = PREFIX_BLOCK_N,  # prefix kernel: keys per iteration
    prefix_latent: bool = False,  # prefix kernel: values are the keys' first Dv columns (MLA)
    prefix_stages: int | None = None,  # prefix kernel: Triton's pipeline stages (None: its own)
    prefix_index_ahead: bool = False,  # prefix kernel: a key tile's slots read a tile ahead
    prefix_gluon: bool = False,  # prefix kernel: the Gluon one (`tree_attention_gluon`)
    prefix_q_once: bool = False,  # prefix kernel: MHA queries loaded once, keys in one tile
    tree_merge_chunk: int = 1,  # tree kernel: prefix shares merged per iteration (power of 2)
    warps: tuple | None = None,  # (prefix, tree) warps per program; None (either): kernel_warps
) -> torch.Tensor:
    """[bs * W, Hq, Dv]: ``tree_attention_reference``'s result, by the two kernels and the
    merge. The tree block comes from ``tree_mask``, or straight from the attention backend's
    ``full_mask`` (request b's W rows of prefix + W columns at ``mask_indptr[b]``; the prefix
    columns are all True in a DDTREE verify, so only the last W are read). The prefix's keys
    come from ``kv_indices`` slot by slot, or (``page_size``) from a block table of pages, as
    FlashMLA's paged cache holds them. No host sync: every size it launches with comes from
    tensor shapes and host ints."""
    n, hq, d = q.shape
    if tree_mask is not None:
        bs, w, _ = tree_mask.shape
        mask = tree_mask.to(torch.int8).contiguous()
    else:
        assert full_mask is not None and mask_indptr is not None and num_nodes is not None
        w = int(num_nodes)
        bs = n // w
        mask = full_mask
    dv = v_buffer.shape[-1]
    assert n == bs * w and node_loc.numel() == n  # the rest: prefix_attention_part's
    block_w = max(16, triton.next_power_of_2(w))
    block_r = min(block_w, tree_rows or TREE_ROWS)
    d_tiles = triton.cdiv(d, min(64, max(16, triton.next_power_of_2(d))))
    prefix_warps, tree_warps = kernel_warps(
        block_r, block_w, _value_tiles(dv, tree_dv_block)[0], d_tiles
    )
    if warps is not None:  # the bench's sweep: either may be None (kernel_warps' choice)
        prefix_warps, tree_warps = warps[0] or prefix_warps, warps[1] or tree_warps
    o1, lse1 = prefix_attention_part(
        q, k_buffer, v_buffer, kv_indptr, kv_indices, w, sm_scale, page_size=page_size,
        prefix_dv_block=prefix_dv_block, prefix_splits=prefix_splits, prefix_rows=prefix_rows,
        prefix_keys=prefix_keys, prefix_latent=prefix_latent, prefix_stages=prefix_stages,
        prefix_warps=prefix_warps, prefix_index_ahead=prefix_index_ahead, prefix_gluon=prefix_gluon,
        prefix_q_once=prefix_q_once,
    )  # fmt: skip
    # The tree kernel reads share s of node r of request b at o1[s, b * W + r].
    o1_strides = (w * o1.stride(1), o1.stride(1), o1.stride(2), o1.stride(0))
    lse_strides = (w * lse1.stride(1), lse1.stride(1), lse1.stride(2), lse1.stride(0))
    return _tree_part_and_merge(
        q, k_buffer, v_buffer, node_loc, mask, mask_indptr, kv_indptr, o1, o1_strides,
        lse1, lse_strides, sm_scale, bs=bs, w=w, full_mask=tree_mask is None,
        prefix_splits=prefix_splits, tree_dv_block=tree_dv_block, block_r=block_r,
        warps=tree_warps, prefix_keys=prefix_keys, merge_chunk=tree_merge_chunk,
    )  # fmt: skip


def prefix_attention_part(
    q: torch.Tensor,  # [bs * W, Hq, D]
    k_buffer: torch.Tensor,  # [slots, Hkv, D]
    v_buffer: torch.Tensor,  # [slots, Hkv, Dv] (may be a view of k_buffer, as in MLA)
    kv_indptr: torch.Tensor,  # [bs + 1] int
    kv_indices: torch.Tensor,  # [sum(prefix)] int; or the block table, with page_size
    w: int,  # W: query nodes per request
    sm_scale: float,
    *,
    page_size: int = 0,  # > 0: kv_indices is a [bs, pages] block table of such pages
    prefix_dv_block: int | None = None,  # value columns per program (None: all)
    prefix_splits: int = 1,  # programs sharing each request's prefix
    prefix_rows: int | None = None,  # query rows per program (None: by W * G)
    prefix_keys: int = PREFIX_BLOCK_N,  # keys per iteration
    prefix_latent: bool = False,  # values are the keys' first Dv columns (MLA)
    prefix_stages: int | None = None,  # Triton's pipeline stages (None: its own)
    prefix_warps: int = 4,  # warps per program
    prefix_index_ahead: bool = False,  # a key tile's slots or page read a tile ahead
    prefix_gluon: bool = False,  # the paged latent prefix as a Gluon kernel (Hopper)
    prefix_q_once: bool = False,  # MHA: the key width in one tile, the queries loaded once
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefix part of `tree_attention` per share of each prefix (every node against all
    of its prefix keys, no mask): ``(out [P, bs * W, Hq, Dv], lse [P, bs * W, Hq])``, float32,
    ``P = prefix_splits``; share s covers keys ``[s * share, (s + 1) * share)``
    (`_share_keys`), an empty one left unwritten. The settings are `launch_settings`'."""
    n, hq, d = q.shape
    hkv, dv = k_buffer.shape[1], v_buffer.shape[-1]
    assert n % w == 0 and hq % hkv == 0 and prefix_splits >= 1
    assert q.stride(-1) == k_buffer.stride(-1) == v_buffer.stride(-1) == 1
    assert kv_indices.dim() == (2 if page_size else 1) and kv_indices.stride(-1) == 1
    bs, g = n // w, hq // hkv
    assert not (prefix_index_ahead and page_size % prefix_keys), "a key tile within a page"
    # Scores in key-width tiles of <= 64 (MLA keys are 576 wide); values in one tile (<= 512,
    # MLA's latent), so the prefix is read once per request, KV head and row block.
    block_dk = min(64, max(16, triton.next_power_of_2(d)))
    if prefix_q_once:  # one key-width tile (128 for 128-wide heads), its queries held
        assert not prefix_latent and not prefix_gluon and d <= 256, d
        block_dk = max(16, triton.next_power_of_2(d))
    d_tiles = triton.cdiv(d, block_dk)
    # One value tile holds the accumulator of every row of a program; ``prefix_dv_block``
    # splits wide values (MLA's 512) over programs, each recomputing the scores (their lse is
    # equal). The merge reads the part per column, whatever its tiling.
    prefix_block_dv, prefix_dv_tiles = _value_tiles(dv, prefix_dv_block)
    if prefix_latent:
        assert is_latent_view(k_buffer, v_buffer) and dv & (dv - 1) == 0
        assert prefix_block_dv * prefix_dv_tiles == dv and 0 < d - dv <= 64, (d, dv)
    o1 = torch.empty(prefix_splits, n, hq, dv, dtype=torch.float32, device=q.device)
    lse1 = torch.empty(prefix_splits, n, hq, dtype=torch.float32, device=q.device)
    block_m = prefix_rows or _rows_per_program(w, g, dv)
    stages = {} if prefix_stages is None else {"num_stages": prefix_stages}
    grid = (bs, hkv, triton.cdiv(w * g, block_m) * prefix_dv_tiles * prefix_splits)
    if prefix_gluon:  # 64 rows and 64-key tiles of a bf16 latent with a 64-wide rope part
        assert prefix_latent and hkv == 1 and (block_m, prefix_keys, d - dv) == (64, 64, 64)
        assert page_size and page_size % prefix_keys == 0 and q.dtype == torch.bfloat16
        from sglang_ddtree.core.tree_attention_gluon import latent_prefix_gluon

        latent_prefix_gluon(
            grid, q, k_buffer, kv_indptr, kv_indices, o1, lse1, sm_scale, w, g, block_m,
            prefix_keys, prefix_splits, page_size, MIN_SHARE_KEYS,
        )  # fmt: skip
        return o1, lse1
    _prefix_attention_kernel[grid](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, o1, lse1, sm_scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), o1.stride(1), o1.stride(2),
        lse1.stride(1), o1.stride(0), lse1.stride(0),
        kv_indices.stride(0) if page_size else 0,
        W=w, G=g, D=d, DV=dv, BLOCK_M=block_m, BLOCK_N=prefix_keys,
        BLOCK_DK=block_dk, D_TILES=d_tiles, BLOCK_DV=prefix_block_dv, DV_TILES=prefix_dv_tiles,
        SPLITS=prefix_splits, MIN_SHARE=MIN_SHARE_KEYS, PAGE=page_size, LATENT=prefix_latent,
        BLOCK_ROPE=64, INDEX_AHEAD=prefix_index_ahead, Q_ONCE=prefix_q_once,
        num_warps=prefix_warps, **stages,
    )  # fmt: skip
    return o1, lse1


def is_latent_view(k_buffer: torch.Tensor, v_buffer: torch.Tensor) -> bool:
    """Whether the values are the keys' first Dv columns, as in SGLang's MLA pool."""
    return (
        v_buffer.data_ptr() == k_buffer.data_ptr()
        and v_buffer.stride() == k_buffer.stride()
        and v_buffer.shape[:-1] == k_buffer.shape[:-1]
    )


def _value_tiles(dv: int, dv_block: int | None) -> tuple[int, int]:
    """``(block, tiles)``: a program's value columns and how many programs cover Dv."""
    block = max(16, triton.next_power_of_2(dv if dv_block is None else dv_block))
    return block, triton.cdiv(dv, block)


def _tree_part_and_merge(
    q, k_buffer, v_buffer, node_loc, mask, mask_indptr, kv_indptr, o1, o1_strides, lse1,
    lse_strides, sm_scale, *, bs, w, full_mask, prefix_splits, tree_dv_block, block_r, warps,
    given_prefix=False, lse_log2=False, prefix_keys=PREFIX_BLOCK_N, merge_chunk=1,
) -> torch.Tensor:  # fmt: skip
    """The tree kernel's launch: ``[bs * W, Hq, Dv]``, the ancestor block merged with the
    prefix part ``o1`` / ``lse1`` (strides per request, node, head and share; ``lse_log2``:
    ``lse1`` in base 2; ``merge_chunk``: shares read per iteration, a power of two)."""
    assert merge_chunk >= 1 and merge_chunk & (merge_chunk - 1) == 0, merge_chunk
    n, hq, d = q.shape
    hkv, dv = k_buffer.shape[1], v_buffer.shape[-1]
    block_dk = min(64, max(16, triton.next_power_of_2(d)))
    tree_block_dv, tree_dv_tiles = _value_tiles(dv, tree_dv_block)
    out = torch.empty(n, hq, dv, dtype=q.dtype, device=q.device)
    _tree_attention_kernel[(bs, hq, triton.cdiv(w, block_r) * tree_dv_tiles)](
        q, k_buffer, v_buffer, node_loc, mask,
        mask_indptr if mask_indptr is not None else kv_indptr, kv_indptr,
        o1, lse1, out, sm_scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), out.stride(0), out.stride(1),
        *o1_strides, *lse_strides,
        W=w, G=hq // hkv, D=d, DV=dv, BLOCK_R=block_r,
        BLOCK_W=max(16, triton.next_power_of_2(w)), BLOCK_DK=block_dk,
        D_TILES=triton.cdiv(d, block_dk), BLOCK_DV=tree_block_dv, DV_TILES=tree_dv_tiles,
        FULL_MASK=full_mask, SPLITS=prefix_splits,
        BLOCK_S=triton.next_power_of_2(prefix_splits), MIN_SHARE=MIN_SHARE_KEYS,
        BLOCK_N=prefix_keys, GIVEN_PREFIX=given_prefix, LSE_LOG2=lse_log2,
        MERGE_CHUNK=merge_chunk, num_warps=warps,
    )  # fmt: skip
    return out


def tree_attention_with_prefix(
    q: torch.Tensor,  # [bs * W, Hq, D]
    k_buffer: torch.Tensor,  # [slots, Hkv, D]
    v_buffer: torch.Tensor,  # [slots, Hkv, Dv] (may be a view of k_buffer, as in MLA)
    node_loc: torch.Tensor,  # [bs * W] int, the nodes' KV slots
    tree_mask: torch.Tensor,  # [bs, W, W] bool (or int8), ancestor-or-self, contiguous
    sm_scale: float,
    prefix_out: torch.Tensor,  # [bs, W, Hq, Dv] the prefix part's normalized output
    prefix_lse: torch.Tensor,  # [bs, Hq, W] float32, its log-sum-exp (natural log by default)
    *,
    tree_dv_block: int | None = None,  # value columns per program (None: value_tiling's)
    tree_rows: int | None = None,  # query nodes per program (None: TREE_ROWS)
    prefix_lse_log2: bool = False,  # prefix_lse in base 2, as FlashInfer's kernels return it
) -> torch.Tensor:
    """[bs * W, Hq, Dv]: the verify attention from a prefix part computed elsewhere (a paged
    kernel that returns its log-sum-exp, as FlashMLA's decode and FlashInfer's batch prefill
    do: every node against the whole cached prefix, no mask) and the ancestor block, merged in
    the tree kernel's epilogue. Both parts are read through their strides (a token-major part
    through `token_major_prefix_part`'s views). Every prefix must be nonempty (a verify's
    prefix holds at least the prompt)."""
    n, hq, d = q.shape
    bs, w, _ = tree_mask.shape
    hkv, dv = k_buffer.shape[1], v_buffer.shape[-1]
    assert n == bs * w and hq % hkv == 0 and node_loc.numel() == n and tree_mask.is_contiguous()
    assert prefix_out.shape == (bs, w, hq, dv) and prefix_out.stride(-1) == 1
    assert prefix_lse.shape == (bs, hq, w) and prefix_lse.dtype == torch.float32
    assert q.stride(-1) == k_buffer.stride(-1) == v_buffer.stride(-1) == 1
    if tree_dv_block is None:
        tree_dv_block = value_tiling(dv)[1]
    block_dk = min(64, max(16, triton.next_power_of_2(d)))
    block_w = max(16, triton.next_power_of_2(w))
    block_r = min(block_w, tree_rows or TREE_ROWS)
    warps = kernel_warps(
        block_r, block_w, _value_tiles(dv, tree_dv_block)[0], triton.cdiv(d, block_dk)
    )[1]
    o1_strides = (*prefix_out.stride()[:3], 0)
    lse_strides = (prefix_lse.stride(0), prefix_lse.stride(2), prefix_lse.stride(1), 0)
    return _tree_part_and_merge(
        q, k_buffer, v_buffer, node_loc, tree_mask, None, node_loc, prefix_out, o1_strides,
        prefix_lse, lse_strides, sm_scale, bs=bs, w=w, full_mask=False, prefix_splits=1,
        tree_dv_block=tree_dv_block, block_r=block_r, warps=warps, given_prefix=True,
        lse_log2=prefix_lse_log2,
    )  # fmt: skip


def token_major_prefix_part(
    prefix_out: torch.Tensor,  # [bs * W, Hq, Dv] row b * W + i: node i of request b
    prefix_lse: torch.Tensor,  # [bs * W, Hq] float32
    w: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefix part laid out token-major (FlashInfer's batch prefill with W query rows a
    request) as `tree_attention_with_prefix` takes it: ``([bs, W, Hq, Dv], [bs, Hq, W])``,
    views of the same memory (the tree kernel reads the lse through its strides, no copy)."""
    n, hq, dv = prefix_out.shape
    assert n % w == 0 and prefix_lse.shape == (n, hq)
    return prefix_out.view(n // w, w, hq, dv), prefix_lse.view(n // w, w, hq).transpose(1, 2)
