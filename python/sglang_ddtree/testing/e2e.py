"""End-to-end checks of DDTREE inside SGLang on a CUDA machine, with the tiny random pair.

Run as ``python -m sglang_ddtree.testing.e2e --out DIR [--checks greedy,sampling,...]``
(``--pair trained``: the shipped trained pair and its held-out prompts instead, where a check
needs the drafter accepted often, as the logprobs check's sampled paths do). Each
check starts its own ``sgl.Engine``(s) (CUDA graphs on, triton attention) and records numbers in
``DIR/e2e_summary.json``; ``test/srt/test_e2e_ddtree.py`` runs this once and asserts on it.

Checks:
- ``greedy``: DDTREE greedy == no-speculation greedy, token for token up to near-ties
  (``testing/near_tie``: at a first difference the two tokens are the non-speculative
  engine's top two, at most ``NEAR_TIE_NATS`` apart; that engine restarts only to judge a
  difference), 32 prompts at batch 1, 4, 16 and 32 (same engine settings, same batching;
  batch 32 is the default schedule's W = B bucket and runs without CUDA graphs, above this
  engine's graph max of 16).
- ``sampling``: at T=1.0 and at T=0.7/top_p=0.9 the DDTREE output law equals no-speculation
  sampling (per-position two-sample chi-squared tests, Bonferroni-combined, p > 0.001), and a
  deliberately wrong DDTREE (verify coins scaled by 0.5, injected into its scheduler processes
  by `sglang_ddtree.testing.inject`, which biases acceptance toward the first children) is
  rejected (p < 0.001).
- ``grammar``: constrained decoding (regex, JSON schema, EBNF, a batch mixing constrained and
  free requests, JSON sampled at T 1.0 / top_p 0.95, the law under a regex) against the
  non-speculative engine; see `sglang_ddtree.testing.grammar_check`.
- ``accept``: mean accept length of DDTREE >= DFLASH on the same models and prompts.
- ``chain`` (not run by default): SGLang's DFLASH chain through the same greedy and sampled
  checks, beside DDTREE's, as the calibration for what verify-versus-decode numerics alone do
  on this pair (a MoE router's near-ties flip experts; bfloat16 moves logits ~8x more than
  float16). With it, greedy also passes when DDTREE's differing prompts are not more than the
  chain's at any batch size (one-sided Fisher test, p > ``CHAIN_EXCESS_P``), and the summary
  gives the chain's law p-values next to DDTREE's.
- ``backend_floor`` (not run by default, with ``sampling`` on a backend other than triton): the
  non-speculative server on triton (same page size) through the same law test against the
  non-speculative server on the chosen backend: what switching SGLang's own attention kernel
  does to the law test on this pair, beside what DDTREE's verify on that backend does.
- ``defaults`` (not run by default): a server over a target whose generation_config.json sets
  a repetition penalty and a min-p serves plain requests (see
  `sglang_ddtree.testing.server_check.check_generation_defaults`).
- ``server``: see `sglang_ddtree.testing.server_check`.
- ``adaptive``: one DDTREE engine with the budget schedule
  ``SGLANG_DDTREE_BUDGET_SCHEDULE=1:33,4:17`` (block-8 drafter: W=33 for bs 1..3, W=17 for
  bs >= 4), prompts in groups of 1, 3, 4 and 16 (batches shrink as requests finish, so W
  switches inside a run): greedy output == no speculation (up to near-ties, as above); every
  verify step of both widths replayed a CUDA graph (counts written by `testing.inject`;
  no eager step, no width mismatch); every glue segment (tree, accept, KV;
  ``srt/ddtree_glue_graph.py``) replayed its graph on every step except the one that captured
  it, with no capture failure; no glue capture after startup, and the memory the startup
  capture took within what the constructor held for it before the KV pool was sized and the
  slack (``ddtree_glue_warmup``'s ``glue_memory_limit``, where the startup warns). Run only
  it with ``--checks adaptive``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from contextlib import ExitStack, contextmanager

from sglang_ddtree.srt.ddtree_attention.attention_registry import VERIFY_BACKENDS
from sglang_ddtree.srt.ddtree_attention.verify_backend import VERIFY_FLAG
from sglang_ddtree.srt.ddtree_envs import envs
from sglang_ddtree.srt.ddtree_glue_warmup import glue_memory_limit
from sglang_ddtree.testing import grammar_check, inject, tiny_models
from sglang_ddtree.testing.near_tie import first_difference, judge, top2_of

# The engines' scheduler processes import this module again: the test-only changes this run
# names in the environment (the wrong law, the graph counts' file) are made there.
inject.install_from_env()

NUM_PROMPTS = 32
GREEDY_NEW_TOKENS = 48
BATCH_SIZES = (1, 4, 16, 32)  # 32: the default schedule's W = B bucket
SAMPLE_PROMPTS = 4
SAMPLES_PER_PROMPT = 256
SAMPLE_NEW_TOKENS = 24
SAMPLING_CASES = (("T1.0", 1.0, 1.0), ("T0.7_p0.9", 0.7, 0.9))
ADAPTIVE_SCHEDULE = "1:33,4:17"  # valid for the tiny drafter's block 8 (every W >= 8)
ADAPTIVE_BATCH_SIZES = (1, 3, 4, 11, 16)  # 11: between captured sizes 10 and 12 (padded)
ALL_CHECKS = ("greedy", "sampling", "grammar", "accept", "server", "adaptive")
# Accepted by --checks, not in the default set.
OPTIONAL_CHECKS = ("chain", "backend_floor", "defaults", "logprobs")
CHAIN_EXCESS_P = 0.01
ENGINE_EXTRA: dict = {}  # set from the command line (--tp) for every engine of a run
DDTREE_EXTRA: dict = {}  # set from the command line (--verify-attention) for DDTREE's engines
# Tensor-parallel checks use NCCL's plain all-reduce: they check DDTREE's ranks, not SGLang's
# custom all-reduce or FlashInfer's all-reduce fusion (why: RESULTS.md, "Kimi K2.6 shape").
TP_CHECK_ENGINE = {
    "disable_custom_all_reduce": True,
    "enforce_disable_flashinfer_allreduce_fusion": True,
}


def tp_check_cli() -> list[str]:
    """`TP_CHECK_ENGINE` as ``launch_server`` flags."""
    return [f"--{k.replace('_', '-')}" for k, v in TP_CHECK_ENGINE.items() if v is True]


def backend_settings(
    attention_backend: str | None,
    page_size: int | None = None,
    draft_attention_backend: str | None = None,
) -> dict:
    """ServerArgs fields for every engine or server of a check on ``attention_backend``:
    flashmla (MLA targets) runs at its page size 64 unless ``page_size`` says otherwise, and
    the drafter (MHA) takes a backend of its own there. Empty: triton at page 1."""
    out: dict = {}
    if attention_backend:
        out["attention_backend"] = attention_backend
    page = page_size or (64 if attention_backend == "flashmla" else None)
    if page:
        out["page_size"] = page
    if draft_attention_backend:
        out["speculative_draft_attention_backend"] = draft_attention_backend
    return out


def make_prompts(vocab_lo: int, vocab_hi: int, count: int, seed: int) -> list[list[int]]:
    """Random token-id prompts of 6..40 tokens over [vocab_lo, vocab_hi)."""
    rng = random.Random(seed)
    return [
        [rng.randrange(vocab_lo, vocab_hi) for _ in range(rng.randint(6, 40))] for _ in range(count)
    ]


def engine_kwargs(target: str, draft: str, algo: str | None, **extra) -> dict:
    kw = dict(
        model_path=target,
        attention_backend="triton",
        mem_fraction_static=0.25,
        cuda_graph_max_bs_decode=16,
        max_running_requests=16,
        context_length=1024,
        log_level="info",  # DDTREE's notes (the split attention's first verify) are at info
        random_seed=0,
    )
    if algo is not None:
        kw.update(speculative_algorithm=algo, speculative_draft_model_path=draft)
    kw.update(ENGINE_EXTRA)
    if algo == "DDTREE":
        kw.update(DDTREE_EXTRA)
    kw.update(extra)
    # A fixed KV pool rather than a share of the free memory: SGLang sizes its pool from the
    # memory free when the engine starts, so engines starting side by side on one GPU would
    # each count the others' memory as theirs.
    kw.setdefault("max_total_tokens", 2 * kw["max_running_requests"] * kw["context_length"])
    return kw


@contextmanager
def engine(**kwargs):
    import sglang as sgl

    t0 = time.time()
    eng = sgl.Engine(**kwargs)
    print(f"[e2e] engine up in {time.time() - t0:.1f}s: {kwargs.get('speculative_algorithm')}")
    try:
        yield eng
    finally:
        eng.shutdown()


def generate(eng, prompts, params) -> list[dict]:
    out = eng.generate(input_ids=prompts, sampling_params=params)
    return out if isinstance(out, list) else [out]


GREEDY = {"temperature": 0.0, "max_new_tokens": GREEDY_NEW_TOKENS, "ignore_eos": True}


def run_greedy_groups(eng, prompts, batch_sizes) -> tuple[dict, list[float]]:
    """({bs: [output_ids per prompt]}, accept lengths), prompts submitted in groups of bs."""
    res, accept = {}, []
    for bs in batch_sizes:
        outs = []
        for i in range(0, len(prompts), bs):
            outs += generate(eng, prompts[i : i + bs], GREEDY)
        res[bs] = [o["output_ids"] for o in outs]
        accept += [o["meta_info"].get("spec_accept_length", 1.0) for o in outs]
    return res, accept


def run_greedy_batches(eng, prompts) -> dict:
    """{bs: [output_ids per prompt]} plus accept lengths, prompts submitted in groups of bs."""
    params = GREEDY
    res, accept = run_greedy_groups(eng, prompts, BATCH_SIZES)
    # One batch mixing greedy (even) and T=1.0 (odd) requests: the greedy rows must still be
    # exact (accept_greedy and accept_sampled run side by side in one verify step).
    sampled = dict(params, temperature=1.0)
    mixed = prompts[: max(BATCH_SIZES)]
    plist = [params if i % 2 == 0 else sampled for i in range(len(mixed))]
    outs = eng.generate(input_ids=mixed, sampling_params=plist)
    res["mixed_greedy_rows"] = [o["output_ids"] for o in outs[::2]]
    return {"outputs": res, "accept_lengths": accept}


def sample_completions(eng, prompts, params: dict) -> list[list[list[int]]]:
    """[prompt][sample] output ids: SAMPLES_PER_PROMPT completions of SAMPLE_NEW_TOKENS tokens
    per prompt under the sampling ``params`` (the samples ``law_test`` compares)."""
    params = dict(params, max_new_tokens=SAMPLE_NEW_TOKENS, ignore_eos=True)
    per_prompt = []
    for p in prompts:
        outs = generate(eng, [p] * SAMPLES_PER_PROMPT, params)
        per_prompt.append([o["output_ids"] for o in outs])
    return per_prompt


def chi2_two_sample(a: list, b: list, min_bin: int = 10) -> tuple[float, int]:
    """Two-sample chi-squared homogeneity test of two samples of hashable outcomes.

    Outcomes whose pooled count is below ``min_bin`` share one bin. Returns (p, dof); dof 0
    (one bin) gives p = 1.
    """
    from scipy.stats import chi2_contingency

    ca, cb = {}, {}
    for x in a:
        ca[x] = ca.get(x, 0) + 1
    for x in b:
        cb[x] = cb.get(x, 0) + 1
    rows, rest = [], [0, 0]
    for x in set(ca) | set(cb):
        u, v = ca.get(x, 0), cb.get(x, 0)
        if u + v >= min_bin:
            rows.append([u, v])
        else:
            rest[0] += u
            rest[1] += v
    if sum(rest) > 0:
        rows.append(rest)
    if len(rows) < 2:
        return 1.0, 0
    stat, p, dof, _ = chi2_contingency(rows, correction=False)
    return float(p), int(dof)


def law_test(ref, other) -> dict:
    """Per (prompt, position) tests; Bonferroni-combined p-value and the token count."""
    pvals = []
    for ref_p, oth_p in zip(ref, other):
        for pos in range(SAMPLE_NEW_TOKENS):
            p, dof = chi2_two_sample([s[pos] for s in ref_p], [s[pos] for s in oth_p])
            if dof > 0:
                pvals.append(p)
    m = max(len(pvals), 1)
    tokens = sum(len(s) for prompt in other for s in prompt)
    return {"p_combined": min(1.0, min(pvals) * m) if pvals else 1.0, "tests": m, "tokens": tokens}


def _compare_outputs(b: list, t: list, prompts: list | None = None, probe=None) -> dict:
    """Prompts whose greedy outputs differ between the non-speculative ``b`` and ``t``, each
    first difference judged by ``near_tie.judge`` with ``probe`` (none: every one a fault)."""
    mism = [i for i in range(len(b)) if b[i] != t[i]]
    diffs = [
        dict(judge(first_difference(prompts[i] if prompts else [], b[i], t[i]), probe), prompt=i)
        for i in mism
    ]
    near = sum(d["near_tie"] for d in diffs)
    return {"prompts": len(b), "mismatches": len(mism), "near_ties": near, "differences": diffs}


def _rows_ok(rows: dict) -> bool:
    """Every greedy difference a near-tie of the non-speculative engine."""
    return all(r["near_ties"] == r["mismatches"] for r in rows.values())


def _greedy_summary(base: dict, tree: dict, prompts: list | None = None, probe=None) -> dict:
    rows = {}
    for bs in BATCH_SIZES:
        rows[str(bs)] = _compare_outputs(base["outputs"][bs], tree["outputs"][bs], prompts, probe)
    b, t = base["outputs"]["mixed_greedy_rows"], tree["outputs"]["mixed_greedy_rows"]
    mixed = prompts[: max(BATCH_SIZES)][::2] if prompts else None
    rows["mixed_greedy_in_sampled_batch"] = _compare_outputs(b, t, mixed, probe)
    acc = tree["accept_lengths"]
    return {
        "by_batch": rows,
        "ddtree_mean_accept_length": sum(acc) / len(acc),
        "passed": _rows_ok(rows),
    }


def excess_p(tree_mismatches: int, chain_mismatches: int, prompts: int) -> float:
    """One-sided Fisher p that DDTREE's greedy outputs differ from no speculation on more
    prompts than the chain's do (small: DDTREE adds differences of its own)."""
    from scipy.stats import fisher_exact

    table = [
        [tree_mismatches, prompts - tree_mismatches],
        [chain_mismatches, prompts - chain_mismatches],
    ]
    return float(fisher_exact(table, alternative="greater")[1])


