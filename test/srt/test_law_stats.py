"""The statistics of the end-to-end law check (`sglang_ddtree.testing.law`), on the CPU.

Calibration at the check's own sample size (3,000 completions a side) and Bonferroni family
(every setting x 7 tests): samples of one law pass, a 10 % temperature error is rejected.
"""

import json
import math
import random
from pathlib import Path

import pytest

pytest.importorskip("scipy")

from sglang_ddtree.testing import law  # noqa: E402


def _chain(temperature, vocab=40):
    """The next-token tables of a toy Markov chain (next token depends on the last) at a
    temperature: {previous token: probabilities}, fixed logits N(0, 3^2) per previous token, so
    they spread like a language model's (a 10 % temperature error moves ~5 % of the mass)."""
    import math

    def dist(prev):
        g = random.Random(prev)
        w = [math.exp(g.gauss(0.0, 3.0) / temperature) for _ in range(vocab)]
        return [x / sum(w) for x in w]

    return {p: dist(p) for p in range(vocab)}


def _completions(rng, temperature, n=law.SAMPLES, vocab=40, new_tokens=law.NEW_TOKENS):
    """n completions of `_chain`'s toy chain at a temperature, each starting after token 0."""
    tables = _chain(temperature, vocab)
    out = []
    for _ in range(n):
        seq, prev = [], 0
        for _ in range(new_tokens):
            prev = rng.choices(range(vocab), weights=tables[prev])[0]
            seq.append(prev)
        out.append(seq)
    return out


def test_chi2_pools_rare_outcomes_and_handles_one_bin():
    p, dof = law.chi2_two_sample([1] * 50, [1] * 50)
    assert (p, dof) == (1.0, 0)
    p, dof = law.chi2_two_sample([1] * 50 + [2] * 50 + [3], [1] * 50 + [2] * 50 + [4])
    assert dof == 2 and p > 0.5  # 3 and 4 pooled into one bin


def test_family_null_passes_and_temperature_error_is_rejected():
    rng = random.Random(0)
    ref = {f"s{i}": _completions(rng, 1.0) for i in range(3)}
    same = {k: _completions(rng, 1.0) for k in ref}
    hot = {k: _completions(rng, 1.1) for k in ref}
    null = {k: law.compare_samples(ref[k], same[k]) for k in ref}
    power = {k: law.compare_samples(ref[k], hot[k]) for k in ref}
    # The level of the real check's DDTREE family: every setting plus the mixed ones, 7 tests each.
    level = law.ALPHA / ((len(law.law_settings()) + len(law.MIXED)) * (law.NEW_TOKENS + 1))
    assert all(r["min_p"] > level for r in null.values())
    # The wrong law is rejected as a family (Bonferroni over its 3 x 7 tests), as in the check.
    assert min(r["min_p"] for r in power.values()) < law.ALPHA / (3 * (law.NEW_TOKENS + 1))
    fam = law.family(null)
    assert fam["tests"] == 3 * (law.NEW_TOKENS + 1) and fam["rejected"] == []


def _swap_after(samples, prefix, a, b):
    """``samples`` with token ``a`` replaced by ``b`` where it follows ``prefix`` (the identity
    of the token at a near-tied boundary flipped, its mass kept)."""
    k = len(prefix)
    return [s[:k] + [b] + s[k + 1 :] if s[:k] == prefix and s[k] == a else s for s in samples]


def _extend_law(rng, prefix, swap=None, temperature=1.0):
    """A stand-in for the server's extend-path sampler after ``prefix`` (the toy chain's next
    token), with the same swap as the speculative side or none."""
    table = _chain(temperature)[prefix[-1] if prefix else 0]
    out = rng.choices(range(len(table)), weights=table, k=law.SAMPLES)
    return [swap[1] if swap and t == swap[0] else t for t in out]


def _extend_law_of(rng, swap=None):
    """`_extend_law` as a one-argument referee."""
    return lambda p: _extend_law(rng, p, swap)


def _swap_case(rng):
    """A reference sample, a second sample of the same law, the most common first token as the
    prefix, and a token after it emitted 60-200 times out of 3,000 (``a``) with one never
    emitted there (``b``)."""
    ref, same = _completions(rng, 1.0), _completions(rng, 1.0)
    first = max(set(s[0] for s in ref), key=[s[0] for s in ref].count)
    after = [s[1] for s in ref if s[0] == first]
    a = next(t for t in sorted(set(after)) if 60 <= after.count(t) <= 200)
    seen = set(after) | {s[1] for s in same if s[0] == first}
    b = next(t for t in range(40) if t not in seen)
    return ref, same, [first], a, b


def test_forward_path_check_excuses_a_boundary_swap_and_not_a_law_error():
    """`law.attribute_rejection` at the real family's per-test level (sample size 3,000).
    Excused: the speculative side emits ``b`` where the reference emits ``a`` after one prefix,
    and the extend path swaps them too (a near-tie at a boundary). Not excused: the same swap
    with an extend path that agrees with the decode path; a swap at position 1 (both servers
    sample it from the prefill); a 10 % temperature error, alone or next to an excused swap."""
    rng = random.Random(7)
    level = law.ALPHA / ((len(law.law_settings()) + len(law.MIXED)) * (law.NEW_TOKENS + 1))
    ref, same, prefix, a, b = _swap_case(rng)
    swapped = _swap_after(same, prefix, a, b)
    assert law.compare_samples(ref, swapped)["min_p"] < level  # the swap alone is rejected

    got = law.attribute_rejection(ref, swapped, level, lambda p: _extend_law(rng, p, (a, b)))
    assert got["explained"], got
    (entry,) = got["prefixes"]
    assert entry["prefix"] == prefix and entry["p_decode_vs_extend"] < law.ALPHA
    assert entry["p_other_vs_extend"] > law.ALPHA and got["remainder_min_p"] >= level

    got = law.attribute_rejection(ref, swapped, level, lambda p: _extend_law(rng, p))
    assert not got["explained"] and got["prefixes"][0]["p_decode_vs_extend"] > law.ALPHA

    first_swap = [[b if s[0] == ref[0][0] else s[0]] + s[1:] for s in same]
    got = law.attribute_rejection(ref, first_swap, level, lambda p: _extend_law(rng, p, (a, b)))
    assert not got["explained"] and got["prefixes"] == [] and got["first_token"]

    hot = _completions(rng, 1.1)
    for other in (hot, _swap_after(hot, prefix, a, b)):
        assert law.compare_samples(ref, other)["min_p"] < level
        got = law.attribute_rejection(ref, other, level, lambda p: _extend_law(rng, p, (a, b)))
        assert not got["explained"], got

    # The family wrapper: only the rejected settings are checked, and without an engine every
    # rejection stays unexplained.
    results = {"swap": law.compare_samples(ref, swapped), "same": law.compare_samples(ref, same)}
    fam = law.family(results)
    fam["per_test_level"] = level
    fam["rejected"] = [k for k, r in results.items() if r["min_p"] < level]
    refs, others = {"swap": ref, "same": ref}, {"swap": swapped, "same": same}
    ok = law.attribute_family(dict(fam), refs, others, lambda n, p: _extend_law(rng, p, (a, b)))
    assert fam["rejected"] == ["swap"] and ok["unexplained"] == []
    assert law.attribute_family(dict(fam), refs, others, None)["unexplained"] == ["swap"]


