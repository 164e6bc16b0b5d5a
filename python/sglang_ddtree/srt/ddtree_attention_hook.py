"""Plugin registration of the DDTREE tree-verify attention: AROUND hooks on the construction of
``TritonAttnBackend`` and ``FlashMLABackend`` (which decides once whether the backend verifies
DDTREE trees), on their ``forward_extend`` and on FlashMLA's metadata calls (in SGLang's tree,
a line in each constructor and a call at the top of each method).

FlashMLA's hooks are registered only where SGLang's flashmla backend imports: SGLang's hook
registry imports every hooked class, and logs a traceback for each one that does not import, on
every launch, whichever backend is selected. Where it does not import, a server that selects
flashmla is refused at start (``ddtree_args.flashmla_unavailable_error``)."""

from __future__ import annotations

import logging

from sglang_ddtree.srt.ddtree_args import FLASHMLA_BACKEND_MODULE, flashmla_import_error
from sglang_ddtree.srt.ddtree_attention import (
    enabled,
    flashmla_tree_verify_attention,
    set_flashmla_verify,
    takes_ddtree_verify,
    tree_verify_attention,
)

logger = logging.getLogger(__name__)

TRITON = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend"
TARGET = f"{TRITON}.forward_extend"
FLASHMLA = f"{FLASHMLA_BACKEND_MODULE}.FlashMLABackend"


def register_if_enabled() -> bool:
    if not enabled():
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{TRITON}.__init__", backend_init_hook, HookType.AROUND)
    HookRegistry.register(TARGET, forward_extend_hook, HookType.AROUND)
    reason = flashmla_import_error()
    if reason is not None:
        logger.debug("DDTREE: no flashmla verify hooks, its backend does not import: %s", reason)
        return True
    HookRegistry.register(f"{FLASHMLA}.__init__", backend_init_hook, HookType.AROUND)
    HookRegistry.register(
        f"{FLASHMLA}.forward_extend", flashmla_forward_extend_hook, HookType.AROUND
    )
    HookRegistry.register(
        f"{FLASHMLA}.init_forward_metadata", flashmla_eager_metadata_hook, HookType.AROUND
    )
    HookRegistry.register(
        f"{FLASHMLA}.init_forward_metadata_out_graph", flashmla_graph_metadata_hook, HookType.AROUND
    )
    return True


def backend_init_hook(original_fn, backend, *args, **kwargs):
    original_fn(backend, *args, **kwargs)
    model_runner = args[0] if args else kwargs.get("model_runner")
    backend.ddtree_takes_verify = takes_ddtree_verify(model_runner)


def forward_extend_hook(
    original_fn, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs
):
    out = None
    if not args:
        out = tree_verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    if out is None:
        return original_fn(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    return out


def flashmla_forward_extend_hook(
    original_fn, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs
):
    out = None
    if not args and not kwargs:
        out = flashmla_tree_verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache)
    if out is None:
        return original_fn(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    return out


def flashmla_eager_metadata_hook(original_fn, backend, forward_batch, *args, **kwargs):
    out = original_fn(backend, forward_batch, *args, **kwargs)
    set_flashmla_verify(backend, forward_batch, in_graph=False)
    return out


def flashmla_graph_metadata_hook(original_fn, backend, forward_batch, *args, **kwargs):
    out = original_fn(backend, forward_batch, *args, **kwargs)
    set_flashmla_verify(backend, forward_batch, in_graph=True)
    return out
