"""The KV commit of a DDTREE step, one glue segment: the accepted path's target KV moved to the
contiguous slots ``prefix ..`` and its drafter KV appended from the target's hidden states.

The target KV moves by ``core.kv_move_triton`` where the pool has SGLang's slot-row layout; any
other pool (MLA's, HND, a pool's own move) only SGLang's mover knows, so it runs there. The drafter
KV is DFLASH's append, on a workspace of the segment's own (`own_draft_kv_workspace`; in-tree
DFLASH's methods): DFLASH's prefill grows its helper's workspace by replacing its tensors, which a
captured KV graph bound to them would go on writing after they are freed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from types import SimpleNamespace

import torch

from sglang_ddtree.core.kv_move_triton import move_accepted_kv

logger = logging.getLogger(__name__)


def own_draft_kv_workspace(helper, rows: int):
    """The KV segment's own copy of DFLASH's fused drafter-KV materializer ``helper``: the same
    stacked weights, and a workspace of ``rows`` allocated now (in the worker's constructor,
    before SGLang sizes the KV pool) that nothing grows. None: no helper, no rows."""
    if helper is None or rows <= 0:
        return None
    own = copy.copy(helper)  # shares the weights
    own._workspace_capacity = 0  # so the next call allocates tensors of its own
    own._ensure_workspace(rows, helper.flat_kv_weight_t.dtype)
    return own


@contextlib.contextmanager
def kv_commit_workspace(dflash, own, own_rows: int, rows: int):
    """DFLASH's drafter-KV append of ``rows`` accepted-path rows on the segment's own helper
    ``own`` (sized for ``own_rows``) where they fit it, as every captured key does; an eager
    step above them appends through DFLASH's helper, whose growth no graph sees."""
    theirs = dflash._fused_kv_helper
    if own is None or theirs is None or rows > own_rows:
        yield
        return
    dflash._fused_kv_helper = own
    try:
        yield
    finally:
        if dflash._fused_kv_helper is own:  # DFLASH sets None if its fused path fails
            dflash._fused_kv_helper = theirs


class KVCommit:
    """The KV segment's function of each W (`fn`) over the pools of ``dflash`` (DFLASH's worker:
    the target's pools, the drafter-KV append), looked up at the first call: SGLang builds the
    pools after the worker. ``rows``: the accepted-path rows its own workspace holds."""

    def __init__(self, dflash, rows: int):
        self.dflash = dflash
        self.rows = rows
        self.helper = own_draft_kv_workspace(getattr(dflash, "_fused_kv_helper", None), rows)

    def fn(self, shape):
        """The segment's function at ``shape`` (a ``DDTreeShape``), by bound names."""
        w, s = shape.num_nodes, shape.accept_width
        depth_offsets = torch.arange(s, device=self.dflash.device)

        def kv_fn(hidden, keep_index, accept_length, commit_lens, verify_loc, seq_lens, pool_idx):
            # hidden [bs * W, H_aux], keep_index [bs, S], verify_loc [bs * W], the rest [bs].
            rows = self.target_kv_rows
            if rows is not None:
                move_accepted_kv(*rows[:2], keep_index, verify_loc, w, rows[2])
            else:  # SGLang's mover reads these four batch fields
                from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache

                runner = self.dflash.model_runner
                batch = SimpleNamespace(
                    seq_lens=seq_lens, out_cache_loc=verify_loc, req_pool_indices=pool_idx,
                    req_to_token_pool=runner.req_to_token_pool,
                )  # fmt: skip
                move_accept_tokens_to_target_kvcache(
                    batch, keep_index, accept_length, runner.token_to_kv_pool_allocator
                )
            bs = seq_lens.shape[0]
            cache_loc_2d = verify_loc.view(bs, w)[:, :s].contiguous()
            positions = (seq_lens.to(torch.int64)[:, None] + depth_offsets[None, :]).reshape(-1)
            with kv_commit_workspace(self.dflash, self.helper, self.rows, bs * s):
                self.dflash._append_target_hidden_to_draft_kv_by_loc(
                    target_hidden=hidden[keep_index.clamp(min=0).reshape(-1)],
                    cache_loc=cache_loc_2d.reshape(-1),
                    cache_loc_2d=cache_loc_2d,
                    positions=positions,
                    commit_lens=commit_lens,
                )

        return kv_fn

    @functools.cached_property
    def target_kv_rows(self) -> tuple | None:
        """``(data_ptrs, data_strides, max row bytes)`` of the target KV pool for
        `move_accepted_kv` where SGLang's mover would run its slot-row byte copy over the same
        buffers (the base MHA pool's ``move_kv_cache``, NHD, copy config, no native move); else
        None: SGLang's own mover runs (host metadata only)."""
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        pool = self.dflash.model_runner.token_to_kv_pool_allocator.get_kvcache()
        cls = type(pool)
        rows = None
        if (
            isinstance(pool, MHATokenToKVPool)
            and cls.move_kv_cache is MHATokenToKVPool.move_kv_cache
            and cls._move_kv_cache_impl is MHATokenToKVPool._move_kv_cache_impl
            and not getattr(pool, "use_hnd", False)
            and not getattr(pool, "use_native_move_kv_cache", False)
            and getattr(pool, "_kv_copy_config", None) is not None
            and getattr(pool, "layer_num", 0) > 0
        ):
            buffers = pool._slot_move_pointer_buffers()
            assert len(buffers) == pool.data_ptrs.numel() == pool.data_strides.numel()
            max_row = max(b[0].numel() * b.element_size() for b in buffers)
            rows = (pool.data_ptrs, pool.data_strides, int(max_row))
        elif self.dflash.tp_rank == 0:
            logger.info("DDTREE: SGLang's KV mover moves accepted rows (pool %s).", cls.__name__)
        return rows
