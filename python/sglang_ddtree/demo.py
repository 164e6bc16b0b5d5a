"""See DDTree work on a CPU: ``python -m sglang_ddtree.demo`` (add ``--toy`` for the toy pair).

Default: the shipped trained pair (:mod:`sglang_ddtree.pair`: a 5-layer Qwen3 target and a
DFlash block-16 drafter, float32 in plain PyTorch) continues one held-out prompt for
``--new-tokens`` tokens (stop tokens ignored) with

- no speculation (one target forward per token),
- the DFlash chain: block 16, the top-1 token at each of the D = 15 depths (a DDTree with
  ``budget = D``, ``topk = 1``),
- DDTree at each ``--budgets`` value,

at T = 0 and at T = 1 / top-p 0.95. The default prompt (held-out prompt 14) has a readable
continuation and a T = 0 chain accept length (2.76) close to the 64-prompt mean at this length
(2.87, ``assets/MODEL_CARD.md``); ``--prompt`` picks another. It prints the generated text, the accept length (committed
tokens per verify step, bonus included) and tokens/s of each, one draft tree with decoded tokens
and the accepted path, and checks that greedy chain and greedy DDTree text equal greedy
no-speculation text token for token.

One speculative step runs the real core (N = budget + 1 nodes, V vocabulary, H hidden):

    drafter(features of newly committed tokens, [root, MASK x 15]) -> draft logits [1, 15, V]
    select_candidates -> build_tree_from_candidates -> DraftTree [1, N]
    tree_to_retrieve_arrays -> positions [1, N], tree_mask [1, N, N]
    target(tree tokens, positions, tree_mask, commit=False) -> logits [1, N, V], features
    accept_greedy (T = 0) or target_probs + draw_coins + accept_sampled (T > 0)
    commit_accepted -> kept nodes: KVCache.commit(nodes), their features feed the drafter

``--toy``: a toy target and drafter over a small vocabulary, in seconds:

- target: a Markov chain over ``V`` tokens; its next-token distribution after token ``x`` is row
  ``x`` of a sharp random transition matrix ``P``.
- drafter: one "block diffusion" forward gives, for each depth ``d = 1..D``, the marginal of the
  chain ``d`` steps after the root (``P**d[root]``) blurred with noise. Like a DFlash drafter, the
  per-depth distributions are marginals, independent of the tokens picked at other depths.

Each toy decode step runs build_tree -> tree_to_retrieve_arrays -> (target rows at every node)
-> accept_greedy / accept_sampled -> commit_accepted. The toy demo prints one tree, checks that
greedy DDTree output equals plain greedy decoding, and compares accept lengths of the chain
(budget = D, top-1 per depth: DFlash) with DDTree trees of growing budget, at T = 0 and T = 1.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sglang_ddtree.core.accept import AcceptResult, accept_greedy, accept_sampled
from sglang_ddtree.core.commit import commit_accepted
from sglang_ddtree.core.layout import TreeLayout, tree_to_retrieve_arrays
from sglang_ddtree.core.sampling import draw_coins, target_probs
from sglang_ddtree.core.tree import (
    DraftTree,
    build_tree,
    build_tree_from_candidates,
    select_candidates,
)

ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def toy_label(token: int) -> str:
    """A toy token id as one character."""
    return ALPHABET[token % len(ALPHABET)]


def render_tree(
    tree: DraftTree,
    b: int = 0,
    accepted: set[int] | None = None,
    label: Callable[[int], str] = toy_label,
) -> str:
    """A draft tree as indented text: token, draft prefix prob; '*' marks the accepted path.

    tree: a DraftTree batch ([bs, N] fields); b: the row to draw; accepted: slots on the path;
    label: token id -> the text shown for it.
    """
    accepted = accepted or set()
    n = int(tree.valid[b].sum())
    parents = tree.parents[b, :n].tolist()
    kids: dict[int, list[int]] = {}
    for i in range(1, n):
        kids.setdefault(parents[i], []).append(i)
    lines = []

    def visit(i: int, indent: int) -> None:
        tok = label(int(tree.tokens[b, i]))
        mark = "*" if i in accepted else " "
        prob = float(tree.logw[b, i].exp())
        info = "root" if i == 0 else f"q={prob:.3f}"
        lines.append(f"{mark} {'  ' * indent}{tok}  [node {i}, {info}]")
        for c in kids.get(i, []):
            visit(c, indent + 1)

    visit(0, 0)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# toy pair (--toy)


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


def decode(pair, root: int, steps: int, budget: int, topk: int, temperature: float, seed: int):
    """Run `steps` toy DDTree decode steps from one root token; returns (tokens, accept lengths)."""
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
    """Plain greedy decoding of the toy target from `root`, `length` tokens in all."""
    out = [root]
    while len(out) < length:
        out.append(int(pair.target_logits[out[-1]].argmax()))
    return out


def run_toy(args: argparse.Namespace) -> None:
    """The toy demo: one rendered tree, greedy check, accept-length table."""
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


# --------------------------------------------------------------------------------------------
# trained pair (default)


@dataclass(frozen=True)
class Method:
    """A decoding method: no speculation (``budget`` None) or a DDTree of ``budget`` nodes with
    ``topk`` candidates per depth (the DFlash chain is ``budget = D``, ``topk = 1``)."""

    name: str
    budget: int | None = None
    topk: int = 1


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one run; ``temperature == 0`` is greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class StepTrace:
    """One speculative step: its tree (batch of 1, [1, N] fields) and accepted slots."""

    tree: DraftTree
    path: list[int]


@dataclass
class Run:
    """Output of one decoding run.

    tokens: the generated token ids (prompt excluded), exactly ``new_tokens`` of them.
    step_lens: tokens committed per target forward after the prefill (1 each without
        speculation; accept length + 1 with it, the last step cut at ``new_tokens``).
    seconds: wall time, prefill included.
    traces: per-step trees (speculative runs with tracing on).
    """

    tokens: list[int]
    step_lens: list[int]
    seconds: float
    traces: list[StepTrace] = field(default_factory=list)

    @property
    def accept_length(self) -> float:
        return sum(self.step_lens) / max(len(self.step_lens), 1)

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds


def next_token(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> torch.Tensor:
    """logits [1, V] -> token [1]: argmax, or a draw from the same filtered target distribution
    the speculative path verifies against (``core.target_probs``)."""
    if sampling.greedy:
        return logits.argmax(-1)
    probs = target_probs(logits[:, None], *_sampling_tensors(sampling))[:, 0]  # [1, V]
    return torch.multinomial(probs, 1, generator=gen)[:, 0]


def _sampling_tensors(sampling: Sampling) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(temperature [1], top_k [1] (0 = off), top_p [1]) for ``core.target_probs``."""
    return (
        torch.tensor([sampling.temperature]),
        torch.tensor([0]),
        torch.tensor([sampling.top_p]),
    )


