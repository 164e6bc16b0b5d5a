"""Top-k support check: a sampled request at ``top_k = k`` never gets a token outside the
target's top-k set at its prefix (on a CUDA machine, with a tiny pair).

Run as ``python -m sglang_ddtree.testing.support --out DIR [--arch mla8-dense
--attention-backend flashmla --dtype bfloat16 ...]``. Unlike a two-sample law test this needs
no statistics: a token of probability zero under the law is an error however rarely it shows,
and the failing prefix is named.

The pair should have no MoE router in bfloat16 (``mla8-dense``, ``qwen3``): a random tiny
router's top expert choices are often within rounding of each other, so two forwards of the
same prefix (the verify's and the server's extend) can route to different experts and hold
different top-k sets, each sampled exactly (`testing.law`'s exact-model referee shows this on
the ``mla8`` pair). The dense pair keeps the verify attention, the glue and the accept under
test without that.

1. The speculative server (DDTREE, or ``--algorithm DFLASH`` for SGLang's chain) answers, in
   one submission so that its batches mix them: for each of ``--prompts`` prompts,
   ``--samples`` completions of ``NEW_TOKENS`` tokens at each ``--top-ks`` value
   (temperature ``TEMPERATURE``), as many at top-p 0.95 without top-k (so the batches need
   both filters, as served traffic does) and a few greedy ones (batch company, not judged
   here: greedy has its near-tie check in `testing.e2e`).
2. The non-speculative server then reads, for every distinct prefix (prompt + the completion's
   tokens before position j), its top ``k + EXTRA_RANKS`` logprobs through its extend path
   (the prefix as prompt, one greedy token with ``top_logprobs_num``), and answers the same
   requests itself (the null: its own samples judged the same way).
3. A token is judged against the k-th logprob of its prefix: inside the top k, an **edge**
   (outside, within ``--tolerance`` nats of the k-th: a decode-versus-extend rounding can put
   it inside on the sampling server), or a **violation**. The check passes when the
   speculative server has no violation; it is inconclusive when the null has one (the
   tolerance is then below what rounding alone does on this pair). The calibration that the
   judge catches a known error: the null's top-p samples (no top-k) judged as if at the
   smallest k must give violations.

Writes ``DIR/support_summary.json``; exit status 0 when passed.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections import Counter

from sglang_ddtree.testing import e2e, tiny_models

NEW_TOKENS = 6
TEMPERATURE = 1.0
TOP_P_ONLY = 0.95  # rows without top-k: judged only by the calibration, at the smallest k
GREEDY_PER_PROMPT = 4
EXTRA_RANKS = 8
MAX_RUNNING = 128  # as the law tool: batches of every size up to here, padded ones included
DEFAULT_TOLERANCE = {"bfloat16": 0.25, "float16": 0.05, "float32": 0.01}


def build_requests(prompts, top_ks, samples):
    """(prompt indices, sampling params, labels): every prompt's completions at each top-k
    (label k), at top-p alone (label 0) and greedy (label -1)."""
    idx, params, labels = [], [], []
    for i in range(len(prompts)):
        for k in top_ks:
            sp = {"temperature": TEMPERATURE, "top_k": k, "top_p": 1.0}
            idx += [i] * samples
            params += [sp] * samples
            labels += [k] * samples
        idx += [i] * samples
        params += [{"temperature": TEMPERATURE, "top_k": -1, "top_p": TOP_P_ONLY}] * samples
        labels += [0] * samples
        idx += [i] * GREEDY_PER_PROMPT
        params += [{"temperature": 0.0}] * GREEDY_PER_PROMPT
        labels += [-1] * GREEDY_PER_PROMPT
    params = [dict(sp, max_new_tokens=NEW_TOKENS, ignore_eos=True) for sp in params]
    return idx, params, labels


def sample(eng, prompts, idx, params) -> list[list[int]]:
    outs = e2e.generate(eng, [prompts[i] for i in idx], params)
    return [o["output_ids"] for o in outs]


def events(idx, labels, completions, as_k=None):
    """Counter of (prompt, prefix, k, token): each emitted token with the prefix it followed
    and the k it is judged at (``as_k``: {label: k} to judge some labels at another k; labels
    0 (top-p alone) and -1 (greedy) are not judged unless mapped)."""
    out: Counter = Counter()
    for i, label, c in zip(idx, labels, completions):
        k = (as_k or {}).get(label, label)
        if k <= 0:
            continue
        for j, tok in enumerate(c):
            out[(i, tuple(c[:j]), k, tok)] += 1
    return out


def read_top_logprobs(eng, prompts, prefixes, ranks: int) -> dict:
    """{(prompt, prefix): [(token, logprob)] best first}: the non-speculative server's raw
    top ``ranks`` logprobs after prompt + prefix, from its extend path."""
    keys = sorted(prefixes)
    greedy = {"temperature": 0.0, "max_new_tokens": 1}
    out = {}
    step = 512
    for s in range(0, len(keys), step):
        chunk = keys[s : s + step]
        res = eng.generate(
            input_ids=[prompts[i] + list(p) for i, p in chunk],
            sampling_params=[greedy] * len(chunk),
            return_logprob=True,
            top_logprobs_num=ranks,
        )
        for key, o in zip(chunk, res):
            rows = o["meta_info"]["output_top_logprobs"][0]
            out[key] = [(int(t), float(lp)) for lp, t, *_ in rows]
    return out


def judge(counts: Counter, tops: dict, tolerance: float) -> dict:
    """Each (prompt, prefix, k, token) against the k-th logprob of its prefix: inside, edge
    (outside, within ``tolerance`` nats) or violation. Returns per-k totals and the
    violations (largest first)."""
    per_k: dict = {}
    violations = []
    for (i, prefix, k, tok), n in counts.items():
        top = tops[(i, prefix)]
        rank = next((r for r, (t, _) in enumerate(top) if t == tok), None)
        kth = top[k - 1][1]
        lp = top[rank][1] if rank is not None else None
        if rank is not None and rank < k:
            verdict = "inside"
        elif lp is not None and kth - lp <= tolerance:
            verdict = "edge"
        else:
            verdict = "violation"
        row = per_k.setdefault(str(k), {"inside": 0, "edge": 0, "violation": 0})
        row[verdict] += n
        if verdict == "violation":
            violations.append({
                "prompt": i, "prefix": list(prefix), "k": k, "token": tok, "count": n,
                "rank": rank, "logprob": lp, "kth_logprob": kth,
                "top": [[t, round(x, 4)] for t, x in top[: k + 2]],
            })  # fmt: skip
    violations.sort(key=lambda v: -v["count"])
    return {"per_k": per_k, "violations": len(violations), "worst": violations[:20]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--arch", choices=tiny_models.TINY_ARCHS, default="mla8-dense", help="tiny pair"
    )
    ap.add_argument("--algorithm", default="DDTREE", help="DDTREE, or DFLASH (SGLang's chain)")
    ap.add_argument("--dtype", default="bfloat16", choices=tuple(DEFAULT_TOLERANCE))
    ap.add_argument("--attention-backend", default="triton", choices=("triton", "flashmla"))
    ap.add_argument("--page-size", type=int, default=None)
    ap.add_argument("--draft-attention-backend", default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=256, help="completions per prompt and k")
    ap.add_argument("--top-ks", default="2,5", help="comma list of top_k values (each >= 2)")
    ap.add_argument("--tolerance", type=float, default=None, help="nats (default by dtype)")
    args = ap.parse_args(argv)
    top_ks = [int(k) for k in args.top_ks.split(",") if k]
    if not top_ks or min(top_ks) < 2:
        ap.error("--top-ks: each value at least 2 (top_k 1 is greedy)")
    if args.attention_backend == "flashmla" and not args.arch.startswith("mla"):
        ap.error("--attention-backend flashmla serves MLA targets: pass --arch mla, mla8, ...")
    tolerance = DEFAULT_TOLERANCE[args.dtype] if args.tolerance is None else args.tolerance
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()

    target, draft, cfg = tiny_models.make_pair(args.arch, tempfile.mkdtemp(prefix="ddtree_sup_"))
    # The law tool's prompts (same seed): its prompt i is this check's prompt i.
    prompts = e2e.make_prompts(len(tiny_models.SPECIALS), cfg.vocab_size, args.prompts, seed=1)
    e2e.ENGINE_EXTRA.update(
        e2e.backend_settings(args.attention_backend, args.page_size, args.draft_attention_backend)
    )
    common = dict(
        dtype=args.dtype,
        mem_fraction_static=0.3,
        max_running_requests=MAX_RUNNING,
        cuda_graph_max_bs_decode=MAX_RUNNING,
    )
    idx, params, labels = build_requests(prompts, top_ks, args.samples)
    with e2e.engine(**e2e.engine_kwargs(target, draft, args.algorithm.upper(), **common)) as eng:
        spec = sample(eng, prompts, idx, params)
    with e2e.engine(**e2e.engine_kwargs(target, None, None, **common)) as eng:
        null = sample(eng, prompts, idx, params)
        judged = {
            "spec": events(idx, labels, spec),
            "null": events(idx, labels, null),
            "calibration": events(idx, labels, null, as_k={0: min(top_ks)}),
        }
        prefixes = {(i, p) for c in judged.values() for (i, p, _k, _t) in c}
        tops = read_top_logprobs(eng, prompts, prefixes, max(top_ks) + EXTRA_RANKS)
    verdicts = {name: judge(c, tops, tolerance) for name, c in judged.items()}
    summary = {
        "algorithm": args.algorithm.upper(),
        "arch": args.arch,
        "dtype": args.dtype,
        **e2e.ENGINE_EXTRA,
        "prompts": args.prompts,
        "samples_per_prompt_and_k": args.samples,
        "top_ks": top_ks,
        "tolerance_nats": tolerance,
        "distinct_prefixes": len(prefixes),
        **verdicts,
        "calibrated": verdicts["calibration"]["violations"] > 0,
        "null_clean": verdicts["null"]["violations"] == 0,
        "seconds": round(time.time() - t0, 1),
    }
    summary["passed"] = (
        summary["calibrated"] and summary["null_clean"] and verdicts["spec"]["violations"] == 0
    )
    with open(os.path.join(args.out, "support_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    for name, v in verdicts.items():
        print(f"[support] {name}: {json.dumps(v['per_k'])}; violations {v['violations']}")
        for w in v["worst"][:5]:
            print(f"[support]   {json.dumps(w)}")
    print(f"[support] passed={summary['passed']} (calibrated={summary['calibrated']}, "
          f"null_clean={summary['null_clean']}) in {summary['seconds']} s", flush=True)  # fmt: skip
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
