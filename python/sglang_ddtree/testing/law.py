"""DDTREE's output law against SGLang's non-speculative server, on the shipped trained pair.

``python -m sglang_ddtree.testing.law --out DIR [--dtype float16] [--parts law,greedy,params]
[--arch mla] [--tp N] [--fp32-lm-head] [--attention-backend flashmla] [--page-size N]`` starts
``sgl.Engine``s of the trained pair (or, with ``--arch mla``, of the Kimi-shaped MLA + MoE tiny
pair and random prompts) (triton attention at page 1 unless told, CUDA graphs on), one without
speculation and one with DDTREE (default adaptive budget), and writes ``DIR/law_<tag>.json``
(tag: the dtype, plus ``-fp32head`` with ``--fp32-lm-head``, ``-flashmla`` on flashmla,
``-page<N>`` at another page size on triton).

Parts:

- ``law``: per setting, ``SAMPLES`` completions of ``NEW_TOKENS`` tokens from one prompt on
  each server. Settings: every (top_k, top_p) pairing of top_k in {off, 5, 20, 50} and top_p in
  {1.0, 0.95, 0.8}, each at one temperature of {0.6, 1.0, 1.3} (cycled, so every temperature
  meets every top_p), plus two ``logit_bias`` settings, ``n = 4``, and two settings whose
  DDTREE requests run interleaved one to one with greedy requests (the greedy rows must equal
  the non-speculative greedy output). Statistics per setting: a two-sample chi-squared
  homogeneity test per token position and one on the tuple of the first ``TUPLE_LEN`` tokens
  (bins pooled below ``MIN_BIN`` joint counts); for the worst test of each setting, the
  (prefix, token) cells that weigh most in it (`largest_differences`). Multiple testing: Bonferroni over every test of
  a family, family-wise level ``ALPHA``. Calibration: a second non-speculative sample of the
  ``NULL`` settings must pass (the null), and the non-speculative server at 1.1x the temperature must be rejected (the
  power; a family of ``CALIBRATION`` settings, Bonferroni within it).
- ``greedy``: ``GREEDY_PROMPTS`` prompts (the 64 held-out snippets cut at four lengths), greedy:
  the non-speculative server in one batch and one by one (its own noise floor: bf16 near-ties
  flip argmaxes between batch shapes), DDTREE in one batch; mismatch counts, the position of
  the first difference, and the non-speculative server's top-2 logit margin there (a near-tie,
  or a real difference?). A second floor: the non-speculative server with every token taken
  from its extend path (`extend_path_greedy`) against its one-by-one decode, the difference
  between the two forwards that a verify (an extend) meets.
- ``min_p``: as ``law`` for the ``MIN_P_SETTINGS`` (min-p alone, and with top-k and top-p,
  where SGLang's min-p path applies them one after the other rather than jointly), with their
  own calibration: a second non-speculative sample must pass and the non-speculative server at
  twice the min-p must be rejected (Bonferroni within each family).
- ``penalties``: the same for the ``PENALTY_SETTINGS`` (frequency, presence and repetition
  penalties, min_new_tokens over a likely stop id), ``PENALTY_NEW_TOKENS`` tokens a completion
  and a test on each completion's repeat count besides, the power at twice each penalty
  (min_new_tokens: none), which must be rejected at every setting. SGLang's
  default overlap scheduler feeds its penalizers one token late, so the non-speculative
  reference must run with ``--disable-overlap-schedule`` (``--no-overlap``), whose law DDTREE
  follows.
- ``params``: greedy requests with stop strings, stop token ids, EOS (``ignore_eos`` off),
  ``max_new_tokens`` that ends inside an accepted path, ``n = 3``: DDTREE equals the
  non-speculative server request by request (text, ids, finish reason).

The verify forward (tree rows in one extend) and the decode forward round differently, so a
token at a top-k or nucleus boundary can fall inside the set on one server and outside on the
other: a numerical difference, not a law difference, and SGLang's own DFLASH shows it too. In
bfloat16 (7 mantissa bits) the two servers' logits differ by up to a few hundredths, enough to
swap tokens at a boundary; float16 (10 bits) cuts that eightfold, so the law test runs in
float16 (SGLang 0.5.17's CUDA RMSNorm has no float32 kernel). The greedy part measures the same
effect on argmaxes, next to the non-speculative server's own batch-versus-single floor.

A rejected setting is then checked for that cause, against the non-speculative server only
(`attribute_rejection`): at the prefix of the heaviest cell of the setting's worst test, the
server samples the next token ``SAMPLES`` times through its extend path (the prefix as prompt,
one new token). The rejection is put down to the forward path when (1) the server's own decode
path (its law samples through that prefix) differs from its extend path there (p < ``ALPHA``),
(2) the speculative server's samples through that prefix do not differ from that extend path
(p > ``ALPHA``), and (3) with every completion through that prefix left out on both sides, all of
the setting's tests pass at the family's per-test level again (up to ``ATTRIBUTED_PREFIXES``
prefixes, in turn). Position 1 is never put down to it: both servers sample it from the
prefill (a rejection there records the non-speculative server's distance to the top-k or
nucleus edge, `first_token_edge`).
A rejection the forward path does not explain is checked against the server's batch shapes
(`shape_null`): the same server's completions submitted ``SHAPE_WAVE`` at a time (small
batches, as a speculative server admits requests a few at a time) against its reference sample
and against the speculative one, since a GEMM's row count picks its kernel and so the last bits
of every logit. It is put down to the batch shape when the server's own small-batch sample is
rejected against its reference sample at the family's per-test level and the speculative
sample is not rejected against that small-batch sample (every test of the setting).
With ``--exact-referee`` a prefix the extend path does not excuse is asked of a second
referee, the target model's exact law (`ExactModelSampler`: its weights in Hugging Face
transformers, float32, the setting's filters as SGLang applies them): excused when the
reference's samples there differ from the exact law and the speculative server's do not. On a
MoE pair in bfloat16 a random router's top expert choices can be within rounding of each
other, so the reference's decode and extend paths (both bf16 attention) route one way and the
verify (its prefix part in float32 until the merge) the other, each sampling its own logits
exactly; only a referee outside both forwards says which side left the model. (A prefix one
side never reached is asked at its parent: the sides parted one token earlier.) A prefix that
neither referee excuses gets a diagnosis, never an excuse (``router_swaps``): the exact model's
routing sites (layer, context position) whose chosen experts are within ``ROUTER_TIE_GAP`` of
the best one left out, each site's law with that one choice swapped, and both sides' fit to it
(at a few hundred samples a swapped law can also fit a sampler error, such as a 10 % wrong
temperature, which is why it excuses nothing).
Where a check excuses a rejection, the same checks run on the power family, which must
stay rejected: a law error is not excused. Where nothing needs excusing, no extra server starts.

The LM head's output is rounded to the model dtype as well, which makes exact logit ties
common: two tokens tied at a nucleus edge stay together under the joint rule in one forward
and are split by the other's rounding. ``--fp32-lm-head`` runs both servers with SGLang's
``enable_fp32_lm_head`` (logits computed in float32), which removes that rounding from the
comparison; the sampling law is the same with or without it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter

from sglang_ddtree.testing import e2e
from sglang_ddtree.testing.e2e import chi2_two_sample, engine_kwargs, excess_p, generate
from sglang_ddtree.testing.e2e import engine as e2e_engine
from sglang_ddtree.testing.tiny_models import TINY_ARCHS

SAMPLES = 3000
NEW_TOKENS = 6
# The penalties part's completions: penalties act on tokens already generated, so its samples
# run longer (more repeats to penalize) and add a test on each completion's repeat count.
PENALTY_NEW_TOKENS = 16
TUPLE_LEN = 3
MIN_BIN = 10
ALPHA = 0.01
ATTRIBUTED_PREFIXES = 3
# The router-swap diagnosis tries the sites whose k-th and (k+1)-th expert scores are closer
# than this (bfloat16 forwards of the tiny MoE pair were seen to break ties up to ~0.01 apart
# differently), the closest ``ROUTER_SWAPS`` of them.
ROUTER_TIE_GAP = 0.01
ROUTER_SWAPS = 8
# The batch-shape null of an unexplained rejection: the non-speculative server's completions
# submitted this many requests at a time, so its prefill and decode batches hold at most this
# many rows (the speculative server admits new requests a few at a time, as they finish at
# different steps, where the reference admits MAX_RUNNING at once).
SHAPE_WAVE = 32
GREEDY_PROMPTS = 256
GREEDY_NEW_TOKENS = 48
MAX_RUNNING = 128

TEMPERATURES = (0.6, 1.0, 1.3)
TOP_KS = (0, 5, 20, 50)  # 0 = off
TOP_PS = (1.0, 0.95, 0.8)
MIXED = ("T1.0_k20_p0.8", "T1.3_k5_p0.95")
# The null family: a second no-spec sample of these settings (two per temperature).
NULL = (
    "T0.6_k0_p1.0",
    "T0.6_k20_p0.95",
    "T1.0_k20_p0.8",
    "T1.0_k50_p0.95",
    "T1.3_k0_p0.8",
    "T1.3_k5_p0.95",
)
CALIBRATION = ("T1.0_k0_p0.95", "T1.3_k20_p1.0", "T1.0_k50_p0.95")
# SGLang's min-p path (any min-p request: top-k, then top-p, then min-p, for the whole batch).
MIN_P_SETTINGS = {
    "minp0.1_T1.0": {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.1},
    "minp0.05_T1.0_k20_p0.9": {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "min_p": 0.05},
}
PENALTY_SETTINGS = {
    "freq0.5_T1.0": {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "frequency_penalty": 0.5},
    "pres0.5_rep1.2_T1.0_p0.95": {
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 0.95,
        "presence_penalty": 0.5,
        "repetition_penalty": 1.2,
    },
    # min_new_tokens holds back the stop ids, the request's own stop_token_ids among them (even
    # under ignore_eos, which only keeps them from ending the request): `make_plan` names the
    # non-speculative greedy output's 2nd token, a likely one, so the hold-back shows.
    "min_new4_stop_T1.0": {
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "min_new_tokens": 4,
        "stop_token_ids": None,
    },
    # A generation_config's defaults (server_check.GENERATION_DEFAULTS): min-p path + penalty.
    "rep1.05_minp0.05_T1.0": {
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "repetition_penalty": 1.05,
        "min_p": 0.05,
    },
}


def _twice_min_p(sp: dict) -> dict:
    """The min_p part's wrong law: twice the min-p."""
    return dict(sp, min_p=2 * sp["min_p"])


