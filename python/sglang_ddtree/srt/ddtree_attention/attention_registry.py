"""The verify attention backends DDTREE serves, by name (``VERIFY_BACKENDS``), which one a
server verifies on, and the startup check that the target's backend took its hooks. A new
backend is its module and one line here."""

from __future__ import annotations

from sglang_ddtree.srt.ddtree_attention.flashinfer_backend import FlashInferVerify
from sglang_ddtree.srt.ddtree_attention.flashmla_backend import FlashMLASplitVerify
from sglang_ddtree.srt.ddtree_attention.triton_backend import TritonSplitVerify
from sglang_ddtree.srt.ddtree_attention.triton_extend_backend import TritonExtendVerify
from sglang_ddtree.srt.ddtree_attention.verify_backend import (
    VERIFY_FLAG,
    VerifyAttentionBackend,
)

# The one named as an --attention-backend is that backend's default verify.
VERIFY_BACKENDS: dict[str, type[VerifyAttentionBackend]] = {
    backend.name: backend
    for backend in (
        TritonSplitVerify,
        FlashMLASplitVerify,
        FlashInferVerify,
        TritonExtendVerify,
    )
}


def target_verify_backend(cfg) -> str | None:
    """The attention backend SGLang uses for TARGET_VERIFY (prefill side unless
    ``--speculative-attention-mode decode``), from a resolved config view."""
    base = getattr(cfg, "attention_backend", None)
    if getattr(cfg, "speculative_attention_mode", "prefill") == "decode":
        return getattr(cfg, "decode_attention_backend", None) or base
    return getattr(cfg, "prefill_attention_backend", None) or base


def default_backends() -> list[type[VerifyAttentionBackend]]:
    """Each attention backend's default verify, in registry order."""
    return [b for b in VERIFY_BACKENDS.values() if b.name == b.attention_backend]


def verify_attention_backend(backend_class: str | None, cfg) -> str | None:
    """The --attention-backend name of SGLang's backend class ``backend_class`` (the target's
    backend object, through SGLang's wrappers); a class of none of them (a prefill / decode
    split's ``HybridAttnBackend``) verifies on the side `target_verify_backend` names."""
    names = {b.backend_class.rsplit(".", 1)[1]: b.attention_backend for b in default_backends()}
    return names.get(backend_class) or target_verify_backend(cfg)


def verify_backend(cfg, backend_class: str | None = None) -> type[VerifyAttentionBackend] | None:
    """The verify attention of a server (``cfg``: its args): the one
    --speculative-ddtree-verify-attention names, else its verify's attention backend's default
    (`verify_attention_backend`); None where DDTREE has none."""
    name = getattr(cfg, VERIFY_FLAG, None) or verify_attention_backend(backend_class, cfg)
    return VERIFY_BACKENDS.get(name)


def verify_backend_of(model_runner) -> type[VerifyAttentionBackend] | None:
    """`verify_backend` of the target's model runner, by its attention backend object."""
    from sglang.srt.speculative.dflash_utils import resolve_dflash_verify_mask_policy

    backend_class, _ = resolve_dflash_verify_mask_policy(model_runner.attn_backend)
    return verify_backend(model_runner.server_args, backend_class)


# Where SGLang's wrapper backends hold the backends they run (hybrid, prefill / decode split,
# two-batch overlap).
_WRAPPED_BACKENDS = ("full_attn_backend", "prefill_backend", "decode_backend", "primary")


def missing_verify_hook(attn_backend, verify: type[VerifyAttentionBackend] | None) -> str | None:
    """The refusal when the target's attention backend (``attn_backend``, the model runner's,
    through SGLang's wrappers), on which ``verify`` takes the verifies, was built without the
    construction hook: the verify would silently fall to the backend's own kernel (on flashmla,
    one without a tree mask). None when it was, or nothing needs it."""
    if verify is None or not verify.takes_verify:
        return None
    seen, todo = [], [attn_backend]
    while todo:  # the backend and what SGLang's wrappers hold (hybrid prefill / decode)
        b = todo.pop()
        if b is None or any(b is x for x in seen):
            continue
        seen.append(b)
        todo += [getattr(b, n, None) for n in _WRAPPED_BACKENDS]
        todo += list(getattr(b, "children", None) or [])  # two-batch overlap's
    if any(getattr(b, "ddtree_takes_verify", False) for b in seen):
        return None
    return (
        f"DDTREE: the target's {verify.attention_backend} attention backend was built without "
        "DDTREE's verify hook (were DDTREE's plugin hooks applied in this process before the "
        "model runner was built?); it would verify without the tree mask."
    )
