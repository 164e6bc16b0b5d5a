"""The target's tree-verify attention through ``core.tree_attention`` (the prefix part read once
for all nodes, the ancestor block, merged by log-sum-exp) instead of the triton backend's
custom-mask extend kernel. On by default; ``SGLANG_DDTREE_TREE_ATTENTION=0`` keeps the backend's
kernel (a value that is not a boolean stops the server's start with a message).

Whether a backend verifies DDTREE trees is decided once, when SGLang builds it
(`takes_ddtree_verify`: the target's backend of a DDTREE server). Such a backend's
``TritonAttnBackend.forward_extend`` hands every target verify to ``tree_verify_attention``
first, which takes it (a TARGET_VERIFY batch with a custom mask) and reads the backend's own
metadata: the prefix's ``kv_indptr`` / ``kv_indices``, the verify mask and its
``mask_indptr``, so a captured CUDA graph replays it with each step's values. MLA targets come through the same call: SGLang's absorbed MLA on
triton hands the backend queries and keys of the latent plus rope width over one KV head, and
the pool's value buffer is the key buffer's latent slice, which the kernels read through its
strides. The launch (value tiles, prefix shares) is ``launch_settings``'. Anything else
(the drafter's block, prefill, sinks, sliding windows, logit caps, scaled KV, key buffers
that are not slot rows) returns None and stays with the backend. The kernels address KV by
slot, so a paged pool (page size 16, 64) is read as it is: a page is a run of slots.

On ``--attention-backend flashmla`` (MLA targets, page size 64) the whole verify attention is
``core.tree_attention`` reading FlashMLA's pages through the backend's block table, its prefix
shares float32 until the merge (FlashMLA's own prefix part comes back rounded to the cache
dtype, which in bfloat16 moved the sampled law off the non-speculative server's). The prefix
offsets and the step's ancestor mask are set once per forward by the backend's metadata calls
(`set_flashmla_verify`), into static buffers where a CUDA graph replays (refreshed before each
replay), so every layer reads them as they are.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import torch

from sglang_ddtree.srt.ddtree_envs import envs

logger = logging.getLogger(__name__)

ENV = envs.SGLANG_DDTREE_TREE_ATTENTION.name
# Logged once per process when a verify takes the split (the e2e and in-tree checks look for it).
SPLIT_LOG_LINE = "tree-verify attention through core.tree_attention"


def enabled(environ=None) -> bool:
    """The switch; ValueError on a value that is not a boolean (refused at start by
    `env_error`)."""
    return envs.SGLANG_DDTREE_TREE_ATTENTION.get(environ)


@functools.cache
def _switch_on() -> bool:  # read once per process
    return enabled()


def env_error(environ=None) -> str | None:
    """The refusal of a switch value that is not a boolean (``validate_server_args`` raises
    it)."""
    try:
        enabled(environ)
    except ValueError as e:
        return str(e)
    return None


def flashmla_switch_error(verify_backend: str | None, environ=None) -> str | None:
    """`env_error`, and on flashmla the switch at 0 too: FlashMLA's own verify is a causal
    block with no tree mask, so there the split is the only tree verify."""
    error = env_error(environ)
    if error is None and verify_backend == "flashmla" and not enabled(environ):
        error = (
            f"{ENV}=0 keeps the backend's own verify kernel, and flashmla's applies no tree "
            f"mask; unset {ENV} (or pass --attention-backend triton)."
        )
    return error


def takes_ddtree_verify(model_runner) -> bool:
    """Whether an attention backend built for ``model_runner`` verifies DDTREE trees: the
    target's model runner of a DDTREE server, with the switch on. Decided once, when SGLang
    builds the backend (``backend.ddtree_takes_verify``); a backend of another algorithm, or
    the drafter's, never looks further at any call."""
    server_args = getattr(model_runner, "server_args", None)
    return bool(
        _switch_on()
        and str(getattr(server_args, "speculative_algorithm", None)).upper() == "DDTREE"
        and not getattr(model_runner, "is_draft_worker", False)
    )


