"""The logprobs check's logic on the CPU: position kinds from streamed step sizes, the per-kind
differences on the common prefix, the verdict (p99 against the server's own floor, the maximum,
enough positions) and its calibration (the late reading), on synthetic outputs and through the
whole check on a fake pair of engines."""

import random

import pytest

from sglang_ddtree.testing import logprobs_check as lc


def test_position_kinds_from_streamed_steps():
    # The prefill's token alone, then steps of 3, 1 and 2 tokens.
    assert lc.position_kinds([1, 3, 1, 2]) == [
        "prefill", "root", "path", "bonus", "root", "root", "bonus",
    ]  # fmt: skip
    # The first chunk carrying the first step as well.
    assert lc.position_kinds([3, 2]) == ["prefill", "root", "bonus", "root", "bonus"]


def _noisy(outs, noise, rng):
    return [
        {
            "ids": list(o["ids"]),
            "logprobs": [x + rng.uniform(-noise, noise) for x in o["logprobs"]],
            "top": [[(v + rng.uniform(-noise, noise), i) for v, i in row] for row in o["top"]],
        }
        for o in outs
    ]


def _outputs(seed: int, noise: float, steps_per_prompt: int = 12, floor_noise: float = 0.04):
    """(base, tree, kinds, floor) of 8 prompts whose ids agree up to a late divergence in two
    of them; DDTREE's values are the base's plus uniform noise of at most ``noise``, the floor
    the differences of the base from itself plus noise of at most ``floor_noise``."""
    rng = random.Random(seed)
    base, kinds = [], []
    for _ in range(8):
        sizes = [1] + [rng.randint(1, 5) for _ in range(steps_per_prompt)]
        n = sum(sizes)
        top = [sorted(((-rng.random() * 5, rng.randrange(1000)) for _ in range(lc.TOP_N)),
                      reverse=True) for _ in range(n)]  # fmt: skip
        ids = [rng.randrange(1000) for _ in range(n)]
        base.append({"ids": ids, "logprobs": [-rng.random() * 5 for _ in range(n)], "top": top})
        kinds.append(lc.position_kinds(sizes))
    tree = _noisy(base, noise, rng)
    for t in tree[:2]:  # diverges late: the positions past it are not compared
        t["ids"][-3] = (t["ids"][-3] + 1) % 1000
    floor = lc.differences(base, _noisy(base, floor_noise, rng), kinds)
    return base, tree, kinds, floor


def test_within_the_bound_passes_and_the_late_reading_is_caught():
    """DDTREE's differences drawn as the floor's (noise up to 0.04 on both) pass; reading them
    one position late fails the bound on the path positions."""
    base, tree, kinds, floor = _outputs(0, noise=0.04)
    v = lc.verdict(base, tree, kinds, floor)
    assert v["passed"] and v["enough_positions"] and v["one_position_late_caught"], v
    assert v["per_kind"]["path"]["positions"] >= lc.MIN_POSITIONS
    assert not lc.within(v["one_position_late"], floor["path"])
    # Positions past a divergence are not compared: a wild value there changes nothing.
    tree[0]["logprobs"][-1] = 99.0
    assert lc.verdict(base, tree, kinds, floor)["passed"]


@pytest.mark.parametrize("noise, passed", [(0.045, True), (0.06, False)])
def test_the_p99_is_judged_against_the_floors(noise, passed):
    """Noise up to 0.045 against a floor's 0.04 (p99 ratio about 1.1) passes; up to 0.06 (about
    1.5, beyond `P99_RATIO`) fails on the p99 alone: every maximum stays below 0.1. The floor's
    p99 is the one read: a floor with a long tail (its maximum 0.09) judges the same."""
    base, tree, kinds, floor = _outputs(1, noise=noise)
    v = lc.verdict(base, tree, kinds, floor)
    assert v["passed"] is passed, v["per_kind"]
    for cell in floor.values():
        cell["token"]["max"] = 0.09
    assert lc.verdict(base, tree, kinds, floor)["passed"] is passed
    assert all(v["per_kind"][k]["token"]["max"] <= lc.MAX_TOKEN_DIFF for k in lc.KINDS)
    ratio = v["per_kind"]["path"]["token"]["p99"] / floor["path"]["token"]["p99"]
    assert (ratio <= lc.P99_RATIO) is passed


@pytest.mark.parametrize("kind", lc.KINDS)
@pytest.mark.parametrize("outlier, passed", [(0.09, True), (0.15, False)])
def test_one_position_over_the_maximum_fails(kind, outlier, passed):
    """One position of a kind (of hundreds) off by 0.15 fails the verdict through the maximum
    (the p99 does not see it); off by 0.09 passes."""
    base, tree, kinds, floor = _outputs(2, noise=0.01, steps_per_prompt=60)
    p, i = next((p, ks.index(kind)) for p, ks in enumerate(kinds[2:], 2))
    tree[p]["logprobs"][i] = base[p]["logprobs"][i] - outlier
    v = lc.verdict(base, tree, kinds, floor)
    assert v["passed"] is passed, v["per_kind"][kind]
    if kind in lc.JUDGED:  # (8 prefill positions: their p99 is their maximum)
        assert v["per_kind"][kind]["token"]["p99"] <= 0.01