def test_exact_model_referee_excuses_only_where_the_reference_alone_differs():
    """`law.attribute_rejection` with the exact model as the second referee (3,000 completions
    a side, the real family's level). The toy chain is the exact law. Excused: the reference
    swaps ``a`` for ``b`` after one prefix (a router near-tie its forward broke the other way)
    while the speculative side follows the exact law, with the extend path agreeing with the
    reference (so the forward path does not excuse it). Not excused: the speculative side
    swapped and the reference exact (the speculative side is the one off the model); a 10 %
    temperature error (25 %) on the speculative side where the reference is right (alone, or with
    the swap on the speculative side). A setting
    whose two differing prefixes need one referee each is excused prefix by prefix."""
    rng = random.Random(11)
    level = law.ALPHA / ((len(law.law_settings()) + len(law.MIXED)) * (law.NEW_TOKENS + 1))
    ref, same, prefix, a, b = _swap_case(rng)
    ref_swapped = _swap_after(ref, prefix, a, b)
    assert law.compare_samples(ref_swapped, same)["min_p"] < level

    def exact(p):  # the exact law: the unswapped chain
        return _extend_law(rng, p)

    def extend_like_reference(p):  # the extend path breaks the tie as the reference does
        return _extend_law(rng, p, (a, b))

    got = law.attribute_rejection(ref_swapped, same, level, extend_like_reference, exact)
    assert got["explained"], got
    (entry,) = got["prefixes"]
    assert entry["explained_by"] == "exact_model" and entry["p_decode_vs_extend"] > law.ALPHA
    assert entry["p_reference_vs_exact"] < law.ALPHA < entry["p_other_vs_exact"]

    got = law.attribute_rejection(same, _swap_after(ref, prefix, a, b), level, None, exact)
    assert not got["explained"] and got["prefixes"][0]["explained_by"] is None
    assert got["prefixes"][0]["p_reference_vs_exact"] > law.ALPHA

    hot = _completions(rng, 1.25)  # a wrong law where the reference is right: never excused
    for other in (hot, _swap_after(hot, prefix, a, b)):
        assert law.compare_samples(ref, other)["min_p"] < level
        got = law.attribute_rejection(ref, other, level, _extend_law_of(rng), exact)
        assert not got["explained"], got

    # Two prefixes: after ``prefix`` the reference alone is off the exact law (the exact model
    # excuses it); after a second prefix both the speculative side and the extend path swap
    # (the forward path excuses it).
    first2 = next(
        t
        for t in sorted({s[0] for s in ref}, key=[s[0] for s in ref].count, reverse=True)
        if [t] != prefix
    )
    after2 = [s[1] for s in ref if s[0] == first2]
    a2 = next(t for t in sorted(set(after2)) if 60 <= after2.count(t) <= 200)
    b2 = next(t for t in range(40) if t not in set(after2) | {s[1] for s in same if s[0] == first2})

    def extend_two(p):
        return _extend_law(rng, p, (a2, b2) if p == [first2] else (a, b))

    other2 = _swap_after(same, [first2], a2, b2)
    got = law.attribute_rejection(ref_swapped, other2, level, extend_two, exact)
    assert got["explained"], got
    assert sorted(e["explained_by"] for e in got["prefixes"]) == ["exact_model", "forward_path"]
    fam = law.family({"s": law.compare_samples(ref_swapped, other2)})
    fam["per_test_level"] = level
    fam["rejected"] = ["s"]
    out = law.attribute_family(
        fam, {"s": ref_swapped}, {"s": other2}, lambda n, p: extend_two(p),
        exact_law=lambda n, p: exact(p),
    )  # fmt: skip
    assert out["unexplained"] == []
    assert out["attribution"]["s"]["explained_by"] == "exact_model+forward_path"


