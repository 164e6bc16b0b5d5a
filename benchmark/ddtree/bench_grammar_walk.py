"""The grammar mask's host walk over a verify tree: SGLang's ``generate_token_bitmask`` (its
``traverse_tree`` per constrained request, xgrammar filling each accepted node's mask) over the
tree's host arrays as SGLang's ``GrammarTree`` resolves them (torch tensors) and as
``HostArrayGrammarTree`` does (NumPy views of the same copies), side by side; the two masks
must be equal. Host only: the trees are random (each node's parent drawn before it) with
tokens drawn uniformly, as a random-weight drafter proposes them, from the word tokenizer
that ``bench_step.py`` gives its regex cells (``--vocab`` tokens); every request is
constrained by ``--regex`` through SGLang's ``XGrammarGrammar``. Milliseconds per step are the
best of ``--repeats``.

    python benchmark/ddtree/bench_grammar_walk.py --out DIR
    python benchmark/ddtree/bench_grammar_walk.py --batch-sizes 1 4 32 --widths 8 16 --out DIR

Needs SGLang 0.5.17 and xgrammar (no GPU). Writes ``DIR/bench_grammar_walk.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_step import tokenizer_words  # noqa: E402

from sglang_ddtree.testing import tiny_models  # noqa: E402


def random_trees(bs: int, width: int, vocab: int, rng: random.Random) -> tuple:
    """``[bs, width]`` first-child / next-sibling arrays (SGLang's retrieve layout) and tokens."""
    first_child = torch.full((bs, width), -1, dtype=torch.int64)
    next_sibling = torch.full((bs, width), -1, dtype=torch.int64)
    for b in range(bs):
        for node in range(width - 1, 0, -1):
            parent = rng.randrange(node)
            next_sibling[b, node], first_child[b, parent] = first_child[b, parent], node
    tokens = torch.tensor([[rng.randrange(vocab) for _ in range(width)] for _ in range(bs)])
    return first_child, next_sibling, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--regex", default="[a-z ]+")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 32])
    ap.add_argument("--widths", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import xgrammar
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar
    from sglang.srt.speculative.spec_utils import GrammarTree, generate_token_bitmask

    from sglang_ddtree.srt.ddtree_step import HostArrayGrammarTree

    cfg = tiny_models.TinyPairConfig(vocab_size=args.vocab)
    vocab = tiny_models.vocabulary(cfg, tokenizer_words(args.vocab))
    info = xgrammar.TokenizerInfo(vocab, vocab_size=args.vocab)
    compiled = xgrammar.GrammarCompiler(info).compile_regex(args.regex)

    def walk(kind, arrays, bs: int) -> tuple[float, torch.Tensor]:
        reqs = []
        for _ in range(bs):
            matcher = xgrammar.GrammarMatcher(compiled, max_rollback_tokens=200)
            reqs.append(
                SimpleNamespace(grammar=XGrammarGrammar(matcher, args.vocab, compiled, None))
            )
        best, mask = float("inf"), None
        for _ in range(args.repeats):
            tree = GrammarTree.from_host(*arrays)
            tree = HostArrayGrammarTree(tree) if kind == "host arrays" else tree
            start = time.perf_counter()
            mask, _ = generate_token_bitmask(reqs, *tree.resolve(), args.vocab)
            best = min(best, time.perf_counter() - start)
        return best * 1e3, mask

    rng = random.Random(0)
    rows = []
    for bs in args.batch_sizes:
        for width in args.widths:
            arrays = random_trees(bs, width, args.vocab, rng)
            torch_ms, want = walk("tensors", arrays, bs)
            host_ms, got = walk("host arrays", arrays, bs)
            assert torch.equal(got, want), (bs, width)  # the same mask, bit for bit
            filled = int((want != -1).any(-1).sum())  # rows the walk wrote (unwritten: all -1)
            rows.append(dict(bs=bs, width=width, nodes_masked=filled, tensors_ms=torch_ms,
                             host_arrays_ms=host_ms, ratio=host_ms / torch_ms))  # fmt: skip
            print(rows[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_grammar_walk.json"), "w") as f:
        json.dump(dict(args=vars(args), rows=rows), f, indent=1)
    lines = [
        f"SGLang's grammar mask walk, vocabulary {args.vocab:,}, regex `{args.regex}`, "
        f"ms per step (best of {args.repeats}); masks equal in every cell.",
        "",
        "| bs | W | nodes masked | torch tensors | host arrays | ratio |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['bs']} | {r['width']} | {r['nodes_masked']} | {r['tensors_ms']:.2f} | "
            f"{r['host_arrays_ms']:.2f} | {r['ratio']:.2f} |"
        )
    with open(os.path.join(args.out, "bench_grammar_walk.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