@torch.inference_mode()
def generate_plain(target, prompt: list[int], new_tokens: int, sampling: Sampling) -> Run:
    """No speculation: prefill, then one 1-token target forward per new token.

    target: the pair's ``Qwen3ForCausalLM``; prompt: token ids; the KV cache is [layers, 1,
    n_kv, len(prompt) + new_tokens, D].
    """
    from sglang_ddtree.pair.modeling import KVCache

    gen = torch.Generator().manual_seed(sampling.seed)
    start = time.perf_counter()
    cache = KVCache(target.args, 1, len(prompt) + new_tokens)
    logits, _ = target(torch.tensor([prompt]), cache=cache, logits_to_keep=1)  # [1, 1, V]
    out = []
    while True:
        tok = next_token(logits[:, -1], sampling, gen)  # [1]
        out.append(int(tok))
        if len(out) == new_tokens:
            break
        logits, _ = target(tok[:, None], cache=cache, logits_to_keep=1)
    return Run(out, [1] * (new_tokens - 1), time.perf_counter() - start)


def draft_tree(
    drafter, context: torch.Tensor, root: torch.Tensor, dcache, budget: int, topk: int
) -> DraftTree:
    """One DFlash forward -> a DDTree of ``budget`` nodes.

    context: [1, C, K*H] target features of the tokens committed since the last draft (they go
    into the drafter's context cache ``dcache``); root: [1] the bonus token. The block is
    ``[root, MASK x D]``; the drafter's D = block_size - 1 per-depth logits [1, D, V] give the
    top-``topk`` candidates per depth, from which the ``budget`` best prefixes form the tree.
    """
    block = torch.full((1, drafter.block_size), drafter.mask_token_id, dtype=torch.int64)
    block[:, 0] = root
    draft_logits = drafter(context, block, cache=dcache)  # [1, D, V]
    cand_lp, cand_tok = select_candidates(draft_logits, topk, normalize=True)  # [1, D, K]
    return build_tree_from_candidates(cand_lp, cand_tok, root, budget)


