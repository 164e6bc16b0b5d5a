"""Tree-verify attention of one layer: SGLang's triton extend kernel with the verify mask (what a
DDTREE verify runs today) against ``core.tree_attention`` (prefix part + ancestor block, merged).

Per (bs, W, prefix length): random bf16 queries and KV, random trees (each node's parent an
earlier node), SGLang's FULL_MASK verify mask. Each kernel call is captured in a CUDA graph and
replayed ``--iters`` times between CUDA events (microseconds per call, i.e. per layer). Both
outputs are compared with the float32 masked reference (``tree_attention_reference``): the
largest absolute error of each, so a difference between the two is read against their own
rounding.

    python benchmark/ddtree/bench_tree_attention.py --out DIR          # Qwen3-8B's heads
    python benchmark/ddtree/bench_tree_attention.py --mla --out DIR    # Kimi K2.6's MLA, TP 8
    python benchmark/ddtree/bench_tree_attention.py --mla --flashmla --out DIR  # and on FlashMLA

``--mla``: absorbed MLA as SGLang's triton backend runs it, one KV head whose keys are the
latent plus rope (``--heads`` default 8 1 576: K2.6's 64 query heads over 8 ranks) and whose
values are the keys' first ``--mla-latent`` (512) columns, a view as in SGLang's MLA pool.
``split_auto_us`` times what the attention hook launches for the shape on this GPU
(``core.tree_attention.launch_settings``: value tiles and programs per request prefix; the
kernels' default rows and warps). ``--sweep`` also times the launch with one
setting at a time moved from that choice (``sweep_us``, by name: ``S<n>`` prefix shares,
``rows<n>`` / ``rows<n>w<k>`` the tree kernel's query nodes per program / and its warps,
``pw<k>`` the prefix kernel's warps, ``pm32`` its query rows per program, ``pdv256`` its values
in tiles of 256), each checked against the reference (``sweep_max_err``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def random_verify(bs, w, prefix, hq, hkv, d, seed, dv=None, page=None):
    """bf16 inputs of one verify layer on the GPU; returns a dict of tensors and host ints.
    ``prefix``: one length for every request or a list of ``bs``. ``dv``: MLA's latent width
    (values = the keys' first ``dv`` columns, a view), else None. ``page``: KV in pages of that
    many slots as SGLang's paged pools hold it (request b's position p at slot ``block_table[b,
    p // page] * page + p % page``, pages shuffled over the pool; the nodes at positions
    prefix .. prefix + W - 1 of the same pages), with the block table FlashMLA reads."""
    from sglang_ddtree.core.layout import flatten_verify_mask

    g = torch.Generator().manual_seed(seed)
    prefix_lens = torch.tensor([prefix] * bs if isinstance(prefix, int) else list(prefix))
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), prefix_lens.cumsum(0)])
    total = int(prefix_lens.sum())
    if page is None:
        slots = total + bs * w + 8
        perm = torch.randperm(slots, generator=g)
        kv_indices = perm[:total]
        node_loc = perm[total : total + bs * w]
        block_table = None
    else:
        pages_per_req = -(-(prefix_lens + w) // page)
        width = int(pages_per_req.max())
        num_pages = int(pages_per_req.sum()) + 2
        slots = num_pages * page
        order = torch.randperm(num_pages, generator=g)
        block_table = torch.zeros(bs, width, dtype=torch.int64)
        used = 0
        for b in range(bs):
            n = int(pages_per_req[b])
            block_table[b, :n] = order[used : used + n]
            used += n
        pos = [torch.arange(int(p) + w) for p in prefix_lens]
        req_slots = [block_table[b, pp // page] * page + pp % page for b, pp in enumerate(pos)]
        kv_indices = torch.cat([rs[: int(p)] for rs, p in zip(req_slots, prefix_lens)])
        node_loc = torch.cat([rs[int(p) :] for rs, p in zip(req_slots, prefix_lens)])
    mask = torch.zeros(bs, w, w, dtype=torch.bool)
    mask[:, 0, 0] = True
    for i in range(1, w):  # each node: its parent's ancestors and itself
        parent = torch.randint(0, i, (bs,), generator=g)
        mask[:, i] = mask[torch.arange(bs), parent]
        mask[:, i, i] = True
    sizes = (prefix_lens + w) * w
    mask_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    t = dict(
        q=torch.randn(bs * w, hq, d, generator=g),
        k=torch.randn(slots, hkv, d, generator=g),
        v=torch.randn(slots, hkv, d, generator=g),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        node_loc=node_loc,
        mask=mask,
        full_mask=flatten_verify_mask(mask, prefix_lens, int(sizes.sum())),
        mask_indptr=mask_indptr,
        qo_indptr=torch.arange(bs + 1) * w,
    )
    if block_table is not None:
        t["block_table"] = block_table
        t["prefix_lens"] = prefix_lens
    t = {k: v.cuda() for k, v in t.items()}
    for name in ("q", "k", "v"):
        t[name] = t[name].to(torch.bfloat16)
    if dv is not None:
        t["v"] = t["k"][..., :dv]
    for name in ("kv_indptr", "kv_indices", "node_loc", "mask_indptr", "qo_indptr"):
        t[name] = t[name].to(torch.int32 if name != "mask_indptr" else torch.int64)
    for name in ("block_table", "prefix_lens"):
        if name in t:
            t[name] = t[name].to(torch.int32)
    return t


def flashmla_split(t: dict, w: int, scale: float):
    """The DDTREE verify attention on FlashMLA's paged latent cache, as the hook runs it:
    ``(prefix_part, split)``, two callables over ``t`` (`random_verify` with ``page=64``):
    FlashMLA's decode kernel over the prefixes alone (every node of a request a query row,
    ``causal=False``; the output and its log-sum-exp), and that plus
    ``core.tree_attention_with_prefix`` (ancestor block and merge). The tile schedule is made
    once, outside the timed calls, as the backend's metadata call does per forward."""
    from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata

    from sglang_ddtree.core.tree_attention import tree_attention_with_prefix

    q, k = t["q"], t["k"]
    bs, hq, d, dv = t["mask"].shape[0], q.shape[1], q.shape[2], t["v"].shape[-1]
    tile_metadata, num_splits = get_mla_metadata(t["prefix_lens"], w * hq, 1)
    mask = t["mask"].contiguous()

    def prefix_part():
        return flash_mla_with_kvcache(
            q=q.view(bs, w, hq, d), k_cache=k.view(-1, 64, 1, d), block_table=t["block_table"],
            cache_seqlens=t["prefix_lens"], head_dim_v=dv, tile_scheduler_metadata=tile_metadata,
            num_splits=num_splits, softmax_scale=scale, causal=False,
        )  # fmt: skip

    def split():
        out, lse = prefix_part()
        return tree_attention_with_prefix(q, k, t["v"], t["node_loc"], mask, scale, out, lse)

    return prefix_part, split


