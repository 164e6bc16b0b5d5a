"""Judging a greedy difference between two runs of the same model: fault or near-tie.

Two greedy runs that batch differently (a tree of another width, another batch size) reduce in
another order, which moves a float16 logit by ~1e-3. Where the two best tokens are that close,
either run may pick either. A difference is a near-tie iff, at the first differing position,
its two tokens are exactly the non-speculative server's top two after the common prefix and
their logit margin is at most ``NEAR_TIE_NATS``; anything else (a third token, a wider margin,
another length) is a fault. A corrupted KV mapping or a wrong accept rule changes the
distribution itself, far beyond the margin.
"""

from __future__ import annotations

NEAR_TIE_NATS = 0.01  # float16 arithmetic-order differences move a logit by ~1e-3
# bfloat16 keeps 8 bits of a logit: steps of 0.0625 at magnitudes 8-16. The non-speculative
# server's own token logprobs differ by up to 0.075 between its extend and decode paths there
# (the trained pair, `logprobs_check`'s floor), so a margin that small is a tie in bfloat16.
NEAR_TIE_NATS_BY_DTYPE = {"bfloat16": 0.075}


def near_tie_nats(dtype: str | None) -> float:
    """The near-tie margin of runs in ``dtype`` (float16's where unnamed)."""
    return NEAR_TIE_NATS_BY_DTYPE.get(str(dtype), NEAR_TIE_NATS)


def top2_of(meta_info: dict) -> tuple[list[int], float]:
    """The two most likely first tokens and their logit margin (nats) from an SGLang response's
    ``meta_info`` (a one-token greedy request with ``top_logprobs_num=2``)."""
    tops = meta_info["output_top_logprobs"][0]
    return [t[1] for t in tops[:2]], tops[0][0] - tops[1][0]


def first_difference(prompt: list[int], alone: list[int], together: list[int]) -> dict:
    """Where two greedy outputs of ``prompt`` first differ: ``position``, the two ``tokens``
    there (None where one output is a prefix of the other: a different length, never a tie)
    and the ``prefix`` (prompt plus the common tokens) whose next token they disagree on."""
    i = next((j for j, (x, y) in enumerate(zip(alone, together)) if x != y), None)
    if i is None:
        n = min(len(alone), len(together))
        return {"position": n, "tokens": None, "prefix": prompt + alone[:n]}
    return {"position": i, "tokens": [alone[i], together[i]], "prefix": prompt + alone[:i]}


def classify_difference(
    diff: dict, top2_ids: list[int], margin: float, nats: float = NEAR_TIE_NATS
) -> dict:
    """``diff`` (from ``first_difference``) judged against the non-speculative server's top
    two tokens after its prefix: a near-tie iff its two tokens are exactly those, at most
    ``nats`` apart."""
    tie = diff["tokens"] is not None and sorted(top2_ids) == sorted(diff["tokens"])
    return dict(diff, top2=list(top2_ids), margin=round(margin, 6),
                near_tie=bool(tie and margin <= nats))  # fmt: skip


def judge(diff: dict, probe, nats: float = NEAR_TIE_NATS) -> dict:
    """``diff`` without its prefix, classified with ``probe(prefix) -> (top2 ids, margin)``
    (a near-tie within ``nats``); no probe, or a probe that raises, leaves it a fault."""
    diff = dict(diff)
    prefix = diff.pop("prefix")
    if probe is None:
        return dict(diff, near_tie=False)
    try:
        return classify_difference(diff, *probe(prefix), nats=nats)
    except Exception as e:  # noqa: BLE001 - an unjudged difference is a fault
        return dict(diff, near_tie=False, probe_error=f"{type(e).__name__}: {e}"[:300])
