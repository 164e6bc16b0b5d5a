"""DDTREE's split tree verify on SGLang's flashmla backend (MLA targets, page size 64): the whole
verify attention is ``core.tree_attention`` reading FlashMLA's pages through the backend's block
table, its prefix shares float32 until the merge. FlashMLA's own verify is a causal block with no
tree mask, and its prefix part comes back rounded to the cache dtype, which in bfloat16 moved the
sampled law off the non-speculative server's. The prefix offsets and the step's tree mask are set
once per forward by the backend's metadata calls (`init_forward_metadata`), into static buffers
where a CUDA graph replays (refreshed before each replay), so every layer reads them as they are."""

from __future__ import annotations

import functools
import importlib
from typing import NamedTuple

import torch

from sglang_ddtree.srt.ddtree_attention.verify_backend import (
    VerifyAttentionBackend,
    announce,
    launch,
    num_sms,
)

# SGLang's flashmla backend; it imports sgl_kernel's FlashMLA kernels, which not every machine's
# sgl_kernel has.
BACKEND_MODULE = "sglang.srt.layers.attention.flashmla_backend"
PAGE_SIZE = 64  # the flashmla backend's page size (SGLang sets it for that backend)


@functools.cache
def import_error() -> str | None:
    """Why SGLang's flashmla backend does not import on this machine (``ExcType: message``), or
    None where it does. Tried once per process."""
    try:
        importlib.import_module(BACKEND_MODULE)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


class FlashMLAVerifyMetadata(NamedTuple):
    """What every layer of one DDTREE verify on FlashMLA reads (``backend.ddtree_verify``)."""

    prefix_indptr: torch.Tensor  # [bs + 1] int64, the committed prefixes' offsets
    tree_mask: torch.Tensor  # [bs, W, W] bool, ancestor-or-self


class _GraphBuffers:
    """Static tensors the captured verify graphs read, sized for the largest captured batch and
    W; refreshed before every replay."""

    def __init__(self, backend):
        device = backend.req_to_token.device
        max_bs = int(backend.cuda_graph_num_splits.shape[0]) - 1
        max_w = int(backend.num_draft_tokens)
        self.prefix_indptr = torch.zeros(max_bs + 1, dtype=torch.int64, device=device)
        # All True: rows of padded requests attend to every node, never to none.
        self.tree_mask = torch.ones(max_bs * max_w * max_w, dtype=torch.bool, device=device)


class FlashMLASplitVerify(VerifyAttentionBackend):
    name = attention_backend = "flashmla"
    backend_class = f"{BACKEND_MODULE}.FlashMLABackend"
    page_sizes = (PAGE_SIZE,)
    serves_mha = False  # its prefix kernel reads MLA's latent pages
    serves_mla = True
    reads_full_mask = False
    takes_verify = True

    @classmethod
    def unavailable_error(cls) -> str | None:
        reason = import_error()
        if reason is None:
            return None
        return (
            f"--attention-backend flashmla cannot run on this machine: SGLang's flashmla "
            f"backend does not import ({reason}); pass --attention-backend triton (DDTREE's "
            "split verify serves MLA targets there too)."
        )

    @staticmethod
    def handles(backend, forward_batch) -> bool:
        """Whether the split takes this call: a target verify (also its capture, whose dummy
        has no tree yet) on a backend that `takes_ddtree_verify`, on a 16-bit latent cache."""
        return (
            getattr(backend, "ddtree_takes_verify", False)
            and forward_batch.forward_mode.is_target_verify()
            and not backend.is_fp8_kvcache
            and backend.dcp_world_size == 1
        )

    @classmethod
    def init_forward_metadata(cls, backend, forward_batch, in_graph: bool) -> None:
        """The prefix offsets and the ancestor mask, onto ``backend.ddtree_verify``, for a
        verify it `handles`; any other forward: no-op."""
        if not cls.handles(backend, forward_batch):
            return
        bs = forward_batch.batch_size
        spec_info = forward_batch.spec_info
        w = int(spec_info.draft_token_num)
        # Once a forward, not once a layer.
        prefix_indptr = torch.nn.functional.pad(forward_batch.seq_lens[:bs].cumsum(0), (1, 0))
        tree = getattr(spec_info, "tree", None)  # None in the capture dummy
        tree_mask = None if tree is None else tree.layout.tree_mask
        if not in_graph:
            if tree_mask is None and hasattr(spec_info, "tree"):  # DDTREE's own input
                raise RuntimeError("DDTREE: an eager FlashMLA verify without the step's tree.")
            # No tree: a SGLang warm-up forward on DFLASH's dummy input, left to FlashMLA.
            backend.ddtree_verify = tree_mask is not None and FlashMLAVerifyMetadata(
                prefix_indptr, tree_mask.contiguous()
            )
            return
        buffers = getattr(backend, "_ddtree_graph_buffers", None)
        if buffers is None:
            buffers = backend._ddtree_graph_buffers = _GraphBuffers(backend)
        if tree_mask is not None:  # a replay's real requests (bs is padded; the rest keep theirs)
            buffers.tree_mask[: tree_mask.numel()].copy_(tree_mask.reshape(-1))
        backend.ddtree_verify = FlashMLAVerifyMetadata(  # the static slices the graph reads
            buffers.prefix_indptr[: bs + 1].copy_(prefix_indptr),
            buffers.tree_mask[: bs * w * w].view(bs, w, w),
        )

    @classmethod
    def forward_extend(cls, backend, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        """The prefix kernel reads the request's pages through the backend's block table. q:
        ``[n, Hq * 576]`` (absorbed MLA: latent 512 + rope 64); k: ``[n, 1, 576]``, v: ``[n,
        1, 512]``, the nodes' latent."""
        if kwargs or not cls.handles(backend, forward_batch) or not backend.ddtree_verify:
            return None
        from sglang_ddtree.core.tree_attention import gluon_prefix_runs, tree_attention

        announce(cls)
        pool = backend.token_to_kv_pool
        if k is not None and save_kv_cache:
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        state = backend.ddtree_verify
        bs = forward_batch.batch_size
        n = q.shape[0]
        w = n // bs
        hq, dv = layer.tp_q_head_num, backend.kv_lora_rank
        k_cache = pool.get_key_buffer(layer.layer_id)  # [slots, 1, 576]
        hkv, sms = k_cache.shape[1], num_sms(q.device)
        # The Gluon kernel where it runs (Hopper, bfloat16, Gluon's API importable), else Triton's.
        gluon = gluon_prefix_runs(q.device, k_cache.dtype) and q.dtype == k_cache.dtype
        settings = dict(launch(bs, w, hq, hkv, dv, sms, layer.head_dim, PAGE_SIZE, gluon))
        out = tree_attention(
            q.view(n, hq, layer.head_dim),
            k_cache,
            k_cache[..., :dv],
            state.prefix_indptr,
            backend.forward_metadata.block_kv_indices[:bs],
            forward_batch.out_cache_loc,
            state.tree_mask,
            layer.scaling,
            page_size=PAGE_SIZE,
            **settings,
        )
        return out.view(n, hq * dv)