def _twice_penalties(sp: dict) -> dict:
    """The penalties part's wrong law: twice each penalty's distance from neutral, and no
    min_new_tokens."""
    out = dict(sp)
    for name in ("frequency_penalty", "presence_penalty"):
        if name in out:
            out[name] = 2 * out[name]
    if "repetition_penalty" in out:
        out["repetition_penalty"] = 1 + 2 * (out["repetition_penalty"] - 1)
    if "min_new_tokens" in out:
        out["min_new_tokens"] = 0
    return out


# Each request-parameter part: its settings, its calibration's wrong law, the tokens a
# completion, and whether its tests include the repeat count.
PARAMETER_PARTS = {
    "min_p": (MIN_P_SETTINGS, _twice_min_p, NEW_TOKENS, False),
    "penalties": (PENALTY_SETTINGS, _twice_penalties, PENALTY_NEW_TOKENS, True),
}


def _name(t: float, k: int, p: float) -> str:
    return f"T{t}_k{k}_p{p}"


def law_settings() -> dict[str, dict]:
    """{name: sampling params}: the 12 top_k x top_p pairings, each at a cycled temperature,
    plus two logit-bias settings (their bias is filled in from the greedy output) and n = 4."""
    out = {}
    for i, k in enumerate(TOP_KS):
        for j, p in enumerate(TOP_PS):
            t = TEMPERATURES[(i + j) % len(TEMPERATURES)]
            out[_name(t, k, p)] = {"temperature": t, "top_k": k if k else -1, "top_p": p}
    out["bias_T1.0"] = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "logit_bias": None}
    out["bias_T0.6_k20_p0.95"] = {
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "logit_bias": None,
    }
    out["n4_T1.0_p0.95"] = {"temperature": 1.0, "top_k": -1, "top_p": 0.95, "n": 4}
    return out


# ------------------------------------------------------------------------------- statistics
def repeat_count(completion: list[int]) -> int:
    """Tokens of a completion that repeat an earlier token of it (what frequency and presence
    penalties act on)."""
    return sum(1 for i, t in enumerate(completion) if t in completion[:i])


def compare_samples(
    ref: list[list[int]],
    other: list[list[int]],
    new_tokens: int = NEW_TOKENS,
    repeats: bool = False,
) -> dict:
    """Per-position and tuple tests between two lists of completions (token-id lists), and with
    ``repeats`` one on the completions' repeat counts (`repeat_count`)."""
    tests = {}
    for pos in range(new_tokens):
        a = [s[pos] for s in ref if len(s) > pos]
        b = [s[pos] for s in other if len(s) > pos]
        tests[f"pos{pos + 1}"] = chi2_two_sample(a, b, MIN_BIN)
    tests[f"tuple{TUPLE_LEN}"] = chi2_two_sample(
        [tuple(s[:TUPLE_LEN]) for s in ref], [tuple(s[:TUPLE_LEN]) for s in other], MIN_BIN
    )
    if repeats:
        tests["repeats"] = chi2_two_sample(
            [repeat_count(s) for s in ref], [repeat_count(s) for s in other], MIN_BIN
        )
    pmin = min(p for p, _ in tests.values())
    worst = min(tests, key=lambda k: tests[k][0])
    return {
        "n": [len(ref), len(other)],
        "min_p": pmin,
        "tests": {k: {"p": p, "dof": d} for k, (p, d) in tests.items()},
        "distinct_pos2": [len({s[1] for s in ref}), len({s[1] for s in other})],
        "worst": {"test": worst, "cells": largest_differences(ref, other, worst)},
    }


def largest_differences(ref: list[list[int]], other: list[list[int]], test: str, n: int = 5):
    """The ``n`` cells that weigh most in the chi-squared, ``(a - b)^2 / (a + b)`` for counts
    ``a``, ``b`` (equal sample sizes), for one test of `compare_samples`. At ``posK`` a cell is
    (the K-1 tokens before, the K-th token), so a token that one side never emits after some
    prefix stands out; at ``tupleK`` it is the first K tokens; at ``repeats`` a repeat count
    (as "token", with an empty prefix). Each: {"prefix", "token", "ref", "other"} (counts)."""
    if test == "repeats":

        def cell(s):
            return (), repeat_count(s)
    else:
        k = TUPLE_LEN if test.startswith("tuple") else int(test.removeprefix("pos"))

        def cell(s):
            return (tuple(s[: k - 1]), s[k - 1]) if len(s) >= k else None

    def cells(samples):
        return Counter(c for c in map(cell, samples) if c is not None)

    a, b = cells(ref), cells(other)

    def weight(c):
        x, y = a.get(c, 0), b.get(c, 0)
        return (x - y) ** 2 / (x + y)

    keys = sorted(set(a) | set(b), key=lambda c: (-weight(c), c))
    return [
        {"prefix": list(c[0]), "token": c[1], "ref": a.get(c, 0), "other": b.get(c, 0)}
        for c in keys[:n]
    ]


def _reached(samples: list[list[int]], prefix: list[int]) -> bool:
    """Whether some completion continues past ``prefix``."""
    k = len(prefix)
    return any(s[:k] == prefix and len(s) > k for s in samples)


