"""DDTREE's split tree verify on SGLang's triton backend: ``core.tree_attention`` (the prefix
part read once for all nodes, the ancestor block, merged by log-sum-exp) in place of the
custom-mask extend kernel (`TritonExtendVerify`), which keeps every call the split does not take.

It reads the backend's own verify metadata: the prefix's ``kv_indptr`` / ``kv_indices``, the
FULL_MASK and its ``mask_indptr``, so a captured CUDA graph replays it with each step's values.
MLA targets come through the same call: SGLang's absorbed MLA on triton hands the backend
queries and keys of the latent plus rope width over one KV head, and the pool's value buffer is
the key buffer's latent slice, which the kernels read through its strides. The launch (value
tiles, prefix shares) is ``launch_settings``'. Anything else (the drafter's block, prefill,
sinks, sliding windows, logit caps, scaled KV, key buffers that are not slot rows) stays with
the kernel. The kernels address KV by slot, so a paged pool (page size 16, 64) is read as it
is: a page is a run of slots.
"""

from __future__ import annotations

from sglang_ddtree.srt.ddtree_attention.triton_extend_backend import TritonExtendVerify
from sglang_ddtree.srt.ddtree_attention.verify_backend import announce, launch, num_sms


class TritonSplitVerify(TritonExtendVerify):
    name = "triton"
    takes_verify = True

    @staticmethod
    def handles(backend, k, v, layer, forward_batch, kwargs) -> bool:
        """Whether `forward_extend` takes this call: a target verify on a backend that
        `takes_ddtree_verify`, on a layout the kernels read."""
        md = getattr(backend, "forward_metadata", None)
        return (
            getattr(backend, "ddtree_takes_verify", False)
            and forward_batch.forward_mode.is_target_verify()
            and k is not None
            and v is not None
            and md is not None
            and getattr(md, "custom_mask", None) is not None
            and getattr(md, "mask_indptr", None) is not None
            and getattr(backend, "token_to_kv_pool", None) is not None
            and not getattr(backend.token_to_kv_pool, "use_hnd", False)  # slot rows, any page
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

    @classmethod
    def forward_extend(cls, backend, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if not cls.handles(backend, k, v, layer, forward_batch, kwargs):
            return None
        from sglang_ddtree.core.tree_attention import is_latent_view, tree_attention

        announce(cls)
        pool = backend.token_to_kv_pool  # the backend's pool, as its own extend writes it
        if save_kv_cache:
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        md = backend.forward_metadata
        n = q.shape[0]
        w = n // forward_batch.batch_size
        k_buffer = pool.get_key_buffer(layer.layer_id)
        v_buffer = pool.get_value_buffer(layer.layer_id)
        # MLA's pool hands out the latent as a view of the keys: the prefix kernel's latent
        # variant (a key tile loaded once for both products), as on flashmla's pages.
        latent_d = layer.qk_head_dim if is_latent_view(k_buffer, v_buffer) else 0
        settings = dict(
            launch(  # from shapes: no host sync
                forward_batch.batch_size,
                w,
                layer.tp_q_head_num,
                k_buffer.shape[1],
                layer.v_head_dim,
                num_sms(q.device),
                latent_d=latent_d,
            )
        )
        out = tree_attention(
            q.view(n, layer.tp_q_head_num, layer.qk_head_dim),
            k_buffer,
            v_buffer,
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
