"""See DDTree work on a CPU in seconds: ``python -m sglang_ddtree.demo``.

A toy target and a toy drafter over a small vocabulary stand in for real models:

- target: a Markov chain over ``V`` tokens; its next-token distribution after token ``x`` is row
  ``x`` of a sharp random transition matrix ``P``.
- drafter: one "block diffusion" forward gives, for each depth ``d = 1..D``, the marginal of the
  chain ``d`` steps after the root (``P**d[root]``) blurred with noise. Like a DFlash drafter, the
  per-depth distributions are marginals, independent of the tokens picked at other depths.

Each decode step runs the real core: build_tree -> tree_to_retrieve_arrays -> (target rows at
every node) -> accept_greedy / accept_sampled -> commit_accepted. The demo prints one tree, checks
that greedy DDTree output equals plain greedy decoding, and compares accept lengths of the chain
(budget = D, top-1 per depth: DFlash) with DDTree trees of growing budget, at T = 0 and T = 1.
"""

from __future__ import annotations

import argparse
import time

import torch

from sglang_ddtree.core import (
    DraftTree,
    accept_greedy,
    accept_sampled,
    build_tree,
    commit_accepted,
    draw_coins,
    target_probs,
    tree_to_retrieve_arrays,
)

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


class ToyPair:
    """A Markov-chain target and a noisy marginal drafter (see the module docstring)."""

    def __init__(self, vocab: int, depth: int, seed: int = 0, noise: float = 1.0):
        gen = torch.Generator().manual_seed(seed)
        self.vocab, self.depth = vocab, depth
        self.target_logits = torch.randn(vocab, vocab, generator=gen) * 3.0  # [V, V]
        trans = torch.softmax(self.target_logits, dim=-1)
        powers, cur = [], torch.eye(vocab)
        for _ in range(depth):
            cur = cur @ trans
            powers.append(cur)
        self.marginals = torch.stack(powers, dim=1)  # [V(root), D, V]
        self.noise = torch.randn(vocab, depth, vocab, generator=gen) * noise

    def draft_logprobs(self, roots: torch.Tensor) -> torch.Tensor:
        """[bs] int64 roots -> [bs, D, V] float32 per-depth draft log-probs."""
        return torch.log_softmax(self.marginals[roots].log() + self.noise[roots], dim=-1)

    def verify_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """[bs, N] node tokens -> [bs, N, V] target logits after each node."""
        return self.target_logits[tokens]


def render_tree(tree: DraftTree, b: int = 0, accepted: set[int] | None = None) -> str:
    """A draft tree as indented text: token, draft prefix prob; '*' marks the accepted path."""
    accepted = accepted or set()
    n = int(tree.valid[b].sum())
    parents = tree.parents[b, :n].tolist()
    kids: dict[int, list[int]] = {}
    for i in range(1, n):
        kids.setdefault(parents[i], []).append(i)
    lines = []

    def visit(i: int, indent: int) -> None:
        tok = ALPHABET[int(tree.tokens[b, i]) % len(ALPHABET)]
        mark = "*" if i in accepted else " "
        prob = float(tree.logw[b, i].exp())
        label = "root" if i == 0 else f"q={prob:.3f}"
        lines.append(f"{mark} {'  ' * indent}{tok}  [node {i}, {label}]")
        for c in kids.get(i, []):
            visit(c, indent + 1)

    visit(0, 0)
    return "\n".join(lines)


def decode(pair, root: int, steps: int, budget: int, topk: int, temperature: float, seed: int):
    """Run `steps` DDTree decode steps from one root token; returns (tokens, accept lengths)."""
    gen = torch.Generator().manual_seed(seed)
    out, lengths = [root], []
    cur = torch.tensor([root])
    prefix = torch.zeros(1, dtype=torch.int64)
    n = budget + 1
    for _ in range(steps):
        tree = build_tree(pair.draft_logprobs(cur), budget, cur, topk=topk)
        lay = tree_to_retrieve_arrays(tree, prefix, max_depth=pair.depth)
        logits = pair.verify_logits(tree.tokens)
        if temperature == 0:
            res = accept_greedy(lay, tree.tokens, logits.argmax(-1), pair.depth + 1)
        else:
            probs = target_probs(
                logits,
                torch.tensor([temperature]),
                torch.tensor([0]),
                torch.tensor([1.0]),
            )
            coins, final = draw_coins(1, n, "cpu", generator=gen)
            res = accept_sampled(lay, tree.tokens, probs, coins, final, pair.depth + 1)
        plan = commit_accepted(res, prefix, n)
        k = int(plan.commit_lens[0])
        out += plan.out_tokens[0, :k].tolist()
        lengths.append(k)
        prefix = plan.new_seq_lens
        cur = plan.bonus
    return out, lengths


def greedy_reference(pair, root: int, length: int) -> list[int]:
    out = [root]
    while len(out) < length:
        out.append(int(pair.target_logits[out[-1]].argmax()))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="DDTree on a toy target/drafter pair, on the CPU.")
    ap.add_argument("--vocab", type=int, default=24)
    ap.add_argument("--depth", type=int, default=7, help="draft depth D (= block_size - 1)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    pair = ToyPair(args.vocab, args.depth, args.seed)
    root = 0

    # One tree, rendered, with the greedy accepted path marked.
    budget = 12
    cur = torch.tensor([root])
    tree = build_tree(pair.draft_logprobs(cur), budget, cur)
    lay = tree_to_retrieve_arrays(tree, torch.zeros(1, dtype=torch.int64), args.depth)
    res = accept_greedy(
        lay, tree.tokens, pair.verify_logits(tree.tokens).argmax(-1), args.depth + 1
    )
    path = {int(i) for i in res.accept_index[0].tolist() if i >= 0}
    print(f"A DDTree draft tree (budget {budget}, depth <= {args.depth}); * = greedy accepted path")
    print(render_tree(tree, 0, path))
    print(f"accepted {int(res.accept_length[0])} draft tokens + 1 bonus\n")

    # Greedy DDTree must reproduce plain greedy decoding exactly.
    toks, _ = decode(pair, root, 50, 32, 32, 0.0, args.seed)
    ref = greedy_reference(pair, root, len(toks))
    assert toks == ref, "greedy DDTree output differs from greedy decoding"
    print(f"greedy DDTree == greedy decoding on {len(toks)} tokens: OK\n")

    print(f"mean tokens per step over {args.steps} steps (accept length + bonus)")
    print(f"{'method':<24} {'T=0':>7} {'T=1':>7}")
    rows = [("chain (DFlash), top-1", args.depth, 1)]
    rows += [(f"DDTree budget {b}", b, b) for b in args.budgets]
    start = time.perf_counter()
    for name, b, k in rows:
        means = []
        for temp in (0.0, 1.0):
            _, lengths = decode(pair, root, args.steps, b, k, temp, args.seed)
            means.append(sum(lengths) / len(lengths))
        print(f"{name:<24} {means[0]:>7.2f} {means[1]:>7.2f}")
    print(f"({time.perf_counter() - start:.1f} s on the CPU)")


if __name__ == "__main__":
    main()