def test_first_token_edge_reads_the_nucleus_and_top_k_margins():
    """`law.ExtendPathSampler.first_token_edge` against a stand-in engine answering fixed raw
    logprobs (probabilities 0.6, 0.2, 0.1495, 0.05, ...): at temperature 1 / top_p 0.95 the
    cumulative probabilities and the least distance to 0.95 (0.0005, from 0.9495); at top_k 2
    the gap between ranks 2 and 3; no nucleus margin with top-k set (the nucleus is then of the
    top-k's renormalized law) or at another temperature. The family wrapper attaches it to a
    rejection at position 1 only."""
    probs = [0.6, 0.2, 0.1495, 0.05, 0.0005]
    rows = [(math.log(q), t, None) for q, t in zip(probs, (202, 464, 361, 458, 7))]

    class Engine:
        def generate(self, input_ids, sampling_params, return_logprob=False, top_logprobs_num=0):
            if not return_logprob:
                return [{"output_ids": [202]} for _ in input_ids]
            return [{"output_ids": [202], "meta_info": {"output_top_logprobs": [rows]}}]

    settings = {
        "p": {"temperature": 1.0, "top_k": -1, "top_p": 0.95},
        "k": {"temperature": 1.0, "top_k": 2, "top_p": 0.95},
        "hot": {"temperature": 1.3, "top_k": -1, "top_p": 0.95},
    }
    probe = law.ExtendPathSampler(settings, [[1, 2, 3]], "float16")
    probe._stack, probe._eng = object(), Engine()
    got = probe.first_token_edge("p")
    assert [t for t, *_ in got["extend_top_logprobs"]] == [202, 464, 361, 458, 7]
    # (the readings keep six decimals of each logprob)
    assert got["cumulative"][:4] == pytest.approx([0.6, 0.8, 0.9495, 0.9995], abs=2e-6)
    assert abs(got["top_p_margin"] - 0.0005) < 2e-6 and "top_k_gap" not in got
    k = probe.first_token_edge("k")
    assert abs(k["top_k_gap"] - math.log(0.2 / 0.1495)) < 1e-5 and "top_p_margin" not in k
    assert "top_p_margin" not in probe.first_token_edge("hot")

    rng = random.Random(3)
    ref, same, _, a, b = _swap_case(rng)
    first_swap = [[b if s[0] == ref[0][0] else s[0]] + s[1:] for s in same]
    level = law.ALPHA / ((len(law.law_settings()) + len(law.MIXED)) * (law.NEW_TOKENS + 1))
    fam = {"rejected": ["p"], "per_test_level": level}

    class Probe:
        def __call__(self, name, prefix):
            return _extend_law(rng, prefix, (a, b))

        def first_token_edge(self, name):
            return {"top_p_margin": 0.0005, "setting": name}

    got = law.attribute_family(dict(fam), {"p": ref}, {"p": first_swap}, Probe(), diagnose=True)
    assert got["unexplained"] == ["p"]
    assert got["attribution"]["p"]["first_token_edge"] == {"top_p_margin": 0.0005, "setting": "p"}
    got = law.attribute_family(dict(fam), {"p": ref}, {"p": first_swap}, Probe())  # the power's
    assert "first_token_edge" not in got["attribution"]["p"]


def test_in_waves_submits_small_batches_of_the_setting():
    """`law.ExtendPathSampler.in_waves` against a stand-in engine: ``SAMPLES`` completions of
    the setting's prompt at its parameters (``n`` dropped, ``NEW_TOKENS`` tokens), at most
    ``SHAPE_WAVE`` requests a call; a mixed setting is its plain twin."""
    sizes, seen = [], []

    class Engine:
        def generate(self, input_ids, sampling_params, return_logprob=False, top_logprobs_num=0):
            sizes.append(len(input_ids))
            seen.append((input_ids[0], sampling_params[0]))
            return [{"output_ids": [5] * law.NEW_TOKENS} for _ in input_ids]

    settings = {"s": {"temperature": 1.0, "top_k": -1, "top_p": 0.95, "n": 4}}
    probe = law.ExtendPathSampler(settings, [[1, 2, 3]], "float16")
    probe._stack, probe._eng = object(), Engine()
    out = probe.in_waves("mixed_s")
    assert len(out) == law.SAMPLES and max(sizes) == law.SHAPE_WAVE and sum(sizes) == law.SAMPLES
    assert seen[0] == ([1, 2, 3], {"temperature": 1.0, "top_k": -1, "top_p": 0.95,
                                   "max_new_tokens": law.NEW_TOKENS, "ignore_eos": True})  # fmt: skip


def _first_token_swap(rng):
    """The batch-shape tests' case (3,000 completions a side, the toy chain): the real family's
    per-test level, a reference sample, a speculative sample of the same law whose most common
    first token ``a`` is swapped for a token ``b`` never emitted, and that swap as a function."""
    level = law.ALPHA / ((len(law.law_settings()) + len(law.MIXED)) * (law.NEW_TOKENS + 1))
    ref, same, _, _, b = _swap_case(rng)
    a = max(set(s[0] for s in ref), key=[s[0] for s in ref].count)

    def swap_first(samples):
        return [[b if s[0] == a else s[0]] + s[1:] for s in samples]

    return level, ref, swap_first(same), swap_first


def test_shape_null_tells_a_batch_shape_effect_from_a_speculative_one():
    """`law.shape_null` (sample size 3,000 a side, the toy chain; level: the real family's
    per-test level). A speculative sample whose first token swaps ``a`` for ``b``: where the
    reference's own small-batch sample has the same swap (a batch-shape effect of the server),
    the reference is rejected against it and the speculative sample is not (``batch_shape``);
    where that sample follows the reference's law (calibration: a second sample of it), the
    reference passes against it and the speculative sample is rejected (not ``batch_shape``)."""
    rng = random.Random(11)
    level, ref, other, swap_first = _first_token_swap(rng)
    got = law.shape_null(ref, other, swap_first(_completions(rng, 1.0)), level)
    assert got["wave"] == law.SHAPE_WAVE and got["n"] == law.SAMPLES
    assert got["reference_vs_waves"]["min_p"] < level < got["other_vs_waves"]["min_p"]
    assert got["batch_shape"]
    got = law.shape_null(ref, other, _completions(rng, 1.0), level)
    assert got["other_vs_waves"]["min_p"] < level < got["reference_vs_waves"]["min_p"]
    assert not got["batch_shape"]


def test_batch_shape_check_excuses_the_server_s_own_shift_and_never_a_wrong_law():
    """`law.attribute_family` with the batch-shape check (3,000 completions a side, the toy
    chain, the real family's per-test level). A first-token swap the server's own small-batch
    sample shares is excused, by ``batch_shape``; the same swap with a small-batch sample of
    the reference's law stays unexplained; and the wrong law (temperature x1.3, the power
    family's role) is never excused against the swapped small-batch sample."""
    rng = random.Random(12)
    level, ref, other, swap_first = _first_token_swap(rng)

    class Probe:
        def __init__(self, waves):
            self.waves = waves

        def __call__(self, name, prefix):
            return _extend_law(rng, prefix)

        def in_waves(self, name):
            return self.waves

    def run(others, waves):
        fam = {"rejected": ["s"], "per_test_level": level}
        return law.attribute_family(fam, {"s": ref}, {"s": others}, Probe(waves), diagnose=True)

    swapped_waves = swap_first(_completions(rng, 1.0))
    got = run(other, swapped_waves)
    assert got["unexplained"] == [] and got["attribution"]["s"]["explained_by"] == "batch_shape"
    assert got["attribution"]["s"]["shape_null"]["batch_shape"]
    got = run(other, _completions(rng, 1.0))  # the server's law does not move with its batches
    assert got["unexplained"] == ["s"] and not got["attribution"]["s"]["shape_null"]["batch_shape"]
    wrong = swap_first(_completions(rng, 1.3))
    got = run(wrong, swapped_waves)
    assert got["unexplained"] == ["s"]
    assert got["attribution"]["s"]["shape_null"]["other_vs_waves"]["min_p"] < level


