"""DDTREE's logprobs against SGLang's non-speculative server (GPU; `e2e --checks logprobs`).

Terms:

- kind of an output position, from its place in DDTREE's decode step (the predicting node):
  ``prefill`` (the first output token, from the target's prefill), ``root`` (a step's first
  token, predicted by the tree's root), ``path`` (predicted by an accepted draft node other than
  the step's last) and ``bonus`` (a step's last token of two or more, predicted by its deepest
  accepted node). DDTREE's requests run one at a time and streamed; SGLang streams each decode
  step's committed tokens together, so a chunk is a step (`position_kinds`).
- reference: the non-speculative server's logprobs for DDTREE's tokens, read at DDTREE's batch
  shape (one request at a time: a GEMM's row count picks its kernel, hence the last bits of
  every logit). Greedy: its own greedy decode of the same prompts, compared on each prompt's
  common prefix of equal ids. Sampled (`SAMPLED`, temperature 1.0 / top_p 0.95): its scoring
  of DDTREE's sampled tokens (`rescore`).
- floor: the server's own extend-versus-decode differences, at the same batch shape: its
  decode's logprobs against its extend path's (`rescore`) for the same tokens. A verify is an
  extend over the tree, so its logprobs are not expected nearer the server's decode than the
  server's own extend is (bfloat16 logits: a step of 0.03-0.06 at magnitudes 4-16). Greedy:
  per kind, on the positions DDTREE is compared on, with DDTREE's kinds. Sampled: the server's
  own sampled outputs have no steps (nor DDTREE's tokens), so its floor over all their decode
  positions serves every kind.

Verdict, per part (greedy, sampled) and kind: for root, path and bonus, at least
`MIN_POSITIONS` positions and the token logprob's 99th-percentile |difference| from the
reference at most `P99_RATIO` x the floor's; at every position (prefill included) the token
logprob's |difference| at most `MAX_TOKEN_DIFF`. The top-n values' (`TOP_N`, where both sides
report the same ids in the same order) 99th percentile and maximum are reported beside the
floor's, not judged. Calibration, on the same outputs: DDTREE's logprobs read one position late
(a predicting node one too deep) must fail that bound on the path kind.
"""

from __future__ import annotations

TOP_N = 5
P99_RATIO = 1.25
MAX_TOKEN_DIFF = 0.1
MIN_POSITIONS = 20
SAMPLED = {"temperature": 1.0, "top_p": 0.95}
SAMPLED_PROMPTS = 96  # prompts of both parts: the sampled part needs >= MIN_POSITIONS paths
KINDS = ("prefill", "root", "path", "bonus")
JUDGED = ("root", "path", "bonus")


def position_kinds(step_sizes: list[int]) -> list[str]:
    """The kind of each output position, from the tokens each streamed chunk added: the first
    token is the prefill's (its chunk may carry the first step too), then one chunk per decode
    step. (A reader slower than the steps gets two steps in one chunk: their boundary is then
    counted as path positions.)"""
    first, *rest = step_sizes
    kinds = ["prefill"]
    for size in ([first - 1] if first > 1 else []) + rest:
        kinds += ["root" if j == 0 else "bonus" if j == size - 1 else "path" for j in range(size)]
    return kinds


def common_prefix(a: dict, b: dict) -> int:
    n = 0
    while n < min(len(a["ids"]), len(b["ids"])) and a["ids"][n] == b["ids"][n]:
        n += 1
    return n


def _quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else 0.0
    return {"n": len(xs), "p99": p99, "max": xs[-1] if xs else 0.0}


