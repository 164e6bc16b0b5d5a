"""With min_p, the per-node target law equals SGLang's min-p sampling path (top-k, renormalize,
top-p, renormalize, min-p relative to the most probable token, renormalize).

The reference, `sglang_min_p_path`, handles one row at a time in the order of SGLang's calls
(``top_k_renorm_prob``, ``top_p_renorm_prob``, ``min_p_sampling_from_probs``), with pairwise
comparisons per token (no sort, no cumsum) and float64 sums, from SGLang's float32 softmax of the
logits divided by the temperature.

Sample sizes: `test_matches_sglang_min_p_path` 40 random batches (bs 1-8, 1-5 nodes a request,
V 40-200, logits on a 0.25 grid so ties are everywhere; per row a temperature in [0.4, 2.2],
top_k off (0 or SGLang's 1 << 30) in a third of the rows else 1-30, top_p 1 in a third else
[0.3, 1), min_p 0 in a third else [0.02, 0.6]): 553 node rows, each compared on the kept set
(exactly) and the probabilities (1e-6 absolute, 1e-5 relative). `test_wrong_variants_are_caught`
runs five deliberately wrong laws over the same 40 batches and requires each to differ from the
reference in at least a third of them; a sixth (rows with min_p 0 keeping the joint order in a
min-p batch) touches only such rows, so it is counted over them: 80 node rows, at least a third
must differ. Crafted rows pin the order and the ties by hand.
GPU (not run on the CPU): the sgl_kernel path against the torch path, and 2e5 draws of SGLang's
own three calls against the law (Pearson chi-squared, reject at p < 1e-3), which must reject the
joint-order law where it differs.
"""

import pytest
import torch
from test_sampling_law import NUM_SAMPLES, P_MIN, _gof_pvalue, quantized_rows

from sglang_ddtree.core.layout import tree_to_retrieve_arrays
from sglang_ddtree.core.sampling import (
    _renorm_kernels,
    joint_top_k_top_p_renorm,
    min_p_renorm,
    sequential_top_k_top_p_renorm,
    target_probs,
    top_k_top_p_min_p_renorm,
)
from sglang_ddtree.core.step import accept_and_commit
from sglang_ddtree.core.tree import build_tree

NUM_CASES = 40
TOP_K_ALL = 1 << 30  # SGLang's "no top-k"


# ------------------------------------------------------------------ the reference and variants


def _top_k_keep(p: torch.Tensor, top_k: int) -> torch.Tensor:
    """[V] bool: fewer than ``top_k`` tokens strictly more probable (off when <= 0 or > V)."""
    if top_k <= 0 or top_k > p.numel():
        return torch.ones_like(p, dtype=torch.bool)
    return (p[None, :] > p[:, None]).sum(1) < top_k


def _top_p_keep(p: torch.Tensor, top_p: float) -> torch.Tensor:
    """[V] bool: the mass strictly above the token is below ``top_p`` (every token at 1)."""
    if top_p >= 1.0:
        return torch.ones_like(p, dtype=torch.bool)
    above = torch.where(p[None, :] > p[:, None], p[None, :], torch.zeros_like(p)[None, :])
    return above.sum(1) < top_p


def _renorm(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, p, torch.zeros_like(p))
    return kept / kept.sum()


def _min_p_keep(p: torch.Tensor, min_p: float, max_of: torch.Tensor | None = None) -> torch.Tensor:
    """[V] bool: ``p >= max * min_p`` (the pivot as FlashInfer's kernel forms it, in float32)."""
    top = (p if max_of is None else max_of).max()
    pivot = float(torch.tensor(float(top), dtype=torch.float32) * torch.tensor(min_p))
    return p >= pivot


def tempered_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[V] float64 of SGLang's float32 ``softmax(logits / temperature)``."""
    t = torch.tensor(temperature, dtype=torch.float32)
    return torch.softmax(logits.float() / t, -1).double()


