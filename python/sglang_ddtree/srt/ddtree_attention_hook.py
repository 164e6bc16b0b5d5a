"""Plugin registration of DDTREE's verify attention backends (``ddtree_attention``): on the
SGLang class of each one that ``takes_verify``, AROUND hooks on its construction (which decides
once whether the object verifies DDTREE trees), its ``forward_extend`` and, where it reads no
FULL_MASK, its two metadata calls (in SGLang's tree, a line in each constructor and a call at
the top of each method).

A backend whose SGLang module does not import here (``unavailable_error``: flashmla's without
sgl_kernel's FlashMLA) gets no hooks: SGLang's hook registry imports every hooked class, and
logs a traceback for each one that does not import, on every launch, whichever backend is
selected. A server that selects it is refused at start."""

from __future__ import annotations

import logging

from sglang_ddtree.srt.ddtree_attention.attention_registry import VERIFY_BACKENDS
from sglang_ddtree.srt.ddtree_attention.verify_backend import takes_ddtree_verify

logger = logging.getLogger(__name__)


def register_verify_hooks() -> list[str]:
    """Registers the hooks; the names of the backends hooked."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    hooked = []
    for verify in VERIFY_BACKENDS.values():
        if not verify.takes_verify:
            continue
        reason = verify.unavailable_error()
        if reason is not None:
            logger.debug("DDTREE: no %s verify hooks: %s", verify.name, reason)
            continue
        for method, hook in verify_hooks(verify).items():
            HookRegistry.register(f"{verify.backend_class}.{method}", hook, HookType.AROUND)
        hooked.append(verify.name)
    return hooked


def verify_hooks(verify) -> dict:
    """The AROUND hooks on ``verify.backend_class``'s methods, by method name."""

    def init_hook(original_fn, backend, *args, **kwargs):
        original_fn(backend, *args, **kwargs)
        model_runner = args[0] if args else kwargs.get("model_runner")
        backend.ddtree_takes_verify = takes_ddtree_verify(model_runner, verify)

    def forward_extend_hook(original_fn, backend, q, k, v, layer, fb, save_kv_cache=True, *a, **kw):
        out = None if a else verify.forward_extend(backend, q, k, v, layer, fb, save_kv_cache, **kw)
        if out is None:
            return original_fn(backend, q, k, v, layer, fb, save_kv_cache, *a, **kw)
        return out

    def metadata_hook(in_graph: bool):
        def hook(original_fn, backend, forward_batch, *args, **kwargs):
            out = original_fn(backend, forward_batch, *args, **kwargs)
            verify.init_forward_metadata(backend, forward_batch, in_graph)
            return out

        return hook

    hooks = {"__init__": init_hook, "forward_extend": forward_extend_hook}
    if not verify.reads_full_mask:  # its own metadata: eager, and before a capture or replay
        hooks["init_forward_metadata"] = metadata_hook(in_graph=False)
        hooks["init_forward_metadata_out_graph"] = metadata_hook(in_graph=True)
    return hooks