def attribute_rejection(
    ref: list[list[int]],
    other: list[list[int]],
    level: float,
    extend_law,
    exact_law=None,
    router_swaps=None,
):
    """Whether a rejected setting's difference is the forward path's, or the reference's
    alone where the exact model is the referee (see the module docstring).

    ``ref``/``other``: the two servers' completions of the setting; ``level``: the family's
    per-test level; ``extend_law(prefix) -> [token]``: the non-speculative server's next tokens
    after the setting's prompt + ``prefix``, sampled through its extend path (None: not
    checked); ``exact_law(prefix) -> [token]``: the same from the target's exact law
    (`ExactModelSampler`; None: not checked). At each prefix the extend path is asked first,
    then the exact model; a prefix is excused when the reference differs from the referee and
    the speculative server does not. ``router_swaps(prefix) -> [site]``
    (`ExactModelSampler.router_swaps`; None: not diagnosed): at the prefix no referee
    excused, the near-tied routing sites with their swapped laws' tokens. Returns
    {"explained", "prefixes": [{"prefix", "n": [ref, other], "explained_by", per referee
    asked "p_decode_vs_extend" / "p_other_vs_extend" or "p_reference_vs_exact" /
    "p_other_vs_exact", and where diagnosed "router_swaps": [{"layer", "position", "gap",
    "p_reference_vs_swap", "p_other_vs_swap"}], "router_swap_fits": whether some site's law
    fits the speculative side and not the reference}], "remainder_min_p"}."""
    referees = [
        (name, law, keys)
        for name, law, keys in (
            ("forward_path", extend_law, ("p_decode_vs_extend", "p_other_vs_extend")),
            ("exact_model", exact_law, ("p_reference_vs_exact", "p_other_vs_exact")),
        )
        if law is not None
    ]
    prefixes = []
    for _ in range(ATTRIBUTED_PREFIXES + 1):
        res = compare_samples(ref, other)
        if res["min_p"] >= level:
            return {"explained": True, "prefixes": prefixes, "remainder_min_p": res["min_p"]}
        prefix = list(res["worst"]["cells"][0]["prefix"])
        # A prefix one side never reached: the two sides parted at an earlier token, so the
        # difference is asked where they last met (its parent prefix, in turn).
        while prefix and not (_reached(ref, prefix) and _reached(other, prefix)):
            prefix = prefix[:-1]
        k = len(prefix)
        if k == 0:  # both sample position 1 alike, from their prefill: never excused
            return {"explained": False, "prefixes": prefixes, "remainder_min_p": res["min_p"],
                    "first_token": True}  # fmt: skip
        if len(prefixes) == ATTRIBUTED_PREFIXES:
            break
        at_ref = [s[k] for s in ref if s[:k] == prefix and len(s) > k]
        at_other = [s[k] for s in other if s[:k] == prefix and len(s) > k]
        entry: dict = {"prefix": prefix, "n": [len(at_ref), len(at_other)], "explained_by": None}
        prefixes.append(entry)
        for name, law, (key_ref, key_other) in referees:
            probe = list(law(prefix))
            entry[key_ref] = chi2_two_sample(at_ref, probe, MIN_BIN)[0]
            entry[key_other] = chi2_two_sample(at_other, probe, MIN_BIN)[0]
            if entry[key_ref] < ALPHA and entry[key_other] > ALPHA:
                entry["explained_by"] = name
                break
        if entry["explained_by"] is None:
            if router_swaps is not None:
                entry["router_swaps"] = [
                    {
                        **{key: site[key] for key in ("layer", "position", "gap")},
                        "p_reference_vs_swap": chi2_two_sample(at_ref, site["tokens"], MIN_BIN)[0],
                        "p_other_vs_swap": chi2_two_sample(at_other, site["tokens"], MIN_BIN)[0],
                    }
                    for site in router_swaps(prefix)
                ]
                # As the referees' rule reads, but only a reading: at a few hundred samples a
                # site's law can fit a sampler error too (a wrong temperature), so no excuse.
                entry["router_swap_fits"] = any(
                    site["p_other_vs_swap"] > ALPHA > site["p_reference_vs_swap"]
                    for site in entry["router_swaps"]
                )
            break
        ref = [s for s in ref if s[:k] != prefix]
        other = [s for s in other if s[:k] != prefix]
    return {"explained": False, "prefixes": prefixes, "remainder_min_p": res["min_p"]}


def shape_null(
    ref: list[list[int]], other: list[list[int]], waves: list[list[int]], level: float
) -> dict:
    """The batch-shape check of a rejection the forward path does not explain: the
    non-speculative server's completions of the setting in small batches (``waves``,
    `SHAPE_WAVE` requests at a time) against its own reference sample (``ref``: is the server's
    law, as sampled, moved by its batch shapes alone?) and against the speculative server's
    (``other``). Returns each comparison's smallest p and worst test (`compare_samples`), and
    ``batch_shape``: the reference rejected against its small-batch sample at ``level`` (the
    family's per-test level) and the speculative sample not."""

    def brief(res: dict) -> dict:
        return {"min_p": res["min_p"], "worst": res["worst"]}

    ref_vs = brief(compare_samples(ref, waves))
    other_vs = brief(compare_samples(other, waves))
    return {
        "wave": SHAPE_WAVE,
        "n": len(waves),
        "reference_vs_waves": ref_vs,
        "other_vs_waves": other_vs,
        "batch_shape": ref_vs["min_p"] < level <= other_vs["min_p"],
    }


def attribute_family(
    fam: dict, refs: dict, others: dict, extend_law, diagnose: bool = False, exact_law=None
) -> dict:
    """`attribute_rejection` on every setting ``fam`` rejected; adds ``attribution`` (per
    setting) and ``unexplained`` (the rejections it does not put down to the forward path) to
    ``fam``. ``refs``/``others``: {setting: completions}; ``extend_law(setting, prefix)``, or
    None (no engine: the forward path is not checked); ``exact_law(setting, prefix)``
    (`ExactModelSampler`), or None: the second referee, asked at a prefix the extend path does
    not excuse. ``diagnose``: where ``extend_law`` also reads the first token's edge
    (``first_token_edge``, a reading) and samples in small batches (``in_waves``), a rejection
    still left gets the batch-shape check (`shape_null`), which excuses it when
    ``batch_shape``. ``explained_by``: the referees that excused its prefixes ("forward_path",
    "exact_model", or both joined by "+"), or "batch_shape"."""
    fam["attribution"] = {}
    level = fam["per_test_level"]
    for name in fam["rejected"]:
        if extend_law is None and exact_law is None:
            fam["attribution"][name] = {"explained": False, "not_run": True}
            continue
        got = attribute_rejection(
            refs[name],
            others[name],
            level,
            None if extend_law is None else (lambda p, n=name: extend_law(n, p)),
            None if exact_law is None else (lambda p, n=name: exact_law(n, p)),
            None
            if not hasattr(exact_law, "router_swaps")
            else (lambda p, n=name: exact_law.router_swaps(n, p)),
        )
        if got["explained"]:
            got["explained_by"] = "+".join(sorted({e["explained_by"] for e in got["prefixes"]}))
        if diagnose and got.get("first_token") and hasattr(extend_law, "first_token_edge"):
            got["first_token_edge"] = extend_law.first_token_edge(name)
        if diagnose and not got["explained"] and hasattr(extend_law, "in_waves"):
            shape = shape_null(refs[name], others[name], extend_law.in_waves(name), level)
            got["shape_null"] = shape
            if shape["batch_shape"]:
                got["explained"], got["explained_by"] = True, "batch_shape"
        fam["attribution"][name] = got
    fam["unexplained"] = sorted(k for k, a in fam["attribution"].items() if not a["explained"])
    return fam


def family(results: dict[str, dict], alpha: float = ALPHA) -> dict:
    """Bonferroni over every test in ``results``: per-test level alpha / m, and each
    setting's adjusted p (min(1, m * its smallest p))."""
    m = sum(len(r["tests"]) for r in results.values())
    level = alpha / max(m, 1)
    adjusted = {k: min(1.0, r["min_p"] * m) for k, r in results.items()}
    return {
        "tests": m,
        "alpha": alpha,
        "per_test_level": level,
        "adjusted_p": adjusted,
        "rejected": sorted(k for k, r in results.items() if r["min_p"] < level),
    }


# ------------------------------------------------------------------------------- engines
# The model pair under test: the shipped trained pair unless main() sets another
# (``--arch mla``: the Kimi-shaped tiny pair of ``testing.tiny_models``, with its prompts).
_PAIR: dict = {}


def _pair_dirs() -> tuple[str, str]:
    if _PAIR:
        return _PAIR["target"], _PAIR["draft"]
    from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR

    return str(TARGET_DIR), str(DRAFTER_DIR)


def engine(algo: str | None, dtype: str):
    """An ``sgl.Engine`` of the pair under test (context manager), without speculation or with
    ``algo``, at ``dtype``."""
    target, draft = _pair_dirs()
    kw = engine_kwargs(
        target,
        draft,
        algo,
        dtype=dtype,
        mem_fraction_static=0.3,
        max_running_requests=MAX_RUNNING,
        cuda_graph_max_bs_decode=MAX_RUNNING,
    )
    return e2e_engine(**kw)


