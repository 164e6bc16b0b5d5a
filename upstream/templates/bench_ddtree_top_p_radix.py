"""Benchmark @@ALGORITHM@@'s radix top-p renormalization against sgl_kernel's
``top_p_renorm_prob`` (FlashInfer's, the call SGLang's sampler makes) on [rows, vocab] float32
probabilities, rows = bs x W tree nodes of a sampled verify; and the radix kernel reading the
logits (``top_p_softmax_renorm_radix``: the softmax never written). Two row shapes: flat (as
random weights give, every token near 1 / V: the nucleus' hardest case) and peaked. Prints
microseconds per call (CUDA-graph replays) and the keep / drop decisions that differ from
FlashInfer's (both keep the tokens whose strictly-more-probable mass is below top_p; they may
differ only at ties and float32 rounding at the edge).

    python3 benchmark/kernels/ddtree/bench_ddtree_top_p_radix.py
    python3 benchmark/kernels/ddtree/bench_ddtree_top_p_radix.py --rows 33 136 --vocab 163840
"""

import argparse

import torch
from sgl_kernel import top_p_renorm_prob
from triton.testing import do_bench_cudagraph

from sglang.srt.speculative.ddtree.topp_radix import (
    top_p_renorm_radix,
    top_p_softmax_renorm_radix,
)

SHAPES = {"flat": 0.1, "peaked": 3.0}  # the logits' standard deviation


def measure(rows: int, vocab: int, std: float, top_p: float, gen) -> list:
    """One cell: microseconds per call of each kernel, and the decisions radix makes unlike
    FlashInfer's."""
    logits = torch.randn(rows, vocab, device="cuda", generator=gen) * std
    probs = torch.softmax(logits, dim=-1)
    p = torch.full((rows,), top_p, device="cuda")
    temperature = torch.ones(rows, device="cuda")
    kernels = (
        lambda: top_p_renorm_prob(probs, p),
        lambda: top_p_renorm_radix(probs, p),
        lambda: top_p_softmax_renorm_radix(logits, temperature, p),
    )
    times = [do_bench_cudagraph(fn) * 1e3 for fn in kernels]
    differ = int(((top_p_renorm_radix(probs, p) > 0) != (top_p_renorm_prob(probs, p) > 0)).sum())
    return [*times, differ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[17, 33, 136, 272, 1024])
    ap.add_argument("--vocab", type=int, nargs="+", default=[151936])
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--quick", action="store_true", help="one small cell (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.vocab = [33], [32000]
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("| vocab | rows | shape | FlashInfer us | radix us | radix from logits us | differ |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for vocab in args.vocab:
        for shape, std in SHAPES.items():
            for rows in args.rows:
                flashinfer, radix, fused, differ = measure(rows, vocab, std, args.top_p, gen)
                print(
                    f"| {vocab} | {rows} | {shape} | {flashinfer:.1f} | {radix:.1f} | "
                    f"{fused:.1f} | {differ} |"
                )


if __name__ == "__main__":
    main()