def verify_tree(target, cache, tree: DraftTree, depth: int):
    """Target forward over the N tree nodes, K/V left pending in ``cache``.

    Returns (layout: TreeLayout with positions [1, N] = prefix + depth and tree_mask [1, N, N],
    logits [1, N, V] float32, features [1, N, K*H]).
    """
    prefix = torch.tensor([cache.length])
    layout = tree_to_retrieve_arrays(tree, prefix, max_depth=depth)
    logits, feats = target(
        tree.tokens,
        positions=layout.positions,
        cache=cache,
        attn_mask=layout.tree_mask,
        commit=False,
    )
    return layout, logits, feats


def accept_tree(
    layout: TreeLayout,
    tree: DraftTree,
    logits: torch.Tensor,
    sampling: Sampling,
    gen: torch.Generator,
    max_accept: int,
) -> AcceptResult:
    """Walk the verified tree: by the target argmax (greedy) or by target-only tree sampling.

    logits: [1, N, V] target logits at every node; max_accept: D + 1 (root included).
    """
    if sampling.greedy:
        return accept_greedy(layout, tree.tokens, logits.argmax(-1), max_accept)
    probs = target_probs(logits, *_sampling_tensors(sampling))  # [1, N, V]
    coins, final = draw_coins(1, tree.num_nodes, "cpu", generator=gen)  # [1, N], [1]
    return accept_sampled(layout, tree.tokens, probs, coins, final, max_accept)


@torch.inference_mode()
def generate_spec(
    target,
    drafter,
    prompt: list[int],
    new_tokens: int,
    method: Method,
    sampling: Sampling,
    trace: bool = False,
) -> Run:
    """Speculative decoding (DFlash chain or DDTree) of ``new_tokens`` tokens after ``prompt``.

    The target KV cache holds every committed token but the last (the bonus, the next root);
    the drafter's context cache holds the target features of the same tokens.
    """
    from sglang_ddtree.pair.modeling import DraftKVCache, KVCache

    depth = drafter.block_size - 1
    num_nodes = method.budget + 1
    gen = torch.Generator().manual_seed(sampling.seed)
    start = time.perf_counter()
    cache = KVCache(target.args, 1, len(prompt) + new_tokens + num_nodes)
    dcache = DraftKVCache(drafter.args, 1, len(prompt) + new_tokens + num_nodes)
    logits, context = target(torch.tensor([prompt]), cache=cache, logits_to_keep=1)
    root = next_token(logits[:, -1], sampling, gen)  # [1]
    out, step_lens, traces = [int(root)], [], []
    while len(out) < new_tokens:
        tree = draft_tree(drafter, context, root, dcache, method.budget, method.topk)
        layout, logits, feats = verify_tree(target, cache, tree, depth)
        res = accept_tree(layout, tree, logits, sampling, gen, depth + 1)
        plan = commit_accepted(res, torch.tensor([cache.length]), num_nodes)
        k = int(plan.commit_lens[0])
        keep = plan.keep_nodes[0, :k]  # [k] slots: root, then the accepted nodes
        cache.commit(keep)
        context = feats[:, keep]  # [1, k, K*H]
        emitted = plan.out_tokens[0, :k].tolist()[: new_tokens - len(out)]
        out += emitted
        step_lens.append(len(emitted))
        root = plan.bonus
        if trace:
            traces.append(StepTrace(tree, keep.tolist()))
    return Run(out, step_lens, time.perf_counter() - start, traces)


def pick_trace(traces: list[StepTrace]) -> StepTrace:
    """A step worth drawing: the longest accepted path that leaves the top-1 chain (a node that
    is not its parent's first child), else the longest path."""

    def off_chain(t: StepTrace) -> bool:
        parents = t.tree.parents[0]
        firsts = {int(parents[i]): i for i in range(t.tree.num_nodes - 1, 0, -1)}
        return any(firsts.get(int(parents[i])) != i for i in t.path[1:])

    pool = [t for t in traces if off_chain(t)] or traces
    return max(pool, key=lambda t: len(t.path))


