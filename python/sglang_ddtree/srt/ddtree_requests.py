"""Per-request refusals for DDTREE (reported to the client as HTTP 400; the server keeps serving).

DDTREE verifies every tree node against the target distribution after the grammar mask (JSON
schema, regex, EBNF, structural tag: each node's mask from SGLang's own machinery),
``logit_bias``, temperature, top-k, top-p and min-p (SGLang's min-p path: with any min-p
request in the batch, top-k then top-p then min-p for every row). Options whose exact law over a tree it does not
implement are refused instead of being silently approximated. Per-request seeds are accepted:
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


def refuse_sampling_params(sp) -> str | None:
    """Return an error message for sampling params DDTREE cannot honour exactly, else None."""
    if int(getattr(sp, "min_new_tokens", 0) or 0) > 0:
        # SGLang applies its EOS ban to every tree node alike, not per depth.
        return (
            "DDTREE speculative decoding does not support min_new_tokens (min_tokens); "
            "omit it or set it to 0."
        )
    penalties = {
        "frequency_penalty": (getattr(sp, "frequency_penalty", 0.0), 0.0),
        "presence_penalty": (getattr(sp, "presence_penalty", 0.0), 0.0),
        "repetition_penalty": (getattr(sp, "repetition_penalty", 1.0), 1.0),
    }
    for name, (value, neutral) in penalties.items():
        if value is not None and float(value) != neutral:
            return (
                f"DDTREE speculative decoding does not support {name}; "
                f"omit it or set {name}={neutral}."
            )
    return None


def refuse_logprobs(req) -> str | None:
    """Logprobs are written and wired (``ddtree_logprobs``) and refused until their check against
    the non-speculative server has run."""
    if getattr(req, "return_logprob", False):
        return "DDTREE speculative decoding does not support logprobs; omit logprobs."
    return None


def refuse_request(req) -> str | None:
    if getattr(req, "custom_logit_processor", None):
        return "DDTREE speculative decoding does not support custom logit processors."
    # Refused here (HTTP 400) rather than in the worker, where raising would stop the server.
    return refuse_logprobs(req) or refuse_sampling_params(req.sampling_params)