def sglang_min_p_path(
    logits,
    temperature,
    top_k,
    top_p,
    min_p,
    *,
    joint=False,
    min_p_before_temperature=False,
    pivot_before_renorm=False,
    renorm_after_min_p=True,
    min_p_before_top_p=False,
):
    """[V] float64: SGLang's min-p path on one row; each keyword is a deliberately wrong law."""
    p = tempered_probs(logits, temperature)
    if joint:  # the non-min-p path's rule: both filters judged on the same distribution
        q2 = _renorm(p, _top_k_keep(p, top_k) & _top_p_keep(p, top_p))
    else:
        q1 = _renorm(p, _top_k_keep(p, top_k))
        if min_p_before_top_p:
            q1 = _renorm(q1, _min_p_keep(q1, min_p))
        q2 = _renorm(q1, _top_p_keep(q1, top_p))
        if min_p_before_top_p:
            return q2
    if min_p_before_temperature:
        keep = _min_p_keep(tempered_probs(logits, 1.0), min_p)
    elif pivot_before_renorm:
        keep = _min_p_keep(q2, min_p, max_of=p)
    else:
        keep = _min_p_keep(q2, min_p)
    kept = torch.where(keep, q2, torch.zeros_like(q2))
    return kept / kept.sum() if renorm_after_min_p else kept


WRONG_VARIANTS = {
    "joint top-k / top-p (the non-min-p order), then min-p": dict(joint=True),
    "min-p judged before the temperature": dict(min_p_before_temperature=True),
    "min-p relative to the max before the top-k / top-p renormalization": dict(
        pivot_before_renorm=True
    ),
    "no renormalization after min-p": dict(renorm_after_min_p=False),
    "min-p before top-p": dict(min_p_before_top_p=True),
}


class Case:
    """One batch of rows: logits at every node and each request's sampling parameters."""

    def __init__(self, seed: int):
        gen = torch.Generator().manual_seed(seed)

        def rand(*shape):
            return torch.rand(*shape, generator=gen)

        self.bs = int(torch.randint(1, 9, (), generator=gen))
        self.nodes = int(torch.randint(1, 6, (), generator=gen))
        vocab = int(torch.randint(40, 201, (), generator=gen))
        bs = self.bs
        self.logits = quantized_rows(seed, bs * self.nodes, vocab).view(bs, self.nodes, vocab)
        self.temperature = rand(bs) * 1.8 + 0.4
        k = torch.randint(1, 31, (bs,), generator=gen)
        off = rand(bs)
        self.top_k = torch.where(off < 1 / 6, 0, torch.where(off < 1 / 3, TOP_K_ALL, k))
        self.top_p = torch.where(rand(bs) < 1 / 3, 1.0, rand(bs) * 0.7 + 0.3)
        self.min_p = torch.where(rand(bs) < 1 / 3, 0.0, rand(bs) * 0.58 + 0.02)

    def got(self, **kw) -> torch.Tensor:
        args = (self.logits, self.temperature, self.top_k, self.top_p)
        return target_probs(*args, min_p=self.min_p, need_min_p=True, **kw)

    def reference(self, mixed_joint: bool = False, **wrong) -> torch.Tensor:
        """[bs, N, V] float64. ``mixed_joint``: rows with min_p 0 keep the joint law (wrong)."""
        out = torch.empty(self.logits.shape, dtype=torch.float64)
        for b in range(self.bs):
            params = (
                float(self.temperature[b]),
                int(self.top_k[b]),
                float(self.top_p[b]),
                float(self.min_p[b]),
            )
            kw = dict(joint=True) if mixed_joint and params[3] == 0.0 else wrong
            for v in range(self.nodes):
                out[b, v] = sglang_min_p_path(self.logits[b, v], *params, **kw)
        return out