def _chain_summary(got: dict, prompts: list, probe, summary: dict) -> dict:
    """The DFLASH chain through the greedy and sampled checks DDTREE ran, and DDTREE's greedy
    differences against the chain's (``excess_p`` per batch size)."""
    chain, base = got["chain"], got["base"]
    out: dict = {}
    if "greedy" in chain:
        out["greedy"] = _greedy_summary(base["greedy"], chain["greedy"], prompts, probe)
        tree_rows = summary.get("greedy", {}).get("by_batch")
        if tree_rows:
            excess = {
                bs: excess_p(
                    tree_rows[bs]["mismatches"],
                    out["greedy"]["by_batch"][bs]["mismatches"],
                    tree_rows[bs]["prompts"],
                )
                for bs in tree_rows
            }
            out["ddtree_excess_p"] = excess
            within = all(p > CHAIN_EXCESS_P for p in excess.values())
            summary["greedy"]["passed_against_chain"] = within
            summary["greedy"]["passed"] = summary["greedy"]["passed"] or within
    if "samples" in chain:
        out["sampling"] = {
            n: law_test(base["samples"][n], chain["samples"][n]) for n, _, _ in SAMPLING_CASES
        }
    return out


def _adaptive_summary(
    base_outputs: dict, got: dict, prompts: list | None = None, probe=None
) -> dict:
    """Greedy equality per group size (up to near-ties), and CUDA graphs for every verify
    step of every W."""
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule

    rows = {
        str(bs): _compare_outputs(base_outputs[bs], got["outputs"][bs], prompts, probe)
        for bs in ADAPTIVE_BATCH_SIZES
    }
    stats = got["stats"] or {}
    by_width = stats.get("by_width", {})
    widths = sorted(set(BudgetSchedule.parse(ADAPTIVE_SCHEDULE).num_nodes))
    graphs = {}
    for w in widths:
        row = by_width.get(str(w), {})
        # Every group size is <= the captured max bs (16): any eager verify step is a failure.
        graphs[str(w)] = row.get("graph", 0) > 0 and row.get("eager", 1) == 0
    # Glue graphs: every used segment replays, never fails to capture, and runs eagerly only
    # on its capture steps.
    # With glue graphs captured at startup, judge what serving added (startup touched every
    # segment, also the sampled modes this greedy check never serves).
    startup_glue = (got.get("startup_stats") or {}).get("glue", {})
    served = {
        name: {k: c[k] - startup_glue.get(name, {}).get(k, 0) for k in ("graph", "eager",
               "captures", "capture_failures")}
        for name, c in stats.get("glue", {}).items()
    }  # fmt: skip
    glue = {
        name: c["graph"] > 0 and c["capture_failures"] == 0 and c["eager"] == c["captures"]
        for name, c in served.items()
        if c["graph"] + c["eager"] > 0
    }
    greedy_ok = _rows_ok(rows)
    graphs_ok = all(graphs.values()) and stats.get("width_mismatches", 1) == 0
    graphs_ok = graphs_ok and bool(glue) and all(glue.values())
    # Glue graphs captured at startup: serving must capture none, and the KV commit has one
    # graph per batch size (every accept mode of a batch size writes the outputs it binds), at
    # least as many as the draft tree, which is keyed by the padded batch size.
    startup = got.get("startup_stats")
    serving_captures = None

    def kv_graphs_ok(kv: int, tree: int | None) -> bool:
        return tree is not None and kv >= tree

    kv_per_batch_size = {
        name: kv_graphs_ok(c["captures"], startup_glue.get("tree_" + name[3:], {}).get("captures"))
        for name, c in startup_glue.items()
        if name.startswith("kv_")
    }
    if startup is not None:
        serving_captures = _total_captures(stats) - _total_captures(startup)
        graphs_ok = graphs_ok and serving_captures == 0 and _total_captures(startup) > 0
        graphs_ok = graphs_ok and all(kv_per_batch_size.values())
    else:
        graphs_ok = False  # no counts were written before the first request
    memory = glue_memory_check((startup or {}).get("startup"))
    return {
        "schedule": ADAPTIVE_SCHEDULE,
        "by_batch": rows,
        "graphs_per_width_ok": graphs,
        "glue_graphs_ok": glue,
        "graph_stats": stats,
        "glue_captures_while_serving": serving_captures,
        "kv_graph_per_batch_size": kv_per_batch_size,
        "glue_startup": (startup or {}).get("startup"),
        "glue_memory": memory,
        "ddtree_mean_accept_length": sum(got["accept"]) / max(len(got["accept"]), 1),
        "passed": greedy_ok
        and graphs_ok
        and stats.get("schedule") == ADAPTIVE_SCHEDULE
        and memory["passed"] is not False,
    }


