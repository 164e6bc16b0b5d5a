"""The sampled verify's nucleus kernels, side by side: sgl_kernel's ``top_p_renorm_prob``
(FlashInfer's) and ``core.topp_radix.top_p_renorm_radix`` (the default), on ``[M, V]`` float32
probability rows of three shapes (``bench_core.target_rows``: flat = random weights, gaussian,
zipf = peaked), M = bs x W tree rows, each replayed from a CUDA graph (median of ``--iters``).
Also counts the tokens whose kept / dropped decision differs from FlashInfer's, and for each
kernel the tokens it decides against the float64 law (``G`` = the mass strictly above a token,
summed in float64; kept iff ``G < top_p``) where ``G`` is more than ``EDGE`` from ``top_p``.
From the logits: the division, softmax and radix apart against
``top_p_softmax_renorm_radix`` (the softmax never written).

    python benchmark/ddtree/bench_top_p.py --out DIR
    python benchmark/ddtree/bench_top_p.py --rows 33 136 1024 --vocab 163840 151937 --out DIR

Writes ``DIR/bench_top_p.json`` and ``DIR/bench_top_p.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import TARGET_ROWS, target_rows, time_graph  # noqa: E402

EDGE = 1e-5  # |G - top_p| below this: either decision is a rounding of the same law


def off_float64(kept: torch.Tensor, probs: torch.Tensor, top_p: torch.Tensor) -> int:
    """Tokens (of nonzero probability) whose kept / dropped decision in ``kept`` ([M, V] bool)
    differs from the float64 law's, ``EDGE`` or more away from its boundary."""
    from sglang_ddtree.core.sampling import mass_above_each

    g = mass_above_each(probs.double())
    p = top_p.double()[:, None]
    law = (g < p) | (p >= 1)
    return int(((kept != law) & ((g - p).abs() >= EDGE) & (probs > 0)).sum())


def measure(rows: int, vocab: int, shape: str, top_p: float, iters: int) -> dict:
    """One cell: microseconds per call of each kernel, how many decisions radix makes
    differently from FlashInfer, and each kernel's decisions against the float64 law."""
    from sgl_kernel import top_p_renorm_prob

    from sglang_ddtree.core.topp_radix import top_p_renorm_radix, top_p_softmax_renorm_radix

    logits = target_rows(rows, vocab, shape).float()
    probs = torch.softmax(logits, dim=-1)
    p = torch.full((rows,), top_p, dtype=torch.float32, device=probs.device)
    cell = {"rows": rows, "vocab": vocab, "shape": shape, "top_p": top_p}
    kernels = {"flashinfer": top_p_renorm_prob, "radix": top_p_renorm_radix}
    theirs = top_p_renorm_prob(probs, p) > 0
    for name, kernel in kernels.items():
        kept = kernel(probs, p) > 0
        cell[f"{name}_us"] = time_graph(lambda k=kernel: k(probs, p), iters=iters)
        cell[f"kept_{name}"] = int(kept.sum())
        cell[f"{name}_off_float64"] = off_float64(kept, probs, p)
        if name != "flashinfer":
            cell[f"{name}_differ"] = int((kept != theirs).sum())
            cell[f"{name}_speedup"] = cell["flashinfer_us"] / cell[f"{name}_us"]
    # From logits at temperature 1: the division, softmax and radix apart, and radix reading
    # the logits (the softmax never written).
    t = torch.ones(rows, dtype=torch.float32, device=probs.device)
    cell["softmax_radix_us"] = time_graph(
        lambda: top_p_renorm_radix(torch.softmax(logits / t[:, None], dim=-1), p), iters=iters
    )
    cell["from_logits_us"] = time_graph(
        lambda: top_p_softmax_renorm_radix(logits, t, p), iters=iters
    )
    # Its law is the float64 softmax of the logits (its own probabilities are not torch's).
    fused = top_p_softmax_renorm_radix(logits, t, p) > 0
    cell["from_logits_off_float64"] = off_float64(fused, torch.softmax(logits.double(), -1), p)
    return cell


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[17, 33, 136, 272, 1024])
    ap.add_argument("--vocab", type=int, nargs="+", default=[151936])
    ap.add_argument("--shapes", nargs="+", default=list(TARGET_ROWS), choices=TARGET_ROWS)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_top_p.py needs a CUDA GPU (and sgl_kernel).", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    cells = []
    for vocab in args.vocab:
        for shape in args.shapes:
            for rows in args.rows:
                cell = measure(rows, vocab, shape, args.top_p, args.iters)
                cells.append(cell)
                print(json.dumps(cell), flush=True)
    result = {"command": " ".join(sys.argv), "gpu": torch.cuda.get_device_name(), "cells": cells}
    with open(os.path.join(args.out, "bench_top_p.json"), "w") as f:
        json.dump(result, f, indent=1)
    lines = [
        f"top_p {args.top_p}, microseconds per call (CUDA-graph replay, median); speedup: "
        "FlashInfer's time over the kernel's; differ: decisions unlike FlashInfer's",
        "",
        "| V | rows | shape | FlashInfer | radix (speedup, differ) | "
        "division + softmax + radix | radix from logits | "
        "off float64: FlashInfer / radix / from logits |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        lines.append(
            f"| {c['vocab']} | {c['rows']} | {c['shape']} | {c['flashinfer_us']:.1f} | "
            f"{c['radix_us']:.1f} ({c['radix_speedup']:.2f}, {c['radix_differ']}) | "
            f"{c['softmax_radix_us']:.1f} | {c['from_logits_us']:.1f} | "
            f"{c['flashinfer_off_float64']} / {c['radix_off_float64']} / "
            f"{c['from_logits_off_float64']} |"
        )
    with open(os.path.join(args.out, "bench_top_p.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
