"""``DDTreeWorkerV2``: the DDTREE speculative worker for SGLang 0.5.17 (spec v2, overlap-safe).

One decode step, per batch (bs requests, W = budget + 1 tree nodes each, B = drafter block,
S = max depth + 1), all on device with no host synchronization:

1. Draft: DFLASH's block forward ``[root, MASK x (B-1)]`` (captured drafter graph), then the
   target LM head over the B-1 masked slots and a per-depth top-K (log-probs).
2. Tree: ``core.build_tree_from_candidates`` (the W-1 most probable draft prefixes) and
   ``core.tree_to_retrieve_arrays`` (sibling arrays, positions = prefix + depth, ancestor mask).
3. Verify: the W nodes of each request go through the target in TARGET_VERIFY mode with the
   tree mask (FULL_MASK layout), KV written to ``req_to_token[prefix : prefix + W]``.
4. Accept per request: greedy rows through ``core.accept_greedy``, sampled rows (temperature,
   top-k, top-p per request) through ``core.accept_sampled``; one ``core.commit_accepted``.
   Constrained requests (json_schema, regex, ebnf, structural_tag) first get every node's
   grammar mask on the verify logits, from SGLang's own machinery over the tree's
   first-child / next-sibling arrays (``GrammarTree``, ``build_grammar_vocab_mask``; the
   arrays read as NumPy, `HostArrayGrammarTree`); the scheduler advances each request's
   matcher over the committed path. Only such batches wait on the host for the tree (the mask
   is built there, during the target forward).
5. Commit: accepted target KV moved to contiguous slots ``prefix ..``; the drafter KV of the
   accepted path rebuilt from the target hidden states; outputs and the next draft input.

W follows the running batch size: ``budget_schedule.num_nodes_for(bs)`` (a host int, from
``len(batch.seq_lens)``) picks the step's `DDTreeShape` (``ddtree_budget``); the target verify
replays that bucket's CUDA graphs (``ddtree_cuda_graph_runner``). Eager verify steps that had a
graph are counted and logged (``graph_stats``).

Glue CUDA graphs: steps 1-2 after the drafter forward (``core.step.draft_to_tree``), step 4
(``core.step.accept_and_commit``) and step 5 (KV moves + drafter-KV append) are each captured
per (bs, W), step 4 also per sampling mode, and replayed (``ddtree_glue_graph.SegmentGraphs``),
so a step is five graph replays (two SGLang forwards, three glue segments) plus a few launches
instead of ~100 eager kernels around two replays. Each W's segments and the coins' generator are
one ``ddtree_utils.StepGlue``, which this worker and the startup capture
(``ddtree_glue_warmup``) drive. Outputs that outlive the step are cloned.

Tensor parallelism: step 2 splits around one all-gather (each rank's draft top-K over its
vocabulary rows of the LM head, then the same merge and tree on every rank), the verify coins
come from a generator seeded alike on every rank, and one fingerprint all-reduce per step stops
the server (device assert) if ranks ever built different trees or paths.

Prefill and idle batches are DFLASH's, unchanged. The parent class is built with a copy of the
server args whose ``speculative_num_draft_tokens`` is B, so every DFLASH internal (block
buffers, draft spec info, KV helper bounds) sees the drafter block.
"""

from __future__ import annotations

import copy
import functools
import logging
import os

import torch
from sglang.kernels.ops.speculative.dflash import _prepare_dflash_draft_block_unchecked
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import (
    apply_dflash_verify_logits_adjustments,
    is_dflash_sampling_verify_available,
    resolve_dflash_verify_mask_policy,
)
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

from sglang_ddtree.core.commit import CommitPlan
from sglang_ddtree.core.penalties import apply_tree_penalties
from sglang_ddtree.core.step import TreeStep
from sglang_ddtree.srt import ddtree_requests as requests
from sglang_ddtree.srt.ddtree_args import (
    TOPK_FLAG,
    DDTreeShape,
    check_target,
    draft_topk_backend,
    format_errors,
    read_topk,
    target_verify_backend,
    top_p_kernel_unavailable,
    verify_backend_name,
)
from sglang_ddtree.srt.ddtree_attention import missing_verify_hook
from sglang_ddtree.srt.ddtree_budget import BudgetSchedule, read_schedule_env
from sglang_ddtree.srt.ddtree_cuda_graph_runner import install_target_graph_runner
from sglang_ddtree.srt.ddtree_glue_graph import SegmentGraphs, padded_size
from sglang_ddtree.srt.ddtree_glue_warmup import GlueReserve, capture_glue_at_startup, draft_kv_rows
from sglang_ddtree.srt.ddtree_info import DDTreeVerifyInput
from sglang_ddtree.srt.ddtree_kv_commit import KVCommit
from sglang_ddtree.srt.ddtree_logprobs import prefill_with_logprobs, write_step_logprobs
from sglang_ddtree.srt.ddtree_penalties import PenaltyRows
from sglang_ddtree.srt.ddtree_utils import (
    HostArrayGrammarTree,
    StepGlue,
    accept_output_group,
    make_accept_fn,
    make_tree_fns,
    rank_fingerprint,
    ranks_agree,
)