def test_too_few_positions_do_not_pass():
    base, tree, kinds, floor = _outputs(3, noise=0.0, steps_per_prompt=1)
    v = lc.verdict(base[:1], tree[:1], kinds[:1], floor)
    assert not v["enough_positions"] and not v["passed"]


def test_differences_read_the_given_positions():
    """The greedy floor is read on the positions DDTREE is compared on (``lengths``), with its
    kinds; the top-n only where both report the same ids in the same order."""
    a = {"ids": [1, 2, 3], "logprobs": [-1.0, -2.0, -3.0], "top": [[(-1.0, 1)], [(-2.0, 2)], []]}
    b = {"ids": [1, 2, 3], "logprobs": [-1.5, -2.1, -9.0], "top": [[(-1.2, 1)], [(-2.0, 5)], []]}
    kinds = [["prefill", "root", "bonus"]]
    got = lc.differences([a], [b], kinds, lengths=[2])
    assert set(got) == {"prefill", "root"} and got["root"]["token"]["max"] == pytest.approx(0.1)
    assert got["prefill"]["top"]["max"] == pytest.approx(0.2) and got["root"]["top"]["n"] == 0
    assert lc.differences([a], [b], kinds)["bonus"]["token"]["max"] == pytest.approx(6.0)


def test_rescore_asks_each_token_after_the_tokens_before_it():
    """`rescore` sends one request per position, alone (the prompt and the tokens before it,
    asking the token there, one new token at the same sampling parameters) and hands each answer
    back to its prompt and position."""
    calls = []

    class Engine:
        def generate(self, input_ids, sampling_params, return_logprob, top_logprobs_num,
                     token_ids_logprob):  # fmt: skip
            calls.append((sampling_params, top_logprobs_num))
            assert return_logprob and len(input_ids) == len(token_ids_logprob) == 1
            ids, tok = input_ids[0], token_ids_logprob[0][0]
            return [{"meta_info": {
                "output_token_ids_logprobs": [[(-len(ids) - tok / 1000, tok, None)]],
                "output_top_logprobs": [[(-0.1, len(ids), None)]],
            }}]  # fmt: skip

    prompts = [[1, 2, 3], [4]]
    outs = [{"ids": [7, 8]}, {"ids": [9, 5, 6]}]
    got = lc.rescore(Engine(), prompts, outs, lc.SAMPLED)
    assert len(calls) == 5
    assert all(c == ({"max_new_tokens": 1, "ignore_eos": True, **lc.SAMPLED}, lc.TOP_N)
               for c in calls)  # fmt: skip
    # Prompt 0: position 0 after 3 tokens asks 7, position 1 after 4 tokens asks 8.
    assert got[0]["ids"] == [7, 8] and got[0]["logprobs"] == [-3 - 0.007, -4 - 0.008]
    assert got[1]["logprobs"] == [-1 - 0.009, -2 - 0.005, -3 - 0.006]
    assert got[1]["top"][2] == [(-0.1, 3)]


class _Model:
    """A deterministic 'model': token t's logprob after context c, its top-n, and the next
    token (greedy, or 'sampled': another token on DDTREE's engine than on the server's), read
    exactly through the server's extend path (`rescore`'s), with noise ``decode_noise`` through
    its decode path and with ``tree_noise`` through DDTREE's verify; ``late``: DDTREE reports
    each position's logprobs one position late."""

    def __init__(self, decode_noise: float, tree_noise: float, late: bool = False):
        self.noise = {"decode": decode_noise, "tree": tree_noise, "extend": 0.0}
        self.late = late
        self.rng = random.Random(5)

    @staticmethod
    def exact(ctx, tok):
        return -(((sum(ctx) * 31 + len(ctx) * 7 + tok) % 97) + 1) / 10

    def next_token(self, ctx, sampled, path):
        # A sampled token differs between the servers (each draws its own), as in a real run.
        shift = 1 if sampled and path == "tree" else 0
        return (sum(ctx) * (3 if sampled else 1) + len(ctx) + shift) % 50

    def read(self, ctx, tok, path):
        e = self.rng.uniform(-self.noise[path], self.noise[path])
        top = [(self.exact(ctx, i) + e, i) for i in range(lc.TOP_N)]
        return self.exact(ctx, tok) + e, top

    def decode(self, prompt, params, path):
        ctx, lps, tops = list(prompt), [], []
        for _ in range(params["max_new_tokens"]):
            tok = self.next_token(ctx, params["temperature"] > 0, path)
            lp, top = self.read(ctx, tok, path)
            lps.append((lp, tok, None))
            tops.append([(v, i, None) for v, i in top])
            ctx.append(tok)
        if path == "tree" and self.late:
            lps = [(lp[0], tok[1], None) for lp, tok in zip(lps[1:] + lps[-1:], lps)]
            tops = tops[1:] + tops[-1:]
        return lps, tops


