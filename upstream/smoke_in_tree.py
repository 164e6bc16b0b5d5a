"""GPU smoke of the applied patch, without the plugin: ``python upstream/smoke_in_tree.py``.

Run with SGLang 0.5.17 patched by ``upstream/sglang-ddtree.patch`` first on ``PYTHONPATH`` and
``python/`` after it (for ``sglang_ddtree.testing.tiny_models`` only; the plugin's entry point
(``ddtree``) is not installed, so DDTREE must come from the in-tree registration). On the tiny random pair:
greedy DDTREE (in-tree flags ``speculative_ddtree_budget_schedule`` / ``_topk``) equals greedy
without speculation; a refused option (min_p) aborts with a message naming DDTREE; a bad flag
value is refused at launch. Prints one JSON summary line; exit status 0 when all hold.
"""

from __future__ import annotations

import importlib.metadata
import json
import random
import sys
import tempfile


def main() -> int:
    import sglang as sgl
    import sglang.srt.speculative.spec_info as spec_info
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_ddtree.testing.e2e import engine_kwargs
    from sglang_ddtree.testing.tiny_models import make_tiny_pair

    plugins = [e.name for e in importlib.metadata.entry_points(group="sglang.srt.plugins")]
    summary = {"plugins": plugins, "spec_info": spec_info.__file__}
    summary["registered"] = type(get_spec("DDTREE")).__name__
    tmp = tempfile.mkdtemp()
    target, draft = make_tiny_pair(tmp)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 120) for _ in range(rng.randrange(6, 40))] for _ in range(16)]
    greedy = {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True}
    base = engine_kwargs(target, None, None)  # the e2e checks' engine settings
    eng = sgl.Engine(**base)
    ref = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=greedy)]
    eng.shutdown()
    eng = sgl.Engine(
        **base,
        speculative_algorithm="DDTREE",
        speculative_draft_model_path=draft,
        speculative_ddtree_budget_schedule="1:33,4:17",
        speculative_ddtree_topk=4,
    )
    outs = eng.generate(input_ids=prompts, sampling_params=greedy)
    one = [eng.generate(input_ids=p, sampling_params=greedy) for p in prompts[:4]]
    try:
        refused = eng.generate(input_ids=prompts[0], sampling_params={**greedy, "min_p": 0.1})
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
    summary["refusal"] = refused
    try:
        sgl.Engine(**base, speculative_algorithm="DDTREE", speculative_draft_model_path=draft,
                   speculative_ddtree_budget_schedule="4:17")  # fmt: skip
        summary["bad_flag"] = "accepted"
    except Exception as e:  # noqa: BLE001
        summary["bad_flag"] = f"{type(e).__name__}: {e}"[:300]
    ok = (
        "ddtree" not in plugins
        and summary["registered"] == "DDTreeSpecAlgo"
        and summary["greedy_mismatches_batched"] == 0
        and summary["greedy_mismatches_single"] == 0
        and summary["accept_length"] > 1.0
        and "DDTREE" in json.dumps(summary["refusal"])
        and "threshold must be 1" in summary["bad_flag"]
    )
    summary["passed"] = ok
    print("SMOKE " + json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
