"""Benchmark @@ALGORITHM@@'s tree-verify attention (one layer, bf16, prefixes and tree nodes in
shuffled 64-slot pages, random trees; us per call from CUDA-graph replays; max error against the
float32 masked reference). ``extend``: triton's TARGET_VERIFY without the split (its extend
kernel, custom mask); ``split``: ``tree_attention`` as that backend launches it; MLA with
FlashMLA: its decode kernel over the prefixes merged with the ancestor block, and the flashmla
backend's verify with its own prefix kernel (``split on pages``). Heads: ``mha`` Qwen3-8B's;
``mla`` one TP-8 rank of Kimi K2.6 (8 heads over one latent head, keys 576, values 512).
"""

import argparse
import importlib.util
import itertools

import torch
from triton.testing import do_bench_cudagraph

from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.srt.speculative.ddtree.layout import ancestor_mask, flatten_verify_mask
from sglang.srt.speculative.ddtree.tree_attention import (
    gluon_prefix_runs,
    launch_settings,
    tree_attention,
    tree_attention_reference,
    tree_attention_with_prefix,
)

HEADS = {"mha": (32, 8, 128, 128), "mla": (8, 1, 576, 512)}  # Hq, Hkv, D, Dv
PAGE = 64


def verify_inputs(bs, w, prefix, hkv, d, dv, latent, gen):
    pages = -(-(prefix + w) // PAGE)
    table = torch.randperm(bs * pages, generator=gen, device="cuda").view(bs, pages).int()
    pos = torch.arange(prefix + w, device="cuda")
    slots = table[:, pos // PAGE].long() * PAGE + pos % PAGE  # [bs, prefix + W]
    parents = torch.full((bs, w), -1, dtype=torch.int64)
    for i in range(1, w):
        parents[:, i] = torch.randint(0, i, (bs,), generator=torch.Generator().manual_seed(i))
    mask = ancestor_mask(parents, w - 1).cuda()
    k = torch.randn(bs * pages * PAGE, hkv, d, generator=gen, device="cuda").bfloat16()
    v = k[..., :dv] if latent else torch.randn(k.shape, generator=gen, device="cuda").bfloat16()
    lens = torch.full((bs,), prefix, device="cuda")
    sizes = (lens + w) * w
    return dict(
        k=k, v=v, mask=mask, block_table=table, prefix_lens=lens.int(),
        kv_indptr=torch.arange(bs + 1, device="cuda", dtype=torch.int32) * prefix,
        kv_indices=slots[:, :prefix].flatten().int(), node_loc=slots[:, prefix:].flatten().int(),
        full_mask=flatten_verify_mask(mask, lens, int(sizes.sum())),
        mask_indptr=torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]),
        qo_indptr=torch.arange(bs + 1, device="cuda", dtype=torch.int32) * w,
    )  # fmt: skip


def measure(heads, bs, w, prefix, gen):
    hq, hkv, d, dv = HEADS[heads]
    t = verify_inputs(bs, w, prefix, hkv, d, dv, heads == "mla", gen)
    q = torch.randn(bs * w, hq, d, generator=gen, device="cuda").bfloat16()
    k, v, scale = t["k"], t["v"], d**-0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = tree_attention_reference(
        q, k, v, t["kv_indptr"], t["kv_indices"], t["node_loc"], t["mask"], scale
    ).float()
    k_ext, v_ext = k[t["node_loc"].long()], v[t["node_loc"].long()]
    out = q.new_empty(bs * w, hq, dv)

    def extend():
        extend_attention_fwd(
            q, k_ext, v_ext, out, k, v, t["qo_indptr"], t["kv_indptr"], t["kv_indices"],
            t["full_mask"], False, t["mask_indptr"], w, 1.0, 1.0, scale,
        )  # fmt: skip
        return out

    settings = launch_settings(bs, w, hq, hkv, dv, sms, latent_d=d if heads == "mla" else 0)
    runs = {"extend": extend, "split": lambda: tree_attention(
        q, k, v, t["kv_indptr"], t["kv_indices"], t["node_loc"], t["mask"], scale, **settings)}
    if heads == "mla" and importlib.util.find_spec("sgl_kernel.flash_mla") is not None:
        from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata
        meta, ns = get_mla_metadata(t["prefix_lens"], w * hq, 1)

        def flashmla():
            o, lse = flash_mla_with_kvcache(
                q=q.view(bs, w, hq, d), k_cache=k.view(-1, PAGE, 1, d),
                cache_seqlens=t["prefix_lens"], head_dim_v=dv, tile_scheduler_metadata=meta,
                block_table=t["block_table"], num_splits=ns, softmax_scale=scale, causal=False,
            )  # fmt: skip
            return tree_attention_with_prefix(q, k, v, t["node_loc"], t["mask"], scale, o, lse)

        gluon = gluon_prefix_runs(q.device, k.dtype)
        paged = launch_settings(bs, w, hq, hkv, dv, sms, d, page_size=PAGE, gluon=gluon)
        runs["flashmla prefix + block"] = flashmla
        runs["split on pages"] = lambda: tree_attention(
            q, k, v, t["kv_indptr"], t["block_table"], t["node_loc"], t["mask"], scale,
            page_size=PAGE, **paged,
        )  # fmt: skip
    return {
        name: (do_bench_cudagraph(fn) * 1e3, (fn().float() - want).abs().max().item())
        for name, fn in runs.items()
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", nargs="+", default=["mha", "mla"], choices=sorted(HEADS))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--widths", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--prefix", type=int, nargs="+", default=[8192])
    ap.add_argument("--quick", action="store_true", help="one small cell per heads (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.widths, args.prefix = [2], [8], [300]
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("| heads | bs | W | prefix | kernel | us | max error |")
    print("|---|---:|---:|---:|---|---:|---:|")
    cells = itertools.product(args.heads, args.prefix, args.batch_sizes, args.widths)
    for heads, prefix, bs, w in cells:
        for name, (us, err) in measure(heads, bs, w, prefix, gen).items():
            print(f"| {heads} | {bs} | {w} | {prefix} | {name} | {us:.1f} | {err:.4f} |")


if __name__ == "__main__":
    main()