def tokenized_prompts() -> list[list[int]]:
    """The held-out snippets, each cut at 1, 3/4, 1/2 and 1/4 of its tokens (min 8); for
    another pair, its own prompts."""
    if _PAIR:
        return _PAIR["prompts"]
    from tokenizers import Tokenizer

    from sglang_ddtree.pair import TARGET_DIR, heldout_prompts

    tok = Tokenizer.from_file(str(TARGET_DIR / "tokenizer.json"))
    full = [tok.encode(t).ids for t in heldout_prompts()]
    out = []
    for frac in (1.0, 0.75, 0.5, 0.25):
        out += [ids[: max(8, int(len(ids) * frac))] for ids in full]
    return out


GREEDY = {"temperature": 0.0, "max_new_tokens": GREEDY_NEW_TOKENS, "ignore_eos": True}


def _ids(outs: list[dict]) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


def top2_margins(eng, prompts: list[list[int]]) -> tuple[list[list[float]], list[list[int]]]:
    """The batch greedy run again with SGLang's top-2 logprobs: per prompt and position, the
    margin top1 - top2 (nats, the raw logits' gap), and the output ids (to check that this run
    equals the plain batch run)."""
    outs = eng.generate(
        input_ids=prompts,
        sampling_params=[GREEDY] * len(prompts),
        return_logprob=True,
        top_logprobs_num=2,
    )
    margins = []
    for o in outs:
        tops = o["meta_info"]["output_top_logprobs"]
        margins.append([t[0][0] - t[1][0] if len(t) > 1 else float("inf") for t in tops])
    return margins, _ids(outs)