def same_law(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same kept set and probabilities within 1e-6 absolute / 1e-5 relative."""
    if not torch.equal(got > 0, want > 0):
        return False
    return torch.allclose(got.double(), want, atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def cases():
    return [Case(seed) for seed in range(NUM_CASES)]


@pytest.fixture(scope="module")
def references(cases):
    return [c.reference() for c in cases]


# ------------------------------------------------------------------------------------- tests


def test_matches_sglang_min_p_path(cases, references):
    for seed, (case, want) in enumerate(zip(cases, references)):
        got = case.got()
        assert got.shape == want.shape and got.dtype == torch.float32
        assert same_law(got, want), f"case {seed}"
        # need_top_k / need_top_p False promise no row uses the filter: the same law then.
        if bool((case.top_p == 1.0).all()):
            assert same_law(case.got(need_top_p=False), want), f"case {seed}, no top-p"


def test_min_p_path_without_top_k_skips_its_pass(cases):
    """SGLang's min-p path applies ``top_k_renorm_prob`` to every row; where no row has top-k
    (SGLang's ``need_top_k_sampling`` False: every k at "all") that pass keeps every token and
    renormalizes a sum of 1, so ``need_top_k=False`` (the accept mode that skips it) gives the
    same law, for each case with its top-k taken off. Calibration: a case that keeps a row's
    top-k is caught."""
    caught = 0
    for seed, case in enumerate(cases):
        kept_top_k = case.top_k
        case.top_k = torch.full_like(kept_top_k, TOP_K_ALL)
        try:
            want = case.reference()
            assert same_law(case.got(need_top_k=False), want), f"case {seed}"
            assert same_law(case.got(), want), f"case {seed}"
        finally:
            case.top_k = kept_top_k
        if bool((kept_top_k < case.logits.shape[-1]).any() & (kept_top_k > 0).any()):
            caught += not same_law(case.got(need_top_k=False), case.reference())
    assert caught >= NUM_CASES // 2, caught


def test_cases_exercise_the_law(cases, references):
    """The sample holds rows where the order matters: min-p cutting tokens the filters kept,
    and the sequential nucleus differing from the joint one (min_p 0 rows included)."""
    min_p_cuts = order_matters = order_matters_without_min_p = 0
    for case, want in zip(cases, references):
        no_min_p = case.min_p == 0
        joint = case.reference(joint=True)
        for b in range(case.bs):
            params = (float(case.temperature[b]), int(case.top_k[b]), float(case.top_p[b]), 0.0)
            for v in range(case.nodes):
                unfiltered = sglang_min_p_path(case.logits[b, v], *params)
                min_p_cuts += int((unfiltered > 0).sum()) > int((want[b, v] > 0).sum())
                differs = not same_law(joint[b, v].float(), want[b, v])
                order_matters += differs
                order_matters_without_min_p += differs and bool(no_min_p[b])
    assert min(min_p_cuts, order_matters, order_matters_without_min_p) >= 20, (
        min_p_cuts,
        order_matters,
        order_matters_without_min_p,
    )


def test_wrong_variants_are_caught(cases, references):
    caught = {name: 0 for name in WRONG_VARIANTS}
    for case, want in zip(cases, references):
        got = case.got()
        assert same_law(got, want)
        for name, kw in WRONG_VARIANTS.items():
            caught[name] += not same_law(got, case.reference(**kw))
    assert all(n >= NUM_CASES // 3 for n in caught.values()), caught


def test_rows_without_min_p_keeping_the_joint_law_are_caught(cases):
    """Mixed batches: the rows with min_p 0 and both filters on (the only rows the wrong law
    touches), node by node; at least a third of them must differ."""
    eligible = caught = 0
    for case in cases:
        got, wrong = case.got(), case.reference(mixed_joint=True)
        for b in range(case.bs):
            both_filters = 0 < int(case.top_k[b]) < TOP_K_ALL and float(case.top_p[b]) < 1.0
            if float(case.min_p[b]) == 0.0 and both_filters:
                eligible += case.nodes
                caught += sum(not same_law(got[b, v], wrong[b, v]) for v in range(case.nodes))
    assert eligible >= 40 and caught >= eligible // 3, (eligible, caught)


# Rows by hand: (probs, top_k, top_p, min_p, the min-p path's law before renormalization).
CRAFTED = [
    # Top-k 3 renormalizes [0.3, 0.25, 0.2] to [0.4, 1/3, 0.267]; its nucleus at 0.6 holds two
    # (the joint rule holds three); min-p 0.8 of the max 0.4 keeps both.
    ([0.3, 0.25, 0.2, 0.15, 0.1], 3, 0.6, 0.8, [0.3, 0.25, 0.0, 0.0, 0.0]),
    # The same with min-p 0.9: 0.333 < 0.36, only the top token stays.
    ([0.3, 0.25, 0.2, 0.15, 0.1], 3, 0.6, 0.9, [0.3, 0.0, 0.0, 0.0, 0.0]),
    # A tie at the min-p edge (0.4 * 0.5 == 0.2 exactly in float32): every tied token stays.
    ([0.4, 0.2, 0.2, 0.2], 0, 1.0, 0.5, [0.4, 0.2, 0.2, 0.2]),
    # min_p 0 on the min-p path: the sequential order alone (two tokens, not the joint three).
    ([0.3, 0.25, 0.2, 0.15, 0.1], 3, 0.6, 0.0, [0.3, 0.25, 0.0, 0.0, 0.0]),
    # min_p 1 keeps the tokens tied at the top.
    ([0.35, 0.35, 0.3], 0, 1.0, 1.0, [0.35, 0.35, 0.0]),
]


@pytest.mark.parametrize("probs,top_k,top_p,min_p,expect", CRAFTED)
def test_crafted_rows(probs, top_k, top_p, min_p, expect):
    p = torch.tensor([probs])
    want = torch.tensor(expect) / sum(expect)
    got = top_k_top_p_min_p_renorm(
        p, torch.tensor([top_k]), torch.tensor([top_p]), torch.tensor([min_p])
    )[0]
    torch.testing.assert_close(got, want.float())


def test_min_p_renorm_keeps_ties_and_renormalizes():
    """Pivot 0.5 * 0.25 = 0.125 (exact): the two tokens tied at it stay; pivot 0.15 cuts them
    and the rest is renormalized; min_p 0 keeps every token."""
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).expand(3, 4)
    got = min_p_renorm(probs, torch.tensor([0.25, 0.3, 0.0]))
    assert torch.equal(got[0], probs[0]) and torch.equal(got[2], probs[2])
    assert torch.equal(got[1], torch.tensor([0.5, 0.25, 0.0, 0.0]) / torch.tensor(0.75))


def test_mixed_batch_flag_changes_every_row():
    """One row with min_p 0 next to one with min_p > 0: with the batch flag set the first row
    takes the sequential order; without it (no row has min_p) the joint one."""
    row = torch.log(torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1]))
    logits = torch.stack([row, row])[:, None]  # [2, 1, 5]
    args = (torch.ones(2), torch.tensor([3, 3]), torch.tensor([0.6, 0.6]))
    flagged = target_probs(logits, *args, min_p=torch.tensor([0.0, 0.9]), need_min_p=True)
    assert (flagged[0, 0] > 0).tolist() == [True, True, False, False, False]
    assert (flagged[1, 0] > 0).tolist() == [True, False, False, False, False]
    unflagged = target_probs(logits, *args, min_p=torch.tensor([0.0, 0.9]), need_min_p=False)
    assert (unflagged[0, 0] > 0).tolist() == [True, True, True, False, False]
    assert torch.equal(unflagged, target_probs(logits, *args))


def test_kernel_order_on_the_min_p_path():
    """The CUDA branch's composition, with pure-torch stand-ins of the two renorm kernels:
    sequential on the min-p path, joint otherwise, one filter alone the same in both."""
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(quantized_rows(5, 64, 80), -1)
    k = torch.randint(1, 20, (64,), generator=gen)
    p = torch.rand(64, generator=gen) * 0.7 + 0.3

    def top_k_kernel(x, kk):
        return joint_top_k_top_p_renorm(x, kk.to(torch.int64), torch.ones(x.shape[0]))

    def top_p_kernel(x, pp):
        return joint_top_k_top_p_renorm(x, torch.zeros(x.shape[0], dtype=torch.int64), pp)

    kernels = (top_k_kernel, top_p_kernel)
    seq = _renorm_kernels(probs.clone(), k, p, True, True, kernels, sequential=True)
    torch.testing.assert_close(seq, sequential_top_k_top_p_renorm(probs, k, p))
    joint = _renorm_kernels(probs.clone(), k, p, True, True, kernels, sequential=False)
    torch.testing.assert_close(joint, joint_top_k_top_p_renorm(probs, k, p))
    assert not torch.equal(seq > 0, joint > 0)
    for need_k, need_p in ((True, False), (False, True)):
        a = _renorm_kernels(probs.clone(), k, p, need_k, need_p, kernels, sequential=True)
        b = _renorm_kernels(probs.clone(), k, p, need_k, need_p, kernels, sequential=False)
        assert torch.equal(a, b)


def test_greedy_rows_untouched_by_min_p():
    """accept_and_commit: greedy rows (top_k 1) commit the greedy walk whatever min_p they carry
    and whatever the min-p path does to the sampled rows."""
    gen = torch.Generator().manual_seed(3)
    bs, budget, vocab, depth = 4, 7, 50, 3
    draft = torch.log_softmax(torch.randn(bs, depth, vocab, generator=gen) * 2, -1)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    tree = build_tree(draft, budget, roots, topk=4, backend="torch")
    layout = tree_to_retrieve_arrays(tree, torch.zeros(bs, dtype=torch.int64))
    w = budget + 1
    logits = torch.randn(bs * w, vocab, generator=gen) * 3
    coins = torch.rand(bs, w, generator=gen)
    final = torch.rand(bs, generator=gen)
    common = dict(
        accept_width=depth + 1,
        temperatures=torch.tensor([1.0, 0.8, 1.0, 1.2]),
        top_ks=torch.tensor([1, 20, 1, TOP_K_ALL]),
        top_ps=torch.tensor([1.0, 0.9, 1.0, 0.8]),
        coins=coins,
        final_coins=final,
    )
    seq_lens = torch.zeros(bs, dtype=torch.int64)
    plain = accept_and_commit(logits, tree.tokens, layout, seq_lens, **common)
    with_min_p = accept_and_commit(
        logits,
        tree.tokens,
        layout,
        seq_lens,
        min_ps=torch.tensor([0.7, 0.3, 0.0, 0.5]),
        need_min_p=True,
        **common,
    )
    greedy = torch.tensor([True, False, True, False])
    assert torch.equal(plain.out_tokens[greedy], with_min_p.out_tokens[greedy])
    assert torch.equal(plain.keep_index[greedy], with_min_p.keep_index[greedy])


# --------------------------------------------------------------------------------------- GPU


def _sglang_min_p_samples(probs, top_k: int, top_p: float, min_p: float, num: int):
    """``num`` draws of SGLang's min-p path calls on the row ``probs`` [V]."""
    from flashinfer.sampling import min_p_sampling_from_probs
    from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob

    rows = probs[None].expand(num, -1).contiguous().cuda()
    ks = torch.full((num,), top_k if top_k > 0 else TOP_K_ALL, dtype=torch.int32, device="cuda")
    ps = torch.full((num,), top_p, dtype=torch.float32, device="cuda")
    ms = torch.full((num,), min_p, dtype=torch.float32, device="cuda")
    rows = top_p_renorm_prob(top_k_renorm_prob(rows, ks), ps)
    out = min_p_sampling_from_probs(rows, ms)
    return torch.bincount(out.long().cpu(), minlength=probs.numel())


def _gpu_cases():
    """(name, logits [V], temperature, top_k, top_p, min_p)."""
    rows = quantized_rows(13, 4, 96)
    return [
        ("crafted_order", torch.log(torch.tensor([0.3, 0.25, 0.2, 0.15, 0.1])), 1.0, 3, 0.6, 0.0),
        ("bf16_T1.3_k20_p0.9_m0.1", rows[0], 1.3, 20, 0.9, 0.1),
        ("bf16_T0.7_k0_p1_m0.05", rows[1], 0.7, 0, 1.0, 0.05),
        ("bf16_T1.0_k10_p0.8_m0.2", rows[2], 1.0, 10, 0.8, 0.2),
        ("bf16_T1.5_k30_p0.7_m0.0", rows[3], 1.5, 30, 0.7, 0.0),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("case", _gpu_cases(), ids=lambda c: c[0])
def test_kernel_min_p_path_matches_sglang(case):
    """sgl_kernel path == the torch path (same kept set, values to 1e-6); 2e5 draws of SGLang's
    own calls fit it (p > 1e-3) and reject the joint-order law where it differs."""
    name, logits, temp, top_k, top_p, min_p = case
    args = [torch.tensor([temp]), torch.tensor([top_k]), torch.tensor([top_p])]
    args.append(torch.tensor([min_p]))
    cuda_args = [a.cuda() for a in args]
    got = target_probs(
        logits[None, None].cuda(),
        *cuda_args[:3],
        min_p=cuda_args[3],
        need_min_p=True,
    )[0, 0].cpu()
    ref = target_probs(logits[None, None], *args[:3], min_p=args[3], need_min_p=True)[0, 0]
    assert torch.equal(got > 0, ref > 0), name
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)

    probs = torch.softmax(logits.float() / temp, -1)
    counts = _sglang_min_p_samples(probs, top_k, top_p, min_p, NUM_SAMPLES)
    assert _gof_pvalue(counts, got) > P_MIN, name
    joint = sglang_min_p_path(logits, temp, top_k, top_p, min_p, joint=True).float()
    if not torch.allclose(joint, ref, atol=1e-3):
        assert _gof_pvalue(counts, joint) < P_MIN, name


@pytest.mark.gpu
def test_kernel_min_p_path_without_top_k():
    """On the GPU, sgl_kernel's ``top_k_renorm_prob`` at k >= V (SGLang's "all") keeps every
    token and changes the values only by float32 rounding (it renormalizes; not bit for bit),
    so the min-p accept mode without the top-k pass (``need_top_k=False``, the top-p pass then
    free to take the logits: radix) keeps SGLang's law: the same kept set and values within
    float32 rounding as the path with the pass, over 16 requests x 9 nodes of logits on a 0.25
    grid (ties at the cuts)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sgl_kernel import top_k_renorm_prob

    g = torch.Generator().manual_seed(11)
    bs, n, vocab = 16, 9, 1000
    logits = ((torch.randn(bs, n, vocab, generator=g) * 12).round() * 0.25).cuda()
    probs = torch.softmax(logits.view(bs * n, vocab), -1)
    for k in (TOP_K_ALL, vocab):
        ks = torch.full((bs * n,), k, dtype=torch.int32, device="cuda")
        kept = top_k_renorm_prob(probs, ks)
        assert torch.equal(kept > 0, probs > 0), k
        torch.testing.assert_close(kept, probs, atol=1e-6, rtol=1e-5)
    temp = (torch.rand(bs, generator=g) + 0.5).cuda()
    top_k = torch.full((bs,), TOP_K_ALL, device="cuda")
    top_p = (torch.rand(bs, generator=g) * 0.5 + 0.5).cuda()
    min_p = (torch.rand(bs, generator=g) * 0.4).cuda()
    args = (logits, temp, top_k, top_p)
    kw = dict(min_p=min_p, need_min_p=True)
    want = target_probs(*args, need_top_k=True, **kw)
    got = target_probs(*args, need_top_k=False, **kw)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


_INTERPRETED_MIN_P = """
import torch
from sglang_ddtree.core.minp_triton import min_p_renorm_
from sglang_ddtree.core.sampling import min_p_renorm

g = torch.Generator().manual_seed(0)
for rows, vocab, block in ((7, 1000, 128), (5, 300, 512), (3, 1, 16)):
    logits = (torch.randn(rows, vocab, generator=g) * 3 / 0.25).round() * 0.25  # many ties
    probs = torch.softmax(logits, -1)
    probs[0, : vocab // 2] = 0.0  # a row already filtered upstream (zeros stay zeros)
    min_p = torch.rand(rows, generator=g) * 0.6
    min_p[1 % rows] = 0.0  # keeps every token
    want = min_p_renorm(probs, min_p)
    got = min_p_renorm_(probs.clone(), min_p, block=block)
    assert torch.equal(got > 0, want > 0), (rows, vocab)  # the kept set, exactly
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)
    assert torch.allclose(got.sum(-1), torch.ones(rows))
print("interpreted min-p OK")
"""


def test_min_p_kernel_interpreted_equals_torch(run_interpreted):
    """`minp_triton.min_p_renorm_` under Triton's interpreter against `min_p_renorm`: the same
    kept set (ties at the pivot on a 0.25 logit grid) and values within float32 rounding, over
    several blocks a row with a partial last one, one block wider than the row, V = 1."""
    run_interpreted(_INTERPRETED_MIN_P, "interpreted min-p OK")


@pytest.mark.gpu
def test_min_p_kernel_rows_match_the_torch_path():
    """From `MIN_P_KERNEL_ROWS` rows on, CUDA's min-p step is `minp_triton`'s kernel: the
    same kept set as the torch path and values within float32 rounding, over 16 requests x 9
    nodes of logits on a 0.25 grid (ties at the pivot), min_p 0 in some rows."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sglang_ddtree.core.sampling import MIN_P_KERNEL_ROWS

    g = torch.Generator().manual_seed(7)
    bs, n, vocab = 16, 9, 1000
    assert bs * n >= MIN_P_KERNEL_ROWS
    logits = (torch.randn(bs, n, vocab, generator=g) * 12).round() * 0.25
    args = [torch.rand(bs, generator=g) + 0.5, torch.randint(0, 50, (bs,), generator=g),
            torch.rand(bs, generator=g) * 0.5 + 0.5]  # fmt: skip
    min_p = torch.rand(bs, generator=g) * 0.4
    min_p[::4] = 0.0
    got = target_probs(logits.cuda(), *(a.cuda() for a in args), min_p=min_p.cuda(),
                       need_min_p=True).cpu()  # fmt: skip
    want = target_probs(logits, *args, min_p=min_p, need_min_p=True)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
