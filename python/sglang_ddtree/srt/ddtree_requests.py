"""Per-request refusals for DDTREE (reported to the client as HTTP 400; the server keeps serving).

DDTREE verifies every tree node against the target distribution after the grammar mask (JSON
schema, regex, EBNF, structural tag: each node's mask from SGLang's own machinery), the
frequency, presence and repetition penalties and min_new_tokens (each node's counts: the
request's output so far plus the tokens on the node's path; min_new_tokens holds the stop ids
back at the depths it covers), ``logit_bias``, temperature, top-k, top-p and min-p (SGLang's
min-p path: with any min-p request in the batch, top-k then top-p then min-p for every row).
Logprobs are served (``ddtree_logprobs``: each committed token's from the verify logits of the
node that predicted it). Custom logit processors, whose exact law over a tree it does not
implement, are refused instead of being silently approximated. Per-request seeds are accepted:
without ``--enable-deterministic-inference`` (which DDTREE refuses at startup) SGLang's own
sampler does not use them either.
"""

from __future__ import annotations

_active = False


def set_active(active: bool = True) -> None:
    """Mark this process as running a DDTREE worker (set by the worker's constructor)."""
    global _active
    _active = active


def ddtree_active() -> bool:
    return _active


def refuse_request(req) -> str | None:
    if getattr(req, "custom_logit_processor", None):
        # Refused here (HTTP 400) rather than in the worker, where raising would stop the server.
        return "DDTREE speculative decoding does not support custom logit processors."
    return None