def test_law_settings_cover_every_pairing_and_temperature():
    s = law.law_settings()
    pairs = {(v["top_k"], v["top_p"]) for k, v in s.items() if k.startswith("T")}
    assert len(pairs) == len(law.TOP_KS) * len(law.TOP_PS) == 12
    temps = {v["temperature"] for v in s.values()}
    assert temps == set(law.TEMPERATURES)
    assert set(law.MIXED) <= set(s) and set(law.CALIBRATION) <= set(s)
    assert any("logit_bias" in v for v in s.values()) and any(v.get("n", 1) > 1 for v in s.values())


def test_margin_at_differences_reads_the_first_differing_position():
    """The margin reported for a differing output is the non-speculative margin at the first
    position where the outputs part, and the share counts positions with margins that small."""
    ref = {
        "greedy_batch": [[1, 2, 3, 4], [5, 6, 7, 8]],
        "greedy_margin_ids": [[1, 2, 3, 4], [5, 6, 7, 8]],
        "greedy_margin": [[2.0, 0.01, 3.0, 1.0], [4.0, 5.0, 6.0, 0.5]],
    }
    got = law.margin_at_differences(ref, [[1, 2, 9, 9], [5, 6, 7, 8]])
    assert got["margins_at_first_difference"] == [3.0]
    assert got["share_of_positions_at_or_below_worst"] == 5 / 8
    assert got["logprob_run_equals_batch"]
    assert law.margin_at_differences(ref, ref["greedy_batch"])["margins_at_first_difference"] == []
    # A logprob run that left the batch run's path before the difference gives no margin.
    ref["greedy_margin_ids"] = [[1, 7, 7, 7], [5, 6, 7, 8]]
    got = law.margin_at_differences(ref, [[1, 2, 9, 9], [5, 6, 7, 8]])
    assert got["margins_at_first_difference"] == [] and got["differences_without_a_margin"] == 1
    assert not got["logprob_run_equals_batch"]


def test_extend_path_sampler_requests_and_readings():
    """`law.ExtendPathSampler` against a stand-in engine: the probe asks for ``SAMPLES`` one-token
    completions of the setting's prompt + prefix at the setting's parameters (``n`` dropped), is
    asked once per (setting, prefix), and records the top logprobs from the extend path (the
    prompt + prefix) and from one decode step (the prefix's last token generated, forced by a
    bias), or no decode reading where the bias did not force that token."""
    settings = {"s": {"temperature": 1.0, "top_k": 5, "top_p": 1.0, "n": 4, "logit_bias": None}}
    calls = []

    class Engine:
        forced_token = 280

        def generate(self, input_ids, sampling_params, return_logprob=False, top_logprobs_num=0):
            calls.append((input_ids, sampling_params, return_logprob))
            sp = sampling_params[0]
            if not return_logprob:
                return [{"output_ids": [i % 3]} for i in range(len(input_ids))]
            if "logit_bias" in sp:  # the forced decode step
                rows = [[(-0.01, self.forced_token, None)], [(0.0, 280, None), (-1.5, 310, None)]]
                return [{"output_ids": [self.forced_token, 310],
                         "meta_info": {"output_top_logprobs": rows}}]  # fmt: skip
            return [{"output_ids": [385], "meta_info": {"output_top_logprobs": [
                [(-1.2, 385, None), (-1.3, 310, None)]]}}]  # fmt: skip

    probe = law.ExtendPathSampler(settings, [[1, 2, 3]], "float16")
    probe._stack, probe._eng = object(), Engine()  # no server: the stand-in answers
    tokens = probe("s", [464, 280])
    assert tokens == [i % 3 for i in range(law.SAMPLES)] and probe("s", [464, 280]) is tokens
    ids, params, _ = calls[0]
    assert ids == [[1, 2, 3, 464, 280]] * law.SAMPLES
    assert params[0] == {"temperature": 1.0, "top_k": 5, "top_p": 1.0, "max_new_tokens": 1,
                         "ignore_eos": True}  # fmt: skip
    assert len(calls) == 3  # the samples and two readings; the repeated probe asked nothing
    got = probe.counts["s [464, 280]"]
    assert got["counts"] == {0: 1000, 1: 1000, 2: 1000}
    assert got["extend_top_logprobs"] == [[385, -1.2], [310, -1.3]]
    assert got["decode_top_logprobs"] == [[280, 0.0, "forced"], [310, -1.5]]
    assert calls[2][0] == [[1, 2, 3, 464]] and calls[2][1][0]["logit_bias"] == {"280": 100.0}
    Engine.forced_token = 999  # the bias lost: no decode-path reading
    assert probe._top_logprobs([1, 2, 3, 464, 280], [464, 280])["decode_top_logprobs"] is None


def test_extend_path_greedy_feeds_each_round_its_tokens_so_far():
    """Every round asks one greedy token per prompt with the tokens so far appended to the
    prompt (so each token comes from an extend), ``GREEDY_NEW_TOKENS`` rounds."""
    seen = []

    class Engine:
        def generate(self, input_ids, sampling_params):
            seen.append([list(x) for x in input_ids])
            assert all(sp["max_new_tokens"] == 1 and sp["temperature"] == 0.0
                       for sp in sampling_params)  # fmt: skip
            return [{"output_ids": [sum(x) % 7]} for x in input_ids]

    out = law.extend_path_greedy(Engine(), [[1, 2], [3]])
    assert len(seen) == law.GREEDY_NEW_TOKENS and all(len(o) == law.GREEDY_NEW_TOKENS for o in out)
    for r, ids in enumerate(seen):
        assert ids == [[1, 2] + out[0][:r], [3] + out[1][:r]]