def glue_memory_check(startup: dict | None) -> dict:
    """The startup capture's memory (``memory_gib``) against what the constructor held for it
    (``reserved_gib``), within `glue_memory_limit` (where the startup warns). ``passed``: None
    where nothing was captured at startup; False where it was but a number is missing."""
    if startup is None:
        return {"passed": None}
    grown, held = startup.get("memory_gib"), startup.get("reserved_gib")
    if grown is None or held is None:
        return {"passed": False, "why": "no memory numbers from the startup capture"}
    limit = glue_memory_limit(held * 2**30) / 2**30
    return {"grown_gib": grown, "held_gib": held, "limit_gib": round(limit, 4),
            "passed": grown <= limit}  # fmt: skip


def _read_stats(stats_path):
    if not os.path.exists(stats_path):
        return None
    with open(stats_path) as f:
        return json.load(f)


def _total_captures(stats: dict) -> int:
    return sum(c["captures"] for c in stats.get("glue", {}).values())


def _run_adaptive(eng, prompts, stats_path) -> dict:
    # Written by the scheduler process once its graphs are captured (before any request) and
    # after every decode step.
    startup = _read_stats(stats_path)
    outputs, accept = run_greedy_groups(eng, prompts, ADAPTIVE_BATCH_SIZES)
    stats = _read_stats(stats_path)
    print(f"[e2e] adaptive graph stats: {json.dumps(stats)}", flush=True)
    return {"outputs": outputs, "accept": accept, "stats": stats, "startup_stats": startup}


