"""DDTREE's logprobs against SGLang's non-speculative server (GPU; `e2e --checks logprobs`).

Greedy: both engines decode the same prompts greedily with ``return_logprob`` and
``top_logprobs_num`` = `TOP_N`. Sampled (`SAMPLED`, temperature 1.0 / top_p 0.95): DDTREE
samples; the non-speculative server then scores each of DDTREE's tokens after the same tokens
(one request per position: the prompt and DDTREE's tokens before it, asking the logprob of
DDTREE's token there through ``token_ids_logprob``, at the same sampling parameters, so its
sampler reports ``log(softmax(logits / T))`` as for its own tokens). DDTREE's requests run one
at a time and streamed: SGLang streams each decode step's
committed tokens together, so a chunk is a step, and each position gets its kind from its place
in the step (the predicting node): ``prefill`` (the first output token, from the target's
prefill), ``root`` (a step's first token, predicted by the tree's root), ``path`` (predicted by
an accepted draft node other than the step's last) and ``bonus`` (a step's last token of two or
more, predicted by its deepest accepted node). On each prompt's common prefix of equal output
ids (the greedy check judges the ids themselves), per kind: the largest |difference| of the
emitted token's logprob, and of the top-n values where both report the same top-n ids in the
same order. Each part passes when every kind's largest difference is at most `MAX_ABS_DIFF` and
the kinds root, path and bonus each have at least `MIN_POSITIONS` positions.

Calibration, on the same outputs: DDTREE's logprobs read one position late (a predicting node
one too deep) must differ by more than `MAX_ABS_DIFF` somewhere on the path positions.

The non-speculative server's own floor (reported beside each part's verdict): its decode
logprobs against its extend path's for the same tokens (`rescore` of its own greedy output,
per DDTREE position kind; of its own sampled output, at the sampled part's settings).
"Within" is judged on the distributions of the decode positions' differences, not their
maxima (`within_floor`: a one-sided Mann-Whitney U test that DDTREE's are larger, per token and
top-n; a maximum grows with the number of positions, which differ between the two sides).
``within_nospec_floor`` holds where both parts have enough positions, catch the calibration
and stay within their floors.

DDTREE's requests run one at a time, the reference's in one batch, and a GEMM's row count
picks its kernel, hence the last bits of every logit: that comparison carries the batch shape
on top of the forward path. So each part is read a second time at DDTREE's batch shape
(``one_by_one``): the server decodes, and scores through its extend path, one request at a
time, and DDTREE's differences from that decode are judged against the server's own
extend-versus-decode differences at that shape (``within_nospec_floor_one_by_one``). Beside it,
``batch_floor``: the server's one-request decode against its batched one on the greedy
prompts, what the batch shape alone moves. A verify is an extend over the tree, so where the
bound is missed, this says whether DDTREE's differences are the two forward paths' rounding
(bfloat16 logits are 8 significant bits: a step of 0.03-0.06 at magnitudes 4-16) or its own.
"""

from __future__ import annotations

TOP_N = 5
MAX_ABS_DIFF = 0.02  # the bound for bfloat16; float16 runs meet it with room
MIN_POSITIONS = 20
FLOOR_ALPHA = 0.01  # `within_floor` rejects "DDTREE's differences are larger" below this
SAMPLED = {"temperature": 1.0, "top_p": 0.95}
SAMPLED_PROMPTS = 96  # prompts of both parts: the sampled part needs >= MIN_POSITIONS paths
KINDS = ("prefill", "root", "path", "bonus")


def position_kinds(step_sizes: list[int]) -> list[str]:
    """The kind of each output position, from the tokens each streamed chunk added: the first
    token is the prefill's (its chunk may carry the first step too), then one chunk per decode
    step. (A reader slower than the steps gets two steps in one chunk: their boundary is then
    counted as path positions; the verdict's bound is the same for every kind.)"""
    first, *rest = step_sizes
    kinds = ["prefill"]
    for size in ([first - 1] if first > 1 else []) + rest:
        kinds += ["root" if j == 0 else "bonus" if j == size - 1 else "path" for j in range(size)]
    return kinds


def _differences(base: list[dict], tree: list[dict], kinds: list[list[str]], shift: int = 0):
    """Yields ``(kind, |token difference|, |top-n difference| or None)`` per compared position
    (`compare`'s positions; the top-n one where both report the same ids in the same order)."""
    for b, t, ks in zip(base, tree, kinds):
        n = 0
        while n < min(len(b["ids"]), len(t["ids"])) and b["ids"][n] == t["ids"][n]:
            n += 1
        for i in range(min(n, len(t["logprobs"]) - shift)):
            token = abs(b["logprobs"][i] - t["logprobs"][i + shift])
            b_top, t_top = b["top"][i], t["top"][i + shift]
            top = None
            if [x[1] for x in b_top] == [x[1] for x in t_top]:
                top = max((abs(x[0] - y[0]) for x, y in zip(b_top, t_top)), default=0.0)
            yield ks[i], token, top


