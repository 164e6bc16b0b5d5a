"""Measurement switch ``SGLANG_DDTREE_TREE_ATTENTION=1``: the target's tree-verify attention
through ``core.tree_attention`` (the prefix part read once for all nodes, the ancestor block,
merged by log-sum-exp) instead of the triton backend's custom-mask extend kernel.

An AROUND hook on ``TritonAttnBackend.forward_extend`` takes a DDTREE target verify (a
TARGET_VERIFY batch with a custom mask while a DDTREE worker runs in the process) and reads the
backend's own metadata: the prefix's ``kv_indptr`` / ``kv_indices``, the verify mask and its
``mask_indptr``, so a captured CUDA graph replays it with each step's values. MLA targets come
through the same call: SGLang's absorbed MLA on triton hands the backend queries and keys of
the latent plus rope width over one KV head, and the pool's value buffer is the key buffer's
latent slice, which the kernels read through its strides. Anything else
(the drafter's block, prefill, sinks, sliding windows, logit caps, scaled KV, paged KV) goes to
the backend unchanged. Off by default until the full law and fault suites have run with it on.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

ENV = "SGLANG_DDTREE_TREE_ATTENTION"
TARGET = "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend"


def enabled(environ=None) -> bool:
    return (os.environ if environ is None else environ).get(ENV, "0").strip() == "1"


def register_if_enabled() -> bool:
    if not enabled():
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, forward_extend_hook, HookType.AROUND)
    return True


def _handles(backend, k, v, layer, forward_batch, kwargs) -> bool:
    from sglang_ddtree.srt import ddtree_requests

    md = getattr(backend, "forward_metadata", None)
    return (
        ddtree_requests.ddtree_active()
        and forward_batch.forward_mode.is_target_verify()
        and k is not None
        and v is not None
        and md is not None
        and getattr(md, "custom_mask", None) is not None
        and getattr(md, "mask_indptr", None) is not None
        and getattr(backend, "token_to_kv_pool", None) is not None
        and getattr(backend, "page_size", 1) == 1
        and getattr(backend, "dcp_size", 1) == 1
        and getattr(backend, "_translate_kv_loc", None) is None  # unified pools
        and getattr(md, "swa_out_cache_loc", None) is None
        and not getattr(layer, "is_cross_attention", False)
        and getattr(layer, "k_scale", None) is None
        and (getattr(layer, "sliding_window_size", None) or -1) < 0
        and not getattr(layer, "logit_cap", 0)
        and getattr(layer, "xai_temperature_len", -1) in (None, -1)
        and all(kwargs.get(name) is None for name in ("sinks", "score_mod", "aux_tensors"))
    )


_announced: list = []


def forward_extend_hook(
    original_fn, backend, q, k, v, layer, forward_batch, save_kv_cache=True, *args, **kwargs
):
    if args or not _handles(backend, k, v, layer, forward_batch, kwargs):
        return original_fn(backend, q, k, v, layer, forward_batch, save_kv_cache, *args, **kwargs)
    from sglang_ddtree.core.tree_attention import tree_attention

    if not _announced:  # once per process: the switch reached a verify, not only the import
        _announced.append(True)
        logger.warning("DDTREE: tree-verify attention through core.tree_attention (%s=1).", ENV)
    pool = backend.token_to_kv_pool  # the backend's pool, as its own extend writes it
    if save_kv_cache:
        pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
    md = backend.forward_metadata
    n = q.shape[0]
    out = tree_attention(
        q.view(n, layer.tp_q_head_num, layer.qk_head_dim),
        pool.get_key_buffer(layer.layer_id),
        pool.get_value_buffer(layer.layer_id),
        md.kv_indptr,
        md.kv_indices,
        forward_batch.out_cache_loc,
        None,
        layer.scaling,
        full_mask=md.custom_mask,
        mask_indptr=md.mask_indptr,
        num_nodes=n // forward_batch.batch_size,
    ).view(n, layer.tp_q_head_num * layer.v_head_dim)
    attn_out = getattr(forward_batch, "_attn_output", None)
    if attn_out is not None:  # a model that hands the backend its output buffer
        attn_out.view(n, -1).copy_(out)
        return attn_out
    return out
