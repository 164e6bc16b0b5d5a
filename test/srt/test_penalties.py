"""apply_tree_penalties against a per-node replay of SGLang's penalizers (CPU).

The reference, `sglang_replay`, handles one node at a time: it lists the tokens generated
before the node's prediction by walking parent pointers up to the root (the emitted tokens,
root last, then the path's draft tokens root to node), feeds them one by one to counters that
behave as SGLang's four penalizers do (a float32 frequency counter that gains the penalty per
occurrence, presence and repetition values set on first sight, a length for min_new_tokens),
then applies them in ``apply_logits_bias``'s order: one summed additive row, then the
repetition scaling.

Sample sizes: `test_matches_sglang_replay` 48 random cases (bs 1-8, W = budget + 1 up to 33,
draft depth 1-8, V 50-300, 1-60 emitted tokens per request drawn mostly from 16 "hot" ids so
they repeat on the paths, a quarter of the cases drafted from few finite candidates so slots
are padded, a quarter of the rows at neutral penalties); frequency penalties on a 1/8 grid,
where SGLang's repeated float32 adds equal our one product, so the comparison is bit for bit.
`test_wrong_variants_are_caught` runs seven deliberately wrong laws over the same 48 cases and
requires each to differ from the replay in at least a third of them (the correct dense twin
must match in all). Then 8 cases each for bf16 logits, off-grid penalties and neutral
penalties, and hand-computed chains.
"""

import pytest
import torch

from sglang_ddtree.core.layout import tree_to_retrieve_arrays
from sglang_ddtree.core.penalties import RequestPenalties, apply_tree_penalties, count_emitted
from sglang_ddtree.core.tree import build_tree

HOT = 16  # emitted tokens and draft mass concentrate on ids below HOT, so tokens repeat
STOP_COLS = 4
NUM_CASES = 48


class Case:
    """One batch: logits at every node, the tree, the emitted tokens and the penalties."""

    def __init__(self, seed: int, dyadic: bool = True, dtype=torch.float32):
        gen = torch.Generator().manual_seed(seed)

        def randint(lo, hi, shape=()):
            return torch.randint(lo, hi, shape, generator=gen)

        bs = int(randint(1, 9))
        budget = int(randint(1, 33))
        depth = int(randint(1, 9))
        vocab = int(randint(50, 301))
        self.emitted = []
        for _ in range(bs):
            n = int(randint(1, 61))
            hot = randint(0, HOT, (n,))
            cold = randint(0, vocab, (n,))
            self.emitted.append(torch.where(torch.rand(n, generator=gen) < 0.8, hot, cold))
        roots = torch.stack([e[-1] for e in self.emitted])
        bias = torch.zeros(vocab)
        bias[:HOT] = 3.0
        draft = torch.randn(bs, depth, vocab, generator=gen) * 2 + bias
        if seed % 4 == 1:  # few finite candidates: fewer prefixes than the budget, padded slots
            keep = torch.rand(bs, depth, vocab, generator=gen) < 3.0 / vocab
            keep[..., 0] = True
            draft = draft.masked_fill(~keep, float("-inf"))
        self.tree = build_tree(
            torch.log_softmax(draft, -1), budget, roots, topk=min(budget, vocab), backend="torch"
        )
        w = budget + 1
        self.layout = tree_to_retrieve_arrays(self.tree, torch.zeros(bs, dtype=torch.int64))
        self.logits = (torch.randn(bs, w, vocab, generator=gen) * 3).to(dtype)

        def grid(lo, hi, step, size):
            return (randint(round(lo / step), round(hi / step) + 1, (size,)) * step).float()

        if dyadic:
            frequency = grid(-2.0, 2.0, 0.125, bs)
            presence = grid(-2.0, 2.0, 0.125, bs)
        else:
            frequency = torch.rand(bs, generator=gen) * 4 - 2
            presence = torch.rand(bs, generator=gen) * 4 - 2
        repetition = grid(0.25, 2.0, 0.25, bs)
        lens = torch.tensor([len(e) for e in self.emitted], dtype=torch.int64)
        # min_new_tokens around output_len + depth, so the boundary falls inside the tree.
        min_new = (lens + randint(-1, depth + 2, (bs,))).clamp(min=0)
        neutral = torch.rand(bs, generator=gen) < 0.25
        frequency = torch.where(neutral, 0.0, frequency)
        presence = torch.where(neutral, 0.0, presence)
        repetition = torch.where(neutral, 1.0, repetition)
        min_new = torch.where(neutral, 0, min_new)
        stop = torch.full((bs, STOP_COLS), -1, dtype=torch.int64)
        for b in range(bs):
            k = int(randint(0, STOP_COLS + 1))
            stop[b, :k] = randint(0, HOT, (k,))  # hot ids: stop ids on paths and in output
        counts = torch.stack([torch.bincount(e, minlength=vocab) for e in self.emitted])
        self.penalties = RequestPenalties(
            output_counts=counts.to(torch.int32),
            output_lens=lens,
            frequency_penalty=frequency,
            presence_penalty=presence,
            repetition_penalty=repetition,
            min_new_tokens=min_new.to(torch.int64),
            stop_token_ids=stop,
        )

    def apply(self, fn=apply_tree_penalties, **kw):
        return fn(self.logits, self.tree.tokens, self.layout.tree_mask, self.penalties, **kw)


