"""Time the DDTree core on one GPU: build + layout + accept, replayed from a CUDA graph.

For each (vocab, bs, budget) at depth 15 it captures one decode step's core work in a CUDA graph
and reports the median replay time over many replays, measured with CUDA events:

- greedy:  draft top-K (from draft logits) -> build_tree -> layout -> target argmax ->
           accept_greedy (sgl_kernel.verify_tree_greedy) -> commit_accepted
- sampled: the same, but target_probs (temperature, top-k, top-p) -> coins ->
           accept_sampled (sgl_kernel.tree_speculative_sampling_target_only)

Draft and target logits are random bf16 tensors that live outside the graph (the drafter and
target forwards are not part of the core). ``--target-rows`` shapes the target rows, which the
sampled path's top-p renorm (FlashInfer's radix-select AIR top-p) is sensitive to:
``gaussian`` (N(0, 1) logits, the default), ``flat`` (N(0, 0.01): nearly uniform rows, what a
model with ``load_format=dummy`` weights produces) and ``zipf`` (p ~ rank^-1.5 over a random
token order: a peaked, language-model-like row). Usage:

    python benchmark/ddtree/bench_core.py --out bench_core.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from sglang_ddtree.core.accept import accept_greedy, accept_sampled
from sglang_ddtree.core.commit import commit_accepted
from sglang_ddtree.core.layout import tree_to_retrieve_arrays
from sglang_ddtree.core.sampling import clamp_coins, target_probs
from sglang_ddtree.core.tree import build_tree_from_candidates, select_candidates

STAGES = ("select", "build", "layout", "accept")
TARGET_ROWS = ("gaussian", "flat", "zipf")


def target_rows(rows: int, vocab: int, shape: str, device: str = "cuda") -> torch.Tensor:
    """[rows, V] bf16 target logits of the given shape (see the module docstring)."""
    if shape == "gaussian":
        return torch.randn(rows, vocab, device=device, dtype=torch.bfloat16)
    if shape == "flat":
        return (0.01 * torch.randn(rows, vocab, device=device)).to(torch.bfloat16)
    if shape == "zipf":
        ranks = torch.rand(rows, vocab, device=device).argsort(dim=-1) + 1  # random token order
        return (-1.5 * torch.log(ranks.float())).to(torch.bfloat16)
    raise ValueError(f"unknown target row shape {shape!r}: gaussian, flat or zipf")


def make_step(
    bs, budget, depth, vocab, mode, topk, upto="accept", rows="gaussian", draft_float32=False,
    draft_topk="torch",
):  # fmt: skip
    dev = "cuda"
    n = budget + 1
    draft_logits = torch.randn(bs, depth, vocab, device=dev, dtype=torch.bfloat16)
    target_logits = target_rows(bs * n, vocab, rows, dev)
    roots = torch.randint(0, vocab, (bs,), device=dev)
    prefix = torch.full((bs,), 1000, device=dev, dtype=torch.int64)
    temperature = torch.ones(bs, device=dev)
    top_k = torch.zeros(bs, device=dev, dtype=torch.int64)
    top_p = torch.full((bs,), 0.95, device=dev)
    coins = torch.rand(bs, n, device=dev)
    final = torch.rand(bs, device=dev)

    def step():
        # The worker's draft_to_tree upcasts the bf16 LM-head output first (--draft-float32).
        logits = draft_logits.float() if draft_float32 else draft_logits
        lp, tok = select_candidates(logits, topk, normalize=True, backend=draft_topk)
        if upto == "select":
            return lp
        tree = build_tree_from_candidates(lp, tok, roots, budget)
        if upto == "build":
            return tree
        lay = tree_to_retrieve_arrays(tree, prefix, max_depth=depth)
        if upto == "layout":
            return lay
        if mode == "greedy":
            pred = target_logits.argmax(-1).view(bs, n)
            res = accept_greedy(lay, tree.tokens, pred, depth + 1, backend="kernel")
        else:
            probs = target_probs(target_logits.view(bs, n, vocab), temperature, top_k, top_p)
            res = accept_sampled(
                lay,
                tree.tokens,
                probs,
                clamp_coins(coins),
                clamp_coins(final),
                depth + 1,
                backend="kernel",
            )
        return commit_accepted(res, prefix, n)

    return step


def time_graph(step, warmup=3, iters=200):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(10):
        graph.replay()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)  # microseconds
    del graph
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--budget", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--vocab", type=int, nargs="+", default=[151936, 163840])
    ap.add_argument("--depth", type=int, default=15)
    ap.add_argument("--topk", type=int, default=None, help="per-depth top-K (default: budget)")
    ap.add_argument("--modes", nargs="+", default=["greedy", "sampled"])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument(
        "--draft-float32",
        action="store_true",
        help="upcast the draft logits to float32 before the top-K, as the SGLang worker does "
        "(default: top-K on the bf16 logits)",
    )
    ap.add_argument(
        "--draft-topk",
        default="torch",
        choices=("torch", "triton"),
        help="select_candidates backend (triton: core/topk_triton.py, one pass over the vocab)",
    )
    ap.add_argument("--target-rows", nargs="+", default=["gaussian"], choices=TARGET_ROWS)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the cumulative stages (select, build, layout) of the greedy step",
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench_core.py times CUDA-graph replays; it needs a CUDA GPU (none is visible)."
        )
    torch.manual_seed(0)
    rows = []
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(
        f"{'rows':>8} {'vocab':>7} {'bs':>3} {'budget':>6} {'K':>4} "
        + " ".join(f"{m:>11}" for m in args.modes)
    )
    grid = [
        (shape, vocab, bs, budget)
        for shape in args.target_rows
        for vocab in args.vocab
        for bs in args.bs
        for budget in args.budget
    ]
    for shape, vocab, bs, budget in grid:
        topk = min(budget, args.topk or budget)
        row = {
            "target_rows": shape,
            "vocab": vocab,
            "bs": bs,
            "budget": budget,
            "depth": args.depth,
            "topk": topk,
            "draft_float32": args.draft_float32,
            "draft_topk": args.draft_topk,
        }
        if args.breakdown:
            for stage in STAGES[:-1]:
                step = make_step(
                    bs, budget, args.depth, vocab, "greedy", topk, stage,
                    draft_float32=args.draft_float32, draft_topk=args.draft_topk,
                )  # fmt: skip
                row[f"upto_{stage}_us"] = round(time_graph(step, iters=args.iters), 1)
        for mode in args.modes:
            step = make_step(
                bs, budget, args.depth, vocab, mode, topk, rows=shape,
                draft_float32=args.draft_float32, draft_topk=args.draft_topk,
            )  # fmt: skip
            row[f"{mode}_us"] = round(time_graph(step, iters=args.iters), 1)
            del step
            torch.cuda.empty_cache()
        rows.append(row)
        cells = " ".join(f"{row[f'{m}_us']:>9.1f}us" for m in args.modes)
        if args.breakdown:
            cells += (
                "  (cumulative: "
                + ", ".join(f"{s} {row[f'upto_{s}_us']:.1f}" for s in STAGES[:-1])
                + " us)"
            )
        print(f"{shape:>8} {vocab:>7} {bs:>3} {budget:>6} {topk:>4} {cells}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
