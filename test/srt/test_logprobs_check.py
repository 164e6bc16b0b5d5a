"""The logprobs check's logic on synthetic outputs (CPU): position kinds from streamed step
sizes, the per-kind comparison on the common prefix, the verdict and its calibration."""

import random

from sglang_ddtree.testing import logprobs_check as lc


def test_position_kinds_from_streamed_steps():
    # The prefill's token alone, then steps of 3, 1 and 2 tokens.
    assert lc.position_kinds([1, 3, 1, 2]) == [
        "prefill", "root", "path", "bonus", "root", "root", "bonus",
    ]  # fmt: skip
    # The first chunk carrying the first step as well.
    assert lc.position_kinds([3, 2]) == ["prefill", "root", "bonus", "root", "bonus"]


def _outputs(seed: int, noise: float, steps_per_prompt: int = 12):
    """(base, tree, kinds) of 8 prompts whose ids agree up to a late divergence in two of
    them; DDTREE's values are the base's plus uniform noise of at most ``noise``."""
    rng = random.Random(seed)
    base, tree, kinds = [], [], []
    for p in range(8):
        sizes = [1] + [rng.randint(1, 5) for _ in range(steps_per_prompt)]
        n = sum(sizes)
        ids = [rng.randrange(1000) for _ in range(n)]
        lps = [-rng.random() * 5 for _ in range(n)]
        top = [sorted(((-rng.random() * 5, rng.randrange(1000)) for _ in range(lc.TOP_N)),
                      reverse=True) for _ in range(n)]  # fmt: skip
        b = {"ids": ids, "logprobs": lps, "top": top}
        t_ids = list(ids)
        if p < 2:  # diverges late: the positions past it are not compared
            t_ids[n - 3] = (t_ids[n - 3] + 1) % 1000
        t = {
            "ids": t_ids,
            "logprobs": [x + rng.uniform(-noise, noise) for x in lps],
            "top": [[(v + rng.uniform(-noise, noise), i) for v, i in row] for row in top],
        }
        base.append(b)
        tree.append(t)
        kinds.append(lc.position_kinds(sizes))
    return base, tree, kinds


def test_within_the_bound_passes_and_the_late_reading_is_caught():
    base, tree, kinds = _outputs(0, noise=0.005)
    v = lc.verdict(base, tree, kinds)
    assert v["passed"] and v["enough_positions"] and v["one_position_late_caught"], v
    for kind in lc.KINDS:
        assert v["per_kind"][kind]["token"] <= 0.005 + 1e-12
    # Positions past a divergence are not compared: a wild value there changes nothing.
    tree[0]["logprobs"][-1] = 99.0
    assert lc.verdict(base, tree, kinds)["passed"]


def test_a_shift_beyond_the_bound_fails():
    """Calibration: DDTREE's values off by 0.05 (over the 0.02 bound) fail the verdict."""
    base, tree, kinds = _outputs(1, noise=0.0)
    for t in tree:
        t["logprobs"] = [x + 0.05 for x in t["logprobs"]]
    v = lc.verdict(base, tree, kinds)
    assert not v["passed"] and v["per_kind"]["path"]["token"] > lc.MAX_ABS_DIFF


def test_too_few_positions_do_not_pass():
    base, tree, kinds = _outputs(2, noise=0.0, steps_per_prompt=1)
    assert not lc.verdict(base[:1], tree[:1], kinds[:1])["enough_positions"]


def test_rescore_asks_each_token_after_the_tokens_before_it():
    """`rescore` sends one request per position (the prompt and DDTREE's tokens before it,
    asking DDTREE's token there, one new token at the same sampling parameters) and hands each
    answer back to its prompt and position."""
    calls = {}

    class Engine:
        def generate(self, input_ids, sampling_params, return_logprob, top_logprobs_num,
                     token_ids_logprob):  # fmt: skip
            calls.update(params=sampling_params, top=top_logprobs_num)
            assert return_logprob and len(input_ids) == len(token_ids_logprob)
            return [
                {"meta_info": {
                    "output_token_ids_logprobs": [[(-len(ids) - tok[0] / 1000, tok[0], None)]],
                    "output_top_logprobs": [[(-0.1, len(ids), None)]],
                }}
                for ids, tok in zip(input_ids, token_ids_logprob)
            ]  # fmt: skip

    prompts = [[1, 2, 3], [4]]
    outs = [{"ids": [7, 8]}, {"ids": [9, 5, 6]}]
    got = lc.rescore(Engine(), prompts, outs, lc.SAMPLED)
    assert calls["params"] == {"max_new_tokens": 1, "ignore_eos": True, **lc.SAMPLED}
    assert calls["top"] == lc.TOP_N
    # Prompt 0: position 0 after 3 tokens asks 7, position 1 after 4 tokens asks 8.
    assert got[0]["ids"] == [7, 8] and got[0]["logprobs"] == [-3 - 0.007, -4 - 0.008]
    assert got[1]["logprobs"] == [-1 - 0.009, -2 - 0.005, -3 - 0.006]
    assert got[1]["top"][2] == [(-0.1, 3)]


