"""``VerifyAttentionBackend``: how the target's DDTREE verify attends on one of SGLang's
attention backends, and what the backends share.

Terms. A verify forward holds ``bs`` requests of ``W`` tree nodes each (root included), ``n =
bs * W`` query rows; request b's prefix is its ``P_b`` committed KV slots. The tree mask is the
``[bs, W, W]`` bool ancestor-or-self block (``spec_info.tree.layout.tree_mask``). SGLang's
FULL_MASK (``spec_info.custom_mask``, flat bool) holds it per request as ``W x (P_b + W)``, the
prefix columns all True. The split attention is ``core.tree_attention``: every node against its
prefix with no mask and against the tree block under the tree mask, merged by log-sum-exp.

A backend wraps one SGLang attention backend class. As this base class it is that class's own
custom-mask verify: the step builds the FULL_MASK, SGLang's kernel applies it. One that
``takes_verify`` replaces the kernel for a DDTREE target: the class's constructor decides once
(`takes_ddtree_verify`), its ``forward_extend`` hands each call to the backend's first, and
where the backend reads no FULL_MASK its metadata calls end in `init_forward_metadata` (in
SGLang's tree a line in each, in the plugin ``ddtree_attention_hook``).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

# Logged once per process when a verify takes the split (the e2e and in-tree checks look for it).
SPLIT_LOG_LINE = "tree-verify attention through core.tree_attention"
# The ServerArgs field of --speculative-ddtree-verify-attention (declared in ddtree_args).
VERIFY_FLAG = "speculative_ddtree_verify_attention"


class VerifyAttentionBackend:
    """One verify attention of the registry: what it runs on and serves (read by the startup
    checks, the step and the target's graph runner) and what it does in a verify forward (its
    class methods, called with the SGLang backend object where it ``takes_verify``)."""

    name: str  # its registry key, the value of --speculative-ddtree-verify-attention
    attention_backend: str  # the --attention-backend it verifies on
    backend_class: str  # that backend's class, dotted (in SGLang's layers/attention/)
    page_sizes: tuple[int, ...] | None = None  # the --page-size values it serves; None: any
    # The --kv-cache-dtype values it serves: the model's (every kernel reads unscaled KV).
    kv_cache_dtypes: tuple = (None, "auto", "bfloat16", "bf16")
    serves_mha = True
    serves_mla = False  # SGLang's absorbed MLA: one KV head of latent + rope, values the latent
    # The step hands the verify SGLang's FULL_MASK and the target's graphs capture with the
    # all-True one (a replay copies the step's in). False: the backend reads the tree mask of
    # spec_info.tree in `init_forward_metadata`, into buffers of its own.
    reads_full_mask = True
    takes_verify = False  # its `forward_extend` replaces the kernel for a DDTREE target

    @classmethod
    def unavailable_error(cls) -> str | None:
        """Why its SGLang backend cannot run on this machine, or None."""
        return None

    @classmethod
    def init_forward_metadata(cls, backend, forward_batch, in_graph: bool) -> None:
        """After ``backend``'s metadata call of a forward (eager), or of a CUDA-graph capture or
        replay (``in_graph``): the verify's own metadata, in static buffers where a graph reads
        them. No host sync. Here: none (SGLang's metadata is read as it is)."""

    @classmethod
    def forward_extend(cls, backend, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        """``[n, Hq * Dv]``: the verify's attention output (the nodes' KV saved first, as the
        backend's extend would), or None: ``backend``'s own kernel runs. q: ``[n, Hq * D]``; k,
        v: ``[n, Hkv, D]`` / ``[n, Hkv, Dv]``, the nodes' keys and values. Here: None."""
        return None


def takes_ddtree_verify(model_runner, verify: type[VerifyAttentionBackend]) -> bool:
    """Whether an attention backend built for ``model_runner`` hands its verifies to
    ``verify``: the target's model runner of a DDTREE server that did not name another verify
    attention. Decided once, when SGLang builds the backend (``backend.ddtree_takes_verify``);
    a backend of another algorithm, or the drafter's, never looks further at any call."""
    server_args = getattr(model_runner, "server_args", None)
    return bool(
        str(getattr(server_args, "speculative_algorithm", None)).upper() == "DDTREE"
        and not getattr(model_runner, "is_draft_worker", False)
        and getattr(server_args, VERIFY_FLAG, None) in (None, verify.name)
    )


_announced: list = []


def announce(verify: type[VerifyAttentionBackend]) -> None:
    """Once per process, at the first verify a split takes (not at the import)."""
    if not _announced:
        _announced.append(True)
        logger.info("DDTREE: %s (%s).", SPLIT_LOG_LINE, verify.name)


@functools.lru_cache(maxsize=1024)
def launch(*shape, **kw) -> tuple:
    """`core.tree_attention.launch_settings` of a verify shape, once per shape (every layer of
    a forward asks for the same): its items, for a fresh dict at each call."""
    from sglang_ddtree.core.tree_attention import launch_settings

    return tuple(launch_settings(*shape, **kw).items())


@functools.cache
def num_sms(device) -> int:
    import torch

    if device.type != "cuda":  # triton's interpreter (tests): no SMs to fill
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