def differences(
    base: list[dict],
    other: list[dict],
    kinds: list[list[str]],
    shift: int = 0,
    lengths: list[int] | None = None,
) -> dict[str, dict]:
    """Per kind: positions compared and the token logprob's and the top-n values' |difference|
    quantiles (the top-n where both report the same ids in the same order). ``base`` /
    ``other``: per prompt ``{"ids": [...], "logprobs": [...], "top": [[(logprob, id), ...],
    ...]}``, compared on their common prefix of equal ids (or the first ``lengths[p]``
    positions); ``shift``: ``other``'s logprobs read that many positions late."""
    token: dict[str, list[float]] = {}
    top: dict[str, list[float]] = {}
    for p, (b, o, ks) in enumerate(zip(base, other, kinds)):
        n = common_prefix(b, o) if lengths is None else lengths[p]
        for i in range(min(n, len(o["logprobs"]) - shift)):
            token.setdefault(ks[i], []).append(abs(b["logprobs"][i] - o["logprobs"][i + shift]))
            b_top, o_top = b["top"][i], o["top"][i + shift]
            if [x[1] for x in b_top] == [x[1] for x in o_top]:
                diff = max((abs(x[0] - y[0]) for x, y in zip(b_top, o_top)), default=0.0)
                top.setdefault(ks[i], []).append(diff)
    return {
        k: {"positions": len(xs), "token": _quantiles(xs), "top": _quantiles(top.get(k, []))}
        for k, xs in token.items()
    }


def within(cell: dict, floor: dict | None) -> bool:
    """One kind's token differences within the bound: p99 at most `P99_RATIO` x the floor's
    (none: 0), maximum at most `MAX_TOKEN_DIFF`."""
    floor_p99 = floor["token"]["p99"] if floor else 0.0
    return cell["token"]["p99"] <= P99_RATIO * floor_p99 and cell["token"]["max"] <= MAX_TOKEN_DIFF


def verdict(
    reference: list[dict], tree: list[dict], kinds: list[list[str]], floor: dict[str, dict]
) -> dict:
    """DDTREE's outputs ``tree`` (position kinds ``kinds``) against the ``reference``, judged
    against ``floor`` (per judged kind: `differences`' cell of the server's own
    extend-versus-decode differences); the module docstring's verdict."""
    got = differences(reference, tree, kinds)
    late = differences(reference, tree, kinds, shift=1).get("path")
    per_kind = {}
    for k in KINDS:
        cell = got.get(k, {"positions": 0, "token": _quantiles([]), "top": _quantiles([])})
        if k in JUDGED:
            f = floor.get(k)
            per_kind[k] = {**cell, "nospec_floor": f, "within": within(cell, f)}
        else:  # the prefill's token: both servers read it from a prefill
            per_kind[k] = {**cell, "within": cell["token"]["max"] <= MAX_TOKEN_DIFF}
    enough = all(per_kind[k]["positions"] >= MIN_POSITIONS for k in JUDGED)
    caught = late is not None and not within(late, floor.get("path"))
    return {
        "per_kind": per_kind,
        "enough_positions": enough,
        "one_position_late": late,
        "one_position_late_caught": caught,
        "passed": bool(enough and caught and all(c["within"] for c in per_kind.values())),
    }


def _read(meta: dict) -> dict:
    """A finished request's ids, logprobs and top-n, all from its logprob lists (cumulative in a
    stream's last chunk as in a plain response)."""
    return {
        "ids": [int(x[1]) for x in meta["output_token_logprobs"]],
        "logprobs": [float(x[0]) for x in meta["output_token_logprobs"]],
        "top": [[(float(x[0]), int(x[1])) for x in row] for row in meta["output_top_logprobs"]],
    }


def _params(new_tokens: int, sampling: dict | None = None) -> dict:
    return {"max_new_tokens": new_tokens, "ignore_eos": True, **(sampling or {"temperature": 0.0})}


def run_base(
    eng, prompts: list[list[int]], new_tokens: int, sampling: dict | None = None
) -> list[dict]:
    """The non-speculative server's outputs, one request at a time (DDTREE's batch shape)."""
    outs = []
    for p in prompts:
        out = eng.generate(input_ids=[p], sampling_params=_params(new_tokens, sampling),
                           return_logprob=True, top_logprobs_num=TOP_N)  # fmt: skip
        outs.append(_read(out[0]["meta_info"]))
    return outs