def path_tokens(tree, b: int, v: int) -> list[int]:
    """Draft tokens from the root (excluded) down to v (included), by parent pointers."""
    if not bool(tree.valid[b, v]):
        return []  # padded slot: no path, the root's law
    out = []
    while v != 0:
        out.append(int(tree.tokens[b, v]))
        v = int(tree.parents[b, v])
    return out[::-1]


def sglang_replay_row(row, generated, frequency, presence, repetition, min_new, stop_ids):
    """[V]: SGLang's penalizers fed ``generated`` one token at a time, applied to ``row``."""
    vocab = row.shape[0]
    frequency_acc = torch.zeros(vocab)
    presence_acc = torch.zeros(vocab)
    repetition_acc = torch.ones(vocab)
    length = 0
    for t in generated:
        frequency_acc[t] += frequency
        presence_acc[t] = presence
        repetition_acc[t] = repetition
        length += 1
    stop_row = torch.zeros(vocab)
    for t in stop_ids:
        if t >= 0:
            stop_row[t] = float("-inf")
    additive = torch.zeros(vocab)
    additive -= frequency_acc
    additive += stop_row if length < min_new else 0.0
    additive -= presence_acc
    out = row.clone()
    out.add_(additive)
    out[:] = torch.where(out < 0, out * repetition_acc, out / repetition_acc)
    return out


def sglang_replay(case: Case) -> torch.Tensor:
    p = case.penalties
    bs, w, _ = case.logits.shape
    out = torch.empty_like(case.logits)
    for b in range(bs):
        emitted = case.emitted[b].tolist()
        assert emitted[-1] == int(case.tree.tokens[b, 0]), "the root is the last emitted token"
        for v in range(w):
            out[b, v] = sglang_replay_row(
                case.logits[b, v],
                emitted + path_tokens(case.tree, b, v),
                float(p.frequency_penalty[b]),
                float(p.presence_penalty[b]),
                float(p.repetition_penalty[b]),
                int(p.min_new_tokens[b]),
                p.stop_token_ids[b].tolist(),
            )
    return out