def test_within_the_non_speculative_floor():
    """DDTREE's differences against the server's decode, read beside the server's own
    extend-versus-decode differences (a floor of noise up to 0.04): noise up to 0.03 is within
    it, noise up to 0.08 is not."""
    base, floor_out, kinds = _outputs(3, noise=0.04)
    rng = random.Random(4)

    def noisy(noise):
        return [
            {
                "ids": list(b["ids"]),
                "logprobs": [x + rng.uniform(-noise, noise) for x in b["logprobs"]],
                "top": [[(v + rng.uniform(-noise, noise), i) for v, i in row] for row in b["top"]],
            }
            for b in base
        ]

    floor = lc.differences(base, floor_out, kinds)
    assert lc.within_floor(lc.differences(base, noisy(0.03), kinds), floor)["passed"]
    assert not lc.within_floor(lc.differences(base, noisy(0.08), kinds), floor)["passed"]


def test_floor_test_is_calibrated():
    """`within_floor` on draws of known law, 1,000 positions a side (|uniform noise| of 0.04,
    as bfloat16 rounding spreads): the same law passes in at least 194 of 200 draws (the
    test's level is 1 %: 2 expected), DDTREE's differences 1.3x the floor's fail in at least 48
    of 50, and a maximum-only reading would have failed the same law in about half."""
    rng = random.Random(7)

    def draw(scale):
        return [abs(rng.uniform(-0.04, 0.04)) * scale for _ in range(1000)]

    same = [lc.within_floor({"token": draw(1), "top": draw(1)},
                            {"token": draw(1), "top": draw(1)}) for _ in range(200)]  # fmt: skip
    assert sum(r["passed"] for r in same) >= 194
    by_max = sum(r["token"]["ddtree"]["max"] <= r["token"]["floor"]["max"] for r in same)
    assert 60 <= by_max <= 140  # the maximum of one side beats the other's about half the time
    larger = [lc.within_floor({"token": draw(1.3), "top": draw(1.3)},
                              {"token": draw(1), "top": draw(1)}) for _ in range(50)]  # fmt: skip
    assert sum(not r["passed"] for r in larger) >= 48


class _Model:
    """A deterministic 'model': token t's logprob after context c, its top-n, and the next
    token (greedy, or 'sampled': another token on DDTREE's engine than on the server's), read
    through the decode path with noise ``decode_noise`` (the
    extend path, `rescore`'s, is exact) or through DDTREE's verify with ``tree_noise``; a read
    in a batch of several requests moves by a fixed amount per (context, token) of at most
    ``batch_shift`` (the batch shape's rounding: every path alike)."""

    def __init__(self, decode_noise: float, tree_noise: float, batch_shift: float = 0.0):
        self.noise = {"decode": decode_noise, "tree": tree_noise}
        self.batch_shift = batch_shift
        self.rng = random.Random(5)

    @staticmethod
    def exact(ctx, tok):
        return -(((sum(ctx) * 31 + len(ctx) * 7 + tok) % 97) + 1) / 10

    def next_token(self, ctx, sampled, path):
        # A sampled token differs between the servers (each draws its own), as in a real run.
        shift = 1 if sampled and path == "tree" else 0
        return (sum(ctx) * (3 if sampled else 1) + len(ctx) + shift) % 50

    def read(self, ctx, tok, path, batched=False):
        e = self.rng.uniform(-self.noise[path], self.noise[path]) if path != "extend" else 0.0
        if batched:
            e += random.Random(hash((tuple(ctx), tok))).uniform(-1, 1) * self.batch_shift
        top = [(self.exact(ctx, i) + e, i) for i in range(lc.TOP_N)]
        return self.exact(ctx, tok) + e, top

    def decode(self, prompt, params, path, batched=False):
        ctx, lps, tops = list(prompt), [], []
        for _ in range(params["max_new_tokens"]):
            tok = self.next_token(ctx, params["temperature"] > 0, path)
            lp, top = self.read(ctx, tok, path, batched)
            lps.append((lp, tok, None))
            tops.append([(v, i, None) for v, i in top])
            ctx.append(tok)
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
        out, batched = [], len(input_ids) > 1
        for i, p in enumerate(input_ids):
            if token_ids_logprob is None:  # its own decode
                lps, tops = self.model.decode(p, sampling_params, "decode", batched)
                out.append({"meta_info": {"output_token_logprobs": lps,
                                          "output_top_logprobs": tops}})  # fmt: skip
            else:  # `rescore`: one position through the extend path
                lp, top = self.model.read(p, token_ids_logprob[i][0], "extend", batched)
                out.append({"meta_info": {
                    "output_token_ids_logprobs": [[(lp, token_ids_logprob[i][0], None)]],
                    "output_top_logprobs": [[(v, t, None) for v, t in top]],
                }})  # fmt: skip
        return out