def compare(
    base: list[dict], tree: list[dict], kinds: list[list[str]], shift: int = 0
) -> dict[str, dict]:
    """Per kind: positions compared and the largest |difference| of the token logprob and of the
    top-n values (where the top-n ids agree). ``base`` / ``tree``: per prompt ``{"ids": [...],
    "logprobs": [...], "top": [[(logprob, id), ...], ...]}``; ``shift``: read DDTREE's logprobs
    that many positions late (the calibration)."""
    out = {k: {"positions": 0, "token": 0.0, "top": 0.0} for k in KINDS}
    for kind, token, top in _differences(base, tree, kinds, shift):
        cell = out[kind]
        cell["positions"] += 1
        cell["token"] = max(cell["token"], token)
        if top is not None:
            cell["top"] = max(cell["top"], top)
    return out


def differences(base: list[dict], tree: list[dict], kinds: list[list[str]]) -> dict:
    """Every decode position's |difference| (prefill positions left out: both sides read them
    from one prefill): ``{"token": [...], "top": [...]}``."""
    out: dict = {"token": [], "top": []}
    for kind, token, top in _differences(base, tree, kinds):
        if kind != "prefill":
            out["token"].append(token)
            if top is not None:
                out["top"].append(top)
    return out


def _quantiles(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "median": 0.0, "p99": 0.0, "max": 0.0}
    xs = sorted(xs)
    at = {q: xs[min(len(xs) - 1, int(q * len(xs)))] for q in (0.5, 0.99)}
    return {"n": len(xs), "median": at[0.5], "p99": at[0.99], "max": xs[-1]}


def within_floor(got: dict, floor: dict) -> dict:
    """Whether DDTREE's differences (`differences`) are no larger than the non-speculative
    server's own extend-versus-decode ones, judged as distributions, not maxima (a maximum
    grows with the number of positions): per key (token, top-n) a one-sided Mann-Whitney U
    test of "DDTREE's are larger", rejected below ``FLOOR_ALPHA``; with each side's median,
    99th percentile and maximum."""
    from scipy.stats import mannwhitneyu

    out: dict = {"alpha": FLOOR_ALPHA}
    for key in ("token", "top"):
        a, b = got[key], floor[key]
        p = float(mannwhitneyu(a, b, alternative="greater").pvalue) if a and b else 0.0
        out[key] = {"p_larger": p, "ddtree": _quantiles(a), "floor": _quantiles(b)}
    out["passed"] = all(out[k]["p_larger"] >= FLOOR_ALPHA for k in ("token", "top"))
    return out


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
    outs = eng.generate(input_ids=prompts, sampling_params=_params(new_tokens, sampling),
                        return_logprob=True, top_logprobs_num=TOP_N)  # fmt: skip
    return [_read(o["meta_info"]) for o in outs]


def run_base_one_by_one(
    eng, prompts: list[list[int]], new_tokens: int, sampling: dict | None = None
) -> list[dict]:
    """`run_base` with one request at a time (DDTREE's batch shape in `run_tree`)."""
    return [run_base(eng, [p], new_tokens, sampling)[0] for p in prompts]


def rescore(
    eng, prompts: list[list[int]], outs: list[dict], sampling: dict, one_by_one: bool = False
) -> list[dict]:
    """The non-speculative server's logprob and top-n for each of ``outs``' tokens after the
    same tokens (module docstring), in `_read`'s form; ``one_by_one``: each scoring request
    alone."""
    inputs, asked = [], []
    for p, o in zip(prompts, outs):
        for i, tok in enumerate(o["ids"]):
            inputs.append(list(p) + o["ids"][:i])
            asked.append([tok])

    def score(ids: list[list[int]], tokens: list[list[int]]) -> list[dict]:
        return eng.generate(input_ids=ids, sampling_params=_params(1, sampling),
                            return_logprob=True, top_logprobs_num=TOP_N,
                            token_ids_logprob=tokens)  # fmt: skip

    if one_by_one:
        res = [score([x], [a])[0] for x, a in zip(inputs, asked)]
    else:
        res = score(inputs, asked)
    scored, at = [], 0
    for o in outs:
        metas = [r["meta_info"] for r in res[at : at + len(o["ids"])]]
        at += len(o["ids"])
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


def verdict(base: list[dict], tree: list[dict], kinds: list[list[str]]) -> dict:
    got = compare(base, tree, kinds)
    late = compare(base, tree, kinds, shift=1)
    enough = all(got[k]["positions"] >= MIN_POSITIONS for k in ("root", "path", "bonus"))
    within = all(max(c["token"], c["top"]) <= MAX_ABS_DIFF for c in got.values())
    caught = late["path"]["token"] > MAX_ABS_DIFF
    return {
        "per_kind": got,
        "max_abs_diff": MAX_ABS_DIFF,
        "enough_positions": enough,
        "one_position_late_caught": caught,
        "one_position_late": late["path"],
        "passed": bool(enough and within and caught),
    }