def token_label(tok) -> Callable[[int], str]:
    """A label function for :func:`render_tree`: the decoded token, quoted."""
    return lambda i: repr(tok.decode([i]))


def methods(budgets: list[int], depth: int) -> list[Method]:
    """No speculation, the DFlash chain (budget D, top-1), then DDTree per budget."""
    rows = [Method("no speculation"), Method("DFlash chain (top-1)", depth, 1)]
    return rows + [Method(f"DDTree budget {b}", b, b) for b in budgets]


def run_method(pair, prompt, new_tokens, method, sampling, trace=False) -> Run:
    """Dispatch one run to :func:`generate_plain` or :func:`generate_spec`."""
    target, drafter, _ = pair
    if method.budget is None:
        return generate_plain(target, prompt, new_tokens, sampling)
    return generate_spec(target, drafter, prompt, new_tokens, method, sampling, trace)


def run_all(pair, prompt, new_tokens, rows, samplings, trace_budget=None, stage=None) -> dict:
    """Every method at every sampling setting -> {(method name, temperature): Run}. The greedy
    run of the method whose budget is ``trace_budget`` keeps its trees. ``stage``: called with a
    line as each run starts (the demo prints it: the whole table takes minutes on a CPU)."""
    runs = {}
    for s in samplings:
        for m in rows:
            if stage is not None:
                stage(f"{m.name}, T={s.temperature:g}: {new_tokens} tokens ...")
            trace = s.greedy and m.budget == trace_budget and m.topk > 1
            runs[m.name, s.temperature] = run_method(pair, prompt, new_tokens, m, s, trace)
    return runs


def greedy_mismatches(runs: dict, rows: list[Method]) -> dict[str, int]:
    """Method name -> index of the first token where greedy output differs from greedy
    no-speculation output (-1 when equal)."""
    ref = runs[rows[0].name, 0.0].tokens
    out = {}
    for m in rows[1:]:
        got = runs[m.name, 0.0].tokens
        out[m.name] = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), -1)
    return out


def print_table(runs: dict, rows: list[Method], samplings: list[Sampling]) -> None:
    """Accept length (tokens per target forward) and tokens/s per method and temperature."""
    head = f"{'method':<22}"
    for s in samplings:
        head += f" {'T=' + format(s.temperature, 'g') + ' accept':>13} {'tok/s':>7}"
    print(head)
    for m in rows:
        line = f"{m.name:<22}"
        for s in samplings:
            r = runs[m.name, s.temperature]
            line += f" {r.accept_length:>13.2f} {r.tokens_per_s:>7.0f}"
        print(line)