def test_greedy_summary_reports_the_extend_path_floor():
    """Greedy mismatches are read against two floors of the non-speculative server: batch vs
    one by one, and extend path vs one by one. 9 of 256 differing is within an extend floor of
    10 but not within a batch floor of 0; 40 is within neither (one-sided Fisher, p < 0.01)."""
    pytest.importorskip("scipy")
    single = [[i, i + 1, i + 2] for i in range(256)]

    def changed(rows, k):  # the first k rows differ at their last token
        return [r[:2] + [-1] if i < k else list(r) for i, r in enumerate(rows)]

    ref = {"greedy_batch": single, "greedy_single": single, "greedy_extend": changed(single, 10)}
    for k, within in ((9, True), (40, False)):
        tree = {"greedy_batch": changed(single, k), "greedy_accept": [2.0] * 256}
        got = law.summarize_greedy(ref, tree)
        assert got["nospec_extend_vs_single"]["mismatches"] == 10
        assert got["spec_vs_nospec_single"]["first_diff_positions"] == [2] * k
        assert got["within_extend_floor"] is within and not got["within_noise_floor"]
    tree = {"greedy_batch": changed(single, 9), "greedy_accept": [2.0] * 256}
    del ref["greedy_extend"]  # an older saved run: no second floor, no key
    assert "within_extend_floor" not in law.summarize_greedy(ref, tree)


SAVED_LAW_RUN = Path(__file__).resolve().parents[2] / "benchmark/ddtree/results/run28"


@pytest.mark.skipif(
    not SAVED_LAW_RUN.is_dir(), reason="the saved law samples are not in this checkout"
)
def test_saved_run_resummarized_and_the_fp32_head_tag(tmp_path, monkeypatch):
    """Saved samples of a law run on the GPU (3,000 a side, float16) summarized again without
    an engine: no setting rejected, T0.6 / 5 / 0.8 the weakest (its position-4 tie). With
    ``--fp32-lm-head`` every file carries the ``-fp32head`` tag (a saved side of the other
    configuration is never read by mistake) and the engines get SGLang's flag."""
    import json
    import shutil

    from sglang_ddtree.testing import e2e

    monkeypatch.setattr(e2e, "ENGINE_EXTRA", {})
    args = ["--from-saved", str(SAVED_LAW_RUN), "--parts", "law", "--out", str(tmp_path)]
    args.append("--no-probes")  # no engine on the CPU
    assert law.main(args) == 0
    got = json.loads((tmp_path / "law_float16.json").read_text())
    assert got["fp32_lm_head"] is False and e2e.ENGINE_EXTRA == {}
    assert (got["attention_backend"], got["page_size"]) == ("triton", 1)
    fam = got["DDTREE"]["law"]["ddtree_family"]
    assert fam["rejected"] == []
    weakest = min(fam["adjusted_p"], key=fam["adjusted_p"].get)
    assert weakest == "T0.6_k5_p0.8" and fam["adjusted_p"][weakest] < 0.05
    # Its worst test names the cell behind it: token 426 after 464, 280, 390, never emitted
    # without speculation (the float16 tie at the nucleus edge).
    worst = got["DDTREE"]["law"]["ddtree"][weakest]["worst"]
    top = worst["cells"][0]
    assert worst["test"] == "pos4" and (top["prefix"], top["token"]) == ([464, 280, 390], 426)
    assert top["ref"] == 0 and top["other"] > 20

    tagged = tmp_path / "tagged"
    tagged.mkdir()
    for side in ("nospec", "ddtree"):
        shutil.copy(
            SAVED_LAW_RUN / f"law_{side}_float16.json.gz",
            tagged / f"law_{side}_float16-fp32head.json.gz",
        )
    out = tmp_path / "out"
    assert (
        law.main(
            [
                "--from-saved",
                str(tagged),
                "--parts",
                "law",
                "--out",
                str(out),
                "--fp32-lm-head",
                "--no-probes",
            ]
        )
        == 0
    )
    assert json.loads((out / "law_float16-fp32head.json").read_text())["fp32_lm_head"] is True
    assert e2e.ENGINE_EXTRA == {"enable_fp32_lm_head": True}
    with pytest.raises(FileNotFoundError):  # the untagged side is not taken for the tagged one
        law.main(
            [
                "--from-saved",
                str(SAVED_LAW_RUN),
                "--parts",
                "law",
                "--out",
                str(out),
                "--fp32-lm-head",
            ]
        )


SAVED_FP32_HEAD_RUN = SAVED_LAW_RUN.parent / "run49"


@pytest.mark.skipif(
    not SAVED_FP32_HEAD_RUN.is_dir(), reason="the saved law samples are not in this checkout"
)
def test_saved_fp32_head_run_differs_only_through_one_top_k_edge():
    """A law run at float32 logits (3,000 a side, float16) rejects T1.0 / top_k 5 / top_p 1.0
    alone. Its difference is one swap at the top-k edge: after 464, 280 the two servers' five
    kept tokens share four (their counts agree), the fifth is 310 without speculation and 385
    with DDTREE. With the completions through 464, 280 left out on both sides, every test of
    the setting passes at the family's per-test level: stage (3) of the forward-path check on
    real samples (its stages (1) and (2) need the non-speculative server)."""
    import gzip
    import json

    def load(side):
        path = SAVED_FP32_HEAD_RUN / f"law_{side}_float16-fp32head.json.gz"
        with gzip.open(path, "rt") as f:
            return json.load(f)

    ref, tree = load("nospec")["raw"]["law"], load("ddtree")["law"]
    results = {k: law.compare_samples(ref[k], tree[k]) for k in tree}
    fam = law.family(dict(results, **{f"mixed_{k}": results[k] for k in law.MIXED}))
    assert fam["rejected"] == ["T1.0_k5_p1.0"]
    a, b = ref["T1.0_k5_p1.0"], tree["T1.0_k5_p1.0"]

    def after(samples, prefix):
        k = len(prefix)
        return {t: [s[k] for s in samples if s[:k] == prefix].count(t) for t in range(4096)}

    ca, cb = after(a, [464, 280]), after(b, [464, 280])
    kept_a, kept_b = {t for t, c in ca.items() if c}, {t for t, c in cb.items() if c}
    assert kept_a - kept_b == {310} and kept_b - kept_a == {385} and len(kept_a) == 5
    assert ca[310] == cb[385] == 23
    rest = law.compare_samples(
        [s for s in a if s[:2] != [464, 280]], [s for s in b if s[:2] != [464, 280]]
    )
    assert rest["min_p"] > fam["per_test_level"], rest["min_p"]