# Where SGLang's wrapper backends hold the backends they run (hybrid, prefill / decode split,
# two-batch overlap).
_WRAPPED_BACKENDS = ("full_attn_backend", "prefill_backend", "decode_backend", "primary")


def missing_verify_hook(attn_backend, verify_backend: str | None) -> str | None:
    """The refusal when the target's attention backend on which DDTREE verifies (``triton`` or
    ``flashmla``, the split switched on) was built without deciding to take DDTREE's verifies:
    the construction hook did not run, so the verify would silently fall to the backend's own
    kernel (on flashmla, one without a tree mask). None when it did, or nothing needs it.
    ``attn_backend``: the model runner's, through SGLang's wrappers."""
    if verify_backend not in ("triton", "flashmla") or not _switch_on():
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
        f"DDTREE: the target's {verify_backend} attention backend was built without DDTREE's "
        "verify hook (were DDTREE's plugin hooks applied in this process before the model "
        "runner was built?); it would verify without the tree mask."
    )


def handles(backend, k, v, layer, forward_batch, kwargs) -> bool:
    """Whether ``tree_verify_attention`` takes this call: a target verify on a backend that
    `takes_ddtree_verify`, on a layout its kernels read (anything else stays with the
    backend)."""
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


_announced: list = []


@functools.lru_cache(maxsize=1024)
def _launch(*shape, **kw) -> tuple:
    """`core.tree_attention.launch_settings` of a verify shape, once per shape (every layer of
    a forward asks for the same): its items, for a fresh dict at each call."""
    from sglang_ddtree.core.tree_attention import launch_settings

    return tuple(launch_settings(*shape, **kw).items())


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
    from sglang_ddtree.core.tree_attention import is_latent_view, tree_attention

    if not _announced:  # once per process: the switch reached a verify, not only the import
        _announced.append(True)
        logger.info("DDTREE: %s (%s=0 keeps the backend's extend kernel).", SPLIT_LOG_LINE, ENV)
    pool = backend.token_to_kv_pool  # the backend's pool, as its own extend writes it
    if save_kv_cache:
        pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
    md = backend.forward_metadata
    n = q.shape[0]
    w = n // forward_batch.batch_size
    k_buffer = pool.get_key_buffer(layer.layer_id)
    v_buffer = pool.get_value_buffer(layer.layer_id)
    # MLA's pool hands out the latent as a view of the keys: the prefix kernel's latent variant
    # (a key tile loaded once for both products), as on flashmla's pages.
    latent_d = layer.qk_head_dim if is_latent_view(k_buffer, v_buffer) else 0
    settings = dict(
        _launch(  # from shapes: no host sync
            forward_batch.batch_size,
            w,
            layer.tp_q_head_num,
            k_buffer.shape[1],
            layer.v_head_dim,
            _num_sms(q.device),
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


# --- FlashMLA ---------------------------------------------------------------------------------
FLASHMLA_PAGE = 64  # the flashmla backend's page size (SGLang sets it for that backend)


class FlashMLAVerify(NamedTuple):
    """What every layer of one DDTREE verify on FlashMLA reads (`set_flashmla_verify`)."""

    prefix_indptr: torch.Tensor  # [bs + 1] int64, the committed prefixes' offsets
    tree_mask: torch.Tensor  # [bs, W, W] bool, ancestor-or-self


class _FlashMLAGraphBuffers:
    """Static tensors the captured verify graphs read, sized for the largest captured batch and
    W; refreshed before every replay."""

    def __init__(self, backend):
        device = backend.req_to_token.device
        max_bs = int(backend.cuda_graph_num_splits.shape[0]) - 1
        max_w = int(backend.num_draft_tokens)
        self.prefix_indptr = torch.zeros(max_bs + 1, dtype=torch.int64, device=device)
        # All True: rows of padded requests attend to every node, never to none.
        self.tree_mask = torch.ones(max_bs * max_w * max_w, dtype=torch.bool, device=device)


def flashmla_handles(backend, forward_batch) -> bool:
    """Whether the DDTREE split takes this FlashMLA call: a target verify (also its capture,
    whose dummy has no tree yet) on a backend that `takes_ddtree_verify`, on a 16-bit latent
    cache."""
    return (
        getattr(backend, "ddtree_takes_verify", False)
        and forward_batch.forward_mode.is_target_verify()
        and not backend.is_fp8_kvcache
        and backend.dcp_world_size == 1
    )


def set_flashmla_verify(backend, forward_batch, in_graph: bool) -> None:
    """Per verify forward that `flashmla_handles`, before its layers (eager) or before its
    replay (``in_graph``): the prefix offsets and the ancestor mask, onto
    ``backend.ddtree_verify``. No host sync: device copies. Any other forward: no-op."""
    if not flashmla_handles(backend, forward_batch):
        return
    bs = forward_batch.batch_size
    spec_info = forward_batch.spec_info
    w = int(spec_info.draft_token_num)
    # Once a forward, not once a layer.
    prefix_indptr = torch.nn.functional.pad(forward_batch.seq_lens[:bs].cumsum(0), (1, 0))
    tree = getattr(spec_info, "tree", None)  # None in the capture dummy
    tree_mask = None if tree is None else tree.layout.tree_mask
    if not in_graph:
        if tree_mask is None:
            raise RuntimeError("DDTREE: an eager FlashMLA verify without the step's tree.")
        backend.ddtree_verify = FlashMLAVerify(prefix_indptr, tree_mask.contiguous())
        return
    buffers = getattr(backend, "_ddtree_graph_buffers", None)
    if buffers is None:
        buffers = backend._ddtree_graph_buffers = _FlashMLAGraphBuffers(backend)
    if tree_mask is not None:  # a replay's real requests (bs is padded; the rest keep theirs)
        buffers.tree_mask[: tree_mask.numel()].copy_(tree_mask.reshape(-1))
    backend.ddtree_verify = FlashMLAVerify(
        buffers.prefix_indptr[: bs + 1].copy_(prefix_indptr),  # the static slice the graph reads
        buffers.tree_mask[: bs * w * w].view(bs, w, w),
    )


def flashmla_tree_verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache=True):
    """``[n, Hq * Dv]``: the verify attention on FlashMLA's paged latent cache by
    ``core.tree_attention`` (its prefix kernel reads the request's pages through the backend's
    block table, prefix shares float32 until the merge, as on triton), or None where
    `flashmla_handles` says no.

    q: ``[n = bs * W, Hq * 576]`` (absorbed MLA: latent 512 + rope 64); k: ``[n, 1, 576]``,
    v: ``[n, 1, 512]``, the nodes' latent."""
    if not flashmla_handles(backend, forward_batch):
        return None
    from sglang_ddtree.core.tree_attention import gluon_prefix_runs, tree_attention

    if not _announced:
        _announced.append(True)
        logger.info("DDTREE: %s, on FlashMLA's pages.", SPLIT_LOG_LINE)
    pool = backend.token_to_kv_pool
    if k is not None and save_kv_cache:
        pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
    state = backend.ddtree_verify
    bs = forward_batch.batch_size
    n = q.shape[0]
    w = n // bs
    hq, dv = layer.tp_q_head_num, backend.kv_lora_rank
    k_cache = pool.get_key_buffer(layer.layer_id)  # [slots, 1, 576]
    hkv, sms = k_cache.shape[1], _num_sms(q.device)
    # The Gluon kernel where it runs (Hopper, bfloat16, Gluon's API importable), else Triton's.
    gluon = gluon_prefix_runs(q.device, k_cache.dtype) and q.dtype == k_cache.dtype
    settings = dict(_launch(bs, w, hq, hkv, dv, sms, layer.head_dim, FLASHMLA_PAGE, gluon))
    out = tree_attention(
        q.view(n, hq, layer.head_dim),
        k_cache,
        k_cache[..., :dv],
        state.prefix_indptr,
        backend.forward_metadata.block_kv_indices[:bs],
        forward_batch.out_cache_loc,
        state.tree_mask,
        layer.scaling,
        page_size=FLASHMLA_PAGE,
        **settings,
    )
    return out.view(n, hq * dv)
