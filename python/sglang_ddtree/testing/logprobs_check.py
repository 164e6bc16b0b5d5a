"""DDTREE's logprobs against SGLang's non-speculative server (GPU; `e2e --checks logprobs`).

Both engines decode the same prompts greedily with ``return_logprob`` and ``top_logprobs_num``
= `TOP_N`. DDTREE's requests run one at a time and streamed: SGLang streams each decode step's
committed tokens together, so a chunk is a step, and each position gets its kind from its place
in the step (the predicting node): ``prefill`` (the first output token, from the target's
prefill), ``root`` (a step's first token, predicted by the tree's root), ``path`` (predicted by
an accepted draft node other than the step's last) and ``bonus`` (a step's last token of two or
more, predicted by its deepest accepted node). On each prompt's common prefix of equal output
ids (the greedy check judges the ids themselves), per kind: the largest |difference| of the
emitted token's logprob, and of the top-n values where both report the same top-n ids in the
same order. Passes when every kind's largest difference is at most `MAX_ABS_DIFF` and the kinds
root, path and bonus each have at least `MIN_POSITIONS` positions.

Calibration, on the same outputs: DDTREE's logprobs read one position late (a predicting node
one too deep) must differ by more than `MAX_ABS_DIFF` somewhere on the path positions.

The DDTREE engine runs with the per-request refusal of logprobs lifted in its processes
(`testing.inject`), as the server keeps it until this check has passed.
"""

from __future__ import annotations

import os

from sglang_ddtree.testing import inject

TOP_N = 5
MAX_ABS_DIFF = 0.02  # the bound for bfloat16; float16 runs meet it with room
MIN_POSITIONS = 20
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


def compare(
    base: list[dict], tree: list[dict], kinds: list[list[str]], shift: int = 0
) -> dict[str, dict]:
    """Per kind: positions compared and the largest |difference| of the token logprob and of the
    top-n values (where the top-n ids agree). ``base`` / ``tree``: per prompt ``{"ids": [...],
    "logprobs": [...], "top": [[(logprob, id), ...], ...]}``; ``shift``: read DDTREE's logprobs
    that many positions late (the calibration)."""
    out = {k: {"positions": 0, "token": 0.0, "top": 0.0} for k in KINDS}
    for b, t, ks in zip(base, tree, kinds):
        n = 0
        while n < min(len(b["ids"]), len(t["ids"])) and b["ids"][n] == t["ids"][n]:
            n += 1
        for i in range(min(n, len(t["logprobs"]) - shift)):
            cell = out[ks[i]]
            cell["positions"] += 1
            cell["token"] = max(cell["token"], abs(b["logprobs"][i] - t["logprobs"][i + shift]))
            b_top, t_top = b["top"][i], t["top"][i + shift]
            if [x[1] for x in b_top] == [x[1] for x in t_top]:
                top = max((abs(x[0] - y[0]) for x, y in zip(b_top, t_top)), default=0.0)
                cell["top"] = max(cell["top"], top)
    return out


def _read(meta: dict) -> dict:
    """A finished request's ids, logprobs and top-n, all from its logprob lists (cumulative in a
    stream's last chunk as in a plain response)."""
    return {
        "ids": [int(x[1]) for x in meta["output_token_logprobs"]],
        "logprobs": [float(x[0]) for x in meta["output_token_logprobs"]],
        "top": [[(float(x[0]), int(x[1])) for x in row] for row in meta["output_top_logprobs"]],
    }


def _params(new_tokens: int) -> dict:
    return {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}


def run_base(eng, prompts: list[list[int]], new_tokens: int) -> list[dict]:
    outs = eng.generate(input_ids=prompts, sampling_params=_params(new_tokens),
                        return_logprob=True, top_logprobs_num=TOP_N)  # fmt: skip
    return [_read(o["meta_info"]) for o in outs]


def run_tree(eng, prompts: list[list[int]], new_tokens: int) -> tuple[list[dict], list[list[str]]]:
    """One prompt at a time, streamed: (outputs, position kinds)."""
    outs, kinds = [], []
    for p in prompts:
        sizes, last, done = [], 0, None
        for chunk in eng.generate(input_ids=p, sampling_params=_params(new_tokens),
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


def check_logprobs(engine_kwargs, engine, prompts, new_tokens: int, summary: dict) -> None:
    """``summary["logprobs"]``: the verdict. ``engine_kwargs(algo)`` / ``engine(**kw)``: the
    e2e's engine factory (no speculation for ``algo`` None)."""
    with engine(**engine_kwargs(None)) as eng:
        base = run_base(eng, prompts, new_tokens)
    os.environ[inject.SERVE_LOGPROBS_ENV] = "1"  # read by the engine's processes at start
    try:
        with engine(**engine_kwargs("DDTREE")) as eng:
            tree, kinds = run_tree(eng, prompts, new_tokens)
    finally:
        os.environ.pop(inject.SERVE_LOGPROBS_ENV, None)
    summary["logprobs"] = {**verdict(base, tree, kinds), "refusal_lifted_by_the_test": True}