def run_checks(target, draft, prompts, checks, summary, on_verdict=None) -> None:
    """One engine per configuration, shared by the checks that need it (engine starts dominate
    the run time): no-spec, DDTREE, DFLASH, DDTREE with the wrong law, then the server. The
    greedy verdict is reached (and handed to ``on_verdict(summary)``) as soon as its two
    engines have run, so a run stopped later keeps it."""
    want_g, want_s, want_a = ("greedy" in checks), ("sampling" in checks), ("accept" in checks)
    want_ad, want_gr = ("adaptive" in checks), ("grammar" in checks)
    sp = prompts[:SAMPLE_PROMPTS]
    got: dict = {}
    extra = grammar_check.ENGINE_ARGS if want_gr else {}

    def phase(key, algo, fn, **override):
        try:
            with engine(**engine_kwargs(target, draft, algo, **{**extra, **override})) as eng:
                got[key] = fn(eng)
        except Exception as e:
            import traceback

            traceback.print_exc()
            got[key] = e

    def both(eng):
        out = {}
        if want_g or (want_a and algo_is_tree[0]):
            out["greedy"] = run_greedy_batches(eng, prompts)
        if want_s:
            out["samples"] = {
                n: sample_completions(eng, sp, {"temperature": t, "top_p": p})
                for n, t, p in SAMPLING_CASES
            }
        if want_gr and key_is_main[0]:
            out["grammar"] = grammar_check.run_grammar(eng, prompts)
        if want_ad and not algo_is_tree[0]:
            out["adaptive"] = run_greedy_groups(eng, prompts, ADAPTIVE_BATCH_SIZES)[0]
        return out

    algo_is_tree, key_is_main = [False], [True]  # the chain phase runs no grammar requests
    if want_g or want_s or want_ad or want_gr:
        phase("base", None, both)
    algo_is_tree[0] = True
    if want_g or want_s or want_a or want_gr:
        phase("ddtree", "DDTREE", both)
    key_is_main[0] = False
    early = [c for c in ("greedy", "grammar") if c in checks]
    if early:
        with ExitStack() as stack:
            _summarize(got, prompts, early, summary, _lazy_top2_probe(stack, target, draft))
    if want_s and not any(isinstance(got.get(k), Exception) for k in ("base", "ddtree")):
        # DDTREE's law before the calibration's engine runs: a run stopped there keeps it.
        summary["sampling_law"] = _ddtree_law(got)
        print(f"[e2e] sampling law, before calibration: {summary['sampling_law']}", flush=True)
    if (early or want_s) and on_verdict is not None:
        on_verdict(summary)
    if want_ad:
        schedule_env = envs.SGLANG_DDTREE_BUDGET_SCHEDULE.name
        stats_env = inject.GRAPH_STATS_ENV
        stats_path = os.path.join(tempfile.mkdtemp(prefix="ddtree_graphs_"), "graph_stats.json")
        os.environ[schedule_env] = ADAPTIVE_SCHEDULE
        os.environ[stats_env] = stats_path
        try:
            phase("adaptive", "DDTREE", lambda eng: _run_adaptive(eng, prompts, stats_path))
        finally:
            os.environ.pop(schedule_env, None)
            os.environ.pop(stats_env, None)
    if want_a:
        phase("dflash", "DFLASH", lambda eng: run_greedy_batches(eng, prompts))
    if "chain" in checks and (want_g or want_s):
        phase("chain", "DFLASH", both)
    if "backend_floor" in checks and want_s and ENGINE_EXTRA.get("attention_backend") != "triton":
        phase("nospec_triton", None, both, attention_backend="triton")
    if want_s:
        os.environ[inject.WRONG_COINS_ENV] = "0.5"
        name, t, p = SAMPLING_CASES[0]
        phase(
            "wrong",
            "DDTREE",
            lambda eng: sample_completions(eng, sp, {"temperature": t, "top_p": p}),
        )
        os.environ.pop(inject.WRONG_COINS_ENV, None)

    with ExitStack() as stack:
        probe = _lazy_top2_probe(stack, target, draft)
        _summarize(got, prompts, [c for c in checks if c not in summary], summary, probe)


