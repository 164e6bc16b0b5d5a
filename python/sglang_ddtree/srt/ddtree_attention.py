"""The target's tree-verify attention through ``core.tree_attention`` (the prefix part read once
for all nodes, the ancestor block, merged by log-sum-exp) instead of the triton backend's
custom-mask extend kernel. On by default; ``SGLANG_DDTREE_TREE_ATTENTION=0`` keeps the backend's
kernel (any other value than 0 or 1 stops the server's start with a message).

``TritonAttnBackend.forward_extend`` hands every target verify to ``tree_verify_attention``
first, which takes a DDTREE one (a TARGET_VERIFY batch with a custom mask while a DDTREE worker
runs in the process) and reads the backend's own metadata: the prefix's ``kv_indptr`` /
``kv_indices``, the verify mask and its ``mask_indptr``, so a captured CUDA graph replays it
with each step's values. MLA targets come through the same call: SGLang's absorbed MLA on
triton hands the backend queries and keys of the latent plus rope width over one KV head, and
the pool's value buffer is the key buffer's latent slice, which the kernels read through its
strides. The launch (value tiles, prefix shares) is ``launch_settings``'. Anything else
(the drafter's block, prefill, sinks, sliding windows, logit caps, scaled KV, paged KV) returns
None and stays with the backend.
"""

from __future__ import annotations

import functools
import logging
import os

logger = logging.getLogger(__name__)

ENV = "SGLANG_DDTREE_TREE_ATTENTION"
# Logged once per process when a verify takes the split (the e2e and in-tree checks look for it).
SPLIT_LOG_LINE = "tree-verify attention through core.tree_attention"


def _value(environ=None) -> str:
    return (os.environ if environ is None else environ).get(ENV, "1").strip()


def enabled(environ=None) -> bool:
    return _value(environ) == "1"


@functools.cache
def _switch_on() -> bool:  # read once per process: the backend asks on every layer
    return enabled()


def env_error(environ=None) -> str | None:
    """The refusal of a switch value other than 0 or 1 (``validate_server_args`` raises it)."""
    value = _value(environ)
    if value in ("0", "1"):
        return None
    return f"{ENV} must be 0 (the backend's custom-mask kernel) or 1 (the default), not {value!r}"


def handles(backend, k, v, layer, forward_batch, kwargs) -> bool:
    """Whether ``tree_verify_attention`` takes this call: a DDTREE target verify with the
    switch on, on a layout its kernels read (anything else stays with the backend)."""
    from sglang_ddtree.srt import ddtree_requests

    md = getattr(backend, "forward_metadata", None)
    return (
        _switch_on()
        and ddtree_requests.ddtree_active()
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


@functools.cache
def _num_sms(device) -> int:
    import torch

    if device.type != "cuda":  # triton's interpreter (tests): no SMs to fill
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def tree_verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    """``[n, Hq * Dv]``: the verify's attention output (after saving the nodes' KV as the
    backend's own extend would), or None where ``handles`` says no.

    q: ``[n = bs * W, Hq * D]``; k, v: ``[n, Hkv, D]`` / ``[n, Hkv, Dv]``, the nodes' KV."""
    if not handles(backend, k, v, layer, forward_batch, kwargs):
        return None
    from sglang_ddtree.core.tree_attention import launch_settings, tree_attention

    if not _announced:  # once per process: the switch reached a verify, not only the import
        _announced.append(True)
        logger.warning("DDTREE: %s (%s=0 keeps the backend's extend kernel).", SPLIT_LOG_LINE, ENV)
    pool = backend.token_to_kv_pool  # the backend's pool, as its own extend writes it
    if save_kv_cache:
        pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
    md = backend.forward_metadata
    n = q.shape[0]
    w = n // forward_batch.batch_size
    k_buffer = pool.get_key_buffer(layer.layer_id)
    settings = launch_settings(  # from shapes: no host sync
        forward_batch.batch_size, w, layer.tp_q_head_num, k_buffer.shape[1], layer.v_head_dim,
        _num_sms(q.device),
    )
    out = tree_attention(
        q.view(n, layer.tp_q_head_num, layer.qk_head_dim),
        k_buffer,
        pool.get_value_buffer(layer.layer_id),
        md.kv_indptr,
        md.kv_indices,
        forward_batch.out_cache_loc,
        None,
        layer.scaling,
        full_mask=md.custom_mask,
        mask_indptr=md.mask_indptr,
        num_nodes=w,
        **settings,
    ).view(n, layer.tp_q_head_num * layer.v_head_dim)
    attn_out = getattr(forward_batch, "_attn_output", None)
    if attn_out is not None:  # a model that hands the backend its output buffer
        attn_out.view(n, -1).copy_(out)
        return attn_out
    return out
