"""Benchmark @@ALGORITHM@@'s accept-side Triton kernels against the torch they replace (the same
outputs): the target argmax over the verify's [bs x W, V] float32 logits (``argmax_rows`` /
``torch.argmax``), the min-p filter over sampled rows (``min_p_renorm_`` / ``min_p_renorm``)
and the accepted path's KV moved to the slots of its depths, every layer's K and V buffer in one
launch (``move_accepted_kv`` / a torch index copy per buffer). Microseconds per call from
CUDA-graph replays.

    python3 benchmark/kernels/ddtree/bench_ddtree_accept.py
    python3 benchmark/kernels/ddtree/bench_ddtree_accept.py --vocab 163840 --layers 61
"""

import argparse

import torch
from triton.testing import do_bench_cudagraph

from sglang.srt.speculative.ddtree.argmax_triton import argmax_rows
from sglang.srt.speculative.ddtree.kv_move_triton import move_accepted_kv
from sglang.srt.speculative.ddtree.minp_triton import min_p_renorm_
from sglang.srt.speculative.ddtree.sampling import min_p_renorm


def kv_move_case(bs, w, layers, row, gen):
    """Two buffers a layer of ``row`` bf16 values a slot; each request's path of W / 2 nodes."""
    slots = bs * w + 1
    buffers = [torch.randn(slots, row, device="cuda", generator=gen).bfloat16()
               for _ in range(2 * layers)]  # fmt: skip
    verify_loc = torch.randperm(slots - 1, device="cuda", generator=gen)[: bs * w]
    depth = w // 2  # node 2 j at depth j: every node but the root moves
    keep = torch.arange(bs, device="cuda")[:, None] * w + torch.arange(depth, device="cuda") * 2
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device="cuda")
    row_bytes = torch.full((len(buffers),), row * 2, dtype=torch.int64, device="cuda")
    dst = verify_loc.view(bs, w)[:, :depth].reshape(-1)
    src = verify_loc[keep.reshape(-1)]

    def kernel():
        move_accepted_kv(ptrs, row_bytes, keep, verify_loc, w, row * 2)

    def torch_copy():
        for buf in buffers:
            buf[dst] = buf[src]

    return kernel, torch_copy


def measure(bs, args, gen) -> list:
    rows = bs * args.width
    logits = torch.randn(rows, args.vocab, device="cuda", generator=gen)
    probs = torch.softmax(logits, dim=-1)
    scratch = probs.clone()  # the in-place filter's rows (its cost does not depend on them)
    min_p = torch.full((rows,), 0.05, device="cuda")
    kernel, torch_copy = kv_move_case(bs, args.width, args.layers, args.row, gen)
    runs = (
        lambda: torch.argmax(logits, dim=-1),
        lambda: argmax_rows(logits),
        lambda: min_p_renorm(probs, min_p),
        lambda: min_p_renorm_(scratch, min_p),
        torch_copy,
        kernel,
    )
    return [do_bench_cudagraph(fn) * 1e3 for fn in runs]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--width", type=int, default=16, help="W, tree nodes a request")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--row", type=int, default=1024, help="K or V values a slot (heads x dim)")
    ap.add_argument("--quick", action="store_true", help="one small cell (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.vocab, args.layers = [4], 32000, 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("| bs | argmax torch / triton us | min-p torch / triton us | KV move torch / triton us |")
    print("|---:|---:|---:|---:|")
    for bs in args.batch_sizes:
        us = measure(bs, args, gen)
        print(f"| {bs} | {us[0]:.1f} / {us[1]:.1f} | {us[2]:.1f} / {us[3]:.1f} | "
              f"{us[4]:.1f} / {us[5]:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