class _Engine:
    def __init__(self, model):
        self.model = model

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _TreeEngine(_Engine):
    def generate(self, input_ids, sampling_params, return_logprob, top_logprobs_num, stream):
        """One prompt, streamed in steps of 1, 3, 2, 3, 2, ... tokens."""
        lps, tops = self.model.decode(input_ids, sampling_params, "tree")
        at = 0
        for size in [1] + [3, 2] * len(lps):
            if at >= len(lps):
                return
            at = min(at + size, len(lps))
            yield {"meta_info": {"completion_tokens": at, "output_token_logprobs": lps[:at],
                                 "output_top_logprobs": tops[:at]}}  # fmt: skip


class _NospecEngine(_Engine):
    def generate(self, input_ids, sampling_params, return_logprob, top_logprobs_num,
                 token_ids_logprob=None):  # fmt: skip
        assert len(input_ids) == 1  # one request at a time: DDTREE's batch shape
        if token_ids_logprob is None:  # its own decode
            lps, tops = self.model.decode(input_ids[0], sampling_params, "decode")
            return [{"meta_info": {"output_token_logprobs": lps, "output_top_logprobs": tops}}]
        tok = token_ids_logprob[0][0]  # `rescore`: one position through the extend path
        lp, top = self.model.read(input_ids[0], tok, "extend")
        return [{"meta_info": {
            "output_token_ids_logprobs": [[(lp, tok, None)]],
            "output_top_logprobs": [[(v, t, None) for v, t in top]],
        }}]  # fmt: skip


def _check(decode_noise, tree_noise, late=False):
    model = _Model(decode_noise, tree_noise, late)

    def engine(algo):
        return _TreeEngine(model) if algo == "DDTREE" else _NospecEngine(model)

    summary = {}
    prompts = [[i, i + 1] for i in range(lc.SAMPLED_PROMPTS)]
    lc.check_logprobs(lambda algo: {"algo": algo}, engine, prompts, 12, summary)
    return summary["logprobs"]


def test_check_passes_the_extend_paths_values_in_both_parts():
    """DDTREE reading the extend path's values, the server's decode 0.04 off its extend: both
    parts pass with enough positions of every kind (the sampled one only against the server's
    scoring of DDTREE's own tokens: the servers sample different tokens), the late reading
    caught; the greedy floor is the server's per kind, the sampled one its decode positions'."""
    quiet = _check(decode_noise=0.04, tree_noise=0.0)
    assert quiet["passed"], quiet
    for part in ("greedy", "sampled"):
        v = quiet[part]
        assert v["enough_positions"] and v["one_position_late_caught"], v
        for k in lc.JUDGED:
            floor = v["per_kind"][k]["nospec_floor"]["token"]
            assert 0.03 < floor["p99"] <= floor["max"] <= 0.04, (part, k, floor)
    assert all(quiet["sampled"]["per_kind"][k]["token"]["max"] == 0.0 for k in lc.JUDGED)
    exact = _check(decode_noise=0.0, tree_noise=0.0)
    assert exact["passed"], exact


@pytest.mark.parametrize("tree_noise", [0.03, 0.2])
def test_check_fails_differences_beyond_the_floor(tree_noise):
    """DDTREE's own noise on top: up to 0.03 (greedy p99 about 1.7x the floor, maximum under
    0.1) fails the greedy part by the p99, up to 0.2 fails both parts."""
    got = _check(decode_noise=0.04, tree_noise=tree_noise)
    assert not got["passed"] and not got["greedy"]["passed"]
    path = got["greedy"]["per_kind"]["path"]
    assert path["token"]["p99"] > lc.P99_RATIO * path["nospec_floor"]["token"]["p99"]
    if tree_noise < lc.MAX_TOKEN_DIFF:
        assert path["token"]["max"] <= lc.MAX_TOKEN_DIFF
    else:
        assert not got["sampled"]["passed"]


def test_check_fails_logprobs_reported_one_position_late():
    """A DDTREE that reports each token's logprobs from the node one too deep (what the
    calibration reads) fails both parts."""
    late = _check(decode_noise=0.04, tree_noise=0.0, late=True)
    assert not late["greedy"]["passed"] and not late["sampled"]["passed"]
    assert not late["greedy"]["per_kind"]["path"]["within"]