def rescore(eng, prompts: list[list[int]], outs: list[dict], sampling: dict | None) -> list[dict]:
    """The non-speculative server's logprob and top-n for each of ``outs``' tokens after the
    same tokens, through its extend path, in `_read`'s form: one request per position, alone
    (the prompt and the tokens before it, asking the logprob of the token there through
    ``token_ids_logprob``, one new token at ``sampling``, so its sampler reports
    ``log(softmax(logits / T))`` as for its own tokens)."""
    scored = []
    for p, o in zip(prompts, outs):
        metas = []
        for i, tok in enumerate(o["ids"]):
            res = eng.generate(input_ids=[list(p) + o["ids"][:i]],
                               sampling_params=_params(1, sampling), return_logprob=True,
                               top_logprobs_num=TOP_N, token_ids_logprob=[[tok]])  # fmt: skip
            metas.append(res[0]["meta_info"])
        scored.append({
            "ids": list(o["ids"]),
            "logprobs": [float(m["output_token_ids_logprobs"][0][0][0]) for m in metas],
            "top": [[(float(x[0]), int(x[1])) for x in m["output_top_logprobs"][0]]
                    for m in metas],
        })  # fmt: skip
    return scored


def run_tree(
    eng, prompts: list[list[int]], new_tokens: int, sampling: dict | None = None
) -> tuple[list[dict], list[list[str]]]:
    """One prompt at a time, streamed: (outputs, position kinds)."""
    outs, kinds = [], []
    for p in prompts:
        sizes, last, done = [], 0, None
        for chunk in eng.generate(input_ids=p, sampling_params=_params(new_tokens, sampling),
                                  return_logprob=True, top_logprobs_num=TOP_N,
                                  stream=True):  # fmt: skip
            count = int(chunk["meta_info"]["completion_tokens"])
            if count > last:
                sizes.append(count - last)
                last = count
            done = chunk
        outs.append(_read(done["meta_info"]))
        kinds.append(position_kinds(sizes))
    return outs, kinds


def check_logprobs(engine_kwargs, engine, prompts, new_tokens: int, summary: dict) -> None:
    """``summary["logprobs"]``: the greedy and the sampled verdicts. ``engine_kwargs(algo)`` /
    ``engine(**kw)``: the e2e's engine factory (no speculation for ``algo`` None)."""
    few = prompts[:SAMPLED_PROMPTS]
    with engine(**engine_kwargs("DDTREE")) as eng:
        tree, kinds = run_tree(eng, prompts, new_tokens)
        sampled, sampled_kinds = run_tree(eng, few, new_tokens, SAMPLED)
    with engine(**engine_kwargs(None)) as eng:
        base = run_base(eng, prompts, new_tokens)
        base_extend = rescore(eng, prompts, base, None)
        scored = rescore(eng, few, sampled, SAMPLED)
        own = run_base(eng, few, new_tokens, SAMPLED)
        own_extend = rescore(eng, few, own, SAMPLED)
    # Greedy: per kind, on the positions DDTREE is compared on, with its kinds.
    lengths = [common_prefix(b, t) for b, t in zip(base, tree)]
    greedy = verdict(base, tree, kinds, differences(base, base_extend, kinds, lengths=lengths))
    # Sampled: the server's own outputs have no steps; their decode positions serve every kind.
    decode = [["prefill"] + ["decode"] * (len(o["ids"]) - 1) for o in own]
    floor = differences(own, own_extend, decode).get("decode")
    sampled_verdict = verdict(scored, sampled, sampled_kinds, dict.fromkeys(JUDGED, floor))
    summary["logprobs"] = {
        "greedy": greedy,
        "sampled": {**sampled_verdict, "sampling": SAMPLED},
        "bound": {"p99_ratio": P99_RATIO, "max": MAX_TOKEN_DIFF, "min_positions": MIN_POSITIONS},
        "passed": bool(greedy["passed"] and sampled_verdict["passed"]),
    }