def _ddtree_law(got: dict) -> dict:
    """DDTREE's sampled law against the non-speculative engine's, per sampling case."""
    return {
        n: law_test(got["base"]["samples"][n], got["ddtree"]["samples"][n])
        for n, _, _ in SAMPLING_CASES
    }


def _lazy_top2_probe(stack: ExitStack, target: str, draft: str):
    """``probe(prefix) -> (top2 ids, margin)`` on a non-speculative engine that starts on the
    first call (only when some greedy output differs) and stops with ``stack``."""
    held, failed = [], []

    def probe(prefix: list[int]) -> tuple[list[int], float]:
        if failed:  # one start attempt: every later difference fails with its error
            raise RuntimeError(f"the non-speculative engine did not start: {failed[0]}")
        if not held:
            try:
                held.append(stack.enter_context(engine(**engine_kwargs(target, draft, None))))
            except Exception as e:
                failed.append(f"{type(e).__name__}: {e}")
                raise
        out = held[0].generate(
            input_ids=prefix,
            sampling_params={"temperature": 0.0, "max_new_tokens": 1},
            return_logprob=True,
            top_logprobs_num=2,
        )
        return top2_of(out["meta_info"])

    return probe


def _summarize(got: dict, prompts: list, checks: list, summary: dict, probe) -> None:
    """Each check's verdict from the engines' results (``run_checks``)."""
    want_g, want_s, want_a = ("greedy" in checks), ("sampling" in checks), ("accept" in checks)
    want_ad = "adaptive" in checks

    def err(*keys):
        bad = [
            f"{k}: {type(got[k]).__name__}: {got[k]}"
            for k in keys
            if isinstance(got.get(k), Exception)
        ]
        return {"passed": False, "error": "; ".join(bad)} if bad else None

    if want_g:
        summary["greedy"] = err("base", "ddtree") or _greedy_summary(
            got["base"]["greedy"], got["ddtree"]["greedy"], prompts, probe
        )
    if want_s:
        e = err("base", "ddtree", "wrong")
        if e:
            summary["sampling"] = e
        else:
            res = dict(summary.get("sampling_law") or _ddtree_law(got))  # once per run
            res["wrong_variant_T1.0"] = law_test(got["base"]["samples"]["T1.0"], got["wrong"])
            passed = all(res[n]["p_combined"] > 1e-3 for n, _, _ in SAMPLING_CASES)
            passed = passed and res["wrong_variant_T1.0"]["p_combined"] < 1e-3
            summary["sampling"] = {"tests": res, "passed": passed}
    if "grammar" in checks:
        summary["grammar"] = err("base", "ddtree") or grammar_check.grammar_summary(
            got["base"]["grammar"],
            got["ddtree"]["grammar"],
            prompts,
            lambda b, t, p: _compare_outputs(b, t, p, probe),
            law_test,
        )
    if "chain" in checks and "chain" in got:
        summary["chain"] = err("base", "chain") or _chain_summary(got, prompts, probe, summary)
    if "backend_floor" in checks and "nospec_triton" in got:
        summary["backend_floor"] = err("base", "nospec_triton") or {
            "backend": "triton",
            "tests": {
                n: law_test(got["base"]["samples"][n], got["nospec_triton"]["samples"][n])
                for n, _, _ in SAMPLING_CASES
            },
            "passed": True,  # a measurement beside DDTREE's verdict, not a verdict of its own
        }
    if want_ad:
        summary["adaptive"] = err("base", "adaptive") or _adaptive_summary(
            got["base"]["adaptive"], got["adaptive"], prompts, probe
        )
    if want_a:
        e = err("ddtree", "dflash")
        if e:
            summary["accept"] = e
        else:
            tree = got["ddtree"]["greedy"]["accept_lengths"]
            flash = got["dflash"]["accept_lengths"]
            summary["accept"] = {
                "dflash_mean_accept_length": sum(flash) / len(flash),
                "ddtree_mean_accept_length": sum(tree) / len(tree),
                "passed": sum(tree) / len(tree) >= sum(flash) / len(flash),
            }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--checks",
        default=",".join(ALL_CHECKS),
        help=f"comma-separated subset of {','.join(ALL_CHECKS + OPTIONAL_CHECKS)}",
    )
    ap.add_argument("--models", default=None, help="existing tiny pair dir (default: make one)")
    ap.add_argument(
        "--pair",
        choices=("tiny", "trained"),
        default="tiny",
        help="the tiny random pair, or the shipped trained pair with its held-out prompts (its "
        "drafter is accepted often at temperature 1, so sampled paths are long)",
    )
    ap.add_argument(
        "--arch",
        choices=tiny_models.TINY_ARCHS,
        default="qwen3",
        help="tiny Qwen3 target, the Kimi-K2.6-shaped MLA + MoE target, that target with "
        "dense layers only, or with a K2.6 TP-8 rank's 8 heads (tiny_models)",
    )
    ap.add_argument(
        "--dtype",
        default=None,
        help="weights and engine dtype (default: float32 weights, which SGLang's dtype 'auto' "
        "runs in float16)",
    )
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every engine")
    ap.add_argument(
        "--attention-backend",
        default="triton",
        choices=("triton", "flashmla", "flashinfer"),
        help="every engine's attention backend (flashmla: MLA targets, page size 64)",
    )
    ap.add_argument("--page-size", type=int, default=None, help="every engine's KV page size")
    ap.add_argument(
        "--verify-attention",
        default=None,
        choices=sorted(VERIFY_BACKENDS),
        help="every DDTREE engine's --speculative-ddtree-verify-attention (default: the "
        "attention backend's own; triton_extend: triton's custom-mask kernel, the reference)",
    )
    ap.add_argument(
        "--draft-attention-backend",
        default=None,
        help="the drafter's attention backend (default: SGLang's choice for the target's)",
    )
    ap.add_argument(
        "--fp32-lm-head",
        action="store_true",
        help="every engine computes its logits in float32 (SGLang's enable_fp32_lm_head)",
    )
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    if args.pair == "trained" and (args.models or args.arch != "qwen3"):
        ap.error("--pair trained is the shipped Qwen3 pair: no --models, no --arch")
    # The logprobs check samples more prompts than the others take (`SAMPLED_PROMPTS`).
    from sglang_ddtree.testing.logprobs_check import SAMPLED_PROMPTS

    if args.pair == "trained":
        from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR
        from sglang_ddtree.testing.law import tokenized_prompts

        models, target, draft = "trained pair", str(TARGET_DIR), str(DRAFTER_DIR)
        logprob_prompts = tokenized_prompts()
        prompts = logprob_prompts[:NUM_PROMPTS]
    else:
        models = args.models or tempfile.mkdtemp(prefix="ddtree_tiny_")
        weights = args.dtype or "float32"
        target, draft, cfg = tiny_models.make_pair(args.arch, models, weights)
        first, vocab = len(tiny_models.SPECIALS), cfg.vocab_size
        prompts = make_prompts(first, vocab, NUM_PROMPTS, seed=1)
        logprob_prompts = make_prompts(first, vocab, max(NUM_PROMPTS, SAMPLED_PROMPTS), seed=1)
    logprob_prompts = logprob_prompts[:SAMPLED_PROMPTS]
    if args.dtype:
        ENGINE_EXTRA["dtype"] = args.dtype
    if args.tp > 1:
        ENGINE_EXTRA.update(tp_size=args.tp, **TP_CHECK_ENGINE)
    ENGINE_EXTRA.update(
        backend_settings(args.attention_backend, args.page_size, args.draft_attention_backend)
    )
    if args.fp32_lm_head:
        ENGINE_EXTRA["enable_fp32_lm_head"] = True
    if args.verify_attention:
        DDTREE_EXTRA[VERIFY_FLAG] = args.verify_attention
    summary: dict = {
        "models": models,
        "pair": args.pair,
        "arch": args.arch,
        "dtype": args.dtype or "auto",
        "tp": args.tp,
        "attention_backend": args.attention_backend,
        "page_size": ENGINE_EXTRA.get("page_size", 1),
        "fp32_lm_head": args.fp32_lm_head,
        "verify_attention": args.verify_attention or args.attention_backend,
    }
    checks = [c for c in args.checks.split(",") if c]
    unknown = set(checks) - set(ALL_CHECKS + OPTIONAL_CHECKS)
    if unknown:
        raise SystemExit(f"unknown checks: {sorted(unknown)}")
    t0 = time.time()
    summary_path = os.path.join(args.out, "e2e_summary.json")

    def write_summary(partial: dict) -> None:
        with open(summary_path, "w") as f:
            json.dump(partial, f, indent=2)

    run_checks(target, draft, prompts, checks, summary, on_verdict=write_summary)
    if "server" in checks:
        from sglang_ddtree.testing.server_check import check_server

        try:
            check_server(target, draft, summary, log_dir=args.out)
        except Exception as e:
            summary["server"] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
    if "defaults" in checks:
        from sglang_ddtree.testing.server_check import check_generation_defaults

        try:
            check_generation_defaults(target, draft, summary, log_dir=args.out)
        except Exception as e:
            summary["defaults"] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
    if "logprobs" in checks:
        from sglang_ddtree.testing.logprobs_check import check_logprobs

        try:
            check_logprobs(
                lambda algo: engine_kwargs(target, draft, algo),
                engine,
                logprob_prompts,
                GREEDY_NEW_TOKENS,
                summary,
            )
        except Exception as e:
            summary["logprobs"] = {"passed": False, "error": f"{type(e).__name__}: {e}"}
    for name in checks:
        print(f"[e2e] {name}: {json.dumps(summary[name])[:2000]}", flush=True)
    summary["seconds"] = round(time.time() - t0, 1)
    write_summary(summary)
    ok = all(summary[c].get("passed") for c in checks)
    npass = sum(bool(summary[c].get("passed")) for c in checks)
    print(f"[e2e] SUMMARY: {npass} passed, {len(checks) - npass} failed ({checks})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
