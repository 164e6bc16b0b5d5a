"""The near-tie rule's bound per dtype (``testing.near_tie``), on the CPU: the greedy
differences a bfloat16 run of the trained pair showed against the non-speculative server (the
workspace guard on an H100: the server's top two tokens, margins 0 and one bfloat16 step of
0.0625 nats) are ties under bfloat16's bound and faults under float16's; a third token, or two
bfloat16 steps, stays a fault in either."""

from __future__ import annotations

import pytest

from sglang_ddtree.testing.near_tie import (
    NEAR_TIE_NATS,
    classify_difference,
    judge,
    near_tie_nats,
)

# (tokens at the first difference, the non-speculative server's top two there, their margin)
MEASURED_BF16 = [
    ([627, 489], [627, 489], 0.0625),
    ([17, 60], [60, 17], 0.0),
    ([1011, 687], [687, 1011], 0.0625),
    ([805, 2389], [2389, 805], 0.0625),
]


def _diff(tokens):
    return {"position": 3, "tokens": tokens, "prefix": [1, 2, 3]}


def test_bounds_per_dtype():
    assert near_tie_nats(None) == near_tie_nats("float16") == NEAR_TIE_NATS
    assert near_tie_nats("bfloat16") > 0.0625  # one bfloat16 step at logits of 8-16


@pytest.mark.parametrize("tokens, top2, margin", MEASURED_BF16)
def test_measured_bfloat16_differences_are_ties_only_in_bfloat16(tokens, top2, margin):
    judged = judge(_diff(tokens), lambda prefix: (top2, margin), near_tie_nats("bfloat16"))
    assert judged["near_tie"] and "prefix" not in judged
    strict = classify_difference(_diff(tokens), top2, margin, near_tie_nats("float16"))
    assert strict["near_tie"] == (margin <= NEAR_TIE_NATS)


def test_faults_stay_faults_in_bfloat16():
    nats = near_tie_nats("bfloat16")
    assert not classify_difference(_diff([627, 489]), [627, 12], 0.0, nats)["near_tie"]
    assert not classify_difference(_diff([627, 489]), [627, 489], 0.125, nats)["near_tie"]
    assert not classify_difference(_diff(None), [627, 489], 0.0, nats)["near_tie"]
    assert not judge(_diff([627, 489]), None, nats)["near_tie"]
