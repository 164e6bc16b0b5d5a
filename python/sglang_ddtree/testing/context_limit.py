"""A full captured batch of requests at the context limit with a wide fixed tree: the verify's
FULL_MASK, sized on the host from the reserved lengths (committed + 2 W per request), must
fit the target graph's mask buffer (max graph bs x W x (context + W) cells), or the copy into
it fails and the scheduler stops.

Run as ``python -m sglang_ddtree.testing.context_limit --out DIR``: one DDTREE engine on the
tiny Qwen3 pair (triton, W = ``NODES`` at every batch size, CUDA graphs up to bs
``GRAPH_BS``, context ``CONTEXT``), ``ROUNDS`` rounds of ``GRAPH_BS`` prompts of
``PROMPT_TOKENS`` tokens each running to the context limit (``ignore_eos``; SGLang stops them
two tokens short of it), then one fresh request. Passes when every request returns its full
length and the engine still serves; writes ``DIR/context_limit_summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

NODES = 32
GRAPH_BS = 4
CONTEXT = 512
PROMPT_TOKENS = 480
ROUNDS = 3


def engine_kwargs(target: str, draft: str) -> dict:
    return dict(
        model_path=target,
        speculative_algorithm="DDTREE",
        speculative_draft_model_path=draft,
        speculative_num_draft_tokens=NODES,
        attention_backend="triton",
        cuda_graph_max_bs_decode=GRAPH_BS,
        max_running_requests=GRAPH_BS,
        context_length=CONTEXT,
        mem_fraction_static=0.25,
        max_total_tokens=2 * GRAPH_BS * CONTEXT,  # fixed, so that engines can share a GPU
        log_level="warning",
        random_seed=0,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import sglang as sgl

    from sglang_ddtree.testing import tiny_models
    from sglang_ddtree.testing.e2e import make_prompts

    target, draft, cfg = tiny_models.make_pair("qwen3", tempfile.mkdtemp(prefix="ddtree_ctx_"))
    summary: dict = {"nodes": NODES, "graph_bs": GRAPH_BS, "context": CONTEXT, "rounds": []}
    path = os.path.join(args.out, "context_limit_summary.json")
    lo = len(tiny_models.SPECIALS)
    t0 = time.time()
    try:
        eng = sgl.Engine(**engine_kwargs(target, draft))
    except Exception as e:  # a start failure is this check's failure, with its reason
        summary.update(passed=False, error=f"engine start: {type(e).__name__}: {e}"[:2000])
        with open(path, "w") as f:
            json.dump(summary, f, indent=2)
        return 1
    try:
        # SGLang clips max_new_tokens to max_req_len - input - 1, with max_req_len = context - 1
        # (scheduler, tp_worker): the longest a request may run here.
        want = CONTEXT - 2 - PROMPT_TOKENS
        for r in range(ROUNDS):
            prompts = make_prompts(lo, cfg.vocab_size, GRAPH_BS, seed=r)
            prompts = [(p * (PROMPT_TOKENS // len(p) + 1))[:PROMPT_TOKENS] for p in prompts]
            params = {"temperature": 0.0 if r % 2 == 0 else 1.0,
                      "max_new_tokens": CONTEXT - PROMPT_TOKENS,
                      "ignore_eos": True}  # fmt: skip
            outs = eng.generate(input_ids=prompts, sampling_params=params)
            lengths = [len(o["output_ids"]) for o in outs]
            summary["rounds"].append({"lengths": lengths, "full": all(n == want for n in lengths)})
        fresh = eng.generate(input_ids=[lo + 1] * 8, sampling_params={"max_new_tokens": 8})
        summary["serving_after"] = len(fresh["output_ids"]) > 0
        summary["passed"] = summary["serving_after"] and all(r["full"] for r in summary["rounds"])
    except Exception as e:
        summary.update(passed=False, error=f"{type(e).__name__}: {e}"[:2000])
    finally:
        summary["seconds"] = round(time.time() - t0, 1)
        with open(path, "w") as f:
            json.dump(summary, f, indent=2)
        eng.shutdown()
    print(f"[context_limit] {json.dumps(summary)}", flush=True)
    return 0 if summary.get("passed") else 1


if __name__ == "__main__":
    raise SystemExit(main())
