"""``DDTreeWorkerV2``: the DDTREE speculative worker for SGLang 0.5.17 (spec v2, overlap-safe).

DFLASH's worker with the decode step replaced by DDTREE's (``ddtree_step.DDTreeStep``). The
worker is SGLang's adapter: it builds the step from the server args (the budget schedule's
shapes, the glue graphs' pool and stream, the penalty state, the KV commit's workspace), hands
it each decode batch and returns its result as SGLang's ``GenerationBatchResult``. The target
verify's graphs are one set per W of the budget schedule (``ddtree_cuda_graph_runner``); the
glue graphs are captured at startup (``ddtree_glue_warmup``).

Prefill and idle batches are DFLASH's, unchanged. The parent class is built with a copy of the
server args whose ``speculative_num_draft_tokens`` is B, so every DFLASH internal (block buffers,
draft spec info, KV helper bounds) sees the drafter block.
"""

from __future__ import annotations

import copy
import logging

import torch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.runtime_context import get_exec
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import is_dflash_sampling_verify_available
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from sglang_ddtree.srt import ddtree_requests as requests
from sglang_ddtree.srt.ddtree_args import (
    TOPK_FLAG,
    DDTreeShape,
    check_target,
    format_errors,
    read_topk,
    top_p_kernel_unavailable,
)
from sglang_ddtree.srt.ddtree_attention.attention_registry import (
    missing_verify_hook,
    verify_backend_of,
)
from sglang_ddtree.srt.ddtree_budget import BudgetSchedule, schedule_from_args
from sglang_ddtree.srt.ddtree_cuda_graph_runner import install_target_graph_runner
from sglang_ddtree.srt.ddtree_glue_warmup import GlueReserve, capture_glue_at_startup, draft_kv_rows
from sglang_ddtree.srt.ddtree_kv_commit import KVCommit
from sglang_ddtree.srt.ddtree_logprobs import prefill_with_logprobs
from sglang_ddtree.srt.ddtree_penalties import PenaltyRows
from sglang_ddtree.srt.ddtree_step import DDTreeStep

logger = logging.getLogger(__name__)


class GraphStats:
    """Per-W counts of target-verify steps replayed from a CUDA graph or run eagerly.

    ``eager_with_graph`` counts eager steps whose bs had a captured graph: a silent loss of CUDA
    graphs (each one is also logged once per (W, bs)). Host ints only.
    """

    def __init__(self, schedule: BudgetSchedule):
        self.schedule = str(schedule)
        self.by_width: dict[int, dict] = {}
        self.runner = None  # the target's graph runner, for its capture plan in `as_dict`
        self.startup: dict = {}  # the glue capture at startup (ddtree_glue_warmup), when it ran
        self.glue_segments: list = []  # glue_graph.SegmentGraphs of the worker, for their counts
        self._warned: set[tuple[int, int]] = set()

    def record(self, width: int, bs: int, ran_graph: bool, had_graph: bool) -> None:
        row = self.by_width.setdefault(
            width, {"graph": 0, "eager": 0, "eager_with_graph": 0, "bs_seen": []}
        )
        row["graph" if ran_graph else "eager"] += 1
        if bs not in row["bs_seen"]:
            row["bs_seen"] = sorted(row["bs_seen"] + [bs])
        if had_graph and not ran_graph:
            row["eager_with_graph"] += 1
            if (width, bs) not in self._warned:
                self._warned.add((width, bs))
                logger.warning(
                    "DDTREE: target verify at bs=%d, W=%d ran EAGERLY although a CUDA graph was "
                    "captured for it.",
                    bs,
                    width,
                )

    def as_dict(self) -> dict:
        by_width = {str(w): r for w, r in sorted(self.by_width.items())}
        glue = {seg.name: dict(seg.counts) for seg in self.glue_segments}
        out = {"schedule": self.schedule, "by_width": by_width, "glue": glue}
        if self.runner is not None and hasattr(self.runner, "capture_plan"):
            out["capture_plan"] = {str(w): sizes for w, sizes in self.runner.capture_plan}
            out["width_mismatches"] = self.runner.width_mismatches
        return {**out, "startup": self.startup} if self.startup else out


def keep_draft_embeds_dtype(draft_model, dtype: torch.dtype) -> None:
    """SGLang 0.5.17's eager extend forward casts ``input_embeds`` to bfloat16 whatever the
    model's dtype (``ModelRunner._extend_forward_kwargs``), and the drafter's block forward runs
    eagerly above the captured batch sizes: a float16 or float32 drafter would then get bfloat16
    activations into its first projection. A pre-hook on the first layer casts them back. It is
    a no-op for bfloat16 models and is never called by a graph replay. Only the drafter's
    proposals see the bfloat16 rounding; the verify is unchanged."""

    def cast(_layer, args):
        positions, hidden, *rest = args
        if hidden.dtype == dtype:
            return None
        return (positions, hidden.to(dtype), *rest)

    draft_model.layers[0].register_forward_pre_hook(cast)