@pytest.mark.skipif(
    not (SAVED_LAW_RUN.is_dir() and SAVED_FP32_HEAD_RUN.is_dir()),
    reason="the saved law samples are not in this checkout",
)
def test_summarize_law_asks_the_server_only_to_excuse_a_rejection():
    """On run 28's samples (nothing rejected) the summary never asks for an extend-path probe,
    so no extra server starts. On run 49's (T1.0 / 5 / 1.0 rejected at the top-k edge after
    464, 280), with a stand-in probe that draws from DDTREE's own next tokens after that prefix
    (an extend path that rounds as the verify does) and from the reference's elsewhere, the
    rejection is excused, the power family is then checked too and stays rejected."""
    import gzip
    import json

    def load(run, side, tag):
        with gzip.open(run / f"law_{side}_float16{tag}.json.gz", "rt") as f:
            return json.load(f)

    calls = []

    def never(name, prefix):
        calls.append((name, prefix))
        raise AssertionError("no probe needed")

    saved = load(SAVED_LAW_RUN, "nospec", "")
    got = law.summarize_law(
        saved["raw"], load(SAVED_LAW_RUN, "ddtree", ""), saved["plan"]["settings"], never
    )
    assert got["passed"] and calls == []

    saved = load(SAVED_FP32_HEAD_RUN, "nospec", "-fp32head")
    ref, tree = saved["raw"], load(SAVED_FP32_HEAD_RUN, "ddtree", "-fp32head")
    rng = random.Random(3)

    def stand_in(name, prefix):
        calls.append((name, prefix))
        side = tree["law"] if name == "T1.0_k5_p1.0" else ref["law"]
        k = len(prefix)
        pool = [s[k] for s in side[name] if s[:k] == prefix]
        return rng.choices(pool, k=law.SAMPLES)

    got = law.summarize_law(ref, tree, saved["plan"]["settings"], stand_in)
    fam = got["ddtree_family"]
    assert fam["rejected"] == ["T1.0_k5_p1.0"] and fam["unexplained"] == [], fam["attribution"]
    assert calls[0] == ("T1.0_k5_p1.0", [464, 280])
    assert got["power_family"]["unexplained"] and got["passed"]
    for name in got["power_family"]["rejected"]:  # checked, not skipped
        assert "not_run" not in got["power_family"]["attribution"][name]


def test_largest_differences_rank_cells_by_their_chi2_weight():
    """A token one side never emits after a prefix outranks a larger but proportional shift."""
    ref = [[1, 2, 3]] * 100 + [[1, 4, 5]] * 50
    other = [[1, 2, 3]] * 80 + [[1, 4, 5]] * 50 + [[1, 4, 6]] * 20
    cells = law.largest_differences(ref, other, "pos3", n=2)
    assert cells[0] == {"prefix": [1, 4], "token": 6, "ref": 0, "other": 20}
    assert cells[1] == {"prefix": [1, 2], "token": 3, "ref": 100, "other": 80}
    tup = law.largest_differences(ref, other, f"tuple{law.TUPLE_LEN}", n=1)
    assert tup == [{"prefix": [1, 4], "token": 6, "ref": 0, "other": 20}]


def _min_p_completions(rng, min_p, n=law.SAMPLES, vocab=40):
    """`_completions`' toy chain at T 1.0 under a min-p filter: each next-token table keeps the
    tokens with at least ``min_p`` times the largest probability, renormalized."""
    tables = {}
    for prev, table in _chain(1.0, vocab).items():
        pivot = max(table) * min_p
        kept = [x if x >= pivot else 0.0 for x in table]
        tables[prev] = [x / sum(kept) for x in kept]
    out = []
    for _ in range(n):
        seq, prev = [], 0
        for _ in range(law.NEW_TOKENS):
            prev = rng.choices(range(vocab), weights=tables[prev])[0]
            seq.append(prev)
        out.append(seq)
    return out


@pytest.mark.parametrize("ddtree_min_p_scale,passes", [(1.0, True), (2.0, False)])
def test_min_p_part_is_calibrated(ddtree_min_p_scale, passes):
    """The min_p part at its sample size: with DDTREE on the right law it passes (null passes,
    twice the min-p rejected); a DDTREE at twice the min-p fails it."""
    rng = random.Random(3)
    mins = {k: sp["min_p"] for k, sp in law.MIN_P_SETTINGS.items()}
    ref = {
        "min_p": {k: _min_p_completions(rng, m) for k, m in mins.items()},
        "min_p_null": {k: _min_p_completions(rng, m) for k, m in mins.items()},
        "min_p_wrong": {k: _min_p_completions(rng, 2 * m) for k, m in mins.items()},
    }
    tree = {"min_p": {k: _min_p_completions(rng, m * ddtree_min_p_scale) for k, m in mins.items()}}
    got = law.summarize_parameter_part("min_p", ref, tree)
    assert not got["families"]["null"]["rejected"]
    assert got["families"]["power"]["rejected"]
    assert got["passed"] is passes
    assert law.wrong_min_p()["minp0.1_T1.0"]["min_p"] == pytest.approx(0.2)


def test_penalties_part_wrong_law_and_parts(capsys):
    """The penalties part's wrong law moves every penalty away from neutral (twice as far) and
    drops min_new_tokens; an unknown part is refused on the command line, and so is the
    penalties part without --no-overlap."""
    wrong = {k: law._twice_penalties(sp) for k, sp in law.PENALTY_SETTINGS.items()}
    assert wrong["freq0.5_T1.0"]["frequency_penalty"] == 1.0
    assert wrong["pres0.5_rep1.2_T1.0_p0.95"]["presence_penalty"] == 1.0
    assert wrong["pres0.5_rep1.2_T1.0_p0.95"]["repetition_penalty"] == pytest.approx(1.4)
    assert wrong["min_new4_stop_T1.0"]["min_new_tokens"] == 0
    assert set(law.PARAMETER_PARTS) == {"min_p", "penalties"}
    with pytest.raises(SystemExit):
        law.main(["--parts", "law,bogus"])
    # The penalties part without --no-overlap: refused (the reference's penalizers would run
    # one token late), before any engine starts.
    with pytest.raises(SystemExit):
        law.main(["--parts", "penalties"])
    assert "needs --no-overlap" in capsys.readouterr().err


