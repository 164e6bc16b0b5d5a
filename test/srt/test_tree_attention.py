"""Tree-verify attention split into prefix and tree parts (``core.tree_attention``) against the
masked reference, and the reference against PyTorch's own scaled-dot-product attention.

CPU: the kernels' logic under Triton's interpreter (subprocess, TRITON_INTERPRET=1), float32,
MHA-like (grouped heads) and MLA-like (one KV head, values a view of the keys) shapes, a request
with an empty prefix. GPU (``gpu`` marker): verify-sized shapes in bfloat16.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.core.tree_attention import merge_attention_states, tree_attention_reference


def random_case(bs, w, hq, hkv, d, dv, prefix, seed, dtype=torch.float32, device="cpu", mla=False):
    """Inputs of one verify layer: random trees (each node's parent an earlier node), ancestor
    masks, prefix and node slots drawn from one shuffled pool."""
    g = torch.Generator().manual_seed(seed)
    slots = sum(prefix) + bs * w + 5
    perm = torch.randperm(slots, generator=g)
    kv_indptr = torch.tensor([0, *torch.tensor(prefix).cumsum(0).tolist()])
    kv_indices = perm[: sum(prefix)]
    node_loc = perm[sum(prefix) : sum(prefix) + bs * w]
    mask = torch.zeros(bs, w, w, dtype=torch.bool)
    for b in range(bs):
        parent = [0] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, w)]
        for i in range(w):
            j = i
            while True:
                mask[b, i, j] = True
                if j == 0:
                    break
                j = parent[j]
    q = torch.randn(bs * w, hq, d, generator=g)
    k = torch.randn(slots, hkv, d, generator=g)
    v = k[..., :dv] if mla else torch.randn(slots, hkv, dv, generator=g)
    args = [q, k, v, kv_indptr, kv_indices, node_loc, mask]
    args = [a.to(device) for a in args]
    args[:3] = [a.to(dtype) for a in args[:3]]
    if mla:  # a view of the keys on the device, as SGLang's MLA pool hands it over
        args[2] = args[1][..., :dv]
    return args, d**-0.5


def test_reference_equals_torch_sdpa():
    """The reference is PyTorch's attention over the gathered keys with a dense boolean mask."""
    (q, k, v, indptr, indices, loc, mask), scale = random_case(2, 6, 4, 2, 8, 8, [5, 3], 0)
    got = tree_attention_reference(q, k, v, indptr, indices, loc, mask, scale)
    w = 6
    for b in range(2):
        pre = indices[indptr[b] : indptr[b + 1]]
        slots = torch.cat([pre, loc[b * w : (b + 1) * w]])
        kb = k[slots].repeat_interleave(2, dim=1).transpose(0, 1)  # [Hq, P + W, D]
        vb = v[slots].repeat_interleave(2, dim=1).transpose(0, 1)
        allowed = torch.cat([torch.ones(w, len(pre), dtype=torch.bool), mask[b]], dim=1)
        want = torch.nn.functional.scaled_dot_product_attention(
            q[b * w : (b + 1) * w].transpose(0, 1), kb, vb, attn_mask=allowed, scale=scale
        ).transpose(0, 1)
        torch.testing.assert_close(got[b * w : (b + 1) * w], want, atol=1e-5, rtol=1e-5)


def test_value_tiling_tiles_wide_values_in_the_tree_kernel_only():
    from sglang_ddtree.core.tree_attention import value_tiling

    assert value_tiling(128) == (None, None)  # MHA head dim: one tile
    # K2.6's latent at TP 8 (8 query heads, one KV head, Dv 512): the tree kernel in tiles of
    # 128; the prefix kernel whole (its shares fill a small batch's SMs instead).
    assert value_tiling(512) == (None, 128)


def test_prefix_splits_fill_the_sms_of_a_small_batch_only():
    """The prefix kernel's programs per request prefix (`prefix_splits`): doubled while the
    grid stays within 4 programs per SM, at most 16; 1 once the batch fills the GPU."""
    from sglang_ddtree.core.tree_attention import prefix_splits

    # Qwen3-8B heads (32 / 8, 128): bs x 8 KV heads x ceil(W * 4 / 32) row blocks.
    assert prefix_splits(1, 65, 32, 8, 128, None, 132) == 4  # 72 programs -> 288
    assert prefix_splits(1, 17, 32, 8, 128, None, 132) == 16  # 24 -> 384
    assert prefix_splits(8, 17, 32, 8, 128, None, 132) == 2  # 192 -> 384
    assert prefix_splits(32, 16, 32, 8, 128, None, 132) == 1  # 512: the grid is full
    # K2.6's latent at TP 8: 16 query rows a program, ceil(W * 8 / 16) row blocks a request.
    assert prefix_splits(1, 33, 8, 1, 512, None, 132) == 16  # 17 programs -> 272 (the cap)
    assert prefix_splits(8, 17, 8, 1, 512, None, 132) == 4  # 72 -> 288
    assert prefix_splits(8, 65, 8, 1, 512, None, 132) == 2  # 264 -> 528
    assert prefix_splits(1, 65, 8, 1, 512, 128, 132) == 4  # values in 4 tiles: 132 -> 528
    assert prefix_splits(1, 17, 32, 8, 128, None, 1) == 1  # the interpreter: one "SM"
    # The wide MHA tile's 8-warp programs: about two a SM at <= 64 rows, one at 128 rows.
    assert prefix_splits(8, 17, 32, 8, 128, None, 132, rows=128) == 2  # 64 programs -> 128
    assert prefix_splits(8, 16, 32, 8, 128, None, 132, rows=64) == 4  # 64 -> 256
    assert prefix_splits(32, 33, 32, 8, 128, None, 132, rows=128) == 1  # 512: full


def test_launch_settings_are_the_hooks_choice():
    """`launch_settings` (what the attention hook launches): `value_tiling`'s tiles and
    `prefix_splits`' shares for the shape."""
    from sglang_ddtree.core.tree_attention import launch_settings

    # MHA heads of 128 values with more than 16 rows a KV head (W x G): up to 128 of them in
    # one program, 8 warps, 64-key tiles, the queries loaded once, the slots read a tile ahead.
    wide = dict(prefix_keys=64, warps=(8, None), prefix_q_once=True, prefix_index_ahead=True)
    assert launch_settings(1, 65, 32, 8, 128, 132) == dict(  # 24 programs -> 96
        prefix_dv_block=None, tree_dv_block=None, prefix_splits=4, prefix_rows=128, **wide
    )
    rows = {w: launch_settings(4, w, 32, 8, 128, 132)["prefix_rows"] for w in (5, 8, 9, 16, 17)}
    assert rows == {5: 32, 8: 32, 9: 64, 16: 64, 17: 128}
    assert launch_settings(4, 4, 32, 8, 128, 132) == dict(  # 16 rows: the 16-row tile
        prefix_dv_block=None, tree_dv_block=None, prefix_splits=16
    )
    assert "prefix_rows" not in launch_settings(4, 16, 16, 2, 256, 132)  # 256-wide values
    assert launch_settings(1, 33, 8, 1, 512, 132) == dict(
        prefix_dv_block=None, tree_dv_block=128, prefix_splits=16
    )
    assert launch_settings(32, 16, 32, 8, 128, 132)["prefix_splits"] == 1  # 256 programs
    assert launch_settings(32, 33, 32, 8, 128, 132)["prefix_splits"] == 1  # 512: full
    # MLA's latent cache (values the keys' first 512 of 576 columns): the latent variant, all
    # 64 rows of a K2.6 rank's W 8 x 8 heads in one program, shares to fill the SMs (a
    # share per SM at bs 1, 128 of 132; bs 2: 64 each), merged 8 shares a load from 32 on.
    lat = launch_settings(1, 8, 8, 1, 512, 132, latent_d=576)
    assert lat == dict(prefix_dv_block=None, tree_dv_block=32, prefix_splits=128,
                       prefix_latent=True, prefix_rows=64, prefix_keys=64, warps=(8, None),
                       prefix_stages=2, tree_merge_chunk=8)  # fmt: skip
    bs2 = launch_settings(2, 8, 8, 1, 512, 132, latent_d=576)
    assert (bs2["prefix_splits"], bs2["tree_merge_chunk"]) == (64, 8)
    bs4 = launch_settings(4, 8, 8, 1, 512, 132, latent_d=576)
    assert (bs4["prefix_splits"], bs4["tree_dv_block"], bs4["tree_merge_chunk"]) == (32, 32, 8)
    assert launch_settings(1, 8, 8, 1, 512, 100, latent_d=576)["prefix_splits"] == 64
    bs8 = launch_settings(8, 8, 8, 1, 512, 132, latent_d=576)
    assert (bs8["prefix_splits"], bs8["tree_dv_block"]) == (16, 128)
    assert "tree_merge_chunk" not in bs8  # one share a load: 8 at a time was slower at bs 8
    assert launch_settings(32, 8, 8, 1, 512, 132, latent_d=576)["prefix_splits"] == 4
    small = launch_settings(4, 8, 4, 1, 512, 132, latent_d=576)  # the tiny pair: 32 rows
    assert (small["prefix_rows"], small["warps"]) == (32, (4, None))
    assert "prefix_stages" not in small  # Triton's own: two stages are timed at 64 rows only
    # On a paged cache (FlashMLA's 64) the 64-row tile reads its page a tile ahead at bs >= 2;
    # with many shares (bs 1) and on triton's slot table it does not.
    assert launch_settings(4, 8, 8, 1, 512, 132, latent_d=576, page_size=64)["prefix_index_ahead"]
    assert "prefix_index_ahead" not in launch_settings(1, 8, 8, 1, 512, 132, 576, page_size=64)
    assert "prefix_index_ahead" not in bs8
    assert launch_settings(1, 8, 8, 1, 512, 132, latent_d=576, page_size=64) == lat
    # Where the Gluon kernel runs (Hopper, bf16) it takes the paged 64-row tile at every bs,
    # whether a request's rows fit one tile (W 8) or take two or four (W 16 / 32), with the same
    # shares and merge (bs 1: 64 shares at W 16, 32 at W 32); not on a slot table, nor at 32
    # rows a program.
    for bs, w in [(b, w) for b in (1, 4, 8, 32) for w in (8, 16, 32)]:
        triton_paged = launch_settings(bs, w, 8, 1, 512, 132, 576, page_size=64)
        gluon = launch_settings(bs, w, 8, 1, 512, 132, 576, page_size=64, gluon=True)
        assert gluon["prefix_gluon"] and "prefix_index_ahead" not in gluon, (bs, w)
        assert {k: v for k, v in gluon.items() if k != "prefix_gluon"} == {
            k: v for k, v in triton_paged.items() if k != "prefix_index_ahead"
        }
    for w, shares in ((16, 64), (32, 32)):
        bs1 = launch_settings(1, w, 8, 1, 512, 132, 576, page_size=64, gluon=True)
        assert (bs1["prefix_splits"], bs1["tree_merge_chunk"]) == (shares, 8)
    assert "prefix_gluon" not in launch_settings(8, 8, 8, 1, 512, 132, 576, gluon=True)
    assert "prefix_gluon" not in launch_settings(4, 8, 4, 1, 512, 132, 576, 64, gluon=True)
    # Not a latent layout (a rope part over 64 columns, or values as wide as the keys).
    assert "prefix_latent" not in launch_settings(1, 8, 8, 1, 512, 132, latent_d=640)
    assert "prefix_latent" not in launch_settings(1, 8, 8, 1, 128, 132, latent_d=128)


def test_kernel_warps_keep_the_widest_tiles_in_registers():
    """Warps per program (`kernel_warps`): 4 for the prefix kernel; 8 for a tree kernel over
    wide (MLA) keys whose W nodes' keys and values pass 16,384 elements."""
    from sglang_ddtree.core.tree_attention import kernel_warps

    assert kernel_warps(16, 128, 128, 2) == (4, 4)  # 8B heads, W = 65
    assert kernel_warps(16, 64, 128, 2) == (4, 4)  # W = 33
    assert kernel_warps(16, 32, 128, 9) == (4, 8)  # K2.6's latent, W = 17, values in 128s
    assert kernel_warps(16, 16, 16, 1) == (4, 4)


def test_merge_handles_an_empty_prefix():
    o1, o2 = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    lse1 = torch.tensor([[float("-inf"), 0.5]] * 3)
    lse2 = torch.zeros(3, 2)
    out = merge_attention_states(o1, lse1, o2, lse2)
    torch.testing.assert_close(out[:, 0], o2[:, 0])  # no prefix key: the tree part alone
    w1 = torch.exp(torch.tensor(0.5)) / (1 + torch.exp(torch.tensor(0.5)))
    torch.testing.assert_close(out[:, 1], w1 * o1[:, 1] + (1 - w1) * o2[:, 1])


_INTERPRETED_CHECK = """
import torch
from test_tree_attention import random_case
from sglang_ddtree.core.tree_attention import tree_attention, tree_attention_reference

cases = [
    dict(bs=3, w=7, hq=4, hkv=2, d=24, dv=20, prefix=[5, 0, 37], seed=1),  # grouped heads
    dict(bs=2, w=5, hq=4, hkv=1, d=40, dv=32, prefix=[9, 40], seed=2, mla=True),  # MLA-like
    dict(bs=1, w=17, hq=2, hkv=2, d=16, dv=16, prefix=[70], seed=3),  # W > 16, 3 prefix tiles
    dict(bs=2, w=4, hq=2, hkv=1, d=16, dv=16, prefix=[200, 97], seed=5),  # 7 and 4 prefix tiles
    dict(bs=2, w=9, hq=4, hkv=1, d=144, dv=128, prefix=[33, 2], seed=4, mla=True),  # 3 key tiles
    dict(bs=2, w=5, hq=2, hkv=1, d=16, dv=16, prefix=[600, 300], seed=7),  # shares of 256+ keys
]
for case in cases:
    args, scale = random_case(**case)
    got = tree_attention(*args, scale)
    want = tree_attention_reference(*args, scale)
    err = (got - want).abs().max().item()
    assert err < 1e-4, (case, err)
    # Values split over programs (MLA's wide latent): 16 columns each, a ragged last tile
    # where Dv is not a multiple of 16; in both kernels, or in one of them.
    for blocks in ((16, 16), (None, 16), (16, None)):
        got = tree_attention(*args, scale, prefix_dv_block=blocks[0], tree_dv_block=blocks[1])
        err = (got - want).abs().max().item()
        assert err < 1e-4, (case, blocks, err)
    # The prefix shared by several programs (shares of whole 32-key tiles, at least 256 keys
    # each: on short or empty prefixes most shares are empty), alone and with the values tiled.
    for splits, blocks in ((2, (None, None)), (3, (None, None)), (16, (None, None)), (4, (16, 16))):
        got = tree_attention(*args, scale, prefix_dv_block=blocks[0], tree_dv_block=blocks[1],
                             prefix_splits=splits)
        err = (got - want).abs().max().item()
        assert err < 1e-4, (case, splits, blocks, err)
    # The merge reading several shares at once (a ragged last chunk where the shares do not
    # fill it; empty shares masked), with the values tiled or not.
    for splits, chunk, blocks in ((3, 2, (None, None)), (16, 4, (None, 16)), (4, 8, (16, 16))):
        got = tree_attention(*args, scale, prefix_splits=splits, tree_merge_chunk=chunk,
                             prefix_dv_block=blocks[0], tree_dv_block=blocks[1])
        err = (got - want).abs().max().item()
        assert err < 1e-4, (case, splits, chunk, blocks, err)
    # The tree kernel's query nodes over several programs (row tiles, a ragged last one).
    for rows, splits in ((16, 1), (16, 3)):
        got = tree_attention(*args, scale, tree_rows=rows, prefix_splits=splits)
        err = (got - want).abs().max().item()
        assert err < 1e-4, (case, rows, splits, err)
    # More query rows a prefix program (MHA's wider tiles: a KV head's W x G rows in one or
    # two programs, a ragged last one), over 32- and 64-key tiles, alone and with shares.
    if not case.get("mla"):
        for rows, keys, splits in ((64, 32, 1), (128, 64, 1), (64, 64, 3)):
            got = tree_attention(*args, scale, prefix_rows=rows, prefix_keys=keys,
                                 warps=(8, None), prefix_splits=splits)
            err = (got - want).abs().max().item()
            assert err < 1e-4, (case, rows, keys, splits, err)
        # The queries loaded once, the key width in one tile (padded where not a power of 2).
        for rows, splits in ((None, 1), (64, 2)):
            got = tree_attention(*args, scale, prefix_q_once=True, prefix_rows=rows,
                                 prefix_splits=splits)
            err = (got - want).abs().max().item()
            assert err < 1e-4, (case, "queries once", rows, splits, err)
# A KV head's 80 rows (W 20 x G 4) over 64-row programs: a full one and a ragged second.
args, scale = random_case(bs=2, w=20, hq=8, hkv=2, d=32, dv=32, prefix=[90, 33], seed=8)
want = tree_attention_reference(*args, scale)
for rows, keys, splits, once, ahead in (
    (64, 32, 1, False, False), (64, 64, 2, False, False), (128, 32, 1, False, False),
    (64, 32, 1, True, False), (128, 64, 2, True, False), (64, 32, 3, True, True),
):
    got = tree_attention(*args, scale, prefix_rows=rows, prefix_keys=keys, warps=(8, None),
                         prefix_splits=splits, prefix_q_once=once, prefix_index_ahead=ahead)
    err = (got - want).abs().max().item()
    assert err < 1e-4, ("80 rows", rows, keys, splits, once, ahead, err)
# The tree block read straight from SGLang's verify mask (FULL_MASK layout) gives the same.
from sglang_ddtree.core.layout import flatten_verify_mask
for case in cases:
    args, scale = random_case(**case)
    q, k, v, indptr, indices, loc, mask = args
    prefix = indptr[1:] - indptr[:-1]
    w = mask.shape[1]
    sizes = (prefix + w) * w
    mask_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    full = flatten_verify_mask(mask, prefix, int(sizes.sum()))
    got = tree_attention(q, k, v, indptr, indices, loc, None, scale, full_mask=full,
                         mask_indptr=mask_indptr, num_nodes=w)
    err = (got - tree_attention_reference(*args, scale)).abs().max().item()
    assert err < 1e-4, (case, "full mask", err)
# The check can fail: the same kernels without the ancestor mask (every node sees every node)
# are far from the reference.
args, scale = random_case(**cases[0])
unmasked = args[:6] + [torch.ones_like(args[6])]
assert (tree_attention(*unmasked, scale) - tree_attention_reference(*args, scale)).abs().max() > 0.05
print("interpreted tree attention OK")
"""


def _needs_loaded_loop_bounds() -> None:
    """The prefix kernel loops over each request's prefix, bounded by a loaded length."""
    import triton
    from conftest import interpreter_bounds_loops_by_loads

    if not interpreter_bounds_loops_by_loads():
        pytest.skip(
            f"Triton {triton.__version__}'s interpreter cannot bound a loop by a loaded value; "
            "the compiled kernels are checked by the gpu-marked tests"
        )


def test_tree_attention_interpreted_equals_reference(run_interpreted):
    _needs_loaded_loop_bounds()
    run_interpreted(_INTERPRETED_CHECK, "interpreted tree attention OK")


_PREFIX_PART_CHECK = """
import torch
from test_tree_attention import random_case
from test_flashmla_verify import prefix_part_reference
from sglang_ddtree.core.tree_attention import MIN_SHARE_KEYS, prefix_attention_part

cases = [
    dict(bs=2, w=3, hq=4, hkv=1, d=40, dv=32, prefix=[600, 7], seed=5, mla=True),
    dict(bs=2, w=5, hq=4, hkv=2, d=24, dv=20, prefix=[300, 11], seed=6),  # grouped heads
]
# Keys scaled up late in the first request's prefix (its max grows past the first tiles: the
# accumulator is rescaled late) or early (the first tile holds the max).
for case, boost in [(c, b) for c in cases for b in (None, "late", "early")]:
    args, scale = random_case(**case)
    q, k, v, indptr, indices, loc, mask = args
    if boost is not None:
        first = indices[: int(indptr[1])].long()
        k[first[200:] if boost == "late" else first[:64]] *= 6.0  # v is k's view in MLA
    w, n, hq, dv = mask.shape[1], q.shape[0], q.shape[1], v.shape[-1]
    ref_out, ref_lse = prefix_part_reference(q, k, v, indptr, indices, w, scale)
    ref_out, ref_lse = ref_out.reshape(n, hq, dv), ref_lse.transpose(1, 2).reshape(n, hq)
    latent = dict(prefix_latent=True, prefix_rows=32, prefix_keys=64) if case.get("mla") else {}
    for splits in (1, 4):
        out, lse = prefix_attention_part(q, k, v, indptr, indices, w, scale,
                                         prefix_splits=splits, **latent)
        assert out.shape == (splits, n, hq, dv) and lse.shape == (splits, n, hq)
        # Shares cut as the merge cuts them: the nonempty ones, merged by log-sum-exp, are
        # the whole prefix's part (natural-log lse, whatever base the kernel works in).
        lens = (indptr[1:] - indptr[:-1]).repeat_interleave(w)  # [n]
        share = -(-lens // splits)
        share = torch.maximum(share, torch.full_like(share, MIN_SHARE_KEYS))
        nonempty = torch.arange(splits)[:, None] * share[None, :] < lens[None, :]  # [S, n]
        lse = torch.where(nonempty[..., None], lse, float("-inf"))
        out = torch.where(nonempty[..., None, None], out, 0.0)
        total = torch.logsumexp(lse, 0)  # [n, hq]
        merged = (out * (lse - total).exp()[..., None]).sum(0)
        assert (total - ref_lse).abs().max().item() < 1e-4, (case, boost, splits)
        tol = 1e-4 * max(1.0, ref_out.abs().max().item())
        assert (merged - ref_out).abs().max().item() < tol, (case, boost, splits)
        assert nonempty.sum().item() > n or splits == 1, "a long prefix takes several shares"
    # Calibration: the part of another scale (a wrong softmax base would be one) is caught.
    out, lse = prefix_attention_part(q, k, v, indptr, indices, w, scale * 1.5, **latent)
    assert (lse[0] - ref_lse).abs().max().item() > 1e-2, case
print("interpreted prefix part OK")
"""


def test_prefix_attention_part_interpreted_equals_reference(run_interpreted):
    """`prefix_attention_part` alone, under Triton's interpreter: its shares (one, or four of
    a long prefix), merged by their log-sum-exp, are the reference prefix part (output and
    natural-log lse), in the latent variant and with grouped heads (keys whose scores jump late
    in a prefix, or peak in its first tile); a wrong scale is caught."""
    _needs_loaded_loop_bounds()
    run_interpreted(_PREFIX_PART_CHECK, "interpreted prefix part OK")


@pytest.mark.gpu
@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize(
    "dv_blocks,splits",
    [((None, None), 1), ((128, 128), 1), ((None, 128), 1), ((None, None), 4), ((128, 128), 16)],
)
def test_tree_attention_on_gpu_bf16(mla, dv_blocks, splits):
    from sglang_ddtree.core.tree_attention import tree_attention

    if mla:  # K2.6-like latent widths: keys 576 (512 latent + 64 rope), values the latent
        shape = dict(bs=4, w=33, hq=16, hkv=1, d=576, dv=512)
    else:
        shape = dict(bs=4, w=33, hq=32, hkv=8, d=128, dv=128)
    args, scale = random_case(
        **shape, prefix=[300, 1, 0, 129], seed=4, dtype=torch.bfloat16, device="cuda", mla=mla
    )
    got = tree_attention(
        *args, scale, prefix_dv_block=dv_blocks[0], tree_dv_block=dv_blocks[1],
        prefix_splits=splits,
    )  # fmt: skip
    want = tree_attention_reference(*args, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("bs,prefix", [(1, [20000]), (8, [4000, 1, 700, 64, 2500, 33, 999, 5])])
def test_latent_variant_on_a_slot_table_on_gpu(bs, prefix):
    """One K2.6 rank's latent (keys 576, values their first 512, 8 query heads, W 8) read slot
    by slot, as triton's MLA verify launches it (`launch_settings` with the latent variant:
    64 rows, 8 warps, 128 shares at bs 1 merged over 32-column tree tiles 8 shares a load),
    equal to the masked reference in bf16."""
    from sglang_ddtree.core.tree_attention import launch_settings, tree_attention

    args, scale = random_case(
        bs=bs, w=8, hq=8, hkv=1, d=576, dv=512, prefix=prefix, seed=bs, dtype=torch.bfloat16,
        device="cuda", mla=True,
    )  # fmt: skip
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    settings = launch_settings(bs, 8, 8, 1, 512, sms, latent_d=576)
    assert settings["prefix_latent"] and settings["prefix_rows"] == 64
    got = tree_attention(*args, scale, **settings)
    want = tree_attention_reference(*args, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("w", [5, 8, 9, 17, 33, 65])
@pytest.mark.parametrize("bs", [1, 4, 32])
def test_wide_mha_prefix_as_the_hook_launches_it_on_gpu(bs, w):
    """Qwen3-8B's heads (32 query over 8 KV heads, 128 wide) as the hook launches them
    (`launch_settings`: up to 128 of a KV head's W x G rows a program, the queries loaded
    once, slots read a tile ahead, its shares), over ragged prefixes (empty, one key, shorter
    than a 64-key tile, several thousand keys), equal to the masked reference in bf16."""
    from sglang_ddtree.core.tree_attention import launch_settings, tree_attention

    lengths = [5000, 0, 1, 63, 64, 129, 2500, 777]
    prefix = [lengths[i % len(lengths)] for i in range(bs)]
    args, scale = random_case(
        bs=bs, w=w, hq=32, hkv=8, d=128, dv=128, prefix=prefix, seed=bs * 100 + w,
        dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    settings = launch_settings(bs, w, 32, 8, 128, sms)
    assert settings.get("prefix_q_once", False) == (w * 4 > 16), settings
    got = tree_attention(*args, scale, **settings)
    want = tree_attention_reference(*args, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    # Calibration: the same launch at another scale is caught at this tolerance.
    wrong = tree_attention(*args, scale * 1.5, **settings)
    assert (wrong.float() - want.float()).abs().max().item() > 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mla", [False, True])
def test_tree_attention_on_gpu_bf16_at_w65_with_shares(mla):
    """W = 65 (budget 64): the tree kernel over 128 key nodes in row tiles (at `kernel_warps`'
    warps), a long prefix in 4 shares merged in the tree kernel, as the hook launches it at
    bs 1."""
    from sglang_ddtree.core.tree_attention import tree_attention, value_tiling

    if mla:
        shape = dict(bs=2, w=65, hq=8, hkv=1, d=576, dv=512)
    else:
        shape = dict(bs=2, w=65, hq=32, hkv=8, d=128, dv=128)
    args, scale = random_case(
        **shape, prefix=[2000, 37], seed=6, dtype=torch.bfloat16, device="cuda", mla=mla
    )
    blocks = value_tiling(shape["dv"])
    got = tree_attention(
        *args, scale, prefix_dv_block=blocks[0], tree_dv_block=blocks[1], prefix_splits=4
    )
    want = tree_attention_reference(*args, scale)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


_HOOK_CHECK = """
import torch
from types import SimpleNamespace
from test_tree_attention import random_case
from sglang_ddtree.core.layout import flatten_verify_mask
from sglang_ddtree.core.tree_attention import tree_attention_reference
from sglang_ddtree.srt.ddtree_attention.triton_backend import TritonSplitVerify
from sglang_ddtree.srt.ddtree_attention_hook import verify_hooks
hooks = verify_hooks(TritonSplitVerify)
backend_init_hook, forward_extend_hook = hooks["__init__"], hooks["forward_extend"]
assert sorted(hooks) == ["__init__", "forward_extend"]  # it reads SGLang's metadata as it is

# Four query heads a KV head: W x G = 20 rows, the wide MHA tile (`_wide_mha_prefix`).
from sglang_ddtree.core.tree_attention import launch_settings
assert launch_settings(2, 5, 4, 1, 16, 1)["prefix_q_once"]
args, scale = random_case(bs=2, w=5, hq=4, hkv=1, d=16, dv=16, prefix=[6, 11], seed=9)
q, k_buf, v_buf, indptr, indices, loc, mask = args
prefix = indptr[1:] - indptr[:-1]
sizes = (prefix + 5) * 5
md = SimpleNamespace(kv_indptr=indptr, kv_indices=indices, mask_indptr=torch.cat(
    [torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)]),
    custom_mask=flatten_verify_mask(mask, prefix, int(sizes.sum())), swa_out_cache_loc=None)
layer = SimpleNamespace(layer_id=0, tp_q_head_num=4, qk_head_dim=16, v_head_dim=16,
                        scaling=scale, k_scale=None, sliding_window_size=-1, logit_cap=0,
                        is_cross_attention=False, xai_temperature_len=-1)
want_k, want_v = k_buf.clone(), v_buf.clone()
new_k, new_v = k_buf[loc].clone(), v_buf[loc].clone()  # this step's nodes, written by the hook
k_buf[loc] = 0.0
v_buf[loc] = 0.0
class Pool:
    def set_kv_buffer(self, layer, loc, k, v):
        k_buf[loc] = k
        v_buf[loc] = v
    def get_key_buffer(self, i):
        return k_buf
    def get_value_buffer(self, i):
        return v_buf
# As in SGLang 0.5.17: the KV pool is the backend's (ForwardBatch has no token_to_kv_pool).
backend = SimpleNamespace(forward_metadata=md, page_size=1, dcp_size=1, _translate_kv_loc=None,
                          use_mla=False, token_to_kv_pool=Pool())
fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True),
                     out_cache_loc=loc, batch_size=2)
calls = []
original = lambda *a, **kw: calls.append(a) or "original"
# The first verify that takes the split logs SPLIT_LOG_LINE (the e2e and in-tree checks read it).
import logging
from sglang_ddtree.srt.ddtree_attention.verify_backend import SPLIT_LOG_LINE
logged = []
handler = logging.Handler()
handler.emit = lambda record: logged.append(record.getMessage())
logger = logging.getLogger("sglang_ddtree.srt.ddtree_attention.verify_backend")
logger.addHandler(handler)
logger.setLevel(logging.INFO)  # logged at info
# Built for a DDTREE server's target: the construction hook decides it takes the verifies.
runner = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="DDTREE"),
                         is_draft_worker=False)
backend_init_hook(lambda b, model_runner: None, backend, runner)
assert backend.ddtree_takes_verify
# Called as SGLang's AttentionBackend.forward calls forward_extend: save_kv_cache by keyword.
out = forward_extend_hook(original, backend, q.reshape(10, -1), new_k, new_v, layer, fb,
                          save_kv_cache=True)
assert len(logged) == 1 and SPLIT_LOG_LINE in logged[0], logged
want = tree_attention_reference(q, want_k, want_v, indptr, indices, loc, mask, scale)
assert not calls and out.shape == (10, 64)
assert (out.view(10, 4, 16) - want).abs().max() < 1e-4
assert torch.equal(k_buf, want_k)  # the nodes' KV was saved first
# Not a DDTREE verify: the backend's own kernel runs.
layer.logit_cap = 30.0
assert forward_extend_hook(original, backend, q, new_k, new_v, layer, fb, save_kv_cache=True) == "original"
layer.logit_cap = 0
# MLA as SGLang's triton backend gets it (absorbed): one KV head, keys the latent plus rope,
# values the latent; the pool stores the keys only, its value buffer their latent slice.
args, scale = random_case(bs=2, w=5, hq=4, hkv=1, d=40, dv=32, prefix=[6, 11], seed=10, mla=True)
q, k_buf, v_buf, indptr, indices, loc, mask = args
assert v_buf.data_ptr() == k_buf.data_ptr()  # a view, as MLATokenToKVPool.get_value_buffer
want_k = k_buf.clone()
new_k = k_buf[loc].clone()
k_buf[loc] = 0.0
class MLAPool:
    def set_kv_buffer(self, layer, loc, k, v):
        k_buf[loc] = k
    def get_key_buffer(self, i):
        return k_buf
    def get_value_buffer(self, i):
        return v_buf
md.kv_indptr, md.kv_indices, fb.out_cache_loc = indptr, indices, loc
md.custom_mask = flatten_verify_mask(mask, prefix, int(sizes.sum()))
layer = SimpleNamespace(**dict(vars(layer), qk_head_dim=40, v_head_dim=32, scaling=scale))
backend = SimpleNamespace(**dict(vars(backend), use_mla=True, token_to_kv_pool=MLAPool()))
calls.clear()
import sglang_ddtree.core.tree_attention as kernels
launched, real = [], kernels.tree_attention
kernels.tree_attention = lambda *a, **kw: launched.append(kw) or real(*a, **kw)
out = forward_extend_hook(original, backend, q.reshape(10, -1), new_k, new_k[..., :32], layer, fb)
kernels.tree_attention = real
assert launched and launched[0].get("prefix_latent") is True  # the latent view: its variant
want = tree_attention_reference(q, want_k, want_k[..., :32], indptr, indices, loc, mask, scale)
assert not calls and out.shape == (10, 4 * 32)
assert (out.view(10, 4, 32) - want).abs().max() < 1e-4
assert torch.equal(k_buf, want_k)
# A backend built for another algorithm's target: the backend's own kernel.
backend_init_hook(lambda b, model_runner: None, backend,
                  SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="EAGLE"),
                                  is_draft_worker=False))
assert forward_extend_hook(original, backend, q, new_k, new_v, layer, fb, save_kv_cache=True) == "original"
# A DDTREE server that verifies on triton's own extend kernel (the reference): the same.
backend_init_hook(lambda b, model_runner: None, backend, SimpleNamespace(
    server_args=SimpleNamespace(speculative_algorithm="DDTREE",
                                speculative_ddtree_verify_attention="triton_extend"),
    is_draft_worker=False))
assert not backend.ddtree_takes_verify
assert forward_extend_hook(original, backend, q, new_k, new_v, layer, fb, save_kv_cache=True) == "original"
assert len(logged) == 1  # once per process
print("interpreted attention hook OK")
"""


def test_attention_hook_interpreted(run_interpreted):
    """The backend hook: on a DDTREE verify it saves the nodes' KV, then returns the split
    attention over the backend's own metadata (the reference's result); otherwise it calls the
    backend's kernel."""
    _needs_loaded_loop_bounds()
    run_interpreted(_HOOK_CHECK, "interpreted attention hook OK")


def test_tree_verify_attention_takes_only_a_ddtree_verify():
    """``handles``: a target verify on a backend built for a DDTREE server's target (that did
    not name another verify attention), on a layout the kernels read; anything else (the
    reference kernel named, another algorithm, the drafter's backend, another mode, a logit
    cap, sinks, a pool that is not slot rows) stays with the backend, and ``forward_extend``
    returns None for it."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_attention.triton_backend import TritonSplitVerify as split
    from sglang_ddtree.srt.ddtree_attention.verify_backend import takes_ddtree_verify

    def runner(algo="DDTREE", draft=False, verify=None):
        args = SimpleNamespace(speculative_algorithm=algo)
        if verify is not None:
            args.speculative_ddtree_verify_attention = verify
        return SimpleNamespace(server_args=args, is_draft_worker=draft)

    assert takes_ddtree_verify(runner(), split)
    assert takes_ddtree_verify(runner("ddtree"), split)  # SGLang parses the name in any case
    assert takes_ddtree_verify(runner(verify="triton"), split)
    assert not takes_ddtree_verify(runner("DFLASH"), split)
    assert not takes_ddtree_verify(runner(draft=True), split)
    assert not takes_ddtree_verify(None, split)
    assert not takes_ddtree_verify(runner(verify="triton_extend"), split)

    md = SimpleNamespace(
        custom_mask=torch.ones(1), mask_indptr=torch.zeros(2), swa_out_cache_loc=None
    )
    backend = SimpleNamespace(
        forward_metadata=md, token_to_kv_pool=object(), page_size=1, ddtree_takes_verify=True
    )
    layer = SimpleNamespace(logit_cap=0, k_scale=None, sliding_window_size=-1)
    fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: True))
    k = v = torch.zeros(1)
    assert split.handles(backend, k, v, layer, fb, {})
    assert not split.handles(backend, k, v, layer, fb, {"sinks": torch.zeros(1)})
    assert not split.handles(
        backend, k, v, SimpleNamespace(**dict(vars(layer), logit_cap=30.0)), fb, {}
    )
    paged = SimpleNamespace(**dict(vars(backend), page_size=16))
    assert split.handles(paged, k, v, layer, fb, {})  # pages of slot rows: read by slot
    hnd = SimpleNamespace(**dict(vars(backend), token_to_kv_pool=SimpleNamespace(use_hnd=True)))
    assert not split.handles(hnd, k, v, layer, fb, {})  # head-major pages: not slot rows
    other = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: False))
    assert not split.handles(backend, k, v, layer, other, {})
    assert split.forward_extend(backend, None, k, v, layer, other) is None
    decided_no = SimpleNamespace(**dict(vars(backend), ddtree_takes_verify=False))
    assert not split.handles(decided_no, k, v, layer, fb, {})
    unhooked = SimpleNamespace(
        **{n: x for n, x in vars(backend).items() if n != "ddtree_takes_verify"}
    )
    assert not split.handles(unhooked, k, v, layer, fb, {})  # built before the hooks applied


def test_a_target_backend_built_without_the_hook_is_refused():
    """At startup: the target's triton or flashmla backend (through SGLang's wrappers) must have
    decided at construction to take DDTREE's verifies; otherwise the worker refuses to start
    rather than verify without the tree mask. Verify backends that take none (SGLang's own
    custom-mask kernels) need nothing."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_attention.attention_registry import (
        VERIFY_BACKENDS,
        missing_verify_hook,
    )

    hooked = SimpleNamespace(ddtree_takes_verify=True)
    unhooked = SimpleNamespace()
    hybrid = SimpleNamespace(prefill_backend=unhooked, decode_backend=hooked)
    wrapped = SimpleNamespace(full_attn_backend=hybrid)
    tbo = SimpleNamespace(primary=unhooked, children=[unhooked, hooked])
    triton, flashmla = VERIFY_BACKENDS["triton"], VERIFY_BACKENDS["flashmla"]
    for backend in (hooked, hybrid, wrapped, tbo):
        assert missing_verify_hook(backend, triton) is None
    error = missing_verify_hook(SimpleNamespace(full_attn_backend=unhooked), flashmla)
    assert "flashmla" in error and "hook" in error
    assert missing_verify_hook(unhooked, VERIFY_BACKENDS["flashinfer"]) is None  # SGLang's mask
    assert missing_verify_hook(unhooked, VERIFY_BACKENDS["triton_extend"]) is None  # its kernel
    assert missing_verify_hook(unhooked, None) is None  # refused at start already


def test_the_reference_verify_is_refused_on_flashmla():
    """Triton's extend kernel (the reference) verifies on triton only: named on flashmla, whose
    own verify kernel applies no tree mask, it is refused at start with what to pass."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_args import check_server_args

    def cfg(backend, verify):
        return SimpleNamespace(
            attention_backend=backend, page_size=64, speculative_draft_model_path="/d",
            speculative_ddtree_verify_attention=verify,
        )  # fmt: skip

    assert check_server_args(cfg("flashmla", None)) == []
    assert check_server_args(cfg("triton", "triton_extend")) == []
    (error,) = check_server_args(cfg("flashmla", "triton_extend"))
    assert "triton_extend" in error and "--attention-backend triton" in error
    (error,) = check_server_args(cfg("triton", "on"))
    assert "'on' is none of DDTREE's verify attention backends" in error
    assert "triton_extend" in error


def test_the_split_is_each_backends_default_verify():
    """Unnamed, a server verifies on its attention backend's own entry (triton: the split);
    --speculative-ddtree-verify-attention names another (triton_extend: the extend kernel);
    every entry wraps its backend's SGLang class, and only the splits take verifies."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_attention.attention_registry import (
        VERIFY_BACKENDS,
        verify_backend,
    )

    triton = SimpleNamespace(attention_backend="triton")
    assert verify_backend(triton) is VERIFY_BACKENDS["triton"]
    assert VERIFY_BACKENDS["triton"].takes_verify and VERIFY_BACKENDS["flashmla"].takes_verify
    reference = SimpleNamespace(**vars(triton), speculative_ddtree_verify_attention="triton_extend")
    assert verify_backend(reference) is VERIFY_BACKENDS["triton_extend"]
    assert not VERIFY_BACKENDS["triton_extend"].takes_verify
    assert not VERIFY_BACKENDS["flashinfer"].takes_verify
    assert verify_backend(SimpleNamespace(attention_backend="fa3")) is None
    for name, verify in VERIFY_BACKENDS.items():
        assert verify.name == name
        assert verify.backend_class.startswith("sglang.srt.layers.attention.")
    assert VERIFY_BACKENDS["triton_extend"].backend_class == VERIFY_BACKENDS["triton"].backend_class


@pytest.mark.parametrize(
    "case",
    [
        "k26_bs1_paged",
        "k26_bs8_paged",
        "k26_bs8_ahead",
        "k26_bs8_n32s4ahead",
        "k26_bs8_gluon",
        "k26_bs1_gluon",
        "k26_bs4_gluon",
        "k26w12_bs2_gluon",
        "k26w32_bs32_gluon",
        "k26_bs64_gluon",
        "tiny_mla_bs4",
        "tiny_mla_bs4_ahead",
        "8b_bs1_full_mask",
        "8bw33_bs8_wide_rows",
    ],
)
def test_the_hooks_launches_compile_for_hopper(load_benchmark, case):
    """Every kernel launch `tree_attention` makes with the hook's settings (`launch_settings`)
    compiles for sm_90a with Triton's compiler, on a machine without a GPU
    (`kernel_registers.py`): what the CPU interpreter never checks (a loop-carried variable
    that changes type, a constexpr branch the interpreter tolerates). Cases: one K2.6 TP-8
    rank (8 heads, latent 512 + rope 64, W 8) on FlashMLA's 64-slot pages at bs 1 (128 shares,
    the chunked merge) and bs 8, also with page numbers read ahead (and half-page tiles in four
    stages); the tiny pair's 4-head latent on a slot table (also with its slots read ahead);
    the 8B shape (32 / 8 heads of 128, W 16) from SGLang's verify mask; the K2.6 rank's prefix
    as the Gluon kernel, where the hook takes it on Hopper (bs 8, 4 and 1; W 12's half-masked
    second row tile at bs 2, W 32's four tiles at bs 32 over one share, bs 64); and the 8B
    shape's prefix at 128 rows a program with its queries loaded once (benchmark cells, not
    yet a hook launch)."""
    regs = load_benchmark("kernel_registers")
    missing = regs.compiler_missing()
    if missing:
        pytest.skip(missing)
    from sglang_ddtree.core.layout import flatten_verify_mask
    from sglang_ddtree.core.tree_attention import tree_attention

    shape, bs = case.split("_")[0], int(case.split("_bs")[1].split("_")[0])
    shape, _, width = shape.partition("w")  # "k26w12": the K2.6 rank at W 12
    gluon = "_gluon" in case  # the Gluon prefix kernel (`core.tree_attention_gluon`)
    if gluon:
        pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    call, kw = regs.hook_case(bs, shape, gluon=gluon, width=int(width) if width else None)
    assert kw.get("prefix_gluon", False) == gluon  # the hook's pick on Hopper at 64 rows
    if case == "k26_bs1_paged":
        assert kw["tree_merge_chunk"] > 1 and kw["prefix_splits"] > 1 and kw["page_size"] == 64
    if case == "k26_bs8_ahead":
        kw["prefix_index_ahead"] = True
    if case == "k26_bs8_n32s4ahead":  # four stages of half-page tiles fill shared memory
        kw.update(prefix_index_ahead=True, prefix_keys=32, prefix_stages=4)
    if case == "tiny_mla_bs4_ahead":  # a slot table's slots read a tile ahead
        kw["prefix_index_ahead"] = True
    if case == "8bw33_bs8_wide_rows":  # the benchmark's MHA cells: 128 rows, queries once
        kw.update(prefix_rows=128, warps=(8, None), prefix_q_once=True)
    if case == "8b_bs1_full_mask":
        q, k, v, indptr, indices, loc, mask, scale = call
        w = mask.shape[1]
        prefix = (indptr[1:] - indptr[:-1]).long()
        sizes = (prefix + w) * w
        mask_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
        full = flatten_verify_mask(mask, prefix, int(sizes.sum()))
        call = (q, k, v, indptr, indices, loc, None, scale)
        kw.update(full_mask=full, mask_indptr=mask_indptr, num_nodes=w)
    with regs.record_launches() as launches:
        tree_attention(*call, **kw)
    prefix_kernel = "_latent_prefix_gluon" if gluon else "_prefix_attention_kernel"
    assert {name for name, (_, recorded) in launches.items() if recorded} == {
        prefix_kernel,
        "_tree_attention_kernel",
    }
    for name, (kernel, recorded) in launches.items():
        for args, launch_kw in recorded:  # one launch each of the two kernels the case runs
            compiled = regs.compile_launch(kernel, args, launch_kw)
            registers, _ = regs.usage(compiled)  # what cuobjdump reads off the cubin
            assert 0 < registers <= 255, (case, name, registers)
            if name == "_latent_prefix_gluon":  # two partitions, each with its products
                ttgir = compiled.asm["ttgir"]
                assert "ttg.warp_specialize" in ttgir and "async_tma_copy_global_to_local" in ttgir
                # Per warpgroup: the scores a latent half at a time and the rope, two values.
                assert ttgir.count("warp_group_dot ") >= 2 * (2 + 1 + 2), case