logger = logging.getLogger(__name__)


def schedule_from_args(server_args) -> BudgetSchedule:
    """The schedule resolved by ``DDTreeSpecAlgo.handle_server_args`` in the launcher process.

    It travels as the private ``_ddtree_budget_schedule`` of the pickled args; if that was lost,
    the env var (inherited by the scheduler process) or else the fixed W is used.
    """
    text = getattr(server_args, "_ddtree_budget_schedule", None)
    nodes = int(server_args.speculative_num_draft_tokens)
    if text:
        schedule = BudgetSchedule.parse(text)
    else:
        schedule = read_schedule_env(os.environ) or BudgetSchedule.fixed(nodes)
        logger.warning("DDTREE: no resolved budget schedule on the server args; using %s", schedule)
    if schedule.max_num_nodes != nodes:
        raise RuntimeError(
            f"DDTREE: budget schedule {schedule} has largest W {schedule.max_num_nodes} but "
            f"speculative_num_draft_tokens is {nodes}; they must agree."
        )
    return schedule


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
    """DFLASH's worker with the decode step replaced by draft tree -> tree verify -> accept."""

    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker):
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
        install_target_graph_runner(target_worker.model_runner, schedule)
        parent_args = copy.deepcopy(server_args)
        parent_args.override("ddtree.drafter_block", speculative_num_draft_tokens=shape.block_size)
        super().__init__(parent_args, gpu_id, ps, nccl_port, target_worker)
        self.budget_schedule = schedule
        self.ddtree_shapes = shapes
        self.ddtree_shape = shape  # the largest W: idle results, startup log
        self._check_supported()
        from sglang.srt.distributed import get_tp_group

        self._tp_group = get_tp_group()
        self.tp_size = int(self._tp_group.world_size)
        # The verify coins come from a generator of their own, seeded alike on every rank and
        # drawn in the same order: under tensor parallelism every rank takes the same sampled
        # decisions (a check in `_check_ranks_agree` makes any disagreement loud).
        self._coin_generator = torch.Generator(device=self.device)
        self._coin_generator.manual_seed(int(getattr(server_args, "random_seed", 0) or 0))
        vocab = int(self.model_runner.model_config.vocab_size)
        from sglang_ddtree.core.topp_radix import load_kernel

        try:  # built now: with the glue graphs off no warm-up runs it
            load_kernel()
        except Exception as e:
            raise top_p_kernel_unavailable(e) from e
        self._topk = {w: s.candidates_per_depth(vocab) for w, s in shapes.items()}
        # Per W, by K and vocabulary (ddtree_args.draft_topk_backend).
        self._draft_topk = {w: draft_topk_backend(k, vocab) for w, k in self._topk.items()}
        self.graph_stats = GraphStats(schedule)
        # One memory pool and one capture stream for every glue graph: they replay one at a
        # time on one stream. On exactly when SGLang's graphs are: their outputs are the glue
        # graphs' bound inputs.
        glue_on = not server_args.disable_cuda_graph
        self._glue_rows: dict[int, int | None] = {}  # `glue_rows` by batch size
        self._glue_on = glue_on
        share = (
            {"pool": torch.cuda.graph_pool_handle(), "stream": torch.cuda.Stream()}
            if glue_on
            else {}
        )
        self.glue_stream = share.get("stream")  # also the glue memory measure's (GlueReserve)
        # Before SGLang sizes the KV pool, so the pool is sized around it: the request pool has
        # at most max_running_requests + 1 rows (ReqToTokenPool's padding row).
        self._penalty_rows = PenaltyRows(
            rows=int(server_args.max_running_requests) + 1, vocab=vocab, device=self.device
        )
        max_graph_bs = _max_graph_bs(server_args)
        kv_rows = draft_kv_rows(schedule, shapes, max_graph_bs) if glue_on else 0
        self._kv_commit = KVCommit(self, kv_rows)
        self.step_glue = {w: self._build_glue(s, glue_on, share) for w, s in shapes.items()}
        self.graph_stats.glue_segments = [
            seg for g in self.step_glue.values() for seg in g.segments.values()
        ]
        keep_draft_embeds_dtype(self.draft_model_runner.model, self.draft_model_runner.dtype)
        # Held while SGLang sizes the KV pool (after this constructor); handed back to the glue
        # graphs in init_cuda_graphs.
        self.glue_reserve = GlueReserve(self, max_graph_bs) if glue_on else None
        requests.set_active(True)
        if self.ps.tp_rank == 0:
            logger.info(
                "DDTREE worker ready: budget schedule %s (bs:W nodes/request), B=%d, "
                "depth<=%d, K=%s (%s top-K), S=%d, glue CUDA graphs %s, penalty state %.3f GiB",
                schedule,
                shape.block_size,
                shape.max_depth,
                {w: k for w, k in self._topk.items()},
                self._draft_topk,
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
            self.model_runner.attn_backend, target_verify_backend(self.model_runner.server_args)
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

    @functools.cached_property
    def verify_full_mask(self) -> bool:
        """Whether the target's verify reads SGLang's FULL_MASK (triton, flashinfer) or the
        tree's own ``[bs, W, W]`` mask (flashmla, DDTREE's split). Asked at the first verify:
        the target's backend object is built after the worker."""
        name, _ = resolve_dflash_verify_mask_policy(self.model_runner.attn_backend)
        return verify_backend_name(name, self.model_runner.server_args) != "flashmla"

    @functools.cached_property
    def _verify_mask_capacity(self) -> int | None:
        """Cells of the target backend's static verify-mask buffer, which a graph replay copies
        the step's FULL_MASK into (None: the backend keeps none)."""
        buffer = getattr(
            getattr(self.model_runner.attn_backend, "verify_mask", None), "buffer", None
        )
        return None if buffer is None else int(buffer.numel())

    def shape_for(self, bs: int) -> DDTreeShape:
        """The step shape for ``bs`` requests (host int; no device read)."""
        return self.ddtree_shapes[self.budget_schedule.num_nodes_for(bs)]

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

    # ------------------------------------------------------------------------------------------
    # Request penalties (srt/ddtree_penalties.py): state per request-pool row, written at every
    # prefill.
    def _reset_penalty_rows(self, batch, first_tokens: torch.Tensor) -> None:
        self._penalty_rows.reset([r.req_pool_idx for r in batch.reqs], batch.reqs, first_tokens)

    def _penalized(self, batch) -> bool:
        """Whether any request of the batch has a penalty (host: a set lookup per request)."""
        penalized = self._penalty_rows.penalized
        return bool(penalized) and any(r.req_pool_idx in penalized for r in batch.reqs)

    def _apply_penalties(self, logits, tree: TreeStep, batch, sampling_info):
        """Each node's penalties (`core.penalties`), then ``logit_bias``, in place on the verify
        logits ``[bs * W, V]``; SGLang's own speculative penalty (one linear term for every
        node) is not applied on top. Returns the rows' state it read (the step's count after
        the accept starts from it)."""
        bs, w = tree.tokens.shape
        if logits.shape[-1] != self._penalty_rows.vocab:
            raise RuntimeError(
                f"DDTREE penalties: logits of {logits.shape[-1]} tokens, state of "
                f"{self._penalty_rows.vocab}."
            )
        rows = logits.view(bs, w, -1)
        state = self._penalty_rows.gather(
            batch.req_pool_indices, [r.req_pool_idx for r in batch.reqs]
        )
        apply_tree_penalties(rows, tree.tokens, tree.layout.tree_mask, state, inplace=True)
        bias = getattr(sampling_info, "logit_bias", None)
        if bias is not None:
            rows.add_(bias[:, None, :].to(rows.dtype))
        return state

    def _write_step_logprobs(self, logits_output, logits, commit, batch, sampling_info) -> None:
        """The committed tokens' logprobs, as the non-speculative server reports them, from the
        processed verify logits (`ddtree_logprobs.write_step_logprobs`)."""
        from sglang.srt.layers.sampler import SGLANG_RETURN_ORIGINAL_LOGPROB

        write_step_logprobs(
            logits_output,
            logits,
            commit.keep_nodes,
            commit.next_token_ids,
            sampling_info.temperatures,
            bool(sampling_info.is_all_greedy),
            getattr(batch, "top_logprobs_nums", None),
            getattr(batch, "token_ids_logprobs", None),
            before_temperature=bool(SGLANG_RETURN_ORIGINAL_LOGPROB),
        )

    # ------------------------------------------------------------------------------------------
    def host_seq_lens(self, batch, draft_input, extra: int):
        """Host upper bound of the KV length seen by a forward: committed + ``extra``.

        Returns (seq_lens_cpu [bs] int32 CPU tensor, sum). Uses the host copies the scheduler
        keeps; never reads the device.
        """
        if batch.seq_lens_cpu is not None:
            lens = batch.seq_lens_cpu.to(torch.int32) + extra
            return lens, int(lens.sum())
        if draft_input.reserved_seq_lens_cpu is not None:
            return draft_input.reserved_seq_lens_cpu, int(draft_input.reserved_seq_lens_sum)
        raise RuntimeError("DDTREE needs host sequence lengths (seq_lens_cpu) for the verify.")

    def _draft_hidden(self, batch, draft_input, bs: int, shape: DDTreeShape) -> torch.Tensor:
        """Drafter block forward ``[root, MASK x D]``: hidden states [bs * B, H]."""
        block = shape.block_size
        target_model = self.target_worker.model_runner.model
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions_2d = self._draft_block_positions_buf[:bs]
        cache_loc_2d = self._draft_verify_out_cache_loc_buf[:bs]
        _prepare_dflash_draft_block_unchecked(
            bonus_tokens=draft_input.bonus_tokens.view(-1),
            prefix_lens=batch.seq_lens.view(-1),
            req_pool_indices=batch.req_pool_indices.view(-1),
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            block_ids_out=block_ids,
            positions_out=positions_2d,
            cache_loc_out=cache_loc_2d,
            mask_token_id=int(self._mask_token_id),
        )
        embeds = target_model.get_input_embeddings()(block_ids)
        seq_lens_cpu, seq_lens_sum = self.host_seq_lens(batch, draft_input, block)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=cache_loc_2d.reshape(-1),
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=positions_2d.reshape(-1),
            input_embeds=embeds.view(-1, embeds.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )
        with torch.inference_mode():
            draft_out = self.draft_model_runner.forward(forward_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the drafter returned no hidden states.")
        return hidden

    def draft_tree(self, batch, draft_input, bs: int, key, rows: int | None = None) -> TreeStep:
        """Phases 1-2 of a decode step, also the startup capture's: the drafter's block (SGLang's
        graph) and the draft tree with the verify's inputs (the glue graph at ``key``; None:
        eager; ``rows``: `glue_rows`). ``batch``: the step's ``seq_lens``, ``req_pool_indices``
        and host lengths."""
        shape = self.shape_for(bs)
        hidden = self._draft_hidden(batch, draft_input, bs, shape)
        return self.step_glue[shape.num_nodes].draft_tree(
            key, hidden, draft_input.bonus_tokens, batch.seq_lens, batch.req_pool_indices, rows
        )

    def glue_rows(self, bs: int) -> int | None:
        """The padded batch size the step's tree and accept glue run at: the captured size
        SGLang pads a verify of ``bs`` requests to, where it pads the drafter's block to the same
        (the padded rows of both forwards are then this step's, computed from SGLang's fill
        values); else None (the real size, as the KV commit always runs)."""
        if bs not in self._glue_rows:  # once per batch size: the capture lists are fixed
            target = padded_size(self.model_runner.decode_cuda_graph_runner, bs)
            runner = getattr(self.draft_model_runner, "decode_cuda_graph_runner", None)
            draft = padded_size(runner, bs)
            ok = target is not None and target == draft and target > bs
            self._glue_rows[bs] = target if ok else None
        return self._glue_rows[bs]

    # ------------------------------------------------------------------------------------------
    # Glue segments (captured per key by glue_graph.SegmentGraphs; see core/step.py).
    def tree_fns(self, shape: DDTreeShape, lm_head, req_to_token) -> dict:
        """The draft-tree segment functions at ``shape`` (`make_tree_fns`) with this worker's
        top-K choices; ``lm_head`` / ``req_to_token``: callables returning the [V, H] LM head
        and the request-to-token table (the model's and the pool's, or the startup measure's
        placeholders). Tensor parallel: this rank's vocabulary rows of the LM head give its
        candidates (the "shard" segment); an all-gather between the two segments; every rank
        merges the same gathered tensor into the same tree."""
        w = shape.num_nodes
        return make_tree_fns(
            shape,
            int(self.model_runner.model_config.vocab_size),
            self._topk[w],
            self._draft_topk[w],
            lm_head=lm_head,
            req_to_token=req_to_token,
            lm_head_shard=self._lm_head_shard if self.tp_size > 1 else None,
        )

    def accept_fn(self, shape: DDTreeShape):
        """The accept segment's function at ``shape`` (`make_accept_fn`)."""
        return make_accept_fn(shape.accept_width)

    def _build_glue(self, shape: DDTreeShape, enabled: bool, share) -> StepGlue:
        w = shape.num_nodes
        vocab = int(self.model_runner.model_config.vocab_size)
        tree_fns = self.tree_fns(
            shape,
            lm_head=lambda: self.target_worker.model_runner.model.lm_head.weight[:vocab],
            req_to_token=lambda: self.model_runner.req_to_token_pool.req_to_token,
        )
        accept_fn = self.accept_fn(shape)
        glue = {
            name: SegmentGraphs(f"{name}_w{w}", fn, enabled=enabled, **share)
            for name, fn in tree_fns.items()
        }
        # Every accept mode of a batch size writes one set of outputs: the KV segment that
        # binds them is then one graph per batch size, not one per mode.
        glue["accept"] = SegmentGraphs(
            f"accept_w{w}", accept_fn, enabled=enabled, outputs_by=accept_output_group, **share
        )
        kv_fn = self._kv_commit.fn(shape)
        glue["kv"] = SegmentGraphs(f"kv_w{w}", kv_fn, enabled=enabled, pure=False, **share)
        gather = self._gather_candidates if self.tp_size > 1 else None
        return StepGlue(glue, self._coin_generator, gather)

    def _lm_head_shard(self) -> tuple[torch.Tensor, int]:
        """This rank's rows of the target LM head that are real tokens, and the global id of
        the first: ``([V_shard, H], start)``."""
        lm_head = self.target_worker.model_runner.model.lm_head
        shard = getattr(lm_head, "shard_indices", None)
        if shard is None or int(getattr(shard, "num_added_elements", 0)) != 0:
            raise RuntimeError("DDTREE under tensor parallelism needs a vocab-parallel LM head.")
        return lm_head.weight[: int(shard.num_org_elements)], int(shard.org_vocab_start_index)

    def _gather_candidates(self, packed: torch.Tensor) -> torch.Tensor:
        """Tensor parallel: every rank's draft candidates (``[tp, ...]``), all-gathered eagerly
        between the shard and tree segments; every rank then builds the same tree."""
        gathered = packed.new_empty((self.tp_size, *packed.shape))
        self._tp_group.all_gather_into_tensor(gathered.view(-1), packed.contiguous().view(-1))
        return gathered

    def _check_ranks_agree(self, tree: TreeStep, commit: CommitPlan) -> None:
        """Tensor parallel: one all-reduce of a fingerprint of the tree and the accepted path;
        ranks that disagree (which would commit different KV) stop the server with a device
        assert instead of corrupting it silently. No host sync."""
        both = rank_fingerprint(tree.tokens, commit.next_token_ids, commit.keep_index)
        torch.distributed.all_reduce(
            both, op=torch.distributed.ReduceOp.MAX, group=self._tp_group.device_group
        )
        torch._assert_async(
            ranks_agree(both), "DDTREE: tensor-parallel ranks built different trees or paths"
        )

    def target_has_graph(self, bs: int) -> bool:
        """Whether SGLang's target verify of ``bs`` requests replays a captured graph (host)."""
        has_graph = getattr(self.model_runner.decode_cuda_graph_runner, "has_graph_for", None)
        return bool(has_graph(bs)) if has_graph is not None else False

    def _record_verify(self, width: int, bs: int, ran_graph: bool, had_graph: bool) -> None:
        """Count the verify step per W; an eager step that had a captured graph is logged."""
        self.graph_stats.runner = self.model_runner.decode_cuda_graph_runner
        self.graph_stats.record(width, bs, ran_graph, had_graph)

    def _decode_step(self, batch, on_publish, grammar_barrier=None) -> GenerationBatchResult:
        draft_input = batch.spec_info
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        bs = len(batch.seq_lens)  # host int: tensor metadata, no device read
        shape = self.shape_for(bs)
        w, s = shape.num_nodes, shape.accept_width
        glue = self.step_glue[w]
        # Glue graphs only where SGLang's forwards replay graphs: their static outputs are the
        # glue graphs' bound inputs (an eager forward returns new tensors every step).
        sglang_graphs = self.target_has_graph(bs)
        key = (bs,) if sglang_graphs else None

        # 1-2) Drafter block (SGLang graph), then the draft tree and verify inputs (glue graph).
        rows = self.glue_rows(bs) if key is not None else None
        tree = self.draft_tree(batch, draft_input, bs, key, rows)

        # Constrained requests: the tree's host copy starts here, ahead of the verify launch.
        grammar_tree = (
            HostArrayGrammarTree(
                GrammarTree.from_device(
                    tree.layout.retrieve_next_token, tree.layout.retrieve_next_sibling, tree.tokens
                )
            )
            if batch.has_grammar
            else None
        )

        # 3) Tree verify on the target.
        verify_input = DDTreeVerifyInput.from_tree(
            tree,
            batch,
            draft_input,
            full_mask=self.verify_full_mask,
            mask_capacity=self._verify_mask_capacity if sglang_graphs else None,
        )
        # A copy: the batch keeps out_cache_loc past this step; the graph output is reused.
        batch.out_cache_loc = tree.verify_loc.clone()
        sampling_info = batch.sampling_info
        cpu_backup, sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        batch.seq_lens_cpu, batch.seq_lens_sum = self.host_seq_lens(batch, draft_input, w)
        try:
            verify_fb, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = cpu_backup, sum_backup
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_fb, is_verify=True, skip_attn_backend_init=True
        )
        self._record_verify(w, bs, bool(target_out.can_run_cuda_graph), sglang_graphs)
        logits_output = target_out.logits_output
        logits = logits_output.next_token_logits  # [bs * W, V]
        grammar_mask = None
        if grammar_tree is not None:  # host work, overlapping the target forward
            grammar_mask = build_grammar_vocab_mask(
                reqs=batch.reqs,
                tree=grammar_tree,
                sampling_info=sampling_info,
                device=logits.device,
                barrier=grammar_barrier,
            )
        penalty_state = None
        if self._penalized(batch):
            penalty_state = self._apply_penalties(logits, tree, batch, sampling_info)
        elif sampling_info is not None:
            apply_dflash_verify_logits_adjustments(
                next_token_logits=logits, sampling_info=sampling_info, draft_token_num=w
            )
        if grammar_mask is not None:  # every node's mask before the greedy and sampled accept
            grammar_mask.apply(logits)
        target_hidden = logits_output.hidden_states
        if target_hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states, got None.")

        # 4) Accept and plan the commit (glue graph; its key adds the accept mode).
        commit: CommitPlan = glue.accept(key, tree, logits, sampling_info, rows=rows)
        if self.tp_size > 1:
            self._check_ranks_agree(tree, commit)
        if penalty_state is not None:  # the emitted tokens count from the next step on
            self._penalty_rows.record(batch.req_pool_indices, commit.out_tokens, penalty_state)
        if getattr(batch, "return_logprob", False):
            self._write_step_logprobs(logits_output, logits, commit, batch, sampling_info)
        # Publish the next lengths before the KV glue, as DFLASH v2 does before its drafter-KV
        # append: the scheduler's seq-lens copy waits on this event, not on the KV moves.
        # A clone: graph outputs are overwritten by the next replay.
        new_seq_lens = commit.new_seq_lens.clone()
        if on_publish is not None:
            on_publish(new_seq_lens)

        # 5) Commit the KV: target KV moved to contiguous slots, drafter KV of the accepted path.
        glue.commit_kv(key, target_hidden, commit, tree)
        logits_output.hidden_states = None

        # Graph outputs are overwritten by the next replay: clone what outlives the step.
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=commit.next_token_ids.clone(),
            accept_lens=commit.commit_lens.clone(),
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(
                bonus_tokens=commit.bonus.clone(), new_seq_lens=new_seq_lens
            ),
            speculative_num_draft_tokens=s,
            new_seq_lens=new_seq_lens,
        )


def _max_graph_bs(server_args) -> int:
    """The largest decode batch size SGLang may capture graphs for (its capture list before
    the KV pool clamps it): glue graphs exist only up to there."""
    decode = getattr(getattr(server_args, "cuda_graph_config", None), "decode", None)
    sizes = list(getattr(decode, "bs", None) or [])
    return max(sizes) if sizes else int(getattr(decode, "max_bs", 0) or 0)
