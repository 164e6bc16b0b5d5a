"""Plugin registration of ``ddtree_attention.tree_verify_attention``: an AROUND hook on
``TritonAttnBackend.forward_extend`` (in SGLang's tree, a call at the top of that method)."""

from __future__ import annotations

from sglang_ddtree.srt.ddtree_attention import enabled, tree_verify_attention

TARGET = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend"


def register_if_enabled() -> bool:
    if not enabled():
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, forward_extend_hook, HookType.AROUND)
    return True


def forward_extend_hook(
    original_fn, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs
):
    out = None
    if not args:
        out = tree_verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    if out is None:
        return original_fn(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    return out
