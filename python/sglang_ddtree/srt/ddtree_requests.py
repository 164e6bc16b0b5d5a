"""Per-request refusals for DDTREE (reported to the client as HTTP 400; the server keeps serving).

DDTREE verifies every tree node against the target distribution after the grammar mask (JSON schema,
regex, EBNF, structural tag: each node's mask from SGLang's own machinery), the frequency, presence
and repetition penalties and min_new_tokens (each node's counts: the request's output so far plus
the tokens on the node's path; min_new_tokens holds the stop ids back at the depths it covers),
``logit_bias``, temperature, top-k, top-p and min-p (SGLang's min-p path: with any min-p request in
the batch, top-k then top-p then min-p for every row). Logprobs are served (``ddtree_logprobs``:
each committed token's from the verify logits of the node that predicted it). Custom logit
processors, whose exact law over a tree it does not implement, are refused instead of being silently
approximated, and so is a min_new_tokens request that holds back every token of the vocabulary (its
stop ids, the tokenizer's EOS and extra stop ids cover all of it): no token could be emitted, and
SGLang's own sampler asserts on such a row where no top-k / top-p / min-p request shares its batch,
which ends the scheduler. Per-request seeds are accepted: without
``--enable-deterministic-inference`` (which DDTREE refuses at startup) SGLang's own sampler does not
use them either.
"""

from __future__ import annotations

_active = False
_vocab: int | None = None  # the target's vocabulary (logits' width), once a worker runs
EVERY_TOKEN_HELD_BACK = "holds back every token"


def set_active(active: bool = True, vocab: int | None = None) -> None:
    """Mark this process as running a DDTREE worker of a target with ``vocab`` tokens (set by
    the worker's constructor)."""
    global _active, _vocab
    _active, _vocab = active, vocab


def ddtree_active() -> bool:
    return _active


def refuse_request(req) -> str | None:
    held_back = _refuse_if_every_token_held_back(req)  # first: it defuses the request
    if getattr(req, "custom_logit_processor", None):
        # Refused here (HTTP 400) rather than in the worker, where raising would stop the server.
        return "DDTREE speculative decoding does not support custom logit processors."
    return held_back


def _refuse_if_every_token_held_back(req) -> str | None:
    sp = getattr(req, "sampling_params", None)
    min_new = int(getattr(sp, "min_new_tokens", 0) or 0)
    if _vocab is None or min_new <= 0:
        return None
    from sglang_ddtree.srt.ddtree_penalties import stop_ids

    if len(stop_ids(req, _vocab)) < _vocab:
        return None
    sp.min_new_tokens = 0  # SGLang still prefills a refused request a token, under its penalties
    return (
        f"min_tokens / min_new_tokens {min_new} {EVERY_TOKEN_HELD_BACK}: the stop_token_ids "
        f"(with the tokenizer's EOS) cover the whole vocabulary of {_vocab} tokens, so no token "
        "could be emitted. Send fewer stop_token_ids or no min_tokens."
    )
