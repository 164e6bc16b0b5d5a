"""The per-node target law equals SGLang's non-speculative sampler's (joint top-k / top-p).

CPU: `joint_top_k_top_p_renorm` and `target_probs` against an independent brute-force reference
of the joint rule (pairwise comparisons per token, float64 sums), on rows with exact ties.
GPU: the sgl_kernel path of `target_probs` against the same reference, and against samples of
FlashInfer's ``top_k_top_p_sampling_from_probs(..., filter_apply_order="joint")``, the call
SGLang's sampler makes: 2e5 samples per row, Pearson chi-squared, reject at p < 1e-3; the same
test must reject the top-k-then-top-p law (the old verify order) and a 10 % temperature error.
"""

import pytest
import torch
from scipy.stats import chisquare

from sglang_ddtree.core.sampling import joint_top_k_top_p_renorm, target_probs

P_MIN = 1e-3  # chi-squared p-value below which a law is rejected
NUM_SAMPLES = 200_000


def brute_force_joint(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[V] float64: the joint rule token by token (no sort, no cumsum): token x stays when
    fewer than ``top_k`` tokens are strictly more probable and their summed mass is below
    ``top_p``; ``top_k`` <= 0 means off."""
    p = probs.double()
    keep = torch.zeros_like(p, dtype=torch.bool)
    for x in range(p.numel()):
        above = p > p[x]
        count_ok = top_k <= 0 or int(above.sum()) < top_k
        keep[x] = count_ok and float(p[above].sum()) < top_p
    kept = torch.where(keep, p, torch.zeros_like(p))
    return kept / kept.sum()


def sequential_top_k_then_top_p(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[V]: the other order (top-k, renormalize, then the nucleus of that): a known-wrong law."""
    k_only = brute_force_joint(probs, top_k, 1.1)
    return brute_force_joint(k_only.float(), 0, top_p)


def quantized_rows(seed: int, rows: int, vocab: int) -> torch.Tensor:
    """Logits rounded to bf16 with a coarse scale, so exact ties are common (as in served
    bf16 models)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 2.0
    return (logits * 4).round() / 4  # a 0.25 grid: many ties in every row


# Rows that separate the candidate laws: (probs, top_k, top_p, joint result).
CRAFTED = [
    # Joint vs top-k-first: the nucleus is cut from the original mass (0.3 + 0.25 < 0.6 keeps
    # three tokens); cut from the top-3-renormalized mass it would keep two.
    ([0.3, 0.25, 0.2, 0.15, 0.1], 3, 0.6, [0.3, 0.25, 0.2, 0.0, 0.0]),
    # A tie at the k-th place: all tied tokens stay (one token is strictly above each).
    ([0.4, 0.2, 0.2, 0.2], 2, 1.0, [0.4, 0.2, 0.2, 0.2]),
    # A tie at the nucleus edge: both tied tokens have 0.4 strictly above them, below 0.5.
    ([0.4, 0.3, 0.3], 0, 0.5, [0.4, 0.3, 0.3]),
    # top_k = 1 keeps every token tied at the top.
    ([0.35, 0.35, 0.3], 1, 1.0, [0.35, 0.35, 0.0]),
]


@pytest.mark.parametrize("probs,top_k,top_p,expect", CRAFTED)
def test_joint_rule_on_crafted_rows(probs, top_k, top_p, expect):
    p = torch.tensor([probs])
    want = torch.tensor(expect) / sum(expect)
    got = joint_top_k_top_p_renorm(p, torch.tensor([top_k]), torch.tensor([top_p]))[0]
    torch.testing.assert_close(got, want.float())
    torch.testing.assert_close(brute_force_joint(p[0], top_k, top_p), want.double())


def test_top_k_first_order_is_a_different_law():
    """The rule the test guards against really differs on the first crafted row."""
    probs, top_k, top_p, expect = CRAFTED[0]
    wrong = sequential_top_k_then_top_p(torch.tensor(probs), top_k, top_p)
    assert int((wrong > 0).sum()) == 2 and sum(e > 0 for e in expect) == 3


@pytest.mark.parametrize("seed", range(4))
def test_joint_renorm_equals_brute_force_with_ties(seed):
    """Random bf16-like rows (ties everywhere) at random top_k / top_p: same kept set, same
    probabilities."""
    vocab = 48
    logits = quantized_rows(seed, 24, vocab)
    gen = torch.Generator().manual_seed(100 + seed)
    top_k = torch.randint(0, 12, (24,), generator=gen)  # 0 = off
    top_p = torch.rand(24, generator=gen) * 0.9 + 0.1
    probs = torch.softmax(logits, -1)
    got = joint_top_k_top_p_renorm(probs, top_k, top_p)
    for r in range(24):
        want = brute_force_joint(probs[r], int(top_k[r]), float(top_p[r]))
        assert torch.equal(got[r] > 0, want > 0), r
        torch.testing.assert_close(got[r].double(), want, atol=1e-6, rtol=1e-5)


def test_target_probs_temperature_above_one_and_bias():
    """Temperature (> 1 included) scales the logits before both filters, as SGLang's sampler
    does; an additive logit bias (applied by SGLang before sampling) moves tokens into and out
    of the filtered set exactly as it would there."""
    vocab = 32
    logits = quantized_rows(7, 1, vocab)
    bias = torch.zeros(vocab)
    bias[logits[0].argmin()] = 12.0  # the least likely token becomes the most likely
    for temp, top_k, top_p in [(1.3, 5, 0.9), (0.6, 20, 0.8), (2.0, 0, 0.95), (1.0, 3, 1.0)]:
        for b in (torch.zeros(vocab), bias):
            row = logits + b
            got = target_probs(
                row[None], torch.tensor([temp]), torch.tensor([top_k]), torch.tensor([top_p])
            )[0, 0]
            want = brute_force_joint(torch.softmax(row[0] / temp, -1), top_k, top_p)
            assert torch.equal(got > 0, want > 0)
            torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------------------- GPU


def _gpu_cases():
    """(name, logits [V], temperature, top_k, top_p): crafted rows and bf16-like rows."""
    cases = []
    for name, (probs, k, p, _) in zip(("joint_vs_first", "tie_k", "tie_p", "tie_top"), CRAFTED):
        cases.append((name, torch.log(torch.tensor(probs)), 1.0, k, p))
    rows = quantized_rows(11, 4, 96)
    cases += [
        ("bf16_T1.3_k20", rows[0], 1.3, 20, 1.0),
        ("bf16_T1.0_k50_p0.8", rows[1], 1.0, 50, 0.8),
        ("bf16_T0.6_k5_p0.95", rows[2], 0.6, 5, 0.95),
        ("bf16_T1.0_k20_p0.8", rows[3], 1.0, 20, 0.8),
    ]
    return cases


def _flashinfer_joint_samples(probs: torch.Tensor, top_k: int, top_p: float, num: int):
    """``num`` draws from SGLang's non-speculative sampling call on the row ``probs`` [V]."""
    from flashinfer.sampling import top_k_top_p_sampling_from_probs

    rows = probs[None].expand(num, -1).contiguous().cuda()
    ks = torch.full((num,), top_k if top_k > 0 else 1 << 30, dtype=torch.int32, device="cuda")
    ps = torch.full((num,), top_p, dtype=torch.float32, device="cuda")
    out = top_k_top_p_sampling_from_probs(rows, ks, ps, filter_apply_order="joint")
    return torch.bincount(out.long().cpu(), minlength=probs.numel())


def _gof_pvalue(counts: torch.Tensor, law: torch.Tensor) -> float:
    """Pearson goodness of fit; tokens with expected count < 5 pooled into one bin. Samples
    where the law has zero mass make the p-value 0."""
    n = int(counts.sum())
    expected = law.double() * n
    if int(counts[law == 0].sum()) > 0:
        return 0.0
    big = expected >= 5
    obs = counts[big].double().tolist()
    exp = expected[big].tolist()
    rest_o, rest_e = float(counts[~big].sum()), float(expected[~big].sum())
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    scale = sum(obs) / sum(exp)
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _gpu_cases(), ids=lambda c: c[0])
def test_kernel_target_probs_match_sglang_sampler(case):
    """sgl_kernel path == the torch reference (same kept set, values to 1e-6), and the
    FlashInfer joint sampler's 2e5 draws fit it (p > 1e-3). Power: on the same draws the
    top-k-then-top-p law (where it differs) and a 10 % temperature error are rejected."""
    name, logits, temp, top_k, top_p = case
    args = (torch.tensor([temp]), torch.tensor([top_k]), torch.tensor([top_p]))
    got = target_probs(logits[None, None].cuda(), *(a.cuda() for a in args))[0, 0].cpu()
    ref = target_probs(logits[None, None], *args)[0, 0]
    assert torch.equal(got > 0, ref > 0), name
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)

    probs = torch.softmax(logits.float() / temp, -1)
    counts = _flashinfer_joint_samples(probs, top_k, top_p, NUM_SAMPLES)
    assert _gof_pvalue(counts, got) > P_MIN, name
    wrong_order = sequential_top_k_then_top_p(probs, top_k, top_p)
    if not torch.allclose(wrong_order.float(), ref, atol=1e-3):
        assert _gof_pvalue(counts, wrong_order) < P_MIN, name
    hot = target_probs(logits[None, None], torch.tensor([temp * 1.1]), *args[1:])[0, 0]
    if float((hot - ref).abs().sum()) > 0.02:  # tokens tied at one value keep their ratio
        assert _gof_pvalue(counts, hot) < P_MIN, name