def run_pair(args: argparse.Namespace) -> None:
    """The trained-pair demo (see the module docstring)."""
    from sglang_ddtree.pair import evaluate, heldout_prompts, load_pair

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    pair = load_pair()
    target, drafter, tok = pair
    depth = drafter.block_size - 1
    text = heldout_prompts()[args.prompt]
    prompt = tok.encode(text)
    rows = methods(args.budgets, depth)
    samplings = [Sampling(0.0, 1.0, args.seed), Sampling(1.0, args.top_p, args.seed)]
    print(
        f"Trained pair: Qwen3 target ({sum(p.numel() for p in target.parameters()) / 1e6:.1f}M), "
        f"DFlash drafter (block {drafter.block_size}), float32 on the CPU, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"held-out prompt {args.prompt} ({len(prompt)} tokens), {args.new_tokens} new tokens")
    print("-" * 72 + "\n" + text.rstrip("\n") + "\n" + "-" * 72, flush=True)

    def stage(line: str) -> None:
        print(f"[{time.perf_counter() - t0:5.1f} s] {line}", flush=True)

    stage(f"warm-up: every method for 8 tokens ({len(rows)} methods x {len(samplings)} settings)")
    run_all(pair, prompt, 8, rows, samplings)
    runs = run_all(
        pair, prompt, args.new_tokens, rows, samplings, trace_budget=args.show_budget, stage=stage
    )
    stage("done")

    greedy = runs[rows[0].name, 0.0]
    print(f"\ngreedy continuation (no speculation):\n{tok.decode(greedy.tokens)}")
    print("-" * 72)
    best = rows[-1].name
    print(f"T=1, top-p {args.top_p} continuation ({best}):")
    print(tok.decode(runs[best, 1.0].tokens))
    print("-" * 72 + "\n")

    print("accept = tokens committed per target forward (accepted drafts + bonus)")
    print_table(runs, rows, samplings)
    # The first token comes from the prefill; the reference walks the other new_tokens - 1.
    ref = evaluate.chain_accept_on_prompts(target, drafter, [prompt], args.new_tokens - 1)
    print(
        f"reference T=0 chain accept (evaluate.chain_accept_on_prompts, teacher-forced): "
        f"{ref['accept_length']:.2f}"
    )
    print(
        "T=1 rows are one sample each (noisy; T=0 rows are deterministic). tok/s is CPU wall\n"
        "time, prefill included: here the fixed-shape accept walks of the core (written for\n"
        "CUDA graphs: about depth x budget small ops per step) cost more than the tiny target's\n"
        "forward, so speculation does not pay off on a CPU; accept lengths do not depend on it."
    )

    print()
    bad = greedy_mismatches(runs, rows)
    for name, at in bad.items():
        verdict = "OK" if at < 0 else f"MISMATCH at token {at}"
        print(f"greedy {name} == greedy no speculation ({args.new_tokens} tokens): {verdict}")

    show = next((m for m in rows if m.budget == args.show_budget and m.topk > 1), None)
    if show is not None:
        t = pick_trace(runs[show.name, 0.0].traces)
        print(f"\nOne draft tree of the greedy {show.name} run, q = draft prefix probability;")
        print(f"* = accepted path ({len(t.path) - 1} drafts accepted + 1 bonus)")
        print(render_tree(t.tree, 0, set(t.path), token_label(tok)))
    print(f"\n({time.perf_counter() - t0:.1f} s in all on the CPU)")
    if any(at >= 0 for at in bad.values()):
        raise SystemExit("greedy speculative output differs from greedy decoding")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="DDTree speculative decoding on the CPU.")
    ap.add_argument("--toy", action="store_true", help="the toy Markov pair instead")
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--seed", type=int, default=0)
    pair = ap.add_argument_group("trained pair (default)")
    pair.add_argument("--prompt", type=int, default=14, help="held-out prompt index (0-63)")
    pair.add_argument("--new-tokens", type=int, default=128)
    pair.add_argument("--top-p", type=float, default=0.95)
    pair.add_argument("--show-budget", type=int, default=16, help="budget of the drawn tree")
    toy = ap.add_argument_group("toy pair (--toy)")
    toy.add_argument("--vocab", type=int, default=24)
    toy.add_argument("--depth", type=int, default=7, help="draft depth D (= block_size - 1)")
    toy.add_argument("--steps", type=int, default=100)
    args = ap.parse_args(argv)
    for problem in bad_arguments(args):
        ap.error(problem)  # exits 2 with the usage line
    if args.toy:
        run_toy(args)
    else:
        run_pair(args)


def bad_arguments(args: argparse.Namespace) -> list[str]:
    """What is wrong with the command line, each with the range it must be in."""
    from sglang_ddtree.pair import heldout_prompts

    problems = []
    num_prompts = len(heldout_prompts())
    if not 0 <= args.prompt < num_prompts:
        problems.append(f"--prompt {args.prompt}: pick a held-out prompt in 0..{num_prompts - 1}")
    if args.new_tokens < 1:
        problems.append(f"--new-tokens {args.new_tokens}: must be >= 1")
    if not 0.0 < args.top_p <= 1.0:
        problems.append(f"--top-p {args.top_p}: must be in (0, 1]")
    bad_budgets = [b for b in args.budgets if b < 1]
    if bad_budgets:
        problems.append(f"--budgets {bad_budgets}: every tree budget must be >= 1")
    if args.show_budget < 1:
        problems.append(f"--show-budget {args.show_budget}: must be >= 1")
    if args.vocab < 2:
        problems.append(f"--vocab {args.vocab}: the toy pair needs >= 2 tokens")
    if args.depth < 1:
        problems.append(f"--depth {args.depth}: must be >= 1")
    if args.steps < 1:
        problems.append(f"--steps {args.steps}: must be >= 1")
    return problems


if __name__ == "__main__":
    main()