def _penalized_completions(rng, penalty, held_back=(), n=law.SAMPLES, vocab=30):
    """A toy sampler with a frequency penalty: Zipf-like logits over ``vocab`` tokens, each
    token's logit lowered by ``penalty`` per earlier occurrence in the completion, and the
    ``held_back`` tokens banned for the first 4 tokens (min_new_tokens 4 over stop ids);
    ``law.PENALTY_NEW_TOKENS`` tokens a completion."""
    import math

    base = [-0.5 * math.log(i + 1) * 3 for i in range(vocab)]
    out = []
    for _ in range(n):
        seq, counts = [], [0] * vocab
        for pos in range(law.PENALTY_NEW_TOKENS):
            logits = [b - penalty * c for b, c in zip(base, counts)]
            if pos < 4:
                for t in held_back:
                    logits[t] = -math.inf
            top = max(logits)
            tok = rng.choices(range(vocab), weights=[math.exp(x - top) for x in logits])[0]
            counts[tok] += 1
            seq.append(tok)
        out.append(seq)
    return out


@pytest.mark.parametrize(
    "case,passes", [("right", True), ("penalty_halved", False), ("no_hold_back", False),
                    ("blind_power", False)]
)  # fmt: skip
def test_penalties_part_is_calibrated(case, passes):
    """The penalties part at its sample size (``SAMPLES`` completions of
    ``PENALTY_NEW_TOKENS`` a side, Bonferroni at ``ALPHA`` over every test, the repeat-count
    test among them), on a toy sampler with a frequency penalty and a min_new_tokens
    hold-back: the right law passes (null passes, the wrong law at twice the penalty and with
    no hold-back is rejected at every setting); a DDTREE at half the penalty or without the
    hold-back fails; and where the wrong law is the right one at some setting (a blind power),
    the part fails rather than pass untested."""
    rng = random.Random(5)
    # Two penalty settings and one hold-back setting, as the part's names.
    settings = {"freq": (0.5, ()), "freq_strong": (1.0, ()), "hold": (0.0, (0, 1))}
    saved = law.PARAMETER_PARTS["penalties"]
    law.PARAMETER_PARTS["penalties"] = (dict.fromkeys(settings), *saved[1:])
    try:

        def sample(k, scale=1.0, hold=True):
            pen, held = settings[k]
            return _penalized_completions(rng, pen * scale, held if hold else ())

        ref = {
            "penalties": {k: sample(k) for k in settings},
            "penalties_null": {k: sample(k) for k in settings},
            "penalties_wrong": {
                k: (sample(k) if case == "blind_power" and k == "freq" else sample(k, 2.0, False))
                for k in settings
            },
        }
        tree = {
            "penalties": {
                k: sample(k, 0.5 if case == "penalty_halved" else 1.0, case != "no_hold_back")
                for k in settings
            }
        }
        got = law.summarize_parameter_part("penalties", ref, tree)
    finally:
        law.PARAMETER_PARTS["penalties"] = saved
    assert not got["families"]["null"]["rejected"]
    assert "repeats" in got["ddtree"]["freq"]["tests"]
    assert len(got["ddtree"]["freq"]["tests"]) == law.PENALTY_NEW_TOKENS + 2
    if case == "blind_power":
        assert got["families"]["power"]["rejected"] == ["freq_strong", "hold"]
    else:
        assert got["families"]["power"]["rejected"] == sorted(settings)
    assert got["passed"] is passes


def test_flashmla_law_runs_tag_their_sides_and_set_every_engine(tmp_path, monkeypatch, capsys):
    """``--attention-backend flashmla``: refused for the shipped (MHA) pair; with an MLA pair
    every engine (reference, speculative, probes) gets flashmla at page 64 with the drafter on
    triton, and the saved sides carry a ``-flashmla`` tag, so a triton run's are never read."""
    from sglang_ddtree.testing import e2e

    monkeypatch.setattr(e2e, "ENGINE_EXTRA", {})
    with pytest.raises(SystemExit):
        law.main(["--attention-backend", "flashmla", "--parts", "law"])
    assert "serves MLA targets" in capsys.readouterr().err and e2e.ENGINE_EXTRA == {}
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "law_nospec_bfloat16.json.gz").write_bytes(b"")  # a triton run's side
    args = ["--arch", "mla8", "--attention-backend", "flashmla", "--dtype", "bfloat16"]
    with pytest.raises(FileNotFoundError, match="law_nospec_bfloat16-flashmla.json.gz"):
        law.main([*args, "--from-saved", str(saved), "--parts", "law", "--no-probes",
                  "--out", str(tmp_path / "out")])  # fmt: skip
    assert e2e.ENGINE_EXTRA == {
        "attention_backend": "flashmla",
        "page_size": 64,
        "speculative_draft_attention_backend": "triton",
    }


def test_law_runs_at_a_page_size_tag_their_sides_and_set_every_engine(tmp_path, monkeypatch,
                                                                      capsys):  # fmt: skip
    """``--page-size``: every engine at that page size (triton takes any; flashmla only its
    64), and the saved sides carry a ``-page16`` tag, so a page-1 run's are never read."""
    from sglang_ddtree.testing import e2e

    monkeypatch.setattr(e2e, "ENGINE_EXTRA", {})
    with pytest.raises(SystemExit):
        law.main(["--arch", "mla8", "--attention-backend", "flashmla", "--page-size", "16"])
    assert "page size 64 only" in capsys.readouterr().err and e2e.ENGINE_EXTRA == {}
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "law_nospec_bfloat16.json.gz").write_bytes(b"")  # a page-1 run's side
    with pytest.raises(FileNotFoundError, match="law_nospec_bfloat16-page16.json.gz"):
        law.main(["--dtype", "bfloat16", "--page-size", "16", "--from-saved", str(saved),
                  "--parts", "law", "--no-probes", "--out", str(tmp_path / "out")])  # fmt: skip
    assert e2e.ENGINE_EXTRA == {"attention_backend": "triton", "page_size": 16}


