"""GPU smoke of the applied patch, without the plugin: ``python upstream/smoke_in_tree.py``.

Run with SGLang 0.5.17 patched by ``upstream/sglang-ddtree.patch`` first on ``PYTHONPATH`` and
``python/`` after it (for ``sglang_ddtree.testing``'s tiny pair and test injection only; the plugin's entry point
(``ddtree``) is not installed, so DDTREE must come from the in-tree registration). On the tiny random pair:
greedy DDTREE (in-tree flags ``speculative_ddtree_budget_schedule`` / ``_topk``) equals greedy
without speculation; sampled DDTREE draws from the non-speculative law (``LAW_CASES``:
per-position two-sample chi-squared tests of ``e2e.law_test`` over ``e2e.sample_completions``,
4 prompts x 256 samples x 24 tokens a side, Bonferroni-combined, p > 0.001), and the
deliberately wrong coins (``testing.inject`` scaling the in-tree ``ddtree_step``' coins in the
engine's processes) are rejected at p < 0.001 with the same samples (the test can fail); logprobs
are served (one logprob and a top two per output token, past DFLASH's refusal of them); a refused
option (a custom logit processor) aborts with a message naming DDTREE;
a bad flag value is refused at launch; the in-tree engines' verifies went through the split
tree-verify attention of the patched ``triton_backend.py`` (its one-time log line, read from this
process's stderr, which the engines' scheduler processes inherit). Prints one JSON summary line;
exit status 0 when all hold.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import random
import sys
import tempfile

# Sampled settings: SGLang's joint top-k / top-p law at a temperature below and at 1.
LAW_CASES = {
    "T1.0": {"temperature": 1.0},
    "T0.7_k20_p0.9": {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
}
LAW_PROMPTS = 4
LAW_ALPHA = 1e-3
# The test-only changes the environment names (the wrong coins), made in the in-tree modules of
# every process the engines spawn: they import this file again.
from sglang_ddtree.testing import inject  # noqa: E402 (python/ on PYTHONPATH, as documented)

inject.install_from_env(package=inject.IN_TREE)

# The in-tree ddtree_attention's line, logged once per process when a verify takes the split.
SPLIT_LOG_LINE = "tree-verify attention through core.tree_attention"


def split_attention_lines(run) -> tuple[object, int]:
    """``run()``'s result and how many ``SPLIT_LOG_LINE`` lines were written to file descriptor 2
    meanwhile (by this process or its children, which inherit it). Descriptor 2 goes to a file
    (its path printed first, so a killed run leaves it) and is copied back to stderr after."""
    fd, path = tempfile.mkstemp(prefix="smoke_in_tree_", suffix=".stderr")
    print(f"SMOKE stderr of the engines: {path}", flush=True)
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        result = run()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        with open(path, "rb") as f:
            text = f.read()
        sys.stderr.buffer.write(text)
        sys.stderr.flush()
    return result, text.decode(errors="replace").count(SPLIT_LOG_LINE)


def main() -> int:
    rc, lines = split_attention_lines(smoke)
    print(f"SMOKE split attention lines: {lines}", flush=True)
    return rc if lines > 0 else 1


def smoke() -> int:
    import sglang as sgl
    import sglang.srt.speculative.spec_info as spec_info
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    from sglang_ddtree.testing.e2e import engine_kwargs, law_test, sample_completions
    from sglang_ddtree.testing.tiny_models import make_tiny_pair

    plugins = [e.name for e in importlib.metadata.entry_points(group="sglang.srt.plugins")]
    summary = {"plugins": plugins, "spec_info": spec_info.__file__}
    summary["registered"] = str(spec_info.SpeculativeAlgorithm.from_string("DDTREE"))
    tmp = tempfile.mkdtemp()
    target, draft = make_tiny_pair(tmp)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 120) for _ in range(rng.randrange(6, 40))] for _ in range(16)]
    greedy = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
    # The e2e checks' engine settings, 64 requests in flight (the law's samples come faster).
    base = engine_kwargs(target, None, None, max_running_requests=64, cuda_graph_max_bs_decode=64)
    eng = sgl.Engine(**base)
    ref = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=greedy)]
    law_prompts = prompts[:LAW_PROMPTS]
    ref_samples = {name: sample_completions(eng, law_prompts, p) for name, p in LAW_CASES.items()}
    eng.shutdown()
    in_tree = dict(
        speculative_algorithm="DDTREE",
        speculative_draft_model_path=draft,
        speculative_ddtree_budget_schedule="1:33,4:17",
        speculative_ddtree_topk=4,
    )
    eng = sgl.Engine(**base, **in_tree, enable_custom_logit_processor=True)
    outs = eng.generate(input_ids=prompts, sampling_params=greedy)
    law = {
        n: law_test(ref_samples[n], sample_completions(eng, law_prompts, p))
        for n, p in LAW_CASES.items()
    }
    one = [eng.generate(input_ids=p, sampling_params=greedy) for p in prompts[:4]]
    try:
        meta = eng.generate(input_ids=prompts[0], sampling_params=greedy, return_logprob=True,
                            top_logprobs_num=2)["meta_info"]  # fmt: skip
        tops = meta["output_top_logprobs"]
        logprobs = (len(meta["output_token_logprobs"]) == len(tops) == meta["completion_tokens"]
                    and all(len(t) == 2 for t in tops))  # fmt: skip
    except Exception as e:  # noqa: BLE001
        logprobs = f"{type(e).__name__}: {e}"[:300]
    try:
        refused = eng.generate(
            input_ids=prompts[0],
            sampling_params={**greedy, "custom_params": {"token_ids": [5]}},
            custom_logit_processor=DisallowedTokensLogitsProcessor.to_str(),
        )
        refused = refused["meta_info"].get("finish_reason")
    except Exception as e:  # noqa: BLE001
        refused = f"{type(e).__name__}: {e}"[:300]
    eng.shutdown()
    got = [o["output_ids"] for o in outs]
    verify = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    summary["greedy_mismatches_batched"] = sum(a != b for a, b in zip(ref, got))
    summary["greedy_mismatches_single"] = sum(a != b["output_ids"] for a, b in zip(ref[:4], one))
    summary["accept_length"] = round(tokens / max(verify, 1), 3)
    summary["logprobs_served"] = logprobs
    summary["refusal"] = refused
    try:
        sgl.Engine(**base, speculative_algorithm="DDTREE", speculative_draft_model_path=draft,
                   speculative_ddtree_budget_schedule="4:17")  # fmt: skip
        summary["bad_flag"] = "accepted"
    except Exception as e:  # noqa: BLE001
        summary["bad_flag"] = f"{type(e).__name__}: {e}"[:300]
    summary["law"] = law
    print("SMOKE-PART " + json.dumps(summary), flush=True)  # kept if a later engine stalls
    os.environ[inject.WRONG_COINS_ENV] = "0.5"  # the engine's processes import this file again
    try:
        eng = sgl.Engine(**base, **in_tree)
        law["wrong_coins_T1.0"] = law_test(
            ref_samples["T1.0"], sample_completions(eng, law_prompts, {"temperature": 1.0})
        )
        eng.shutdown()
    finally:
        os.environ.pop(inject.WRONG_COINS_ENV, None)
    ok = (
        "ddtree" not in plugins
        and summary["registered"] == "SpeculativeAlgorithm.DDTREE"
        and summary["greedy_mismatches_batched"] == 0
        and summary["greedy_mismatches_single"] == 0
        and summary["accept_length"] > 1.0
        and all(law[n]["p_combined"] > LAW_ALPHA for n in LAW_CASES)
        and law["wrong_coins_T1.0"]["p_combined"] < LAW_ALPHA
        and summary["logprobs_served"] is True
        and "DDTREE" in json.dumps(summary["refusal"])
        and "threshold must be 1" in summary["bad_flag"]
    )
    summary["passed"] = ok
    print("SMOKE " + json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