def graph_us(fn, iters: int) -> float:
    """Microseconds per call of ``fn`` replayed from a CUDA graph."""
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def sweep_variants(w: int, mla: bool) -> dict:
    """``--sweep``'s launch settings, each one knob moved from the hook's choice."""
    out = {f"S{n}": dict(prefix_splits=n) for n in (1, 2, 4, 8, 16)}
    for rows in sorted({16, 32, max(16, 1 << (w - 1).bit_length())}):
        for tree_warps in (4, 8):
            out[f"rows{rows}w{tree_warps}"] = dict(tree_rows=rows, warps=(None, tree_warps))
    for prefix_warps in (4, 8, 16):
        out[f"pw{prefix_warps}"] = dict(warps=(prefix_warps, None))
    if mla:
        out["pm32"] = dict(prefix_rows=32)
        out["pdv256"] = dict(prefix_dv_block=256)
    return out


def measure(bs, w, prefix, hq, hkv, d, iters, seed=0, dv=None, sweep=False, flashmla=False):
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    from sglang_ddtree.core.tree_attention import (
        launch_settings,
        tree_attention,
        tree_attention_reference,
    )

    t = random_verify(bs, w, prefix, hq, hkv, d, seed, dv, page=64 if flashmla else None)
    scale = d**-0.5
    k_ext, v_ext = t["k"][t["node_loc"].long()], t["v"][t["node_loc"].long()]
    out_ext = t["q"].new_empty(t["q"].shape[0], hq, t["v"].shape[-1])

    def extend():
        extend_attention_fwd(
            t["q"], k_ext, v_ext, out_ext, t["k"], t["v"], t["qo_indptr"], t["kv_indptr"],
            t["kv_indices"], t["full_mask"], False, t["mask_indptr"], w, 1.0, 1.0, scale,
        )  # fmt: skip

    res = {}

    def split(name, settings):
        res[name] = tree_attention(
            t["q"], t["k"], t["v"], t["kv_indptr"], t["kv_indices"], t["node_loc"], None, scale,
            full_mask=t["full_mask"], mask_indptr=t["mask_indptr"], num_nodes=w, **settings,
        )  # fmt: skip

    sms = torch.cuda.get_device_properties(t["q"].device).multi_processor_count
    dv_real = t["v"].shape[-1]
    auto = launch_settings(bs, w, hq, hkv, dv_real, sms)
    want = tree_attention_reference(
        t["q"], t["k"], t["v"], t["kv_indptr"], t["kv_indices"], t["node_loc"], t["mask"], scale
    ).float()
    row = {"bs": bs, "W": w, "prefix": prefix, "extend_us": graph_us(extend, iters)}
    row["auto"] = dict(auto)
    row["split_auto_us"] = graph_us(lambda: split("auto", auto), iters)
    row["extend_max_err"] = (out_ext.float() - want).abs().max().item()
    row["split_auto_max_err"] = (res["auto"].float() - want).abs().max().item()
    row["ratio"] = row["split_auto_us"] / row["extend_us"]
    if flashmla:
        prefix_part, fm_split = flashmla_split(t, w, scale)
        row["flashmla_prefix_us"] = graph_us(prefix_part, iters)
        out = {}
        row["flashmla_split_us"] = graph_us(lambda: out.update(o=fm_split()), iters)
        row["flashmla_split_max_err"] = (out["o"].float() - want).abs().max().item()
        # Reading each request's prefix latent once at the H200's 4.8 TB/s.
        row["floor_us"] = int(t["prefix_lens"].sum()) * d * 2 / 4.8e6
        row["flashmla_split_over_prefix"] = row["flashmla_split_us"] / row["flashmla_prefix_us"]
    if sweep:
        row["sweep_us"], errs = {}, []
        for name, moved in sweep_variants(w, dv is not None).items():
            settings = {**auto, **moved}
            row["sweep_us"][name] = graph_us(lambda n=name, st=settings: split(n, st), iters)
            errs.append((res[name].float() - want).abs().max().item())
            del res[name]
        row["sweep_max_err"] = max(errs)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--widths", type=int, nargs="+", default=[17, 33, 65])
    ap.add_argument("--prefixes", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--heads", type=int, nargs=3, default=None, help="Hq Hkv D")
    ap.add_argument("--mla", action="store_true", help="absorbed MLA (values a key slice)")
    ap.add_argument("--mla-latent", type=int, default=512, help="MLA's value width")
    ap.add_argument("--sweep", action="store_true",
                    help="also time launch settings moved one at a time from the hook's")  # fmt: skip
    ap.add_argument("--flashmla", action="store_true",
                    help="--mla on a paged cache (64 slots a page): also FlashMLA's prefix part "
                    "alone and with the ancestor block merged (the flashmla backend's verify)")  # fmt: skip
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args(argv)
    args.heads = args.heads or ([8, 1, 576] if args.mla else [32, 8, 128])
    hq, hkv, d = args.heads
    dv = args.mla_latent if args.mla else None
    if dv is not None and (hkv != 1 or dv > d):
        ap.error("--mla: one KV head (Hkv 1) and --mla-latent <= D")
    if args.flashmla and dv is None:
        ap.error("--flashmla needs --mla")
    if not torch.cuda.is_available():
        print("bench_tree_attention.py times CUDA kernels: no CUDA GPU here.", file=sys.stderr)
        return 2
    rows = []
    for bs in args.batch_sizes:
        for w in args.widths:
            for prefix in args.prefixes:
                row = measure(
                    bs, w, prefix, hq, hkv, d, args.iters, dv=dv, sweep=args.sweep,
                    flashmla=args.flashmla,
                )  # fmt: skip
                rows.append(row)
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                                  for k, v in row.items()}), flush=True)  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_tree_attention.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "heads": args.heads, "mla_latent": dv,
                   "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