def extend_path_greedy(eng, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy outputs of ``GREEDY_NEW_TOKENS`` tokens in which every token comes from the
    server's extend path: each round asks for one token with the prompt and the tokens so far
    as the prompt (a verify is an extend too; so is a retracted request's recompute)."""
    outs: list[list[int]] = [[] for _ in prompts]
    one = dict(GREEDY, max_new_tokens=1)
    for _ in range(GREEDY_NEW_TOKENS):
        got = generate(eng, [p + o for p, o in zip(prompts, outs)], [one] * len(prompts))
        for o, g in zip(outs, got):
            o.append(g["output_ids"][0])
    return outs


def margin_at_differences(ref: dict, other: list[list[int]]) -> dict:
    """Where ``other`` first differs from the non-speculative batch output, the non-speculative
    top-2 margin there, against the margins of every position (is each difference a near-tie?)."""
    import statistics

    margins, ids = ref["greedy_margin"], ref["greedy_margin_ids"]
    at, unaligned, allm = [], 0, [m for row in margins for m in row if m != float("inf")]
    for m, x, b, y in zip(margins, ids, ref["greedy_batch"], other):
        i = next((k for k in range(min(len(b), len(y))) if b[k] != y[k]), None)
        if i is None:
            continue
        if i < len(m) and x[: i + 1] == b[: i + 1]:  # the logprob run took the same path
            at.append(round(m[i], 5))
        else:
            unaligned += 1
    worst = max(at) if at else 0.0
    return {
        "margins_at_first_difference": sorted(at),
        "differences_without_a_margin": unaligned,
        "median_margin_all_positions": round(statistics.median(allm), 4) if allm else None,
        "share_of_positions_at_or_below_worst": (
            round(sum(x <= worst for x in allm) / len(allm), 4) if allm and at else 0.0
        ),
        "logprob_run_equals_batch": ids == ref["greedy_batch"],
    }


def first_differences(a: list[list[int]], b: list[list[int]]) -> dict:
    """Prompts whose outputs differ, and where each first differs (0-based token index)."""
    pos = []
    for x, y in zip(a, b):
        if x != y:
            pos.append(
                next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            )
    return {"prompts": len(a), "mismatches": len(pos), "first_diff_positions": sorted(pos)}


# ------------------------------------------------------------------------------- requests
def _prompt_index() -> dict[str, int]:
    """Each setting's prompt: ``prompts[i % len(prompts)]`` for its index here."""
    return {k: i for i, k in enumerate([*law_settings(), *MIN_P_SETTINGS, *PENALTY_SETTINGS])}


def _law_requests(prompts, settings, with_greedy=(), new_tokens=NEW_TOKENS):
    """(prompts, params, owner): SAMPLES completions of ``new_tokens`` per setting, the
    setting's prompt as `_prompt_index` says; settings in ``with_greedy`` get one greedy
    request after each sampled one (owner None)."""
    index = _prompt_index()
    ps, params, owner = [], [], []
    for name, sp in settings.items():
        prompt = prompts[index[name] % len(prompts)]
        n = int(sp.get("n", 1))
        base = {k: v for k, v in sp.items() if v is not None}
        base.update(max_new_tokens=new_tokens, ignore_eos=True)
        for _ in range(SAMPLES // n):
            ps.append(prompt)
            params.append(base)
            owner.append(name)
            if name in with_greedy:
                ps.append(prompt)
                params.append(dict(GREEDY, max_new_tokens=new_tokens))
                owner.append(None)
    return ps, params, owner


def _collect(outs, owner, settings):
    """{setting: [completion ids]} (n > 1 outputs follow their request) and the greedy rows."""
    by = {k: [] for k in settings}
    greedy, j = [], 0
    for name in owner:
        n = int(settings[name].get("n", 1)) if name is not None else 1
        for o in outs[j : j + n]:
            (greedy if name is None else by[name]).append(o["output_ids"])
        j += n
    assert j == len(outs), (j, len(outs))
    return by, greedy


def generate_by_n(eng, prompts: list[list[int]], params: list[dict]) -> list[dict]:
    """`generate`, one call per distinct ``n`` (SGLang requires one n per batch), outputs put
    back in request order (a request's n outputs together)."""
    groups: dict[int, list[int]] = {}
    for i, sp in enumerate(params):
        groups.setdefault(int(sp.get("n", 1)), []).append(i)
    outs: dict[int, list[dict]] = {}
    for n, idx in groups.items():
        got = generate(eng, [prompts[i] for i in idx], [params[i] for i in idx])
        assert len(got) == n * len(idx), (n, len(idx), len(got))
        for j, i in enumerate(idx):  # the n outputs of one request share its prompt and params
            outs[i] = got[j * n : (j + 1) * n]
    return [o for i in range(len(params)) for o in outs[i]]


def _sample(eng, prompts, settings, with_greedy=(), new_tokens=NEW_TOKENS):
    ps, params, owner = _law_requests(prompts, settings, with_greedy, new_tokens)
    return _collect(generate_by_n(eng, ps, params), owner, settings)


class ExtendPathSampler:
    """``(setting, prefix) -> [token]``: ``SAMPLES`` next tokens from the non-speculative server
    after the setting's prompt + ``prefix``, given as the prompt (so sampled from extend-path
    logits), at the setting's parameters. Starts that server on its first call; ``counts``
    keeps every probe's token counts."""

    def __init__(self, settings: dict, prompts: list[list[int]], dtype: str):
        self.settings, self.prompts, self.dtype = settings, prompts, dtype
        self.index = {k: i for i, k in enumerate(settings)}
        self.counts: dict[str, dict] = {}
        self._tokens: dict[str, list[int]] = {}
        self._stack = None

    def _engine(self):
        """The non-speculative server, started on first use."""
        import contextlib

        if self._stack is None:
            self._stack = contextlib.ExitStack()
            self._eng = self._stack.enter_context(engine(None, self.dtype))
        return self._eng

    def _request(self, name: str, new_tokens: int) -> tuple[str, dict, list[int]]:
        """The setting's name without a mixed batch's prefix (the same law), its sampling
        parameters for ``new_tokens`` tokens, and its prompt."""
        name = name.removeprefix("mixed_")
        sp = {k: v for k, v in self.settings[name].items() if v is not None and k != "n"}
        sp.update(max_new_tokens=new_tokens, ignore_eos=True)
        return name, sp, self.prompts[self.index[name] % len(self.prompts)]

    def __call__(self, name: str, prefix: list[int]) -> list[int]:
        name, sp, prompt = self._request(name, 1)
        key = f"{name} {list(prefix)}"
        if key in self._tokens:  # the same probe for another family or its mixed twin
            return self._tokens[key]
        self._engine()
        prompt = prompt + list(prefix)
        outs = generate(self._eng, [prompt] * SAMPLES, [sp] * SAMPLES)
        tokens = [o["output_ids"][0] for o in outs]
        self.counts[key] = {
            "counts": dict(Counter(tokens).most_common()),
            **self._top_logprobs(prompt, prefix),
        }
        self._tokens[key] = tokens
        return tokens

    def _top_logprobs(self, prompt: list[int], prefix: list[int]) -> dict:
        """The no-spec server's top-12 raw logprobs (no temperature, no filter, no bias of the
        setting) for the token after ``prompt`` (which ends with ``prefix``), from its extend
        path and from its decode path: for the latter the prefix's last token is generated, one
        decode step, forced by a logit bias of +100 (it shifts every other token's logprob
        alike, so their gaps are the raw ones; that token's own entry is marked "forced")."""
        head, last = prompt[:-1], prompt[-1]

        def top(ids, sp, step):
            o = self._eng.generate(input_ids=[ids], sampling_params=[sp], return_logprob=True,
                                   top_logprobs_num=12)[0]  # fmt: skip
            if step and o["output_ids"][:step] != [last]:
                return None  # the bias did not force it: no decode-path reading
            rows = o["meta_info"]["output_top_logprobs"][step]
            return [[t, round(lp, 6)] + (["forced"] if step and t == last else [])
                    for lp, t, *_ in rows]  # fmt: skip

        greedy = {"temperature": 0.0, "max_new_tokens": 1}
        forced = dict(greedy, max_new_tokens=2, logit_bias={str(last): 100.0})
        return {
            "extend_top_logprobs": top(prompt, greedy, 0),
            "decode_top_logprobs": top(head, forced, 1) if prefix else None,
        }

    def in_waves(self, name: str) -> list[list[int]]:
        """``SAMPLES`` completions of the setting from the non-speculative server, submitted
        `SHAPE_WAVE` requests at a time (its batches then hold at most that many rows)."""
        _, sp, prompt = self._request(name, NEW_TOKENS)
        eng = self._engine()
        out: list[list[int]] = []
        for start in range(0, SAMPLES, SHAPE_WAVE):
            n = min(SHAPE_WAVE, SAMPLES - start)
            out += [o["output_ids"] for o in generate(eng, [prompt] * n, [sp] * n)]
        return out

    def first_token_edge(self, name: str) -> dict:
        """A diagnosis, not an excuse: how close the setting's first token is to its top-k or
        nucleus edge on the non-speculative server's prefill (extend) logits. From the top-12
        raw logprobs after the setting's prompt: ``top_k_gap`` (the k-th minus the (k+1)-th
        logprob, any temperature) and, at temperature 1 without top-k or bias (the raw
        probabilities are then the nucleus's), each rank's cumulative probability and
        ``top_p_margin``, the least distance of one to top_p (a margin within float rounding
        says an edge the two prefills may cut apart)."""
        name, _, prompt = self._request(name, 1)
        sp = self.settings[name]
        self._engine()
        top = self._top_logprobs(prompt, [])["extend_top_logprobs"]
        out: dict = {"extend_top_logprobs": top}
        lps = [lp for _, lp, *_ in top]
        k, p, t = sp.get("top_k") or -1, sp.get("top_p") or 1.0, sp.get("temperature")
        if 0 < k < len(lps):
            out["top_k_gap"] = round(lps[k - 1] - lps[k], 6)
        if t == 1.0 and p < 1.0 and k <= 0 and not sp.get("logit_bias"):  # raw = the law's
            cumulative, total = [], 0.0
            for lp in lps:
                total += math.exp(lp)
                cumulative.append(round(total, 7))
            out["cumulative"] = cumulative
            out["top_p_margin"] = round(min(abs(c - p) for c in cumulative), 7)
        return out

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None


def _choice_edge(module, router_logits, chosen):
    """A router's edge at each position, by its choice score (score plus correction bias):
    ``(weakest chosen expert's slot [T], its score [T], best expert left out [T], its score
    [T])``."""
    choice = router_logits.sigmoid() + module.e_score_correction_bias
    kept, weakest = choice.gather(1, chosen).min(dim=1)
    left, best = choice.scatter(1, chosen, float("-inf")).max(dim=1)
    return weakest, kept, best, left


class ExactModelSampler:
    """``(setting, prefix) -> [token]``: ``SAMPLES`` next tokens drawn from the target model's
    exact law after the setting's prompt + ``prefix``: the target's weights evaluated by
    Hugging Face transformers in float32 (CUDA where there is one), then the setting's logit
    bias, temperature, top-k and top-p as SGLang's sampler applies them (`core.sampling`, the
    torch path). A second referee for `attribute_rejection`, next to the extend path: where a
    MoE router's top choices are within rounding of each other (a random tiny router in
    bfloat16), the two servers' forwards can pick different experts at a prefix and so follow
    different next-token laws while each samples its own logits exactly; the exact model says
    which side the difference is on. It excuses a prefix only where the speculative server's
    samples fit the exact law and the reference's do not, so a wrong speculative law (or the
    power family's wrong temperature) stays rejected. ``counts`` keeps each probe's top
    probabilities."""

    def __init__(self, target_dir: str, settings: dict, prompts: list[list[int]], seed: int = 0):
        self.target_dir, self.settings, self.prompts = target_dir, settings, prompts
        self.index = {k: i for i, k in enumerate(settings)}
        self.counts: dict[str, dict] = {}
        self._tokens: dict[str, list[int]] = {}
        self._model = None
        self._router_map: dict | None = None
        self._seed = seed

    def _load(self):
        import torch
        from transformers import AutoModelForCausalLM

        if self._model is None:
            self._device = "cuda" if torch.cuda.is_available() else "cpu"
            try:
                model = AutoModelForCausalLM.from_pretrained(self.target_dir, dtype=torch.float32)
            except TypeError:  # transformers before 4.56 names it torch_dtype
                model = AutoModelForCausalLM.from_pretrained(
                    self.target_dir, torch_dtype=torch.float32
                )
            self._model = model.to(self._device).eval()
        return self._model

    def _ids(self, name: str, prefix: list[int]) -> list[int]:
        return self.prompts[self.index[name] % len(self.prompts)] + list(prefix)

    def _routers(self) -> dict:
        """{layer: router module}: the MoE routers that pick experts by score plus correction
        bias (transformers' DeepseekV3TopkRouter, Kimi K2's architecture); found once."""
        if self._router_map is None:
            self._router_map = {
                int(mod_name.split("layers.")[1].split(".")[0]): mod
                for mod_name, mod in self._load().named_modules()
                if hasattr(mod, "e_score_correction_bias") and hasattr(mod, "top_k")
            }
        return self._router_map

    def _forward(self, ids: list[int], hooks: dict | None = None):
        """[V] float32 (CPU): the last position's logits; ``hooks``: {layer: forward hook} on
        that layer's router."""
        import torch

        model = self._load()
        routers = self._routers() if hooks else {}
        handles = [routers[layer].register_forward_hook(h) for layer, h in (hooks or {}).items()]
        try:
            with torch.no_grad():
                out = model(torch.tensor([ids], device=self._device))
            return out.logits[0, -1].float().cpu()
        finally:
            for handle in handles:
                handle.remove()

    def router_near_ties(self, ids: list[int], max_gap: float) -> list[tuple[float, int, int]]:
        """``(gap, layer, position)`` for each routing site of ``ids`` whose weakest chosen
        expert's choice score (score plus correction bias) is within ``max_gap`` of the best
        expert left out, closest first. Routers that choose within expert groups (``n_group``
        > 1, where the best expert left out may sit in a group not taken) are not read; Kimi
        K2's choose from one group."""
        ties = []

        def record(layer):
            def hook(module, inputs, output):
                if getattr(module, "num_group", 1) > 1:
                    return
                router_logits, _, chosen = output
                _, kept, _, left = _choice_edge(module, router_logits, chosen)
                for pos, gap in enumerate((kept - left).tolist()):
                    if gap < max_gap:
                        ties.append((gap, layer, pos))

            return hook

        self._forward(ids, {layer: record(layer) for layer in self._routers()})
        return sorted(ties)

    def router_swaps(self, name: str, prefix: list[int]) -> list[dict]:
        """The router-swap diagnosis at ``prefix``: for each of the ``ROUTER_SWAPS`` closest
        near-tied sites (`router_near_ties`, ``ROUTER_TIE_GAP``), ``SAMPLES`` tokens of the
        setting's law with that site's weakest chosen expert swapped for the best one left
        out (its weight from its own score, normalized as the router does): [{"layer",
        "position", "gap", "tokens"}]."""
        import torch

        name = name.removeprefix("mixed_")
        ids = self._ids(name, prefix)
        sites = []
        for gap, layer, pos in self.router_near_ties(ids, ROUTER_TIE_GAP)[:ROUTER_SWAPS]:

            def swap(module, inputs, output, pos=pos):
                router_logits, weights, chosen = output
                weakest, _, best, _ = _choice_edge(module, router_logits, chosen)
                chosen = chosen.clone()
                chosen[pos, int(weakest[pos])] = int(best[pos])
                weights = router_logits.sigmoid().gather(1, chosen)
                if module.norm_topk_prob:
                    weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
                return router_logits, weights * module.routed_scaling_factor, chosen

            probs = self._law_from_logits(name, self._forward(ids, {layer: swap}))
            gen = torch.Generator().manual_seed(self._seed + layer * 100_003 + pos)
            tokens = torch.multinomial(probs, SAMPLES, replacement=True, generator=gen).tolist()
            sites.append({"layer": layer, "position": pos - len(ids), "gap": round(gap, 6),
                          "tokens": tokens})  # fmt: skip
        return sites

    def law(self, name: str, prefix: list[int]):
        """[V] float32 (CPU): the setting's next-token law after its prompt + ``prefix``."""
        name = name.removeprefix("mixed_")
        return self._law_from_logits(name, self._forward(self._ids(name, prefix)))

    def _law_from_logits(self, name: str, logits):
        """The setting's filters on [V] raw logits, as SGLang's sampler applies them."""
        import torch

        from sglang_ddtree.core.sampling import target_probs

        sp = self.settings[name]
        logits = logits.clone()
        for tok, bias in (sp.get("logit_bias") or {}).items():  # SGLang: bias, then temperature
            logits[int(tok)] += float(bias)
        top_k = sp.get("top_k") or -1
        return target_probs(
            logits[None, None],
            torch.tensor([float(sp["temperature"])]),
            torch.tensor([top_k if top_k > 0 else 0]),
            torch.tensor([float(sp.get("top_p", 1.0))]),
            use_kernels=False,
        )[0, 0]

    def __call__(self, name: str, prefix: list[int]) -> list[int]:
        import torch

        key = f"{name.removeprefix('mixed_')} {list(prefix)}"
        if key not in self._tokens:
            probs = self.law(name, prefix)
            gen = torch.Generator().manual_seed(self._seed + len(self._tokens))
            draws = torch.multinomial(probs, SAMPLES, replacement=True, generator=gen)
            self._tokens[key] = draws.tolist()
            top = torch.topk(probs, min(12, int((probs > 0).sum())))
            self.counts[key] = {
                "exact_top_probs": [[int(t), round(float(v), 6)] for v, t in zip(*top)]
            }
        return self._tokens[key]


def make_plan(eng, prompts) -> dict:
    """The requests both servers answer, fixed from the non-speculative server's greedy output:
    the logit-bias values and the stop token ids."""
    settings = law_settings()
    index = {k: i for i, k in enumerate(settings)}
    for name, sp in settings.items():
        if "logit_bias" in sp:  # push the greedy 1st token down, the 2nd and 3rd up
            p = prompts[index[name] % len(prompts)]
            t = generate(eng, [p], [dict(GREEDY, max_new_tokens=3)])[0]["output_ids"]
            sp["logit_bias"] = {str(t[0]): -3.0, str(t[1]): 2.0, str(t[2]): 3.0}
    index = _prompt_index()
    parameter_settings = {}
    for part, (part_settings, *_rest) in PARAMETER_PARTS.items():
        parameter_settings[part] = {k: dict(sp) for k, sp in part_settings.items()}
        for name, sp in parameter_settings[part].items():
            if "stop_token_ids" in sp and sp["stop_token_ids"] is None:
                p = prompts[index[name] % len(prompts)]
                t = generate(eng, [p], [dict(GREEDY, max_new_tokens=2)])[0]["output_ids"]
                sp["stop_token_ids"] = [t[1]]
    ps = prompts[:32]
    base = _ids(generate(eng, ps, [dict(GREEDY, max_new_tokens=32)] * len(ps)))
    cases = {  # greedy requests that end where the server decides
        # ignore_eos off: SGLang skips stop token ids under ignore_eos
        "stop_token_ids": [
            dict(GREEDY, max_new_tokens=32, stop_token_ids=[b[4]], ignore_eos=False) for b in base
        ],
        "stop_strings": [dict(GREEDY, max_new_tokens=32, stop=["(", "):"])] * len(ps),
        "eos": [dict(GREEDY, max_new_tokens=128, ignore_eos=False)] * len(ps),
        "ignore_eos": [dict(GREEDY, max_new_tokens=128)] * len(ps),
        "n3_greedy": [dict(GREEDY, max_new_tokens=16, n=3)] * 8,
    }
    for m in (1, 2, 3, 5, 7):
        cases[f"max_new_tokens_{m}"] = [dict(GREEDY, max_new_tokens=m)] * len(ps)
    return {"settings": settings, "param_cases": cases, "parameter_settings": parameter_settings}


def collect(eng, prompts, plan, parts, reference: bool) -> dict:
    """Every output one server gives for ``parts``; ``reference`` adds the non-speculative
    extras (null sample, 1.1x-temperature sample, one-by-one greedy)."""
    settings, raw = plan["settings"], {}
    if "law" in parts:
        t0 = time.time()
        raw["law"] = _sample(eng, prompts, settings)[0]
        if reference:
            raw["null"] = _sample(eng, prompts, {k: settings[k] for k in NULL})[0]
            hot = {k: dict(settings[k]) for k in CALIBRATION}
            for sp in hot.values():
                sp["temperature"] = round(sp["temperature"] * 1.1, 6)
            raw["hot"] = _sample(eng, prompts, hot)[0]
            raw["greedy6"] = {
                k: generate(
                    eng, [prompts[i % len(prompts)]], [dict(GREEDY, max_new_tokens=NEW_TOKENS)]
                )[0]["output_ids"]
                for i, k in enumerate(settings)
                if k in MIXED
            }
        else:
            mixed = {k: settings[k] for k in MIXED}
            raw["mixed"], raw["mixed_greedy"] = _sample(eng, prompts, mixed, set(MIXED))
        raw["law_seconds"] = round(time.time() - t0, 1)
    for part, (_, wrong, new_tokens, _repeats) in PARAMETER_PARTS.items():
        if part in parts:
            settings_of_part = plan["parameter_settings"][part]
            raw[part] = _sample(eng, prompts, settings_of_part, new_tokens=new_tokens)[0]
            if reference:
                raw[f"{part}_null"] = _sample(
                    eng, prompts, settings_of_part, new_tokens=new_tokens
                )[0]
                wrong_settings = {k: wrong(sp) for k, sp in settings_of_part.items()}
                raw[f"{part}_wrong"] = _sample(eng, prompts, wrong_settings, new_tokens=new_tokens)[
                    0
                ]
    if "greedy" in parts:
        gp = prompts[:GREEDY_PROMPTS]
        outs = generate(eng, gp, [GREEDY] * len(gp))
        raw["greedy_batch"] = _ids(outs)
        raw["greedy_accept"] = [o["meta_info"].get("spec_accept_length", 1.0) for o in outs]
        if reference:
            raw["greedy_single"] = [generate(eng, [p], [GREEDY])[0]["output_ids"] for p in gp]
            raw["greedy_margin"], raw["greedy_margin_ids"] = top2_margins(eng, gp)
            raw["greedy_extend"] = extend_path_greedy(eng, gp)
    if "params" in parts:
        ps = prompts[:32]
        raw["params"] = {}
        for case, params in plan["param_cases"].items():
            try:
                if any(sp.get("n", 1) > 1 for sp in params):  # one prompt per call: output order
                    outs = [o for p, sp in zip(ps, params) for o in generate(eng, [p], [sp])]
                else:
                    outs = generate(eng, ps[: len(params)], params)
            except Exception as e:  # recorded; the comparison then fails on this case
                raw["params"][case] = {"error": f"{type(e).__name__}: {e}"}
                continue
            raw["params"][case] = [
                {k: o[k] for k in ("output_ids", "text")}
                | {"finish_reason": o["meta_info"].get("finish_reason")}
                for o in outs
            ]
    return raw


# ------------------------------------------------------------------------------- summaries
def summarize_law(ref: dict, tree: dict, settings: dict, extend_law=None, exact_law=None) -> dict:
    """The law part's summary. ``extend_law(setting, prefix) -> [token]``: the
    non-speculative server's extend-path sampler for `attribute_rejection` (None: not run);
    ``exact_law``: the target's exact law as a second referee (`ExactModelSampler`, or None)."""
    others = dict(tree["law"], **{f"mixed_{k}": tree["mixed"][k] for k in MIXED})
    refs = dict(ref["law"], **{f"mixed_{k}": ref["law"][k] for k in MIXED})
    ddtree = {k: compare_samples(refs[k], others[k]) for k in others}
    nulls = {k: compare_samples(ref["law"][k], ref["null"][k]) for k in NULL}
    power = {k: compare_samples(ref["law"][k], ref["hot"][k]) for k in CALIBRATION}
    fam_tree = attribute_family(
        family(ddtree), refs, others, extend_law, diagnose=True, exact_law=exact_law
    )
    fam_null = family(nulls)
    # The wrong law must be rejected as a family (each setting's p is reported too); where a
    # check excused a DDTREE rejection, it must not excuse the wrong law either.
    excused = set(fam_tree["rejected"]) - set(fam_tree["unexplained"])
    by_shape = any(fam_tree["attribution"][k].get("explained_by") == "batch_shape" for k in excused)
    fam_power = attribute_family(
        family(power),
        ref["law"],
        ref["hot"],
        extend_law if excused else None,
        by_shape,
        exact_law=exact_law if excused else None,
    )
    power_ok = bool(fam_power["unexplained"])
    # Greedy rows inside the mixed batches: each equals the no-spec greedy of its prompt, and
    # the rows come in MIXED order, SAMPLES of each.
    want = [ref["greedy6"][k] for k in MIXED for _ in range(SAMPLES)]
    greedy_bad = sum(x != y for x, y in zip(tree["mixed_greedy"], want))
    greedy_bad += abs(len(want) - len(tree["mixed_greedy"]))
    return {
        "samples_per_side": SAMPLES,
        "new_tokens": NEW_TOKENS,
        "ddtree": ddtree,
        "ddtree_family": fam_tree,
        "null": nulls,
        "null_family": fam_null,
        "power_temperature_x1.1": power,
        "power_family": fam_power,
        "mixed_greedy_rows": {"rows": len(tree["mixed_greedy"]), "mismatches": greedy_bad},
        "seconds": {"reference": ref["law_seconds"], "ddtree": tree["law_seconds"]},
        "passed": not fam_tree["unexplained"]
        and not fam_null["rejected"]
        and power_ok
        and greedy_bad == 0,
    }


def wrong_min_p() -> dict[str, dict]:
    """The min-p calibration's wrong law: each of `MIN_P_SETTINGS` at twice its min-p."""
    return {k: _twice_min_p(sp) for k, sp in MIN_P_SETTINGS.items()}


def summarize_parameter_part(
    part: str, ref: dict, tree: dict, settings: dict | None = None
) -> dict:
    """A request-parameter part (``min_p``, ``penalties``): DDTREE against the non-speculative
    server per setting, with the null (a second non-speculative sample, must pass) and the
    power (the part's wrong law, must be rejected at every setting: a setting whose wrong law
    passes says nothing of DDTREE's), each a Bonferroni family at ``ALPHA``. ``settings``: the
    part's settings as the plan filled them in (reported; default the part's own)."""
    names, _, new_tokens, repeats = PARAMETER_PARTS[part]

    def compare(a, b):
        return compare_samples(a, b, new_tokens, repeats)

    ddtree = {k: compare(ref[part][k], tree[part][k]) for k in names}
    null = {k: compare(ref[part][k], ref[f"{part}_null"][k]) for k in names}
    power = {k: compare(ref[part][k], ref[f"{part}_wrong"][k]) for k in names}
    fams = {"ddtree": family(ddtree), "null": family(null), "power": family(power)}
    return {
        "settings": settings or names,
        "ddtree": ddtree,
        "null": null,
        "power_wrong_law": power,
        "families": fams,
        "passed": not fams["ddtree"]["rejected"]
        and not fams["null"]["rejected"]
        and set(fams["power"]["rejected"]) == set(names),
    }


def summarize_greedy(ref: dict, tree: dict) -> dict:
    """Greedy mismatches against the non-speculative server's one-by-one outputs, next to that
    server's own batch-versus-single mismatches (the noise floor). Within the floor: no more
    mismatches than the floor, or a one-sided Fisher exact test finds no excess (p > ALPHA)."""
    acc = tree["greedy_accept"]
    floor = first_differences(ref["greedy_batch"], ref["greedy_single"])
    spec = first_differences(tree["greedy_batch"], ref["greedy_single"])
    n = floor["prompts"]
    a, b = spec["mismatches"], floor["mismatches"]

    def excess(m: int) -> float:  # one-sided: does DDTREE differ more often than m of n?
        return excess_p(a, m, n)

    p_excess = excess(b)
    path = {}
    if "greedy_extend" in ref:  # the server against itself, every token from its extend path
        e = first_differences(ref["greedy_extend"], ref["greedy_single"])
        m = e["mismatches"]
        p_path = excess(m)
        path = {
            "nospec_extend_vs_single": e,
            "p_excess_over_extend_floor": p_path,
            "within_extend_floor": a <= m or p_path > ALPHA,
        }
    return {
        "prompts": n,
        "new_tokens": GREEDY_NEW_TOKENS,
        "nospec_batch_vs_single": floor,
        "spec_vs_nospec_single": spec,
        "spec_vs_nospec_batch": first_differences(tree["greedy_batch"], ref["greedy_batch"]),
        "p_excess_over_floor": p_excess,
        "within_noise_floor": a <= b or p_excess > ALPHA,
        **path,
        "spec_mean_accept_length": sum(acc) / len(acc),
        "near_ties": margin_at_differences(ref, tree["greedy_batch"])
        if "greedy_margin" in ref
        else None,
    }


def _diverged(x: list[int], y: list[int]) -> bool:
    """Whether two outputs differ at a position both reached (a different token stream, from a
    near-tie), as opposed to one being a prefix of the other (a different end)."""
    return any(u != v for u, v in zip(x, y))


def summarize_params(ref: dict, tree: dict) -> dict:
    """Per case, DDTREE ends each request where the non-speculative server does: wherever the
    two token streams agree up to the shorter output, the outputs are equal (ids, text, finish
    reason). Requests whose streams diverge earlier (a bf16/fp16 near-tie, see the greedy part)
    are counted, not compared."""
    res: dict = {}
    for case, want in ref["params"].items():
        got = tree["params"][case]
        if isinstance(want, dict) or isinstance(got, dict):  # a server refused the case
            errors = [x.get("error") if isinstance(x, dict) else None for x in (want, got)]
            res[case] = {"error": errors, "mismatches": 1, "compared": 0, "lengths_ok": False}
            continue
        pairs = [
            (x, y) for x, y in zip(want, got) if not _diverged(x["output_ids"], y["output_ids"])
        ]
        bad = sum(x != y for x, y in pairs) + abs(len(want) - len(got))
        reasons: dict = {}
        for x in want:
            r = (x["finish_reason"] or {}).get("type", "none")
            reasons[r] = reasons.get(r, 0) + 1
        lengths_ok = True
        if case.startswith("max_new_tokens_"):
            m = int(case.rsplit("_", 1)[1])
            lengths_ok = all(len(x["output_ids"]) == m for x in got)
        res[case] = {
            "outputs": [len(want), len(got)],
            "compared": len(pairs),
            "mismatches": bad,
            "nospec_finish_reasons": reasons,
            "lengths_ok": lengths_ok,
        }
    res["passed"] = all(r["mismatches"] == 0 and r["lengths_ok"] for r in res.values())
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--parts", default="law,greedy,params")
    ap.add_argument(
        "--algos",
        default="DDTREE",
        help="speculative servers to compare, each with all parts or NAME:part+part "
        "(e.g. DDTREE,DFLASH:greedy)",
    )
    ap.add_argument(
        "--reference",
        default=None,
        help="DIR with a saved no-spec side (law_nospec_<dtype>.json.gz) to compare against",
    )
    ap.add_argument(
        "--from-saved",
        default=None,
        help="DIR with every side saved by an earlier run: summarize it again (an engine only "
        "for the forward-path check of a rejected setting)",
    )
    ap.add_argument(
        "--no-probes",
        action="store_true",
        help="with --from-saved: no engine at all; a rejected setting then stays unexplained "
        "(the forward-path check needs the non-speculative server)",
    )
    ap.add_argument(
        "--arch",
        choices=("pair", *(a for a in TINY_ARCHS if a.startswith("mla"))),
        default="pair",
        help="the shipped trained pair, the Kimi-shaped MLA + MoE tiny pair, that pair with "
        "dense layers only, or with a K2.6 TP-8 rank's 8 heads (on flashmla at W 8, in "
        "bfloat16 on Hopper: the Gluon prefix kernel)",
    )
    ap.add_argument(
        "--attention-backend",
        default="triton",
        choices=("triton", "flashmla"),
        help="every engine's attention backend; flashmla (MLA pairs) at page size 64 with the "
        "drafter on triton, as a Kimi K2.6 deployment on Hopper serves",
    )
    ap.add_argument(
        "--page-size",
        type=int,
        default=None,
        help="every engine's KV page size (triton: any; flashmla: 64, its default there)",
    )
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every engine")
    ap.add_argument(
        "--fp32-lm-head",
        action="store_true",
        help="every engine computes its logits in float32 (SGLang's enable_fp32_lm_head): no "
        "exact ties from the LM head's rounding at a top-k or nucleus edge",
    )
    ap.add_argument(
        "--exact-referee",
        action="store_true",
        help="a rejection the forward path does not explain is checked against the target's "
        "exact law (transformers, float32; `ExactModelSampler`): works with --no-probes",
    )
    ap.add_argument(
        "--no-overlap",
        action="store_true",
        help="every engine with --disable-overlap-schedule (the penalties part's reference: "
        "SGLang's overlap scheduler feeds its penalizers one token late)",
    )
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if "penalties" in parts and not args.no_overlap:  # else the reference's law is not SGLang's
        ap.error(
            "--parts penalties needs --no-overlap: SGLang's overlap scheduler feeds the "
            "non-speculative reference's penalizers one token late"
        )
    flashmla = args.attention_backend == "flashmla"
    if flashmla and not args.arch.startswith("mla"):
        ap.error("--attention-backend flashmla serves MLA targets: pass --arch mla, mla8, ...")
    if flashmla and args.page_size not in (None, 64):
        ap.error("--attention-backend flashmla serves page size 64 only")
    if args.page_size is not None and args.page_size < 1:
        ap.error("--page-size must be at least 1")
    # Each configuration's saved sides carry its tag: one is never read for another.
    tag = args.dtype + ("-fp32head" if args.fp32_lm_head else "")
    tag += "-flashmla" if flashmla else ""
    tag += f"-page{args.page_size}" if args.page_size not in (None, 1) and not flashmla else ""
    if args.arch.startswith("mla"):
        import tempfile

        from sglang_ddtree.testing import tiny_models as tm

        target, draft, cfg = tm.make_pair(args.arch, tempfile.mkdtemp(prefix="ddtree_law_"))
        prompts = e2e.make_prompts(len(tm.SPECIALS), cfg.vocab_size, GREEDY_PROMPTS, seed=1)
        _PAIR.update(target=target, draft=draft, prompts=prompts)
    # Every engine of the run (reference, speculative, probes) takes these.
    if flashmla or args.page_size:
        draft_backend = "triton" if flashmla else None
        e2e.ENGINE_EXTRA.update(
            e2e.backend_settings(args.attention_backend, args.page_size, draft_backend)
        )
    if args.tp > 1:
        e2e.ENGINE_EXTRA.update(tp_size=args.tp, **e2e.TP_CHECK_ENGINE)
    if args.fp32_lm_head:
        e2e.ENGINE_EXTRA.update(enable_fp32_lm_head=True)
    if args.no_overlap:
        e2e.ENGINE_EXTRA.update(disable_overlap_schedule=True)
    if args.from_saved:
        args.reference = args.from_saved
    known = {"law", "greedy", "params", *PARAMETER_PARTS}
    bad = set(parts) - known
    if bad:
        ap.error(f"unknown parts {sorted(bad)}; choose from {', '.join(sorted(known))}")
    # "DDTREE,DFLASH:greedy": a speculative server with all parts, or with the listed ones.
    algos: dict[str, list[str]] = {}
    for item in (a.strip() for a in args.algos.split(",") if a.strip()):
        name, _, only = item.partition(":")
        algos[name.upper()] = [p for p in only.split("+") if p] if only else parts
        if not set(algos[name.upper()]) <= set(parts):
            ap.error(f"--algos {item}: its parts must be among --parts {args.parts}")
    os.makedirs(args.out, exist_ok=True)
    prompts = tokenized_prompts()
    import gzip

    def save(name: str, obj) -> None:  # after every server: a later timeout keeps the rest
        with gzip.open(os.path.join(args.out, f"law_{name}_{tag}.json.gz"), "wt") as f:
            json.dump(obj, f)

    t0 = time.time()
    if args.reference:
        with gzip.open(os.path.join(args.reference, f"law_nospec_{tag}.json.gz"), "rt") as f:
            saved = json.load(f)
        plan, raw = saved["plan"], {"nospec": saved["raw"]}
    else:
        with engine(None, args.dtype) as eng:
            plan = make_plan(eng, prompts)
            raw = {"nospec": collect(eng, prompts, plan, parts, reference=True)}
        save("nospec", {"plan": plan, "raw": raw["nospec"]})
    for algo, algo_parts in algos.items():
        if args.from_saved:
            path = os.path.join(args.from_saved, f"law_{algo.lower()}_{tag}.json.gz")
            with gzip.open(path, "rt") as f:
                raw[algo] = json.load(f)
            continue
        with engine(algo, args.dtype) as eng:
            raw[algo] = collect(eng, prompts, plan, algo_parts, reference=False)
        save(algo.lower(), raw[algo])
    summary: dict = {
        "dtype": args.dtype,
        "attention_backend": args.attention_backend,
        "page_size": e2e.ENGINE_EXTRA.get("page_size", 1),
        "fp32_lm_head": args.fp32_lm_head,
        "no_overlap": args.no_overlap,
        "settings": plan["settings"],
    }
    probes = ExtendPathSampler(plan["settings"], prompts, args.dtype)
    extend_law = None if args.no_probes else probes
    exact_law = None
    if args.exact_referee:
        exact_law = ExactModelSampler(_pair_dirs()[0], plan["settings"], prompts)
    for algo, algo_parts in algos.items():
        s = summary[algo] = {}
        if "law" in algo_parts:
            s["law"] = summarize_law(
                raw["nospec"], raw[algo], plan["settings"], extend_law, exact_law
            )
        if "greedy" in algo_parts:
            s["greedy"] = summarize_greedy(raw["nospec"], raw[algo])
        if "params" in algo_parts:
            s["params"] = summarize_params(raw["nospec"], raw[algo])
        for part in PARAMETER_PARTS:
            if part in algo_parts:
                s[part] = summarize_parameter_part(
                    part, raw["nospec"], raw[algo], plan["parameter_settings"][part]
                )
    probes.close()
    summary["extend_path_probes"] = probes.counts
    if exact_law is not None:
        summary["exact_model_probes"] = exact_law.counts
    summary["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, f"law_{tag}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    ok = True
    for algo in algos:
        for part, res in summary[algo].items():
            brief = {k: v for k, v in res.items() if k not in ("ddtree", "null", "power_wrong_law")}
            print(f"[law] {algo} {part}: {json.dumps(brief)[:2500]}", flush=True)
            ok = ok and res.get("passed", True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