def _decode_kinds(outs: list[dict]) -> list[list[str]]:
    """Kinds for the server's own sampled outputs, which have no DDTREE steps: the prefill's
    token, then one kind for the rest."""
    return [["prefill"] + ["root"] * (len(o["ids"]) - 1) for o in outs]


def floor_reading(
    own: list[dict],
    own_extend: list[dict],
    tree: list[dict],
    tree_kinds: list[list[str]],
    own_kinds: list[list[str]],
    scored: list[dict] | None = None,
) -> dict:
    """DDTREE's differences from the server, judged against the server's own
    extend-versus-decode differences (`within_floor`). ``own`` / ``own_extend``: the server's
    outputs and their extend scoring (batched, or one request at a time for the
    ``one_by_one`` reading); the reference DDTREE is read against is ``own`` (greedy: the same
    tokens), or ``scored`` (sampled: the server's scoring of DDTREE's own tokens)."""
    reference = own if scored is None else scored
    test = within_floor(
        differences(reference, tree, tree_kinds), differences(own, own_extend, own_kinds)
    )
    per_kind = compare(reference, tree, tree_kinds)
    return {
        "per_kind": per_kind,
        "nospec_extend_vs_decode": compare(own, own_extend, own_kinds),
        "floor_test": test,
        "enough_positions": all(
            per_kind[k]["positions"] >= MIN_POSITIONS for k in ("root", "path", "bonus")
        ),
        "passed": test["passed"],
    }


def check_logprobs(engine_kwargs, engine, prompts, new_tokens: int, summary: dict) -> None:
    """``summary["logprobs"]``: the greedy and the sampled verdicts. ``engine_kwargs(algo)`` /
    ``engine(**kw)``: the e2e's engine factory (no speculation for ``algo`` None)."""
    few = prompts[:SAMPLED_PROMPTS]
    with engine(**engine_kwargs("DDTREE")) as eng:
        tree, kinds = run_tree(eng, prompts, new_tokens)
        sampled, sampled_kinds = run_tree(eng, few, new_tokens, SAMPLED)
    with engine(**engine_kwargs(None)) as eng:
        base = run_base(eng, prompts, new_tokens)
        scored = rescore(eng, few, sampled, SAMPLED)
        own_extend = rescore(eng, prompts, base, None)
        own_sampled = run_base(eng, few, new_tokens, SAMPLED)
        own_sampled_extend = rescore(eng, few, own_sampled, SAMPLED)
        # At DDTREE's batch shape: one request at a time.
        single = run_base_one_by_one(eng, prompts, new_tokens)
        single_extend = rescore(eng, prompts, single, None, one_by_one=True)
        single_scored = rescore(eng, few, sampled, SAMPLED, one_by_one=True)
        own_single = run_base_one_by_one(eng, few, new_tokens, SAMPLED)
        own_single_extend = rescore(eng, few, own_single, SAMPLED, one_by_one=True)
    greedy = verdict(base, tree, kinds)
    batched = floor_reading(base, own_extend, tree, kinds, kinds)
    greedy["nospec_extend_vs_decode"] = batched["nospec_extend_vs_decode"]
    greedy["floor_test"] = batched["floor_test"]
    greedy["within_nospec_floor"] = batched["passed"]
    sampled_verdict = verdict(scored, sampled, sampled_kinds)
    batched = floor_reading(own_sampled, own_sampled_extend, sampled, sampled_kinds,
                            _decode_kinds(own_sampled), scored=scored)  # fmt: skip
    sampled_verdict["nospec_extend_vs_decode"] = batched["nospec_extend_vs_decode"]
    sampled_verdict["floor_test"] = batched["floor_test"]
    sampled_verdict["within_nospec_floor"] = batched["passed"]
    greedy["one_by_one"] = floor_reading(single, single_extend, tree, kinds, kinds)
    greedy["batch_floor"] = {k: _quantiles(v) for k, v in differences(base, single, kinds).items()}
    sampled_verdict["one_by_one"] = floor_reading(own_single, own_single_extend, sampled,
                                                  sampled_kinds, _decode_kinds(own_single),
                                                  scored=single_scored)  # fmt: skip
    summary["logprobs"] = {
        "greedy": greedy,
        "sampled": {**sampled_verdict, "sampling": SAMPLED},
        "passed": bool(greedy["passed"] and sampled_verdict["passed"]),
        # The reference's own floor where the bound is below it (bfloat16 logits): enough
        # positions, the calibration caught, and every kind within the floor, in both parts.
        "within_nospec_floor": all(
            part["within_nospec_floor"]
            and part["enough_positions"]
            and part["one_position_late_caught"]
            for part in (greedy, sampled_verdict)
        ),
        # The same at DDTREE's batch shape (module docstring).
        "within_nospec_floor_one_by_one": all(
            part["one_by_one"]["passed"]
            and part["one_by_one"]["enough_positions"]
            and part["one_position_late_caught"]
            for part in (greedy, sampled_verdict)
        ),
    }
