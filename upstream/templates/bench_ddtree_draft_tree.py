"""Benchmark @@ALGORITHM@@'s draft tree, its three steps each by its torch path and its Triton
kernel (the same outputs): the per-depth top-K of the drafter's [bs, D, V] logits
(``select_candidates``: torch.topk and a log-sum-exp, or one pass), the best-first tree of
``budget`` nodes from those candidates (``build_tree_from_candidates``: a depth beam, or one heap
kernel) and the verify layout (``tree_to_retrieve_arrays``: first-child / next-sibling arrays,
positions and the ancestor mask). Microseconds per call from CUDA-graph replays.

    python3 benchmark/kernels/ddtree/bench_ddtree_draft_tree.py
    python3 benchmark/kernels/ddtree/bench_ddtree_draft_tree.py --vocab 163840 --depth 7
"""

import argparse

import torch
from triton.testing import do_bench_cudagraph

from sglang.srt.speculative.ddtree.layout import tree_to_retrieve_arrays
from sglang.srt.speculative.ddtree.tree import build_tree_from_candidates, select_candidates


def measure(bs: int, depth: int, vocab: int, budget: int, gen) -> dict:
    logits = torch.randn(bs, depth, vocab, device="cuda", generator=gen).bfloat16()
    roots = torch.zeros(bs, dtype=torch.int64, device="cuda")
    prefix_lens = torch.full((bs,), 1000, dtype=torch.int64, device="cuda")
    cand_lp, cand_tok = select_candidates(logits, budget, normalize=True, backend="torch")
    tree = build_tree_from_candidates(cand_lp, cand_tok, roots, budget, backend="torch")
    us = {}
    for backend in ("torch", "triton"):
        steps = {
            "top-K": lambda b=backend: select_candidates(logits, budget, True, b),
            "tree": lambda b=backend: build_tree_from_candidates(
                cand_lp, cand_tok, roots, budget, b
            ),
            "layout": lambda b=backend: tree_to_retrieve_arrays(tree, prefix_lens, depth, b),
        }
        for name, fn in steps.items():
            us[name, backend] = do_bench_cudagraph(fn) * 1e3
    return us


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--depth", type=int, default=15, help="drafter block size - 1")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--quick", action="store_true", help="one small cell (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.budgets, args.vocab = [4], [16], 32000
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("| bs | budget | top-K torch / triton us | tree torch / triton | layout torch / triton |")
    print("|---:|---:|---:|---:|---:|")
    for bs in args.batch_sizes:
        for budget in args.budgets:
            us = measure(bs, args.depth, args.vocab, budget, gen)
            steps = ("top-K", "tree", "layout")
            cells = [f"{us[s, 'torch']:.1f} / {us[s, 'triton']:.1f}" for s in steps]
            print(f"| {bs} | {budget} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