def test_router_swap_diagnosis_is_calibrated_on_the_tiny_moe_target(tmp_path):
    """The router-swap diagnosis on the rebuilt tiny Kimi-shaped MoE target (float32,
    transformers) at the n = 4 setting's prefix (26, 72, 71), 340 tokens a sample as the saved
    run has there, level ``ALPHA``: a sample of the exact law (the null) fits it (p > ALPHA); a
    sample of the law at 1.25x the temperature fits neither it nor any swapped site's law (the
    known error is caught); the closest site's swapped law is a different law from the exact
    one."""
    pytest.importorskip("transformers")
    import gzip

    from sglang_ddtree.testing import e2e
    from sglang_ddtree.testing import tiny_models as tm

    saved = Path(__file__).resolve().parent / "data" / "law_mla8_bf16_flashmla"
    path = saved / "law_nospec_bfloat16-flashmla.json.gz"
    if not path.exists():
        pytest.skip("the saved run is not in this tree")
    with gzip.open(path, "rt") as f:
        settings = json.load(f)["plan"]["settings"]
    target, _, cfg = tm.make_pair("mla8", str(tmp_path / "pair"))
    prompts = e2e.make_prompts(len(tm.SPECIALS), cfg.vocab_size, law.GREEDY_PROMPTS, seed=1)
    name, prefix, n = "n4_T1.0_p0.95", [26, 72, 71], 340
    exact = law.ExactModelSampler(target, settings, prompts)
    sites = exact.router_swaps(name, prefix)
    assert 1 <= len(sites) <= law.ROUTER_SWAPS
    assert all(site["gap"] < law.ROUTER_TIE_GAP for site in sites)
    reference = exact(name, prefix)
    closest = min(sites, key=lambda site: site["gap"])  # a swap there moves the law
    assert law.chi2_two_sample(closest["tokens"], reference, law.MIN_BIN)[0] < law.ALPHA

    null = law.ExactModelSampler(target, settings, prompts, seed=11)(name, prefix)[:n]
    assert law.chi2_two_sample(null, reference, law.MIN_BIN)[0] > law.ALPHA
    hot_settings = {k: dict(sp) for k, sp in settings.items()}
    hot_settings[name]["temperature"] *= 1.25
    hot = law.ExactModelSampler(target, hot_settings, prompts, seed=7)(name, prefix)[:n]
    assert law.chi2_two_sample(hot, reference, law.MIN_BIN)[0] < law.ALPHA
    for site in sites:
        assert law.chi2_two_sample(hot, site["tokens"], law.MIN_BIN)[0] < law.ALPHA


def test_router_near_ties_read_single_group_routers_only(tmp_path):
    """`ExactModelSampler.router_near_ties` on the rebuilt tiny Kimi-shaped MoE target: with no
    gap bound every routing site is listed, one per MoE layer and context position, closest
    first, each gap >= 0 (the weakest chosen expert against the best one left out); the same
    weights with group-limited routing (``n_group`` 2) are not read."""
    pytest.importorskip("transformers")
    from sglang_ddtree.testing import tiny_models as tm

    target, _, cfg = tm.make_pair("mla8", str(tmp_path / "pair"))
    ids = [5, 9, 12, 40, 7]
    sampler = law.ExactModelSampler(target, {}, [])
    ties = sampler.router_near_ties(ids, max_gap=float("inf"))
    moe_layers = sorted(sampler._routers())
    assert moe_layers and len(ties) == len(moe_layers) * len(ids)
    assert {(layer, pos) for _, layer, pos in ties} == {
        (layer, pos) for layer in moe_layers for pos in range(len(ids))
    }
    gaps = [gap for gap, _, _ in ties]
    assert gaps == sorted(gaps) and gaps[0] >= 0

    config = json.loads((Path(target) / "config.json").read_text())
    config.update(n_group=2, topk_group=2)
    (Path(target) / "config.json").write_text(json.dumps(config))
    grouped = law.ExactModelSampler(target, {}, [])
    assert grouped.router_near_ties(ids, max_gap=float("inf")) == []


def test_exact_referee_on_a_saved_bfloat16_grid(tmp_path, monkeypatch):
    """`law --from-saved --no-probes --exact-referee` on a saved run (the tiny Kimi-shaped MoE
    pair on flashmla in bfloat16, 3,000 completions a side; no engine): the target rebuilt by
    `tiny_models.make_pair` and evaluated in float32 by transformers is the referee. At the
    prefix where the server's router broke a near-tie one way and DDTREE's the other, with the
    float32 model on DDTREE's side, the rejection is excused; where the float32 model sides
    with the server, it is not; the power family's wrong temperature stays rejected."""
    pytest.importorskip("transformers")
    from sglang_ddtree.testing import e2e

    saved = Path(__file__).resolve().parent / "data" / "law_mla8_bf16_flashmla"
    if not (saved / "law_nospec_bfloat16-flashmla.json.gz").exists():
        pytest.skip("the saved run is not in this tree")
    monkeypatch.setattr(e2e, "ENGINE_EXTRA", {})
    monkeypatch.setattr(law, "_PAIR", {})
    args = ["--from-saved", str(saved), "--arch", "mla8", "--attention-backend", "flashmla",
            "--dtype", "bfloat16", "--parts", "law", "--no-probes", "--exact-referee",
            "--out", str(tmp_path)]  # fmt: skip
    assert law.main(args) == 1  # n = 4 stays unexcused without the extend-path probes
    summary = json.loads((tmp_path / "law_bfloat16-flashmla.json").read_text())
    fam = summary["DDTREE"]["law"]["ddtree_family"]
    k5 = fam["attribution"]["T1.0_k5_p1.0"]
    assert k5["explained"] and k5["explained_by"] == "exact_model"
    (entry,) = k5["prefixes"]
    assert entry["prefix"] == [52] and entry["p_reference_vs_exact"] < 1e-100
    assert entry["p_other_vs_exact"] > law.ALPHA
    n4 = fam["attribution"]["n4_T1.0_p0.95"]
    assert not n4["explained"] and n4["prefixes"][0]["explained_by"] == "exact_model"
    last = n4["prefixes"][-1]
    assert last["explained_by"] is None and last["p_reference_vs_exact"] > law.ALPHA
    # The diagnosis there: the closest routing tie (the last position's layer-2 router, its
    # 2nd and 3rd experts under 0.001 apart) swapped gives DDTREE's law, not the server's;
    # a reading only: the setting stays unexplained.
    closest = min(last["router_swaps"], key=lambda site: site["gap"])
    assert closest["gap"] < 1e-3 and closest["position"] == -1
    assert closest["p_other_vs_swap"] > law.ALPHA > closest["p_reference_vs_swap"]
    assert last["router_swap_fits"] and "n4_T1.0_p0.95" in fam["unexplained"]
    power = summary["DDTREE"]["law"]["power_family"]
    assert power["rejected"] and power["unexplained"] == power["rejected"]