def _check(decode_noise, tree_noise, batch_shift=0.0):
    model = _Model(decode_noise, tree_noise, batch_shift)

    def engine(algo):
        return _TreeEngine(model) if algo == "DDTREE" else _NospecEngine(model)

    summary = {}
    prompts = [[i, i + 1] for i in range(lc.SAMPLED_PROMPTS)]
    lc.check_logprobs(lambda algo: {"algo": algo}, engine, prompts, 12, summary)
    return summary["logprobs"]


def test_check_reads_both_parts_against_the_servers_own_floor():
    """The whole check on a fake pair of engines: DDTREE reading the extend path's values is
    within the floor in both parts where the server's decode is 0.04 off its extend (and so
    misses the 0.02 bound against itself); DDTREE 0.2 off is not; exact reads pass the bound."""
    quiet = _check(decode_noise=0.04, tree_noise=0.0)
    assert quiet["within_nospec_floor"], quiet
    assert quiet["greedy"]["nospec_extend_vs_decode"]["root"]["token"] > lc.MAX_ABS_DIFF
    assert quiet["sampled"]["within_nospec_floor"] and quiet["sampled"]["enough_positions"]
    loud = _check(decode_noise=0.04, tree_noise=0.2)
    assert not loud["within_nospec_floor"] and not loud["passed"]
    exact = _check(decode_noise=0.0, tree_noise=0.0)
    assert exact["passed"] and exact["within_nospec_floor"], exact
    assert quiet["within_nospec_floor_one_by_one"] and not loud["within_nospec_floor_one_by_one"]


def test_one_by_one_reading_takes_the_batch_shape_out():
    """The server's batched reads moved by a fixed 0.06 at most per (context, token), its
    decode 0.04 off its extend, DDTREE (one request at a time) reading the extend path's
    values: against the batched reference DDTREE looks larger than the floor (the batch
    shape's move counts against it, the floor's two batched sides share it); at one request
    at a time it is within, the batch floor shows the move, and DDTREE 0.2 off still fails."""
    shaped = _check(decode_noise=0.04, tree_noise=0.0, batch_shift=0.06)
    assert not shaped["greedy"]["within_nospec_floor"], shaped["greedy"]["floor_test"]
    # Every read of the one-by-one reading was unbatched: no difference carries the move.
    greedy, sampled = (
        shaped[p]["one_by_one"]["floor_test"]["token"] for p in ("greedy", "sampled")
    )
    assert greedy["floor"]["max"] <= 0.04 and greedy["ddtree"]["max"] <= 0.04
    assert sampled["floor"]["max"] <= 0.04 and sampled["ddtree"]["max"] == 0.0
    assert shaped["greedy"]["one_by_one"]["passed"], shaped["greedy"]["one_by_one"]
    assert shaped["sampled"]["one_by_one"]["passed"], shaped["sampled"]["one_by_one"]
    assert shaped["within_nospec_floor_one_by_one"]
    assert shaped["greedy"]["one_by_one"]["enough_positions"]
    assert shaped["greedy"]["batch_floor"]["token"]["max"] > 0.06
    loud = _check(decode_noise=0.04, tree_noise=0.2, batch_shift=0.06)
    assert not loud["within_nospec_floor_one_by_one"]
    assert not loud["greedy"]["one_by_one"]["passed"]
