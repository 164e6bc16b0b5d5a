"""The flashmla backend's DDTREE verify: this project's kernels over FlashMLA's 64-slot pages
(`srt.ddtree_attention.flashmla_backend.FlashMLASplitVerify`), and the tree verify on a prefix
part computed elsewhere (``core.tree_attention_with_prefix``), as the benchmark times FlashMLA's.

CPU: the paged prefix kernel and the hook under Triton's interpreter against the masked
reference (a wrong block table caught); the per-forward metadata in static buffers; the merge's
logic, the prefix part from torch, against the masked reference, calibrated (a prefix part with
a wrong log-sum-exp fails). GPU (``gpu`` marker): the own kernels (Triton, and Gluon on Hopper)
and the benchmark's FlashMLA prefix part merged with the ancestor block, on a 64-slot paged
latent cache (K2.6's one-rank widths: 8 query heads, keys 576, values 512), ragged prefixes on
and across page boundaries, the nodes' KV crossing into the next page, bs 1-64, one case
replayed from a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.core.tree_attention import tree_attention_reference


def prefix_part_reference(q, k_buffer, v_buffer, kv_indptr, kv_indices, w, sm_scale):
    """Every node against its request's prefix alone, no mask: ``([bs, W, Hq, Dv] output,
    [bs, Hq, W] float32 natural-log log-sum-exp)``, as FlashMLA's decode kernel returns them."""
    bs = kv_indptr.numel() - 1
    hq, hkv = q.shape[1], k_buffer.shape[1]
    heads = torch.arange(hq) // (hq // hkv)
    out = torch.empty(bs, w, hq, v_buffer.shape[-1], dtype=q.dtype)
    lse = torch.empty(bs, hq, w, dtype=torch.float32)
    for b in range(bs):
        pre = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        k = k_buffer[pre][:, heads].float()  # [P, Hq, D]
        v = v_buffer[pre][:, heads].float()
        scores = torch.einsum("ihd,jhd->hij", q[b * w : (b + 1) * w].float(), k) * sm_scale
        lse[b] = torch.logsumexp(scores, -1)
        out[b] = torch.einsum("hij,jhd->ihd", scores.softmax(-1), v).to(q.dtype)
    return out, lse