def bits(x: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so NaNs and signed zeros compare exactly."""
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


# ---- A dense twin (per-node counts over the whole vocabulary) and wrong variants of it. ----


def dense_law(
    logits,
    tokens,
    tree_mask,
    p,
    *,
    count_root=False,
    count_self=True,
    count_path=True,
    repetition_per_occurrence=False,
    presence_as_frequency=False,
    min_new_off_by_one=False,
    scale_before_add=False,
):
    bs, w, vocab = logits.shape
    depth = tree_mask.sum(-1) - 1
    mask = tree_mask if count_self else tree_mask & ~torch.eye(w, dtype=torch.bool)
    on_path = mask & ((depth >= 1) | count_root)[:, None, :]
    one_hot = torch.nn.functional.one_hot(tokens, vocab).float()
    path = torch.bmm(on_path.float(), one_hot).long() if count_path else 0
    count = p.output_counts[:, None, :].long() + path  # [bs, W, V]
    seen = count > 0
    f = p.frequency_penalty[:, None, None]
    pr = p.presence_penalty[:, None, None]
    r = p.repetition_penalty[:, None, None]
    if presence_as_frequency:
        additive = torch.where(seen, -(f + pr) * count, -0.0)
    else:
        additive = torch.where(seen, -(f * count) - pr, -0.0)
    scale = torch.where(seen, r**count if repetition_per_occurrence else r, 1.0)
    out = logits.clone()
    if not scale_before_add:
        out.add_(additive)
    out = torch.where(out < 0, out * scale, out / scale).to(logits.dtype)
    if scale_before_add:
        out.add_(additive)
    before = p.output_lens[:, None] + depth
    banned = (
        before <= p.min_new_tokens[:, None]
        if min_new_off_by_one
        else before < p.min_new_tokens[:, None]
    )
    stop = torch.zeros(bs, vocab + 1, dtype=torch.bool)
    stop.scatter_(1, torch.where(p.stop_token_ids < 0, vocab, p.stop_token_ids), True)
    return out.masked_fill(banned[:, :, None] & stop[:, None, :vocab], float("-inf"))


WRONG_VARIANTS = {
    "path not counted": dict(count_path=False),
    "root counted twice": dict(count_root=True),
    "node's own token not counted": dict(count_self=False),
    "repetition applied per occurrence": dict(repetition_per_occurrence=True),
    "presence counted as frequency": dict(presence_as_frequency=True),
    "min_new_tokens off by one": dict(min_new_off_by_one=True),
    "scaling before the additive penalties": dict(scale_before_add=True),
}


@pytest.fixture(scope="module")
def cases():
    return [Case(seed) for seed in range(NUM_CASES)]


@pytest.fixture(scope="module")
def replays(cases):
    return [sglang_replay(c) for c in cases]


def test_matches_sglang_replay(cases, replays):
    for seed, (case, want) in enumerate(zip(cases, replays)):
        got = case.apply()
        assert torch.equal(bits(got), bits(want)), f"case {seed}"
        assert torch.equal(bits(case.apply(dense_law)), bits(want)), f"dense twin, case {seed}"


def test_cases_exercise_the_law(cases):
    """The sample holds what the law is about: tokens repeated between the emitted output and
    the paths, repeated on one path, stop ids on paths, padded slots, neutral rows."""
    path_hits = repeats_on_path = stop_on_path = padded = 0
    for c in cases:
        bs, w = c.tree.tokens.shape
        for b in range(bs):
            emitted = set(c.emitted[b].tolist())
            stops = set(c.penalties.stop_token_ids[b].tolist())
            padded += int((~c.tree.valid[b]).sum())
            for v in range(w):
                path = path_tokens(c.tree, b, v)
                path_hits += any(t in emitted for t in path)
                repeats_on_path += len(set(path)) < len(path)
                stop_on_path += any(t in stops for t in path)
    assert min(path_hits, repeats_on_path, stop_on_path, padded) >= 20, (
        path_hits,
        repeats_on_path,
        stop_on_path,
        padded,
    )


def test_wrong_variants_are_caught(cases, replays):
    caught = {name: 0 for name in WRONG_VARIANTS}
    for case, want in zip(cases, replays):
        for name, kw in WRONG_VARIANTS.items():
            got = case.apply(lambda *a, kw=kw: dense_law(*a, **kw))
            caught[name] += not torch.equal(bits(got), bits(want))
    assert all(n >= NUM_CASES // 3 for n in caught.values()), caught


def test_bf16_logits_match_the_replay_bit_for_bit():
    """bf16 logits are rounded where SGLang's in-place ops round them: after the addition and
    after the scaling."""
    for seed in range(8):
        case = Case(100 + seed, dtype=torch.bfloat16)
        got = case.apply()
        assert got.dtype == torch.bfloat16
        assert torch.equal(bits(got), bits(sglang_replay(case))), seed


def test_arbitrary_penalties_equal_the_product_law_and_near_sglang():
    """Off the 1/8 grid SGLang's per-occurrence float32 sums and our products differ in the
    last bits once a count passes 5; the product law is matched exactly."""
    for seed in range(8):
        case = Case(200 + seed, dyadic=False)
        got = case.apply()
        assert torch.equal(bits(got), bits(case.apply(dense_law))), seed
        torch.testing.assert_close(got, sglang_replay(case), rtol=1e-6, atol=1e-5)


def test_neutral_penalties_return_the_logits_bit_for_bit():
    for seed in range(8):
        case = Case(300 + seed)
        bs = case.logits.shape[0]
        case.penalties = case.penalties._replace(
            frequency_penalty=torch.zeros(bs),
            presence_penalty=torch.zeros(bs),
            repetition_penalty=torch.ones(bs),
            min_new_tokens=torch.zeros(bs, dtype=torch.int64),
        )
        flat = case.logits.view(-1)
        flat[:4] = torch.tensor([-0.0, 0.0, float("inf"), float("-inf")])
        flat[4] = float("nan")
        flat[case.tree.tokens[0, 0]] = -0.0  # the root's token: counted, so the seen branch
        got = case.apply()
        assert got is not case.logits
        assert torch.equal(bits(got), bits(case.logits)), seed


def test_inplace_overwrites_and_returns_the_logits():
    case = Case(7)
    want = case.apply()
    logits = case.logits.clone()
    got = apply_tree_penalties(
        logits, case.tree.tokens, case.layout.tree_mask, case.penalties, inplace=True
    )
    assert got is logits
    assert torch.equal(bits(got), bits(want))


def one_request(emitted, **params) -> RequestPenalties:
    vocab = 10
    stop = params.get("stop", [-1])
    return RequestPenalties(
        output_counts=torch.bincount(torch.tensor(emitted), minlength=vocab)[None].int(),
        output_lens=torch.tensor([len(emitted)]),
        frequency_penalty=torch.tensor([params.get("frequency", 0.0)]),
        presence_penalty=torch.tensor([params.get("presence", 0.0)]),
        repetition_penalty=torch.tensor([params.get("repetition", 1.0)]),
        min_new_tokens=torch.tensor([params.get("min_new", 0)]),
        stop_token_ids=torch.tensor([stop]),
    )


def chain_mask(w: int) -> torch.Tensor:
    """Ancestor-or-self mask of a chain 0 -> 1 -> ... -> w-1."""
    return torch.ones(w, w, dtype=torch.bool).tril()[None]


def test_hand_computed_chain():
    """Emitted [5, 7, 5] (root 5), chain root -> 5 -> 5 -> 7; frequency 0.5, presence 0.25,
    repetition 2, every logit 1.0. Token 5 counts 2, 3, 4, 4 at depths 0..3; token 7 counts
    1, 1, 1, 2; token 3 is never generated and keeps 1.0."""
    tokens = torch.tensor([[5, 5, 5, 7]])
    p = one_request([5, 7, 5], frequency=0.5, presence=0.25, repetition=2.0)
    got = apply_tree_penalties(torch.ones(1, 4, 10), tokens, chain_mask(4), p)[0]

    def law(count):  # 1 - 0.5 c - 0.25, then * 2 when negative, / 2 otherwise
        x = 1.0 - 0.5 * count - 0.25
        return x * 2 if x < 0 else x / 2

    assert got[:, 5].tolist() == [law(2), law(3), law(4), law(4)]
    assert got[:, 7].tolist() == [law(1), law(1), law(1), law(2)]
    assert got[:, 3].tolist() == [1.0] * 4


def test_min_new_tokens_boundary_by_depth():
    """3 tokens emitted, min_new_tokens 5: the 4th and 5th generated tokens may not stop, so
    depths 0 and 1 ban the stop id 9 and depths 2 and 3 do not."""
    p = one_request([1, 2, 3], min_new=5, stop=[9, -1])
    got = apply_tree_penalties(
        torch.zeros(1, 4, 10), torch.tensor([[3, 4, 4, 4]]), chain_mask(4), p
    )
    assert got[0, :, 9].tolist() == [float("-inf")] * 2 + [0.0] * 2
    assert bool((got[0, :, :9] == 0).all())


def test_stop_token_zero_and_padding():
    """A -1 pad points at token 0 only through the clamp: token 0 is held back only when it is
    itself a stop id."""
    tokens, mask = torch.tensor([[1, 2]]), chain_mask(2)
    pad_only = apply_tree_penalties(
        torch.zeros(1, 2, 10), tokens, mask, one_request([1], min_new=9, stop=[-1, 4, -1])
    )
    assert pad_only[0, :, 0].tolist() == [0.0, 0.0]
    assert pad_only[0, :, 4].tolist() == [float("-inf")] * 2
    zero = apply_tree_penalties(
        torch.zeros(1, 2, 10), tokens, mask, one_request([1], min_new=9, stop=[-1, 0])
    )
    assert zero[0, :, 0].tolist() == [float("-inf")] * 2


def test_count_emitted_adds_a_step():
    gen = torch.Generator().manual_seed(0)
    case = Case(11)
    bs, vocab = case.penalties.output_counts.shape
    out_tokens = torch.randint(0, HOT, (bs, 5), generator=gen)
    lengths = torch.randint(1, 6, (bs,), generator=gen)
    out_tokens = torch.where(torch.arange(5) < lengths[:, None], out_tokens, -1)
    nxt = count_emitted(case.penalties, out_tokens)
    for b in range(bs):
        emitted = torch.cat([case.emitted[b], out_tokens[b, : int(lengths[b])]])
        assert torch.equal(nxt.output_counts[b], torch.bincount(emitted, minlength=vocab).int())
        assert int(nxt.output_lens[b]) == emitted.numel()
    assert torch.equal(
        case.penalties.output_counts.sum(1), torch.tensor([len(e) for e in case.emitted]).int()
    )


# ---- The CUDA dense pass (`core.penalties_triton`) against the torch one. ----

_INTERPRETED_DENSE_PASS = """
import torch
from test_penalties import NUM_CASES, Case, bits
from sglang_ddtree.core.penalties import _penalize_
from sglang_ddtree.core.penalties_triton import penalize_emitted_

# float32 and float16 only: the interpreter casts float32 to bfloat16 by truncation where the
# GPU rounds to nearest (the bfloat16 case runs on the GPU).
for seed in range(NUM_CASES):
    for dtype in (torch.float32, torch.float16):
        case = Case(seed, dyadic=seed % 2 == 0, dtype=dtype)
        p = case.penalties
        rows = [t.float() for t in (p.frequency_penalty, p.presence_penalty, p.repetition_penalty)]
        want = _penalize_(case.logits.clone(), p.output_counts[:, None, :],
                          *(t[:, None, None] for t in rows))
        for block in (32, 128):  # partial last blocks; blocks with and without an emitted id
            got = penalize_emitted_(case.logits.clone(), p.output_counts, *rows, block=block)
            assert torch.equal(bits(got), bits(want)), (seed, dtype, block)
print("interpreted dense pass OK")
"""


def test_dense_pass_kernel_interpreted_equals_torch(run_interpreted):
    """`penalize_emitted_` under Triton's interpreter against `_penalize_`, bit for bit, on the
    48 cases' logits (a quarter of the rows neutral, off-grid penalties on odd seeds)."""
    run_interpreted(_INTERPRETED_DENSE_PASS, "interpreted dense pass OK")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_penalties_match_the_replay_bit_for_bit(cases, replays, dtype):
    """On CUDA `apply_tree_penalties` takes the kernel for its dense pass: bit for bit the
    CPU replay of SGLang's penalizers (float32: the 48 cases; bfloat16: 8 of its own), also
    replayed from a CUDA graph on new logits."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pairs = (
        list(zip(cases, replays))
        if dtype == torch.float32
        else [(c, sglang_replay(c)) for c in (Case(100 + s, dtype=dtype) for s in range(8))]
    )
    for case, want in pairs:
        p = RequestPenalties(*(t.cuda() for t in case.penalties))
        tokens, mask = case.tree.tokens.cuda(), case.layout.tree_mask.cuda()
        got = apply_tree_penalties(case.logits.cuda(), tokens, mask, p)
        assert torch.equal(bits(got.cpu()), bits(want))
    case, want = pairs[0]
    p = RequestPenalties(*(t.cuda() for t in case.penalties))
    tokens, mask = case.tree.tokens.cuda(), case.layout.tree_mask.cuda()
    static = torch.zeros_like(case.logits, device="cuda")
    apply_tree_penalties(static.clone(), tokens, mask, p)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        apply_tree_penalties(static, tokens, mask, p, inplace=True)
    static.copy_(case.logits.cuda())
    graph.replay()
    assert torch.equal(bits(static.cpu()), bits(want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_pass_kernel_compiles_without_fused_multiply_adds(load_benchmark, monkeypatch, dtype):
    """The launch `penalize_emitted_` makes, compiled for sm_90a by Triton's compiler without a
    GPU (`kernel_registers.py`): no fused multiply-add (one would round ``-(f * c) - p`` once
    where torch rounds twice), IEEE division, round-to-nearest casts to bfloat16; the same
    launch with contraction on does fuse (so the first check can fail)."""
    regs = load_benchmark("kernel_registers")
    missing = regs.compiler_missing()
    if missing:
        pytest.skip(missing)
    from sglang_ddtree.core import penalties_triton as pt

    kernel, recorder = pt._penalize_emitted_kernel, regs._LaunchRecorder()
    monkeypatch.setattr(pt, "_penalize_emitted_kernel", recorder)
    rows = torch.zeros(4), torch.zeros(4), torch.ones(4)
    counts = torch.zeros(4, 151936, dtype=torch.int32)
    pt.penalize_emitted_(torch.zeros(4, 16, 151936, dtype=dtype), counts, *rows)
    ((args, kw),) = recorder.launches
    assert kw["enable_fp_fusion"] is False
    ptx = regs.compile_launch(kernel, args, kw).asm["ptx"]
    assert "fma.rn.f32" not in ptx and "div.rn.f32" in ptx
    assert ("cvt.rn.bf16.f32" in ptx) == (dtype == torch.bfloat16)
    fused = regs.compile_launch(kernel, args, dict(kw, enable_fp_fusion=True)).asm["ptx"]
    assert "fma.rn.f32" in fused