class DDTreeWorkerV2(DFlashWorkerV2):
    """DFLASH's worker with the decode step replaced by DDTREE's (``ddtree_step``)."""

    # kw: nccl_port, and SGLang 0.5.17's parallel state ps (later schedulers pass none).
    def __init__(self, server_args, gpu_id, target_worker, **kw):
        block = server_args.speculative_dflash_block_size
        if block is None:
            raise RuntimeError("DDTREE: speculative_dflash_block_size was not resolved.")
        schedule = schedule_from_args(server_args)
        topk = read_topk(flag=getattr(server_args, TOPK_FLAG, None))
        shapes = {
            w: DDTreeShape(num_nodes=w, block_size=int(block), topk=topk)
            for w in sorted(set(schedule.num_nodes))
        }
        shape = shapes[schedule.max_num_nodes]
        # Before super(): the target's verify graphs are captured after this constructor.
        install_target_graph_runner(target_worker.model_runner)
        parent_args = copy.deepcopy(server_args)
        parent_args.override("ddtree.drafter_block", speculative_num_draft_tokens=shape.block_size)
        super().__init__(parent_args, gpu_id, target_worker=target_worker, **kw)
        self.budget_schedule = schedule
        self.ddtree_shapes = shapes
        self.ddtree_shape = shape  # the largest W: idle results, startup log
        self._check_supported()
        from sglang.srt.distributed import get_tp_group

        tp_group = get_tp_group()
        self.tp_size, self.tp_rank = int(tp_group.world_size), int(tp_group.rank_in_group)
        # The verify coins come from a generator of their own, seeded alike on every rank and
        # drawn in the same order: under tensor parallelism every rank takes the same sampled
        # decisions (the step's rank check makes any disagreement loud).
        coin_generator = torch.Generator(device=self.device)
        coin_generator.manual_seed(int(getattr(server_args, "random_seed", 0) or 0))
        vocab = int(self.model_runner.model_config.vocab_size)
        from sglang_ddtree.core.topp_radix import load_kernel

        try:  # built now: with the glue graphs off no warm-up runs it
            load_kernel()
        except Exception as e:
            raise top_p_kernel_unavailable(e) from e
        self.graph_stats = GraphStats(schedule)
        # Before SGLang sizes the KV pool, so the pool is sized around it: the request pool has
        # at most max_running_requests + 1 rows (ReqToTokenPool's padding row).
        self._penalty_rows = PenaltyRows(
            rows=int(server_args.max_running_requests) + 1, vocab=vocab, device=self.device
        )
        # One memory pool and one capture stream for every glue graph: they replay one at a
        # time on one stream. On exactly when SGLang's graphs are: their outputs are the glue
        # graphs' bound inputs.
        glue_on = get_exec().graph.cuda_graph_config.decode.backend != Backend.DISABLED
        self._glue_on = glue_on
        share = (
            {"pool": torch.cuda.graph_pool_handle(), "stream": torch.cuda.Stream()}
            if glue_on
            else {}
        )
        self.glue_stream = share.get("stream")  # also the glue memory measure's (GlueReserve)
        max_graph_bs = _max_graph_bs(server_args)
        kv_rows = draft_kv_rows(schedule, shapes, max_graph_bs) if glue_on else 0
        self.ddtree_step = DDTreeStep.for_worker(
            self, shapes, schedule, coin_generator, KVCommit(self, kv_rows), glue_on, share,
            penalty_rows=self._penalty_rows, graph_stats=self.graph_stats,
            tp_group=tp_group if self.tp_size > 1 else None,
        )  # fmt: skip
        self.graph_stats.glue_segments = [
            seg for named in self.ddtree_step.segments.values() for seg in named.values()
        ]
        keep_draft_embeds_dtype(self.draft_model_runner.model, self.draft_model_runner.dtype)
        # Held while SGLang sizes the KV pool (after this constructor); handed back to the glue
        # graphs in init_cuda_graphs.
        self.glue_reserve = GlueReserve(self, max_graph_bs) if glue_on else None
        requests.set_active(True, vocab)
        if self.tp_rank == 0:
            candidates = {w: self.ddtree_step.candidates(w) for w in shapes}
            logger.info(
                "DDTREE worker ready: budget schedule %s (bs:W nodes/request), B=%d, "
                "depth<=%d, K=%s (%s top-K), S=%d, glue CUDA graphs %s, penalty state %.3f GiB",
                schedule,
                shape.block_size,
                shape.max_depth,
                {w: k for w, (k, _) in candidates.items()},
                {w: backend for w, (_, backend) in candidates.items()},
                shape.accept_width,
                "on" if glue_on else "off",
                self._penalty_rows.nbytes() / 2**30,
            )

    def init_attention_backends(self):
        """DFLASH's, then a check that the target's backend (built just before, by the target
        worker) takes DDTREE's verifies: a refusal at startup, not a silent verify without the
        tree mask."""
        super().init_attention_backends()
        error = missing_verify_hook(
            self.model_runner.attn_backend, verify_backend_of(self.model_runner)
        )
        if error is not None:
            raise RuntimeError(error)

    def init_cuda_graphs(self):
        """DFLASH's drafter graphs (the target's are captured before this), then every glue
        graph (``ddtree_glue_warmup``)."""
        super().init_cuda_graphs()
        if self.glue_reserve is not None:
            self.glue_reserve.release()
        if self._glue_on:
            capture_glue_at_startup(self)

    def _check_supported(self) -> None:
        from sglang.srt.configs.hybrid_arch import mambaish_config

        if mambaish_config(self.model_runner.model_config) is not None:
            raise ValueError("DDTREE does not support hybrid (Mamba/linear-attention) targets.")
        arch = getattr(self.model_runner.model_config, "attention_arch", None)
        from sglang.srt.configs.model_config import AttentionArch

        # AttentionArch is an IntEnum: compared by value (its str() is the number).
        errors = check_target(
            self.model_runner.server_args,
            is_mla=arch == AttentionArch.MLA,
            kv_dtype=self.model_runner.kv_cache_dtype,
        )
        if errors:
            raise ValueError(format_errors(errors))
        if not is_dflash_sampling_verify_available():
            raise RuntimeError(
                "DDTREE needs sgl_kernel.tree_speculative_sampling_target_only (CUDA build)."
            )

    # The drafter's greedy in-graph head is DFLASH's; DDTREE needs top-K log-probs instead.
    def _maybe_build_draft_sampler(self):
        return None

    def _validate_phase1_sampling_support(self, batch) -> None:
        return None  # availability is checked at startup; no silent greedy fallback

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        is_decode = not (
            batch.forward_mode.is_extend()
            or batch.is_extend_in_batch
            or batch.forward_mode.is_idle()
        )
        if not is_decode or batch.spec_info is None:
            if getattr(batch, "return_logprob", False):  # DFLASH refuses them at its door
                dflash = super().forward_batch_generation
                result = prefill_with_logprobs(
                    lambda b: dflash(b, on_publish, grammar_barrier), self.target_worker, batch
                )
            else:
                result = super().forward_batch_generation(batch, on_publish, grammar_barrier)
            if batch.forward_mode.is_idle():
                result.speculative_num_draft_tokens = self.ddtree_shape.accept_width
            elif not is_decode and batch.reqs:  # a prefill: its rows restart
                self._reset_penalty_rows(batch, result.next_token_ids)
            return result
        if not isinstance(batch.spec_info, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch.")
        return self._decode_step(batch, on_publish, grammar_barrier)

    def _reset_penalty_rows(self, batch, first_tokens: torch.Tensor) -> None:
        """A prefill: its requests' penalty rows restart (``ddtree_penalties``)."""
        self._penalty_rows.reset([r.req_pool_idx for r in batch.reqs], batch.reqs, first_tokens)

    def _decode_step(self, batch, on_publish, grammar_barrier=None) -> GenerationBatchResult:
        """The step's result (``DDTreeStep.run``) as SGLang's, with DFLASH's next draft input."""
        out = self.ddtree_step.run(batch, on_publish, grammar_barrier)
        return GenerationBatchResult(
            logits_output=out.logits_output,
            next_token_ids=out.next_token_ids,
            accept_lens=out.accept_lens,
            can_run_cuda_graph=out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(
                bonus_tokens=out.bonus, new_seq_lens=out.new_seq_lens
            ),
            speculative_num_draft_tokens=out.accept_width,
            new_seq_lens=out.new_seq_lens,
        )


def _max_graph_bs(server_args) -> int:
    """The largest decode batch size SGLang may capture graphs for (its capture list before
    the KV pool clamps it): glue graphs exist only up to there."""
    decode = getattr(getattr(server_args, "cuda_graph_config", None), "decode", None)
    sizes = list(getattr(decode, "bs", None) or [])
    return max(sizes) if sizes else int(getattr(decode, "max_bs", 0) or 0)