def paged_case(prefix, w, page, d, generator):
    """Requests' KV in a shuffled pool of ``page``-slot pages, as SGLang's paged pools hold it:
    ``(block_table [bs, pages] int32, k [slots, 1, d], prefix slots (flat), node slots)``, each
    request's W nodes in the slots right after its prefix; and a random ancestor mask."""
    from sglang_ddtree.core.layout import ancestor_mask

    bs = len(prefix)
    pages = [-(-(p + w) // page) for p in prefix]
    order = torch.randperm(sum(pages) + 1, generator=generator)
    table = torch.zeros(bs, max(pages), dtype=torch.int32)
    used = 0
    for b, count in enumerate(pages):
        table[b, :count] = order[used : used + count]
        used += count
    k = torch.randn((sum(pages) + 1) * page, 1, d, generator=generator)
    flat, loc = [], []
    for b, p in enumerate(prefix):
        pos = torch.arange(p + w)
        slots = table[b, pos // page].long() * page + pos % page
        flat.append(slots[:p])
        loc.append(slots[p:])
    parents = torch.full((bs, w), -1)
    for i in range(1, w):
        parents[:, i] = torch.randint(0, i, (bs,), generator=generator)
    return table, k, torch.cat(flat), torch.cat(loc), ancestor_mask(parents, w - 1)


_INTERPRETED_CHECK = """
import torch
from test_tree_attention import random_case
from test_flashmla_verify import prefix_part_reference
from sglang_ddtree.core.tree_attention import tree_attention_reference, tree_attention_with_prefix

cases = [
    dict(bs=3, w=7, hq=4, hkv=1, d=40, dv=32, prefix=[5, 1, 37], seed=1, mla=True),
    dict(bs=2, w=17, hq=2, hkv=1, d=144, dv=128, prefix=[9, 70], seed=2, mla=True),  # W > 16
    dict(bs=2, w=5, hq=4, hkv=2, d=24, dv=20, prefix=[3, 11], seed=3),  # grouped heads
]
for case in cases:
    args, scale = random_case(**case)
    q, k, v, indptr, indices, loc, mask = args
    w = mask.shape[1]
    out, lse = prefix_part_reference(q, k, v, indptr, indices, w, scale)
    want = tree_attention_reference(*args, scale)
    for dv_block, rows in ((None, None), (16, None), (None, 16)):
        got = tree_attention_with_prefix(q, k, v, loc, mask, scale, out, lse,
                                         tree_dv_block=dv_block, tree_rows=rows)
        err = (got - want).abs().max().item()
        assert err < 1e-4, (case, dv_block, rows, err)
    # Calibration: a prefix part whose log-sum-exp is off by log 2 is far from the reference.
    bad = tree_attention_with_prefix(q, k, v, loc, mask, scale, out, lse + 0.693)
    assert (bad - want).abs().max().item() > 1e-2, case
print("interpreted prefix merge OK")
"""


def test_tree_attention_with_prefix_interpreted(run_interpreted):
    run_interpreted(_INTERPRETED_CHECK, "interpreted prefix merge OK")


def wrong_pages(table: torch.Tensor) -> torch.Tensor:
    """Each request's first two pages swapped in its table (the reads stay in the cache)."""
    wrong = table.clone()
    wrong[:, [0, 1]] = table[:, [1, 0]]
    return wrong


_PAGED_CHECK = """
import torch
from test_flashmla_verify import paged_case, wrong_pages
from sglang_ddtree.core.tree_attention import tree_attention, tree_attention_reference

g = torch.Generator().manual_seed(0)
for page, prefix in ((4, [5, 1, 9]), (16, [33, 16, 2])):
    bs, w, hq, d, dv = 3, 5, 4, 40, 32
    table, k, kv_indices, node_loc, mask = paged_case(prefix, w, page, d, g)
    v = k[..., :dv]  # MLA: the values are the latent slice of the keys
    q = torch.randn(bs * w, hq, d, generator=g)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.tensor(prefix).cumsum(0)])
    scale = d ** -0.5
    want = tree_attention_reference(q, k, v, kv_indptr, kv_indices, node_loc, mask, scale)
    got = tree_attention(q, k, v, kv_indptr, table, node_loc, mask, scale, page_size=page)
    assert (got - want).abs().max().item() < 1e-4, (page, prefix)
    # The latent variant (one load of a key tile serves both products), wider key tiles.
    for rows, keys, dv_block in ((16, 32, None), (32, 64, None), (16, 32, 16)):
        lat = tree_attention(q, k, v, kv_indptr, table, node_loc, mask, scale, page_size=page,
                             prefix_latent=True, prefix_rows=rows, prefix_keys=keys,
                             prefix_dv_block=dv_block)
        assert (lat - want).abs().max().item() < 1e-4, (page, prefix, rows, keys, dv_block)
    # Page numbers read a key tile ahead (a tile of 16 keys, one page; an empty share too).
    for splits in (1, 2) if page == 16 else ():
        ahead = tree_attention(q, k, v, kv_indptr, table, node_loc, mask, scale,
                               page_size=page, prefix_latent=True, prefix_rows=16,
                               prefix_keys=16, prefix_splits=splits, prefix_index_ahead=True)
        assert (ahead - want).abs().max().item() < 1e-4, (page, prefix, splits)
    # The latent variant over the slot list (SGLang's triton backend's layout).
    flat_lat = tree_attention(q, k, v, kv_indptr, kv_indices, node_loc, mask, scale,
                              prefix_latent=True, prefix_rows=32, prefix_keys=64)
    assert (flat_lat - want).abs().max().item() < 1e-4, (page, prefix)
    # The slots of a key tile read a tile ahead (tiles of 16 over prefixes of up to 33 keys).
    flat_ahead = tree_attention(q, k, v, kv_indptr, kv_indices, node_loc, mask, scale,
                                prefix_latent=True, prefix_rows=16, prefix_keys=16,
                                prefix_index_ahead=True)
    assert (flat_ahead - want).abs().max().item() < 1e-4, (page, prefix)
    # Calibration: each request's first two pages swapped in its table (reads stay in the
    # cache) is far from the reference.
    bad = tree_attention(q, k, v, kv_indptr, wrong_pages(table), node_loc, mask, scale,
                         page_size=page)
    assert (bad - want).abs().max().item() > 1e-2, (page, prefix)
print("interpreted paged prefix OK")
"""


def test_own_prefix_kernel_reads_a_paged_cache_interpreted(run_interpreted):
    """DDTREE's own prefix kernel on a block table of pages (FlashMLA's cache layout), under
    Triton's interpreter: ragged prefixes on and across page boundaries, the nodes in the
    request's next slots, equal to the masked reference (also its latent variant, values read
    from the keys' tile or in value tiles, and wider key tiles); a wrong table is caught."""
    run_interpreted(_PAGED_CHECK, "interpreted paged prefix OK")


_OWN_PREFIX_HOOK_CHECK = """
import torch
from types import SimpleNamespace
from test_flashmla_verify import paged_case
from sglang_ddtree.core.tree_attention import tree_attention_reference
from sglang_ddtree.srt.ddtree_attention.flashmla_backend import (
    PAGE_SIZE, FlashMLASplitVerify, FlashMLAVerifyMetadata)
from sglang_ddtree.srt.ddtree_attention_hook import verify_hooks
flashmla_forward_extend_hook = verify_hooks(FlashMLASplitVerify)["forward_extend"]

g = torch.Generator().manual_seed(1)
bs, w, hq, d, dv = 3, 4, 2, 40, 32
prefix = [70, 5, 130]
table, k_cache, flat, node_loc, mask = paged_case(prefix, w, PAGE_SIZE, d, g)
nodes_k = k_cache[node_loc].clone()  # this step's nodes' latent, written by the hook
want_cache = k_cache.clone()
k_cache[node_loc] = 0.0
q = torch.randn(bs * w, hq, d, generator=g)

class Pool:
    def set_kv_buffer(self, layer, loc, k, v):
        k_cache[loc] = k
    def get_key_buffer(self, i):
        return k_cache

prefix_lens = torch.tensor(prefix, dtype=torch.int32)
backend = SimpleNamespace(
    ddtree_takes_verify=True, is_fp8_kvcache=False, dcp_world_size=1, kv_lora_rank=dv,
    kv_cache_dim=d, token_to_kv_pool=Pool(),
    forward_metadata=SimpleNamespace(block_kv_indices=table),
    ddtree_verify=FlashMLAVerifyMetadata(
        torch.nn.functional.pad(prefix_lens.long().cumsum(0), (1, 0)), mask),
)
layer = SimpleNamespace(layer_id=0, tp_q_head_num=hq, head_dim=d, scaling=d ** -0.5)
fb = SimpleNamespace(batch_size=bs, out_cache_loc=node_loc,
                     forward_mode=SimpleNamespace(is_target_verify=lambda: True))
calls = []
out = flashmla_forward_extend_hook(lambda *a, **k: calls.append(a), backend,
                                   q.reshape(bs * w, -1), nodes_k, nodes_k[..., :dv], layer, fb,
                                   save_kv_cache=True)  # by keyword, as SGLang passes it
assert not calls and out.shape == (bs * w, hq * dv)
kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), prefix_lens.long().cumsum(0)])
want = tree_attention_reference(q, want_cache, want_cache[..., :dv], kv_indptr, flat, node_loc,
                                mask, d ** -0.5)
assert (out.view(bs * w, hq, dv) - want).abs().max().item() < 1e-4
assert torch.equal(k_cache, want_cache)  # the nodes' latent was saved first
print("interpreted own prefix on flashmla OK")
"""


def test_flashmla_verify_with_the_own_prefix_kernel_interpreted(run_interpreted):
    """The flashmla backend's DDTREE verify saves the nodes' latent and computes the whole
    attention with this project's kernels over the backend's block table of 64-slot pages (no
    FlashMLA call), equal to the masked reference."""
    run_interpreted(_OWN_PREFIX_HOOK_CHECK, "interpreted own prefix on flashmla OK")


def test_prefix_part_reference_merges_to_the_reference():
    """The torch prefix part, merged with the tree part by ``merge_attention_states``, is the
    masked reference: the interpreted check's input is right."""
    from test_tree_attention import random_case

    from sglang_ddtree.core.tree_attention import merge_attention_states

    args, scale = random_case(2, 5, 4, 1, 24, 16, [6, 2], seed=5, mla=True)
    q, k, v, indptr, indices, loc, mask = args
    w = 5
    out, lse = prefix_part_reference(q, k, v, indptr, indices, w, scale)
    # The tree part alone: each request's nodes under the ancestor mask, with its lse.
    want = tree_attention_reference(*args, scale)
    parts = []
    for b in range(2):
        qb = q[b * w : (b + 1) * w].float()
        kb = k[loc[b * w : (b + 1) * w].long()][:, 0].float()
        vb = v[loc[b * w : (b + 1) * w].long()][:, 0].float()
        s = torch.einsum("ihd,jd->hij", qb, kb) * scale
        s = s.masked_fill(~mask[b], float("-inf"))
        parts.append((torch.einsum("hij,jd->ihd", s.softmax(-1), vb), torch.logsumexp(s, -1)))
    o2 = torch.cat([p[0] for p in parts])
    l2 = torch.cat([p[1].transpose(0, 1) for p in parts])
    o1 = out.reshape(2 * w, 4, -1)
    l1 = lse.transpose(1, 2).reshape(2 * w, 4)
    got = merge_attention_states(o1, l1, o2, l2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "bs,w,prefix,hq",
    [
        (1, 16, [8192], 8),
        (4, 16, [1, 63, 64, 65], 8),  # on and across a page boundary; nodes spill into a new page
        (3, 33, [127, 128, 129], 8),
        (8, 32, [5000, 64, 2, 700, 4097, 33, 640, 1], 8),
        (64, 8, [37 + 61 * i for i in range(64)], 8),
        (2, 65, [2000, 50], 8),
        (4, 8, [20, 300, 64, 1000], 4),  # the tiny Kimi-shaped pair's 4 heads at its W 8
        (2, 8, [700, 3000], 16),  # one TP-4 rank of K2.6
    ],
)
def test_flashmla_split_equals_reference(bs, w, prefix, hq, load_benchmark):
    """The benchmark's FlashMLA reference: FlashMLA's prefix part (paged latent cache, 64-slot
    pages, shuffled) merged with the ancestor block equals the masked reference within bf16
    rounding, and a CUDA-graph replay gives the same bits as the eager call."""
    from conftest import graph_replayed

    pytest.importorskip("sgl_kernel.flash_mla")
    bench = load_benchmark("bench_tree_attention")
    t = bench.random_verify(bs, w, prefix, hq, 1, 576, seed=bs + w, dv=512, page=64)
    scale = 576**-0.5
    prefix_part, split = bench.flashmla_split(t, w, scale)
    got = split()
    want = tree_attention_reference(
        t["q"], t["k"], t["v"], t["kv_indptr"], t["kv_indices"], t["node_loc"], t["mask"], scale
    )
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    # FlashMLA's lse is the natural log of the prefix part's sum (what the merge assumes).
    _, lse = prefix_part()
    out_ref, lse_ref = prefix_part_reference(
        t["q"].cpu(), t["k"].cpu(), t["v"].cpu(), t["kv_indptr"].cpu(), t["kv_indices"].cpu(),
        w, scale,
    )  # fmt: skip
    torch.testing.assert_close(lse.cpu(), lse_ref, atol=2e-2, rtol=1e-3)
    replayed, _graph = graph_replayed(split)
    assert torch.equal(replayed, got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "bs,w,prefix,hq",
    [
        (4, 8, [20, 300, 64, 1000], 4),
        (8, 16, [5000, 64, 2, 700, 4097, 33, 640, 1], 8),
        (4, 32, [3000, 1, 129, 9000], 8),  # four row tiles a request
        (1, 8, [20000], 8),  # one request: the most prefix shares
        (1, 16, [20000], 8),  # two row tiles over bs 1's 64 shares
        (1, 32, [20000], 8),  # four row tiles over bs 1's 32 shares
        (2, 12, [3000, 700], 8),  # 96 rows: a second tile half of masked rows
        (64, 8, [1 + i * 997 % 3000 for i in range(64)], 8),  # bs 64: two shares a request
        (32, 32, [1 + i * 389 % 2000 for i in range(32)], 8),  # 128 programs of four tiles
    ],
)
@pytest.mark.parametrize("kernel", ["triton", "gluon"])
def test_own_prefix_kernel_on_flashmla_pages_equals_reference(
    bs, w, prefix, hq, kernel, load_benchmark
):
    """The flashmla verify's attention on the GPU: this project's kernels over a block table of
    64-slot pages (FlashMLA's layout), K2.6's latent widths, equal to the masked reference
    within bf16 rounding, with the hook's launch settings: the Triton latent variant, and
    (``gluon``, where the hook takes it on Hopper: 64 query rows a program, the K2.6 rank's W 8
    x 8 heads, and W 16 / 32's two or four tiles a request) the Gluon kernel (odd tile counts
    and one-key shares among these prefixes)."""
    from sglang_ddtree.core.tree_attention import (
        gluon_prefix_runs,
        launch_settings,
        tree_attention,
        tree_attention_reference,
    )

    bench = load_benchmark("bench_tree_attention")
    t = bench.random_verify(bs, w, prefix, hq, 1, 576, seed=bs * w, dv=512, page=64)
    scale = 576**-0.5
    kv_indptr = torch.nn.functional.pad(t["prefix_lens"].cumsum(0), (1, 0))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gluon = kernel != "triton"
    if gluon and not gluon_prefix_runs(t["q"].device, torch.bfloat16):
        pytest.skip("the Gluon kernels run on Hopper only")
    settings = launch_settings(bs, w, hq, 1, 512, sms, 576, page_size=64, gluon=gluon)
    assert settings["prefix_latent"]
    if gluon and settings["prefix_rows"] != 64:
        assert not settings.get("prefix_gluon")  # 32 rows a program: the Triton kernel's
        pytest.skip("the Gluon kernel takes 64 query rows a program")
    assert settings.get("prefix_gluon", False) == gluon
    got = tree_attention(
        t["q"], t["k"], t["v"], kv_indptr, t["block_table"], t["node_loc"], t["mask"],
        scale, page_size=64, **settings,
    )  # fmt: skip
    want = tree_attention_reference(
        t["q"], t["k"], t["v"], t["kv_indptr"], t["kv_indices"], t["node_loc"], t["mask"], scale
    )
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def _verify_batch(seq_lens, w, tree_mask=None):
    from types import SimpleNamespace

    tree = (
        None if tree_mask is None else SimpleNamespace(layout=SimpleNamespace(tree_mask=tree_mask))
    )
    return SimpleNamespace(
        batch_size=len(seq_lens),
        seq_lens=torch.tensor(seq_lens),
        forward_mode=SimpleNamespace(is_target_verify=lambda: True),
        spec_info=SimpleNamespace(draft_token_num=w, tree=tree),
    )


def test_flashmla_verify_metadata_fills_static_buffers_for_graphs():
    """Graph forwards: the prefix offsets and the tree mask land in buffers whose addresses stay
    put across replays and widths; a capture's dummy (no tree) keeps the all-True mask; a
    replay's padded requests keep their rows; eager forwards carry the step's own tensors."""
    from types import SimpleNamespace

    from sglang_ddtree.srt.ddtree_attention.flashmla_backend import FlashMLASplitVerify
    from sglang_ddtree.srt.ddtree_attention_hook import verify_hooks

    set_verify = FlashMLASplitVerify.init_forward_metadata  # after each metadata call
    backend = SimpleNamespace(
        ddtree_takes_verify=True,  # built for a DDTREE server's target (`takes_ddtree_verify`)
        req_to_token=torch.zeros(1),
        cuda_graph_num_splits=torch.zeros(8 + 1, dtype=torch.int32),  # graphs up to bs 8
        num_draft_tokens=16,  # the largest W
        is_fp8_kvcache=False,
        dcp_world_size=1,
    )
    # Capture at bs 4, W 8: no tree yet.
    set_verify(backend, _verify_batch([1, 1, 1, 1], 8), in_graph=True)
    state = backend.ddtree_verify
    assert state.tree_mask.shape == (4, 8, 8) and bool(state.tree_mask.all())
    assert state.prefix_indptr.tolist() == [0, 1, 2, 3, 4]
    pointers = (state.prefix_indptr.data_ptr(), state.tree_mask.data_ptr())
    assert pointers[0] == backend._ddtree_graph_buffers.prefix_indptr.data_ptr()
    # Replay at padded bs 4 with 3 real requests: their masks copied, the padded row kept.
    masks = torch.rand(3, 8, 8) > 0.5
    set_verify(backend, _verify_batch([70, 5, 129, 1], 8, masks), in_graph=True)
    state = backend.ddtree_verify
    assert (state.prefix_indptr.data_ptr(), state.tree_mask.data_ptr()) == pointers
    assert state.prefix_indptr.tolist() == [0, 70, 75, 204, 205]  # once a forward, static
    assert torch.equal(state.tree_mask[:3], masks) and bool(state.tree_mask[3].all())
    # Another W (16): the same buffers.
    set_verify(backend, _verify_batch([9, 9], 16), in_graph=True)
    state = backend.ddtree_verify
    assert state.prefix_indptr.tolist() == [0, 9, 18]
    assert state.tree_mask.data_ptr() == pointers[1] and state.tree_mask.shape == (2, 16, 16)
    # Eager: the step's own tensors, no buffer; without a tree it refuses.
    masks = torch.rand(2, 8, 8) > 0.5
    set_verify(backend, _verify_batch([300, 2], 8, masks), in_graph=False)
    assert torch.equal(backend.ddtree_verify.tree_mask, masks)
    assert backend.ddtree_verify.prefix_indptr.tolist() == [0, 300, 302]
    with pytest.raises(RuntimeError, match="without the step's tree"):
        set_verify(backend, _verify_batch([3], 8), in_graph=False)
    # SGLang's own eager warm-up forward (FlashInfer's autotune) carries DFLASH's dummy verify
    # input, which has no tree at all: left to FlashMLA's kernel, not refused.
    warmup = _verify_batch([3], 8)
    del warmup.spec_info.tree
    set_verify(backend, warmup, in_graph=False)
    assert not backend.ddtree_verify
    hook = verify_hooks(FlashMLASplitVerify)["forward_extend"]
    q = torch.zeros(8, 4 * 576)
    out = hook(lambda *a, **k: "flashmla's own", backend, q, None, None, None, warmup,
               save_kv_cache=True)  # fmt: skip
    assert out == "flashmla's own"
    # Not a DDTREE verify (a backend not built for DDTREE's target, an FP8 cache): untouched.
    for changed in (dict(ddtree_takes_verify=False), dict(is_fp8_kvcache=True)):
        other = SimpleNamespace(**{**vars(backend), **changed})
        set_verify(other, _verify_batch([3], 8, masks[:1]), in_graph=False)
        assert other.ddtree_verify is backend.ddtree_verify


def test_gluon_cache_descriptors_cover_the_latent_and_rope_columns():
    """The Gluon prefix kernel's two TMA descriptors, built on the host (no GPU): the pool's
    [slots, D] rows at its own address and row stride (also a pool whose rows are wider than
    D), 64-slot blocks of half the 512 latent columns (a key tile arrives in two copies) and of
    the 64 rope columns, a 128-byte swizzle each."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from sglang_ddtree.core.tree_attention_gluon import cache_descriptors

    wide = torch.zeros(300, 1, 640, dtype=torch.bfloat16)
    for pool in (torch.zeros(300, 1, 576, dtype=torch.bfloat16), wide[..., :576]):
        latent, rope = cache_descriptors(pool, 512, 64)
        for desc, cols in ((latent, 256), (rope, 64)):
            assert desc.base.data_ptr() == pool.data_ptr()
            assert list(desc.shape) == [300, 576]
            assert list(desc.strides) == [pool.stride(0), 1]
            assert list(desc.block_shape) == [64, cols]
            assert desc.layout.swizzle_byte_width == 128
