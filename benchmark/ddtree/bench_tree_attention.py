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
    python benchmark/ddtree/bench_tree_attention.py --flashinfer --out DIR      # MHA on FlashInfer

``--mla``: absorbed MLA as SGLang's triton backend runs it, one KV head whose keys are the
latent plus rope (``--heads`` default 8 1 576: K2.6's 64 query heads over 8 ranks) and whose
values are the keys' first ``--mla-latent`` (512) columns, a view as in SGLang's MLA pool.
``split_auto_us`` times what the attention hook launches for the shape on this GPU
(``core.tree_attention.launch_settings``: value tiles and programs per request prefix; the
kernels' default rows and warps). ``--sweep`` also times the launch with one
setting at a time moved from that choice (``sweep_us``, by name: ``S<n>`` prefix shares,
``rows<n>`` / ``rows<n>w<k>`` the tree kernel's query nodes per program / and its warps,
``pw<k>`` the prefix kernel's warps, ``pm32`` its query rows per program, ``pdv256`` its values
in tiles of 256; with ``--mla`` also ``pm<rows>w<warps>n<keys>`` and ``lat<rows>w<warps>n<keys>``,
the prefix kernel's rows, warps and keys per iteration without and with its latent variant, and
around its best ``...s<n>`` pipeline stages, ``...dv256`` value tiles, ``...S<n>`` shares,
``lat64w16...`` four warpgroups, ``...n128...`` wider key tiles, ``...t<n>`` the tree
kernel's value columns per program, ``...m<n>`` its merge reading n shares at once, ``...ahead``
a key tile's page number or slots read a tile ahead, ``...gluon`` the Gluon prefix kernel
(``...gluonS<n>`` over n shares, with ``--flashmla``), each checked against the reference
(``sweep_err`` per setting, ``sweep_max_err``); what Triton built for the prefix kernel of each
setting first compiled in the run (``sweep_prefix_kernel``: registers, spills, shared memory,
warpgroup MMA dots, asynchronous and TMA copies). With
``--flashmla`` the own split reads the paged cache through its block table; it is also timed
as the flashmla verify launches it (``split_paged_us``: `launch_settings` with the latent
variant) and its prefix kernel alone (``own_prefix_us``, `prefix_attention_part`), each against
FlashMLA's (``own_split_over_flashmla_split``, ``own_prefix_over_flashmla_prefix``).

``--flashinfer`` (MHA; by default bs 1 4 8 16 32, W 8 16 32, prefix 8192): also FlashInfer's
batch prefill as the prefix part (every node a query row against its request's paged prefix,
``causal=False``, with its log-sum-exp; ``--page-size`` 1 as SGLang's MHA backends hold the
cache, or 16), alone (``flashinfer_prefix_us``) and with the ancestor block merged by
``core.tree_attention_with_prefix`` (``flashinfer_split_us``), under the plan SGLang's verify
graphs make (``use_cuda_graph``: the tiles fixed for any lengths, as ``launch_settings`` are)
and under the plan for these exact lengths (``flashinfer_exact_*``);
``split_over_flashinfer_prefix`` and ``split_over_flashinfer_split``: the own split's time over
the graph plan's two; and the verify SGLang's flashinfer backend runs for DDTREE, one paged
prefill over each prefix and its W nodes with SGLang's verify mask as the custom mask
(``flashinfer_masked_us``, slot-addressed, the exact plan). FlashInfer compiles its kernels at
first use (the JIT needs FlashInfer's CCCL headers).

``--kernel-times`` (with ``--flashmla`` or ``--flashinfer``): each split's device time per
kernel (``kernel_us``: ``own`` the hook's launch, ``flashmla`` FlashMLA's split kernel, its
combine kernel and the ancestor block, ``flashinfer`` FlashInfer's prefill, its merge and the
ancestor block under the graph plan), from eager calls under torch.profiler, µs per call
averaged over ``--iters``: which kernel a gap between the two splits sits in.

Every mode writes ``bench_tree_attention.json`` (all fields) and ``bench_tree_attention.md`` (a
table of the timings, µs per call; "floor": reading the prefix KV once at 4.8 TB/s).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys

import torch


def random_verify(bs, w, prefix, hq, hkv, d, seed, dv=None, page=None, device="cuda"):
    """bf16 inputs of one verify layer on ``device``; returns a dict of tensors and host ints.
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
    t = {k: v.to(device) for k, v in t.items()}
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


def flashinfer_split(t: dict, w: int, scale: float, page: int = 1, graph_plan: bool = True,
                     backend: str = "fa2"):  # fmt: skip
    """The DDTREE verify attention of an MHA target with FlashInfer's prefix part: ``(prefix_part,
    split)``, two callables over ``t`` (`random_verify`: slot-addressed for ``page`` 1, else its
    block table of ``page``-slot pages): FlashInfer's paged batch prefill over the prefixes alone
    (W query rows a request, ``causal=False``; token-major output and base-2 log-sum-exp), and
    that plus ``core.tree_attention_with_prefix`` (ancestor block and merge). plan() runs here,
    once, outside the timed calls, as the backend plans once per forward; ``graph_plan``: the
    plan of a CUDA-graph wrapper (SGLang's verify graphs: tiles and KV chunks fixed for any
    lengths), else the plan for these lengths. ``backend``: ``fa2``, what SGLang's flashinfer
    backend runs."""
    import flashinfer

    from sglang_ddtree.core.tree_attention import (
        token_major_prefix_part,
        tree_attention_with_prefix,
    )

    q, k, v = t["q"], t["k"], t["v"]
    bs, (n, hq, d), hkv, dv = t["mask"].shape[0], q.shape, k.shape[1], v.shape[-1]
    if page == 1:
        page_indptr, page_indices = t["kv_indptr"], t["kv_indices"]
        last_page_len = torch.ones(bs, dtype=torch.int32, device=q.device)
    else:  # each request's prefix pages: the first ceil(prefix / page) of its block table
        pages = (t["prefix_lens"] + page - 1) // page  # [bs]
        page_indptr = torch.nn.functional.pad(pages.cumsum(0), (1, 0)).to(torch.int32)
        used = torch.arange(t["block_table"].shape[1], device=q.device)[None, :] < pages[:, None]
        page_indices = t["block_table"][used].to(torch.int32)  # request by request
        last_page_len = (t["prefix_lens"] - (pages - 1) * page).to(torch.int32)
    plan_inputs = [t["qo_indptr"], page_indptr, page_indices, last_page_len]
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device=q.device)  # SGLang's for Qwen3
    buffers = {}
    if graph_plan:  # the graph wrapper's own index buffers, filled by plan()
        names = ("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                 "paged_kv_last_page_len_buf")  # fmt: skip
        buffers = {name: x.clone() for name, x in zip(names, plan_inputs)}
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=graph_plan, backend=backend, **buffers
    )
    wrapper.plan(*plan_inputs, hq, hkv, d, page, causal=False, sm_scale=scale,
                 q_data_type=q.dtype, kv_data_type=k.dtype)  # fmt: skip
    kv_cache = (k.view(-1, page, hkv, d), v.view(-1, page, hkv, dv))  # [pages, page, Hkv, D]
    out = q.new_empty(n, hq, dv)
    lse = torch.empty(n, hq, dtype=torch.float32, device=q.device)
    mask = t["mask"].contiguous()

    def prefix_part():
        return wrapper.run(q, kv_cache, out=out, lse=lse, return_lse=True)

    def split():
        prefix_out, prefix_lse = token_major_prefix_part(*prefix_part(), w)
        return tree_attention_with_prefix(q, k, v, t["node_loc"], mask, scale, prefix_out,
                                          prefix_lse, prefix_lse_log2=True)  # fmt: skip

    return prefix_part, split


def flashinfer_masked_verify(t: dict, w: int, scale: float, backend: str = "fa2"):
    """The tree verify as SGLang's flashinfer backend runs a DDTREE verify (MHA, page 1): one
    FlashInfer paged batch prefill per layer over each request's prefix and its W nodes, with
    SGLang's verify mask (W rows of prefix + W columns a request) as the custom mask; no split.
    Returns a callable (output ``[bs * W, Hq, Dv]``); plan() runs here, for these lengths."""
    import flashinfer

    q, k, v = t["q"], t["k"], t["v"]
    bs, (n, hq, d), hkv, dv = t["mask"].shape[0], q.shape, k.shape[1], v.shape[-1]
    indptr, indices, nodes = t["kv_indptr"].tolist(), t["kv_indices"], t["node_loc"]
    keys = torch.cat([
        torch.cat([indices[indptr[b] : indptr[b + 1]], nodes[b * w : (b + 1) * w]])
        for b in range(bs)
    ]).to(torch.int32)  # fmt: skip
    prefix = torch.tensor([indptr[b + 1] - indptr[b] for b in range(bs)], device=q.device)
    kv_indptr = torch.nn.functional.pad((prefix + w).cumsum(0), (1, 0)).to(torch.int32)
    last_page_len = torch.ones(bs, dtype=torch.int32, device=q.device)
    workspace = torch.empty(512 << 20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    wrapper.plan(t["qo_indptr"].to(torch.int32), kv_indptr, keys, last_page_len, hq, hkv, d, 1,
                 custom_mask=t["full_mask"], causal=False, sm_scale=scale, q_data_type=q.dtype,
                 kv_data_type=k.dtype)  # fmt: skip
    kv_cache = (k.view(-1, 1, hkv, d), v.view(-1, 1, hkv, dv))
    out = q.new_empty(n, hq, dv)
    return lambda: wrapper.run(q, kv_cache, out=out)


def prefix_floor_us(t: dict) -> float:
    """Microseconds to read every request's prefix KV once at the H200's 4.8 TB/s (MLA's values,
    a slice of the keys, come with them)."""
    k, v = t["k"], t["v"]
    width = k.shape[-1] + (0 if v.data_ptr() == k.data_ptr() else v.shape[-1])
    return int(t["kv_indptr"][-1]) * k.shape[1] * width * k.element_size() / 4.8e6


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


def kernel_us(events, calls: int) -> dict:
    """``{kernel name: µs per call}`` from a profiler's events of ``calls`` calls: the device
    time of each CUDA kernel, summed by name (cut to 60 characters: a template's instance
    name) and divided by ``calls``."""
    total = {}
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name[:60]
        total[name] = total.get(name, 0.0) + e.device_time_total / calls
    return {name: round(us, 1) for name, us in total.items()}


def profiled_kernel_us(fn, iters: int) -> dict:
    """`kernel_us` of ``iters`` eager calls of ``fn`` (after five warm-up calls)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return kernel_us(prof.events(), iters)


def time_prefix_and_split(row: dict, name: str, parts: tuple, want: torch.Tensor, iters: int):
    """Times ``parts`` (``(prefix_part, split)``, as `flashmla_split` returns them) into ``row``:
    ``{name}_prefix_us``, ``{name}_split_us`` and ``{name}_split_max_err`` (the split's largest
    absolute error against ``want``, the float32 reference)."""
    prefix_part, split = parts
    row[f"{name}_prefix_us"] = graph_us(prefix_part, iters)
    out = {}
    row[f"{name}_split_us"] = graph_us(lambda: out.update(o=split()), iters)
    row[f"{name}_split_max_err"] = (out["o"].float() - want).abs().max().item()


def sweep_variants(w: int, mla: bool) -> dict:
    """``--sweep``'s launch settings, each one knob moved from the hook's choice."""
    out = {f"S{n}": dict(prefix_splits=n) for n in (1, 2, 4, 8, 16, 32)}
    for rows in sorted({16, 32, max(16, 1 << (w - 1).bit_length())}):
        for tree_warps in (4, 8):
            out[f"rows{rows}w{tree_warps}"] = dict(tree_rows=rows, warps=(None, tree_warps))
    for prefix_warps in (4, 8, 16):
        out[f"pw{prefix_warps}"] = dict(warps=(prefix_warps, None))
    if not mla:
        # MHA: a KV head's W x G rows at 64 / 128 a program (the prefix read fewer times),
        # with the warps, key tiles and stages around them (all compile for sm_90a without
        # spills at 8 warps); ``q``: the queries loaded once, the key width in one tile. The
        # shares: the ``S<n>`` cells over the hook's own launch.
        for rows in (64, 128):
            for prefix_warps in (4, 8):
                for keys in (32, 64):
                    name = f"mha{rows}w{prefix_warps}n{keys}"
                    out[name] = dict(prefix_rows=rows, warps=(prefix_warps, None), prefix_keys=keys)
                    out[f"{name}s2"] = dict(out[name], prefix_stages=2)
                    out[f"{name}q"] = dict(out[name], prefix_q_once=True)
        for prefix_warps in (4, 8):  # the hook's 32 rows, queries loaded once
            out[f"mha32w{prefix_warps}q"] = dict(
                prefix_rows=32, warps=(prefix_warps, None), prefix_q_once=True
            )
        for rows in (32, 64, 128):  # and each key tile's slots read a tile ahead
            for keys in (32, 64):
                out[f"mha{rows}w8n{keys}qa"] = dict(
                    prefix_rows=rows, warps=(8, None), prefix_keys=keys, prefix_q_once=True,
                    prefix_index_ahead=True,
                )  # fmt: skip
    if mla:
        out["pm32"] = dict(prefix_rows=32)
        out["pdv256"] = dict(prefix_dv_block=256)
        for rows in (16, 32, 64):
            for prefix_warps in (4, 8):
                for keys in (32, 64):
                    for latent in (False, True):
                        name = f"{'lat' if latent else 'pm'}{rows}w{prefix_warps}n{keys}"
                        out[name] = dict(
                            prefix_rows=rows, warps=(prefix_warps, None), prefix_keys=keys,
                            prefix_latent=latent,
                        )  # fmt: skip
        # Around the latent variant's best: pipeline stages, value tiles, more shares.
        best = out["lat64w8n64"]
        for stages in (1, 2, 4):
            out[f"lat64w8n64s{stages}"] = dict(best, prefix_stages=stages)
        for prefix_warps in (4, 8):
            out[f"lat64w{prefix_warps}n64dv256"] = dict(
                best, warps=(prefix_warps, None), prefix_dv_block=256
            )
        for splits in (16, 32, 64, 128):
            out[f"lat64w8n64S{splits}"] = dict(best, prefix_splits=splits)
            out[f"lat32w4n64S{splits}"] = dict(out["lat32w4n64"], prefix_splits=splits)
        # The hook's bs-1 launch (128 shares, the chunked merge) and bs 4's (32 shares, the page
        # read ahead), which the sweep's general shares do not reproduce.
        bs1 = dict(prefix_stages=2, prefix_splits=128, tree_dv_block=32, tree_merge_chunk=8)
        bs4 = dict(prefix_stages=2, prefix_index_ahead=True, prefix_splits=32)
        # Wider key tiles (fewer softmax rounds a key) and four warpgroups (a quarter of the
        # accumulator each), with the stages shared memory allows.
        for name, moved in (
            ("lat64w8n128s1", dict(prefix_keys=128, prefix_stages=1)),
            ("lat64w8n128s2", dict(prefix_keys=128, prefix_stages=2)),
            ("lat64w16n64", dict(warps=(16, None))),
            ("lat64w16n64s2", dict(warps=(16, None), prefix_stages=2)),
            ("lat64w16n128s1", dict(warps=(16, None), prefix_keys=128, prefix_stages=1)),
            # The hook's pair at bs 1 (two stages, 64 shares), and the tree kernel's merge of
            # many shares over narrower value tiles (more programs a request).
            ("lat64w8n64s2S64", dict(prefix_stages=2, prefix_splits=64)),
            ("lat64w8n64s2S64t64", dict(prefix_stages=2, prefix_splits=64, tree_dv_block=64)),
            ("lat64w8n64s2S64t32", dict(prefix_stages=2, prefix_splits=64, tree_dv_block=32)),
            ("lat64w8n64s2S128t32", dict(prefix_stages=2, prefix_splits=128, tree_dv_block=32)),
            ("lat64w8n64s2t64", dict(prefix_stages=2, tree_dv_block=64)),
            # The merge reading several shares at once (m<chunk>).
            (
                "lat64w8n64s2S64t32m8",
                dict(prefix_stages=2, prefix_splits=64, tree_dv_block=32, tree_merge_chunk=8),
            ),
            (
                "lat64w8n64s2S128t32m8",
                dict(prefix_stages=2, prefix_splits=128, tree_dv_block=32, tree_merge_chunk=8),
            ),
            ("lat64w8n64s2m4", dict(prefix_stages=2, tree_merge_chunk=4)),
            # A key tile's page number (--flashmla) or slots read a tile ahead, at bs >= 2's
            # settings and at bs 1's (128 shares, the chunked merge).
            ("lat64w8n64s2ahead", dict(prefix_stages=2, prefix_index_ahead=True)),
            ("lat64w8n64s2S128t32m8ahead", dict(bs1, prefix_index_ahead=True)),
            # The merge of many shares: more shares a load (bs 1's 128), and bs 4's 32 shares
            # (merged one at a time by the hook) chunked over narrower value tiles.
            *(
                (f"lat64w8n64s2S128t{t}m{m}", dict(bs1, tree_dv_block=t, tree_merge_chunk=m))
                for t, m in ((32, 16), (16, 32))
            ),
            *(
                (f"lat64w8n64s2aheadS32t{t}m{m}", dict(bs4, tree_dv_block=t, tree_merge_chunk=m))
                for t, m in ((128, 1), (32, 8), (64, 4))
            ),
            # bs 4's launch without the read-ahead (is it worth it at 32 shares?), and over two
            # waves of shares (64 each), merged in chunks.
            ("lat64w8n64s2S32", dict(bs4, prefix_index_ahead=False)),
            (
                "lat64w8n64s2aheadS64t32m8",
                dict(bs4, prefix_splits=64, tree_dv_block=32, tree_merge_chunk=8),
            ),  # fmt: skip
            # The Gluon kernel (two warpgroups taking the key tiles in turns) at the general
            # shares and at bs 1's, and over 2 to 128 shares (a chunked merge from 32 on, as
            # the hook's).
            ("lat64w8n64gluon", dict(prefix_gluon=True)),
            ("lat64w8n64S128t32m8gluon", dict(bs1, prefix_stages=None, prefix_gluon=True)),
            *(
                (
                    f"lat64w8n64gluonS{n}",
                    dict(
                        prefix_gluon=True,
                        prefix_splits=n,
                        **(dict(tree_dv_block=32, tree_merge_chunk=8) if n >= 32 else {}),
                    ),
                )
                for n in (2, 4, 8, 16, 32, 64, 128)
            ),
            # Half-page key tiles, page numbers ahead, three and four stages (up to three
            # tiles' copies in flight while one is computed; four stages fill shared memory).
            ("lat64w8n32s3ahead", dict(prefix_keys=32, prefix_stages=3, prefix_index_ahead=True)),
            ("lat64w8n32s4ahead", dict(prefix_keys=32, prefix_stages=4, prefix_index_ahead=True)),
            (
                "lat64w8n32s4S128t32m8ahead",
                dict(
                    prefix_keys=32,
                    prefix_stages=4,
                    prefix_splits=128,
                    tree_dv_block=32,
                    tree_merge_chunk=8,
                    prefix_index_ahead=True,
                ),
            ),
            # Value tiles with the stages that fit shared memory (two programs a row tile).
            ("lat64w8n64dv256s1", dict(prefix_dv_block=256, prefix_stages=1)),
            ("lat64w4n64dv256s1", dict(warps=(4, None), prefix_dv_block=256, prefix_stages=1)),
            (
                "lat64w4n32dv256s2",
                dict(warps=(4, None), prefix_keys=32, prefix_dv_block=256, prefix_stages=2),
            ),
        ):
            out[name] = dict(best, **moved)
    return out


def compiled_kernels(fn) -> dict:
    """``{id: compiled kernel}`` in a Triton JIT function's caches (every device)."""
    found = {}
    for cache in getattr(fn, "device_caches", {}).values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        for kernel in getattr(kernels, "values", lambda: [])():
            found[id(kernel)] = kernel
    return found


def kernel_stats(kernel) -> dict:
    """What Triton built: registers and spills per thread, shared memory, stages and warps, and
    from its TTGIR how many dots are Hopper's warpgroup MMA and how many loads asynchronous
    copies or TMA copies (the software pipeline's) -- where a setting's time comes from."""
    meta = getattr(kernel, "metadata", None)
    ttgir = getattr(kernel, "asm", {}).get("ttgir", "")
    return {
        "regs": getattr(kernel, "n_regs", None),
        "spills": getattr(kernel, "n_spills", None),
        "shared": getattr(meta, "shared", None),
        "stages": getattr(meta, "num_stages", None),
        "warps": getattr(meta, "num_warps", None),
        "warpgroup_dots": ttgir.count("warp_group_dot "),
        "other_dots": len(re.findall(r"= tt\.dot ", ttgir)),
        "async_copies": ttgir.count("async_copy_global_to_local"),
        "tma_copies": ttgir.count("async_tma_copy_global_to_local"),
    }


def measure(
    bs, w, prefix, hq, hkv, d, iters, seed=0, dv=None, sweep=False, flashmla=False,
    flashinfer=False, page_size=1, flashinfer_backend="fa2", sweep_only=None, kernel_times=False,
):  # fmt: skip
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    from sglang_ddtree.core.tree_attention import (
        gluon_prefix_runs,
        launch_settings,
        prefix_attention_part,
        tree_attention,
        tree_attention_reference,
    )

    page = 64 if flashmla else (page_size if flashinfer and page_size > 1 else None)
    t = random_verify(bs, w, prefix, hq, hkv, d, seed, dv, page=page)
    scale = d**-0.5
    k_ext, v_ext = t["k"][t["node_loc"].long()], t["v"][t["node_loc"].long()]
    out_ext = t["q"].new_empty(t["q"].shape[0], hq, t["v"].shape[-1])

    def extend():
        extend_attention_fwd(
            t["q"], k_ext, v_ext, out_ext, t["k"], t["v"], t["qo_indptr"], t["kv_indptr"],
            t["kv_indices"], t["full_mask"], False, t["mask_indptr"], w, 1.0, 1.0, scale,
        )  # fmt: skip

    res = {}

    # On FlashMLA's pages the own split reads the block table, as the flashmla backend's
    # verify with DDTREE's own prefix kernel does.
    paged = dict(page_size=64) if flashmla else {}
    kv_indices = t["block_table"] if flashmla else t["kv_indices"]

    def split(name, settings):
        res[name] = tree_attention(
            t["q"], t["k"], t["v"], t["kv_indptr"], kv_indices, t["node_loc"], None, scale,
            full_mask=t["full_mask"], mask_indptr=t["mask_indptr"], num_nodes=w, **paged,
            **settings,
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
    if flashmla:  # the own split as the flashmla backend's own-prefix verify launches it
        gluon = gluon_prefix_runs(t["q"].device, t["k"].dtype)
        hook = launch_settings(bs, w, hq, hkv, dv_real, sms, d, page_size=64, gluon=gluon)
        row["split_paged_us"] = graph_us(lambda: split("paged", hook), iters)
        row["split_paged_max_err"] = (res.pop("paged").float() - want).abs().max().item()
        # The own prefix kernel alone, as the hook launches it: against FlashMLA's prefix part.
        prefix_settings = {k: v for k, v in hook.items() if k.startswith("prefix_")}
        prefix_warps = (hook.get("warps") or (None, None))[0] or 4
        row["own_prefix_us"] = graph_us(
            lambda: prefix_attention_part(
                t["q"], t["k"], t["v"], t["kv_indptr"], kv_indices, w, scale, page_size=64,
                prefix_warps=prefix_warps, **prefix_settings,
            ),
            iters,
        )  # fmt: skip
        flashmla_parts = flashmla_split(t, w, scale)
        time_prefix_and_split(row, "flashmla", flashmla_parts, want, iters)
        if kernel_times:
            row["kernel_us"] = {
                "own": profiled_kernel_us(lambda: split("paged", hook), iters),
                "flashmla": profiled_kernel_us(flashmla_parts[1], iters),
            }
            res.pop("paged")
        row["floor_us"] = prefix_floor_us(t)
        row["flashmla_split_over_prefix"] = row["flashmla_split_us"] / row["flashmla_prefix_us"]
        row["own_prefix_over_flashmla_prefix"] = row["own_prefix_us"] / row["flashmla_prefix_us"]
        row["own_split_over_flashmla_split"] = row["split_paged_us"] / row["flashmla_split_us"]
    if flashinfer:
        for name, graph_plan in (("flashinfer", True), ("flashinfer_exact", False)):
            parts = flashinfer_split(t, w, scale, page_size, graph_plan, flashinfer_backend)
            time_prefix_and_split(row, name, parts, want, iters)
            if kernel_times and graph_plan:
                row["kernel_us"] = {
                    "own": profiled_kernel_us(lambda: split("auto", auto), iters),
                    "flashinfer": profiled_kernel_us(parts[1], iters),
                }
                res.pop("auto")
        masked = flashinfer_masked_verify(t, w, scale, flashinfer_backend)
        row["flashinfer_masked_us"] = graph_us(masked, iters)
        row["flashinfer_masked_max_err"] = (masked().float() - want).abs().max().item()
        row["floor_us"] = prefix_floor_us(t)
        row["split_over_flashinfer_prefix"] = row["split_auto_us"] / row["flashinfer_prefix_us"]
        row["split_over_flashinfer_split"] = row["split_auto_us"] / row["flashinfer_split_us"]
    if sweep:
        from sglang_ddtree.core import tree_attention as kernels

        row["sweep_us"], row["sweep_err"], row["sweep_prefix_kernel"] = {}, {}, {}
        variants = sweep_variants(w, dv is not None)
        if dv is None:  # MHA: the launch without `_wide_mha_prefix` (16 or 32 rows a program)
            variants["narrow"] = dict(
                prefix_rows=None, warps=None, prefix_keys=kernels.PREFIX_BLOCK_N,
                prefix_q_once=False, prefix_index_ahead=False,
                prefix_splits=kernels.prefix_splits(bs, w, hq, hkv, dv_real, None, sms),
            )  # fmt: skip
        for name, moved in variants.items():
            if sweep_only and not re.fullmatch(sweep_only, name):
                continue
            if moved.get("prefix_gluon") and not flashmla:
                continue  # the Gluon kernel reads pages: FlashMLA's layout
            settings = {**auto, **moved}
            if moved.get("prefix_gluon"):
                from sglang_ddtree.core import tree_attention_gluon

                prefix_kernel = tree_attention_gluon._latent_prefix_gluon
            else:
                prefix_kernel = kernels._prefix_attention_kernel
            built = compiled_kernels(prefix_kernel)
            try:
                row["sweep_us"][name] = graph_us(lambda n=name, st=settings: split(n, st), iters)
            except Exception as e:  # a setting Triton cannot build (out of shared memory)
                row["sweep_us"][name] = f"{type(e).__name__}: {str(e)[:200]}"
                continue
            new = compiled_kernels(prefix_kernel).keys() - built.keys()
            row["sweep_prefix_kernel"][name] = [
                kernel_stats(compiled_kernels(prefix_kernel)[k]) for k in new
            ]
            row["sweep_err"][name] = (res.pop(name).float() - want).abs().max().item()
        row["sweep_max_err"] = max(row["sweep_err"].values())
    return row


US, ERR, RATIO = "{:,.1f}", "{:.4f}", "{:.2f}"
BASE_COLUMNS = [
    ("bs", "bs", "{}"), ("prefix", "prefix", "{:,}"), ("W", "W", "{}"),
    ("triton extend", "extend_us", US), ("own split (a)", "split_auto_us", US),
]  # fmt: skip
MODE_COLUMNS = {  # markdown columns after BASE_COLUMNS: (header, row key, format)
    "triton": [("a / extend", "ratio", RATIO), ("max err extend", "extend_max_err", ERR),
               ("max err a", "split_auto_max_err", ERR)],
    "flashmla": [("FlashMLA prefix", "flashmla_prefix_us", US),
                 ("FlashMLA prefix + block", "flashmla_split_us", US), ("floor", "floor_us", US),
                 ("FlashMLA (prefix + block) / prefix", "flashmla_split_over_prefix", RATIO),
                 ("own prefix, hook", "own_prefix_us", US),
                 ("own split, hook", "split_paged_us", US),
                 ("own prefix / FlashMLA prefix", "own_prefix_over_flashmla_prefix", RATIO),
                 ("own split / FlashMLA split", "own_split_over_flashmla_split", RATIO),
                 ("max err a", "split_auto_max_err", ERR),
                 ("max err FlashMLA + block", "flashmla_split_max_err", ERR)],
    "flashinfer": [("FlashInfer prefix (b)", "flashinfer_prefix_us", US),
                   ("FlashInfer prefix + block (c)", "flashinfer_split_us", US),
                   ("b, exact plan", "flashinfer_exact_prefix_us", US),
                   ("c, exact plan", "flashinfer_exact_split_us", US),
                   ("FlashInfer masked verify (m)", "flashinfer_masked_us", US),
                   ("floor", "floor_us", US),
                   ("a / b", "split_over_flashinfer_prefix", RATIO),
                   ("a / c", "split_over_flashinfer_split", RATIO),
                   ("max err a", "split_auto_max_err", ERR),
                   ("max err c", "flashinfer_split_max_err", ERR),
                   ("max err m", "flashinfer_masked_max_err", ERR)],
}  # fmt: skip


def markdown(rows: list, mode: str, heads: list) -> str:
    """The rows as a markdown table: µs per call and ratios, columns by ``mode``."""
    cols = BASE_COLUMNS + MODE_COLUMNS[mode]
    lines = [
        f"Heads (Hq Hkv D) {heads}, bf16, µs per call from CUDA-graph replays; max err: against "
        "the float32 masked reference; floor: each request's prefix KV read once at 4.8 TB/s.",
        "",
        "| " + " | ".join(header for header, _, _ in cols) + " |",
        "|" + "---:|" * len(cols),
    ]
    for row in rows:  # "-": a field the row lacks (a table is never what stops a run)
        fields = [fmt.format(row[key]) if key in row else "-" for _, key, fmt in cols]
        lines.append("| " + " | ".join(fields) + " |")
    return "\n".join(lines + sweep_table(rows)) + "\n"


def sweep_table(rows: list) -> list[str]:
    """``--sweep``'s settings as table lines, a column per setting (µs per call, or what stopped
    a setting), next to the hook's own split; none without a sweep."""
    names = list(dict.fromkeys(name for row in rows for name in row.get("sweep_us", {})))
    if not names:
        return []
    hook = "split_paged_us" if any("split_paged_us" in row for row in rows) else "split_auto_us"
    lines = [
        "",
        "Sweep, µs per call:",
        "",
        "| bs | prefix | W | hook | " + " | ".join(names) + " |",
    ]
    lines.append("|" + "---:|" * (4 + len(names)))
    for row in rows:
        cells = [row.get("sweep_us", {}).get(name, "-") for name in names]
        cells = [US.format(c) if isinstance(c, float) else str(c)[:24] for c in cells]
        head = [str(row["bs"]), f"{row['prefix']:,}", str(row["W"]), US.format(row[hook])]
        lines.append("| " + " | ".join(head + cells) + " |")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, with each mode's default cells and heads filled in."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-sizes", type=int, nargs="+", help="1 8 32 (--flashinfer: 1 4 8 16 32)")
    ap.add_argument("--widths", type=int, nargs="+", help="W: 17 33 65 (--flashinfer: 8 16 32)")
    ap.add_argument("--prefixes", type=int, nargs="+", help="128 1024 (--flashinfer: 8192)")
    ap.add_argument("--heads", type=int, nargs=3, default=None, help="Hq Hkv D")
    ap.add_argument("--mla", action="store_true", help="absorbed MLA (values a key slice)")
    ap.add_argument("--mla-latent", type=int, default=512, help="MLA's value width")
    ap.add_argument("--sweep", action="store_true",
                    help="also time launch settings moved one at a time from the hook's")  # fmt: skip
    ap.add_argument("--sweep-only", default=None,
                    help="--sweep: only the settings whose name matches this regular expression")  # fmt: skip
    ap.add_argument("--flashmla", action="store_true",
                    help="--mla on a paged cache (64 slots a page): also FlashMLA's prefix part "
                    "alone and with the ancestor block merged (the flashmla backend's verify)")  # fmt: skip
    ap.add_argument(
        "--flashinfer",
        action="store_true",
        help="MHA: also FlashInfer's paged prefill as the prefix part, alone and with the "
        "ancestor block merged",
    )
    ap.add_argument(
        "--page-size",
        type=int,
        default=1,
        help="--flashinfer: slots a KV page (1 as SGLang's MHA backends, or 16)",
    )
    ap.add_argument(
        "--flashinfer-backend",
        choices=["fa2", "fa3"],
        default="fa2",
        help="FlashInfer's kernels (fa2: as SGLang's flashinfer backend runs them)",
    )
    ap.add_argument(
        "--kernel-times",
        action="store_true",
        help="--flashmla / --flashinfer: also each split's device time per kernel (torch.profiler, "
        "eager)",
    )
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args(argv)
    args.heads = args.heads or ([8, 1, 576] if args.mla else [32, 8, 128])
    hkv, d = args.heads[1:]
    dv = args.mla_latent if args.mla else None
    if dv is not None and (hkv != 1 or dv > d):
        ap.error("--mla: one KV head (Hkv 1) and --mla-latent <= D")
    if args.flashmla and dv is None:
        ap.error("--flashmla needs --mla")
    if args.kernel_times and not (args.flashmla or args.flashinfer):
        ap.error("--kernel-times needs --flashmla or --flashinfer")
    if args.flashinfer and dv is not None:
        ap.error("--flashinfer times MHA heads: without --mla")
    if args.page_size < 1 or (args.page_size != 1 and not args.flashinfer):
        ap.error("--page-size: a positive number of slots, with --flashinfer")
    args.batch_sizes = args.batch_sizes or ([1, 4, 8, 16, 32] if args.flashinfer else [1, 8, 32])
    args.widths = args.widths or ([8, 16, 32] if args.flashinfer else [17, 33, 65])
    args.prefixes = args.prefixes or ([8192] if args.flashinfer else [128, 1024])
    args.mode = "flashinfer" if args.flashinfer else "flashmla" if args.flashmla else "triton"
    return args


def cells(args: argparse.Namespace) -> list[tuple[dict, dict]]:
    """Each measured cell as `measure`'s keyword arguments: ``(shape, options)``."""
    hq, hkv, d = args.heads
    options = dict(
        dv=args.mla_latent if args.mla else None, sweep=args.sweep, flashmla=args.flashmla,
        flashinfer=args.flashinfer, page_size=args.page_size,
        flashinfer_backend=args.flashinfer_backend, sweep_only=args.sweep_only,
        kernel_times=args.kernel_times,
    )  # fmt: skip
    return [
        (dict(bs=bs, w=w, prefix=prefix, hq=hq, hkv=hkv, d=d, iters=args.iters), options)
        for bs in args.batch_sizes
        for w in args.widths
        for prefix in args.prefixes
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_tree_attention.py times CUDA kernels: no CUDA GPU here.", file=sys.stderr)
        return 2
    if args.flashinfer and importlib.util.find_spec("flashinfer") is None:
        print("--flashinfer needs FlashInfer (flashinfer-python) installed.", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for shape, options in cells(args):
        row = measure(**shape, **options)
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in row.items()}), flush=True)  # fmt: skip
        # Both files rewritten after every cell: a run cut short keeps what it measured.
        with open(os.path.join(args.out, "bench_tree_attention.json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "heads": args.heads,
                       "mla_latent": args.mla_latent if args.mla else None, "rows": rows}, f,
                      indent=1)  # fmt: skip
        table = markdown(rows, args.mode, args.heads)
        with open(os.path.join(args.out, "bench_tree_attention.md"), "w") as f:
            f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
