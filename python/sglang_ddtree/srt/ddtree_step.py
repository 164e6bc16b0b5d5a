"""``DDTreeStep``: one DDTREE decode step, from SGLang's batch to what the step commits.

Per batch (bs requests, W = budget + 1 tree nodes each, B = drafter block, S = max depth + 1),
all on device with no host synchronization:

1. Draft: DFLASH's block forward ``[root, MASK x (B-1)]`` (its captured drafter graph).
2. Tree: the draft top-K, the W-1 most probable draft prefixes and the verify's inputs
   (``core.step.draft_to_tree``).
3. Verify: the W nodes of each request through the target (TARGET_VERIFY, the tree mask).
4. Accept: each node's penalties and grammar mask on the verify logits (constrained requests'
   masks from SGLang's walk over the tree, `HostArrayGrammarTree`: only such batches wait on
   the host for the tree), then greedy and sampled rows in one pass (``accept_and_commit``).
5. Commit: accepted target KV moved to contiguous slots, the path's drafter KV appended
   (``ddtree_kv_commit``); the emitted tokens, the next lengths and roots.

W follows the batch size (``ddtree_budget``). Phases 2, 4 and 5 are glue segments
(``ddtree_glue_graph.SegmentGraphs``) captured per batch size and W, phase 4 also per accept
mode (`accept_mode`): a step is five graph replays and a few launches. Graph outputs are
overwritten by the next replay: what outlives the step is cloned. Under tensor parallelism
phase 2 splits around one all-gather, the coins' generator is seeded alike on every rank, and a
fingerprint all-reduce stops the server (device assert) if ranks built different trees or paths.

`DDTreeStep.run` serves a step; `DDTreeStep.capture` runs its phases on a placeholder batch at
startup (``ddtree_glue_warmup``). SGLang's modules are imported by the phases that call them.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from sglang_ddtree.core.commit import CommitPlan
from sglang_ddtree.core.fingerprint import rank_fingerprint, ranks_agree
from sglang_ddtree.core.layout import scatter_verify_mask, verify_mask_numel
from sglang_ddtree.core.padding import leading_rows, pad_rows, padded_tensors
from sglang_ddtree.core.penalties import apply_tree_penalties
from sglang_ddtree.core.sampling import draw_coins
from sglang_ddtree.core.step import TreeStep, make_accept_fn, make_tree_fns
from sglang_ddtree.srt.ddtree_args import draft_topk_backend
from sglang_ddtree.srt.ddtree_attention.attention_registry import verify_backend_of
from sglang_ddtree.srt.ddtree_glue_graph import SegmentGraphs, padded_size
from sglang_ddtree.srt.ddtree_logprobs import write_step_logprobs

TOP_K_ALL = 1 << 30  # SGLang's top_k for "no top-k"


def verify_mask(
    tree: TreeStep, batch, draft_input, num_nodes: int, capacity: int | None = None
) -> torch.Tensor:
    """FULL_MASK bool [>= W * sum(prefix) + bs * W * W], sized from host lengths only: the
    reserved KV lengths (committed + 2 W, never clamped) bound every prefix, also under overlap
    scheduling, where the host's committed lengths lag the device's by a step (reading the
    device's would cost a host sync a step).

    ``capacity``: the cells of the static buffer a graph replay copies the mask into (max graph
    bs x W x (context + W)); the mask is cut to it, since near the context limit the reserved
    lengths pass the context by 2 W while the device's stay within it. Device lengths that need
    more cells fail the scatter's bounds check instead of writing past the buffer.
    """
    if draft_input.reserved_seq_lens_cpu is not None:
        prefix = draft_input.reserved_seq_lens_cpu
    elif batch.seq_lens_cpu is not None:
        prefix = batch.seq_lens_cpu
    else:
        raise RuntimeError("DDTREE needs host sequence lengths to size the verify mask.")
    total = verify_mask_numel(num_nodes, prefix)
    if capacity is not None:
        total = min(total, int(capacity))
    return scatter_verify_mask(tree.layout.tree_mask, tree.mask_cells, total)


def accept_mode(sampling_info) -> tuple:
    """The accept segment's host branch: ``("greedy",)`` or ``("sampled", need_top_k,
    need_top_p, need_min_p)`` (SGLang's host flags: a renorm pass over ``[bs * W, V]`` that no
    request needs is skipped). With SGLang's ``need_min_p_sampling`` every row takes the min-p
    path (`core.sampling`), the top-p pass always (as SGLang calls it), the top-k pass only
    where some row has top-k: ``top_k_renorm_prob`` at k >= V keeps every token of a
    distribution that sums to 1, so skipping it is the same law and leaves the top-p pass free
    to take the logits (`topp_radix`). Each mode is its own accept graph; all of a batch size's
    modes write the same outputs (`accept_output_group`)."""
    if sampling_info is None or sampling_info.is_all_greedy:
        return ("greedy",)
    need_k = bool(getattr(sampling_info, "need_top_k_sampling", True))
    if bool(getattr(sampling_info, "need_min_p_sampling", False)):
        return ("sampled", need_k, True, True)
    need_p = bool(getattr(sampling_info, "need_top_p_sampling", True))
    return ("sampled", need_k, need_p, False)


def accept_output_group(key: tuple) -> tuple:
    """The output group of an accept graph key ``(bs, *mode)``: its batch size."""
    return key[:1]


def accept_tree(
    tree: TreeStep,
    logits: torch.Tensor,  # [bs * W, V] target logits at every node (penalties applied)
    sampling_info,  # SGLang's SamplingBatchInfo, or None (every request greedy)
    accept_graphs,  # SegmentGraphs over core.step.make_accept_fn's function
    key,  # its graph key (bs,), or None to run eagerly
    coin_generator: torch.Generator | None,
    mode: tuple | None = None,  # accept_mode(sampling_info), when the caller has it already
    rows: int | None = None,  # > bs: run at this many requests' rows (the padded batch size)
) -> CommitPlan:
    """Accept per request and plan the commit; the graph key adds the sampling mode. With
    ``rows`` the tree and the logits are read at that many requests' rows (their storage
    holds the padded rows of the same step, else no padding), the sampling parameters and
    coins padded alike (temperature 1, every token, top-p 1, min-p 0), the graph keyed by
    ``(rows,)``; the plan returned is the real requests' rows of it."""
    bs, w = tree.tokens.shape
    bound = {"logits": logits, "tokens": tree.tokens, "seq_lens": tree.seq_lens}
    bound.update(tree.layout._asdict())
    padded = padded_tensors(bound, bs, rows) if key is not None else None
    n = rows if padded is not None else bs
    if padded is not None:
        bound, key = padded, (rows,)
    mode = mode or accept_mode(sampling_info)
    if mode == ("greedy",):
        plan = accept_graphs(key and (*key, *mode), bound)
        return plan if n == bs else leading_rows(plan, bs, n)
    _, need_k, need_p, need_min_p = mode
    fills = {"temperatures": 1.0, "top_ks": TOP_K_ALL, "top_ps": 1.0}
    if need_min_p:
        fills["min_ps"] = 0.0
    copied = {}
    for name, fill in fills.items():
        rows_of_request = getattr(sampling_info, name).view(-1)
        # Fewer rows than requests would be padded with the defaults, a wrong law in silence:
        # a host check of the shape (no device read).
        assert rows_of_request.shape[0] == bs, (name, tuple(rows_of_request.shape), bs)
        copied[name] = pad_rows(rows_of_request, n, fill)
    # The coins are drawn here, eagerly (two launches), and copied in like the sampling
    # parameters: the law then never depends on how captured graphs replay the RNG.
    copied["coins"], copied["final_coins"] = draw_coins(
        n, w, logits.device, generator=coin_generator
    )
    static = {"need_top_k": need_k, "need_top_p": need_p, "need_min_p": need_min_p}
    plan = accept_graphs(key and (*key, *mode), bound, copied, static)
    return plan if n == bs else leading_rows(plan, bs, n)


class _HostTreeArray(np.ndarray):
    """A host array of the verify tree as NumPy that also answers ``numel``, the one torch
    method SGLang's mask walk (``generate_token_bitmask``) calls on it."""

    def numel(self) -> int:
        return self.size


class HostArrayGrammarTree:
    """SGLang's ``GrammarTree`` (the verify tree's first-child / next-sibling arrays and tokens,
    copied to the host asynchronously) as ``build_grammar_vocab_mask`` reads it, its arrays
    resolved as NumPy views of the same host copies: the walk (``traverse_tree``) reads a few
    scalars a node, and a NumPy scalar read costs a fraction of a torch 0-d tensor op (the
    masks are the same)."""

    def __init__(self, tree):
        self.tree = tree

    def resolve(self) -> tuple:
        return tuple(t.numpy().view(_HostTreeArray) for t in self.tree.resolve())


class StepResult(NamedTuple):
    """What a decode step hands SGLang (copies: nothing a graph replay overwrites)."""

    logits_output: object  # the verify's LogitsProcessorOutput (logprobs written into it)
    next_token_ids: torch.Tensor  # [bs * S] int64, emitted tokens, 0 padded
    accept_lens: torch.Tensor  # [bs] int32, emitted tokens per request
    bonus: torch.Tensor  # [bs] int64, the next step's roots
    new_seq_lens: torch.Tensor  # [bs] int64, published before the KV commit
    can_run_cuda_graph: bool  # the target verify replayed SGLang's graph
    accept_width: int  # S


class DDTreeStep:
    """The decode step of every batch size: each W's glue segments (``segments[W]``: "tree",
    "accept", "kv" and, under tensor parallelism, "shard" with ``gather`` between it and
    "tree"), each a ``SegmentGraphs`` keyed by ``(bs,)`` (the accept's key adds the accept mode;
    ``key=None`` runs a segment eagerly), and the generator the verify coins come from.

    To serve (`for_worker`) it reads SGLang through ``dflash``, the worker as DFLASH's (the
    target worker and runners, the drafter's block buffers), and updates ``penalty_rows``
    (``ddtree_penalties.PenaltyRows``) and ``graph_stats`` (the verify's graph counts)."""

    def __init__(
        self,
        segments: dict,  # W -> {name: segment}
        coin_generator: torch.Generator | None,
        schedule,  # ddtree_budget.BudgetSchedule: W by batch size
        gather=None,  # [...] -> [tp, ...], every rank's draft candidates
        *,
        shapes: dict | None = None,  # W -> ddtree_args.DDTreeShape
        dflash=None,
        penalty_rows=None,
        graph_stats=None,
        tp_group=None,
    ):
        for named in segments.values():
            assert {"tree", "accept", "kv"} <= set(named), sorted(named)
            assert (gather is None) == ("shard" not in named), "a gather goes with a shard"
        self.segments = segments
        self.coin_generator = coin_generator
        self.schedule = schedule
        self.shapes = shapes
        self.dflash = dflash
        self.penalty_rows = penalty_rows
        self.graph_stats = graph_stats
        self.tp_group = tp_group
        self._gather = gather
        self.mode: tuple | None = None  # the last accept's mode
        self.tree_rows: int | None = None  # the last draft tree's padded batch size, if padded
        self._glue_rows: dict[int, int | None] = {}  # `glue_rows` by batch size

    @classmethod
    def for_worker(
        cls, dflash, shapes, schedule, coin_generator, kv_commit, enabled: bool, share: dict, *,
        penalty_rows, graph_stats, tp_group=None,
    ) -> DDTreeStep:  # fmt: skip
        """The serving step of ``dflash`` (a ``DDTreeWorkerV2``): per W of ``shapes`` its tree
        segments (`tree_fns`), accept segment and KV segment (``kv_commit.fn``), capturing
        graphs where ``enabled``, all in the pool and stream of ``share``; under tensor
        parallelism (``tp_group``) the candidates are all-gathered between segments."""
        step = cls(
            {}, coin_generator, schedule, shapes=shapes, dflash=dflash,
            penalty_rows=penalty_rows, graph_stats=graph_stats, tp_group=tp_group,
        )  # fmt: skip
        step._gather = step._gather_candidates if tp_group is not None else None
        model_runner = dflash.target_worker.model_runner
        for w, shape in shapes.items():
            fns = step.tree_fns(
                shape,
                lm_head=lambda: model_runner.model.lm_head.weight[: step.vocab],
                req_to_token=lambda: dflash.model_runner.req_to_token_pool.req_to_token,
            )
            named = {
                name: SegmentGraphs(f"{name}_w{w}", fn, enabled=enabled, **share)
                for name, fn in fns.items()
            }
            # Every accept mode of a batch size writes one set of outputs: the KV segment that
            # binds them is then one graph per batch size, not one per mode.
            named["accept"] = SegmentGraphs(
                f"accept_w{w}", step.accept_fn(shape), enabled=enabled,
                outputs_by=accept_output_group, **share,
            )  # fmt: skip
            named["kv"] = SegmentGraphs(
                f"kv_w{w}", kv_commit.fn(shape), enabled=enabled, pure=False, **share
            )
            step.segments[w] = named
        return step

    # The serving side's sizes (host only).
    @functools.cached_property
    def vocab(self) -> int:
        return int(self.dflash.model_runner.model_config.vocab_size)

    def candidates(self, w: int) -> tuple[int, str]:
        """K at W = ``w`` and its top-K backend (``ddtree_args.draft_topk_backend``)."""
        k = self.shapes[w].candidates_per_depth(self.vocab)
        return k, draft_topk_backend(k, self.vocab)

    def shape_for(self, bs: int):
        """The step shape for ``bs`` requests (a ``DDTreeShape``; no device read)."""
        return self.shapes[self.schedule.num_nodes_for(bs)]

    def target_has_graph(self, bs: int) -> bool:
        """Whether SGLang's target verify of ``bs`` requests replays a captured graph."""
        runner = self.dflash.model_runner.decode_cuda_graph_runner
        has_graph = getattr(runner, "has_graph_for", None)
        return bool(has_graph(bs)) if has_graph is not None else False

    def glue_rows(self, bs: int) -> int | None:
        """The padded batch size the tree and accept glue run at: the captured size SGLang pads
        a verify of ``bs`` requests to, where it pads the drafter's block to the same (the padded
        rows of both forwards are then this step's); else None (the real size, as the KV)."""
        if bs not in self._glue_rows:  # once per batch size: the capture lists are fixed
            target = padded_size(self.dflash.model_runner.decode_cuda_graph_runner, bs)
            runner = getattr(self.dflash.draft_model_runner, "decode_cuda_graph_runner", None)
            draft = padded_size(runner, bs)
            ok = target is not None and target == draft and target > bs
            self._glue_rows[bs] = target if ok else None
        return self._glue_rows[bs]

    @functools.cached_property
    def verify_full_mask(self) -> bool:
        """Whether the target's verify backend reads SGLang's FULL_MASK or the tree's own
        ``[bs, W, W]`` mask (``reads_full_mask``). Asked at the first verify: the target's
        backend object is built after the worker."""
        verify = verify_backend_of(self.dflash.model_runner)
        return verify is None or verify.reads_full_mask

    @functools.cached_property
    def verify_mask_capacity(self) -> int | None:
        """Cells of the target backend's static verify-mask buffer, which a graph replay copies
        the step's FULL_MASK into (None: the backend keeps none)."""
        backend = self.dflash.model_runner.attn_backend
        buffer = getattr(getattr(backend, "verify_mask", None), "buffer", None)
        return None if buffer is None else int(buffer.numel())

    @staticmethod
    def host_seq_lens(batch, draft_input, extra: int):
        """Host upper bound of the KV length a forward sees, committed + ``extra``, from the
        scheduler's host copies (no device read): (seq_lens_cpu [bs] int32 CPU tensor, sum)."""
        if batch.seq_lens_cpu is not None:
            lens = batch.seq_lens_cpu.to(torch.int32) + extra
            return lens, int(lens.sum())
        if draft_input.reserved_seq_lens_cpu is not None:
            return draft_input.reserved_seq_lens_cpu, int(draft_input.reserved_seq_lens_sum)
        raise RuntimeError("DDTREE needs host sequence lengths (seq_lens_cpu) for the verify.")

    # The glue segments' functions (also the startup memory measure's, over placeholders).
    def tree_fns(self, shape, lm_head, req_to_token) -> dict:
        """The draft-tree segment functions at ``shape`` (`core.step.make_tree_fns`) with the
        step's top-K choices; ``lm_head`` / ``req_to_token``: callables returning the [V, H] LM
        head and the request-to-token table. Tensor parallel: this rank's vocabulary rows of the
        LM head give its candidates (the "shard" segment); every rank merges the same
        all-gathered tensor into the same tree."""
        k, backend = self.candidates(shape.num_nodes)
        shard = self._lm_head_shard if self.tp_group is not None else None
        return make_tree_fns(
            shape, self.vocab, k, backend, lm_head=lm_head, req_to_token=req_to_token,
            lm_head_shard=shard,
        )  # fmt: skip

    @staticmethod
    def accept_fn(shape):
        """The accept segment's function at ``shape`` (`core.step.make_accept_fn`)."""
        return make_accept_fn(shape.accept_width)

    def _lm_head_shard(self) -> tuple[torch.Tensor, int]:
        """This rank's rows of the target LM head that are real tokens, and the global id of
        the first: ``([V_shard, H], start)``."""
        lm_head = self.dflash.target_worker.model_runner.model.lm_head
        shard = getattr(lm_head, "shard_indices", None)
        if shard is None or int(getattr(shard, "num_added_elements", 0)) != 0:
            raise RuntimeError("DDTREE under tensor parallelism needs a vocab-parallel LM head.")
        return lm_head.weight[: int(shard.num_org_elements)], int(shard.org_vocab_start_index)

    def _gather_candidates(self, packed: torch.Tensor) -> torch.Tensor:
        """Tensor parallel: every rank's draft candidates (``[tp, ...]``), all-gathered eagerly
        between the shard and tree segments."""
        gathered = packed.new_empty((int(self.tp_group.world_size), *packed.shape))
        self.tp_group.all_gather_into_tensor(gathered.view(-1), packed.contiguous().view(-1))
        return gathered

    # The phases.
    def draft(self, batch, key, rows: int | None = None) -> TreeStep:
        """Phases 1-2: the drafter's block forward (SGLang's graph) on ``batch``, then `draft_tree`.
        As DFLASH's decode runs it (in-tree its methods, which a plugin cannot add to 0.5.17)."""
        from sglang.kernels.ops.speculative.dflash import _prepare_dflash_draft_block_unchecked
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        dflash, draft_input = self.dflash, batch.spec_info
        bs = len(batch.seq_lens)
        block = self.shape_for(bs).block_size
        dflash._ensure_draft_block_buffers(bs)
        block_ids = dflash._draft_block_ids_buf[:bs]
        positions_2d = dflash._draft_block_positions_buf[:bs]
        cache_loc_2d = dflash._draft_verify_out_cache_loc_buf[:bs]
        _prepare_dflash_draft_block_unchecked(
            bonus_tokens=draft_input.bonus_tokens.view(-1),
            prefix_lens=batch.seq_lens.view(-1),
            req_pool_indices=batch.req_pool_indices.view(-1),
            req_to_token=dflash.model_runner.req_to_token_pool.req_to_token,
            block_ids_out=block_ids,
            positions_out=positions_2d,
            cache_loc_out=cache_loc_2d,
            mask_token_id=int(dflash._mask_token_id),
        )
        embeds = dflash.target_worker.model_runner.model.get_input_embeddings()(block_ids)
        forward_batch = self._verify_batch(
            batch, block, input_ids=block_ids.flatten(), out_cache_loc=cache_loc_2d.reshape(-1),
            positions=positions_2d.reshape(-1), input_embeds=embeds.view(-1, embeds.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH, spec_info=dflash._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )  # fmt: skip
        with torch.inference_mode():
            draft_out = dflash.draft_model_runner.forward(forward_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the drafter returned no hidden states.")
        return self.draft_tree(
            key, hidden, draft_input.bonus_tokens, batch.seq_lens, batch.req_pool_indices, rows
        )

    def _verify_batch(self, batch, extra: int, **fields):
        """A TARGET_VERIFY ``ForwardBatch`` over ``batch``'s requests, their host lengths plus
        ``extra`` (`host_seq_lens`), with ``fields``."""
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

        seq_lens_cpu, seq_lens_sum = self.host_seq_lens(batch, batch.spec_info, extra)
        return ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=len(batch.seq_lens),
            req_pool_indices=batch.req_pool_indices, seq_lens=batch.seq_lens,
            seq_lens_sum=seq_lens_sum, seq_lens_cpu=seq_lens_cpu, **fields,
        )  # fmt: skip

    def draft_tree(
        self,
        key,
        hidden: torch.Tensor,  # [bs * B, H] the drafter's block hidden states
        bonus: torch.Tensor,  # [bs] int64, the roots
        seq_lens: torch.Tensor,  # [bs] committed lengths
        req_pool_indices: torch.Tensor,  # [bs] request-pool rows
        rows: int | None = None,  # > bs: the padded batch size (`glue_rows`)
    ) -> TreeStep:
        """The draft tree and the verify's inputs (`core.step.draft_to_tree`). With ``rows``
        (a graph key given, and ``hidden`` the first rows of the drafter graph's padded output)
        the segment runs at that many requests, keyed ``(rows,)``, the padded rows' roots,
        lengths and pool rows 0 (they read request row 0 and write nothing); the tree returned
        is the real requests' rows of its outputs."""
        bs = seq_lens.shape[0]
        named = self.segments[self.schedule.num_nodes_for(bs)]
        padded = padded_tensors({"hidden": hidden}, bs, rows) if key is not None else None
        n = rows if padded is not None else bs
        if padded is not None:
            hidden, key = padded["hidden"], (rows,)
        copied = {
            "bonus": pad_rows(bonus.view(-1), n, 0),
            "seq_lens": pad_rows(seq_lens, n, 0),
            "req_pool_indices": pad_rows(req_pool_indices, n, 0),
        }
        if self._gather is None:
            tree = named["tree"](key, bound={"hidden": hidden}, copied=copied)
        else:
            gathered = self._gather(named["shard"](key, bound={"hidden": hidden}))
            tree = named["tree"](key, bound={}, copied={"gathered": gathered, **copied})
        self.tree_rows = n if n != bs else None
        return tree if n == bs else leading_rows(tree, bs, n)

    def verify_input(self, tree: TreeStep, batch, mask_capacity: int | None = None):
        """Phase 3's input: ``DDTreeVerifyInput`` with the tree's mask (`verify_mask`, cut to
        ``mask_capacity``) where the target's backend reads SGLang's FULL_MASK."""
        from sglang_ddtree.srt.ddtree_info import DDTreeVerifyInput

        w = tree.tokens.shape[1]
        full = self.verify_full_mask
        mask = verify_mask(tree, batch, batch.spec_info, w, mask_capacity) if full else None
        return DDTreeVerifyInput.from_tree(tree, mask)

    def accept(
        self,
        key,
        tree: TreeStep,
        logits: torch.Tensor,  # [bs * W, V] the verify's processed logits
        sampling_info,  # SGLang's SamplingBatchInfo, or None (every request greedy)
        mode: tuple | None = None,  # the accept mode; None: accept_mode(sampling_info)
        rows: int | None = None,  # > bs: the padded batch size, as for `draft_tree`
    ) -> CommitPlan:
        """Phase 4: the accepted paths and the commit plan (`accept_tree`), in the step's
        accept mode; with ``rows``, at the padded batch size, where the last `draft_tree` ran at
        it (its tree and the verify's logits are then the first rows of padded outputs)."""
        self.mode = mode or accept_mode(sampling_info)
        return accept_tree(
            tree, logits, sampling_info, self.segments[tree.tokens.shape[1]]["accept"], key,
            self.coin_generator, self.mode,
            rows=rows if rows is not None and rows == self.tree_rows else None,
        )  # fmt: skip

    def commit_kv(
        self,
        key,
        target_hidden: torch.Tensor,  # [bs * W, H_aux] the target's captured hidden states
        commit: CommitPlan,  # the last `accept`'s
        tree: TreeStep,
    ) -> None:
        """Phase 5: the accepted target KV to contiguous slots and the path's drafter KV. The
        segment binds the accept graph's outputs, which every accept mode of a batch size writes
        into the same buffers (`accept_output_group`), so one graph per batch size serves
        batches that switch between greedy and sampled."""
        assert self.mode is not None, "commit_kv follows an accept"
        bound = dict(
            hidden=target_hidden, keep_index=commit.keep_index, accept_length=commit.accept_length,
            commit_lens=commit.commit_lens, verify_loc=tree.verify_loc, seq_lens=tree.seq_lens,
            pool_idx=tree.req_pool_indices,
        )  # fmt: skip
        self.segments[tree.tokens.shape[1]]["kv"](key, bound=bound)

    def run(self, batch, on_publish=None, grammar_barrier=None) -> StepResult:
        """One decode step of SGLang's ``batch`` (its ``spec_info``: DFLASH's draft input).
        ``on_publish(new_seq_lens)`` runs before the KV commit, as DFLASH v2 publishes before
        its drafter-KV append: the scheduler's copy of the lengths waits on it, not on the KV
        moves. ``grammar_barrier``: SGLang's, for the grammar mask's host walk."""
        from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
        from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

        dflash, draft_input = self.dflash, batch.spec_info
        batch.seq_lens.record_stream(torch.get_device_module(dflash.device).current_stream())
        bs = len(batch.seq_lens)  # host int: tensor metadata, no device read
        shape = self.shape_for(bs)
        w, s = shape.num_nodes, shape.accept_width
        # Glue graphs only where SGLang's forwards replay graphs: their static outputs are the
        # glue graphs' bound inputs (an eager forward returns new tensors every step).
        sglang_graphs = self.target_has_graph(bs)
        key = (bs,) if sglang_graphs else None
        rows = self.glue_rows(bs) if key is not None else None
        tree = self.draft(batch, key, rows)

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
        verify_input = self.verify_input(
            tree, batch, self.verify_mask_capacity if sglang_graphs else None
        )
        # A copy: the batch keeps out_cache_loc past this step; the graph output is reused.
        batch.out_cache_loc = tree.verify_loc.clone()
        sampling_info = batch.sampling_info
        cpu_backup, sum_backup = batch.seq_lens_cpu, batch.seq_lens_sum
        batch.seq_lens_cpu, batch.seq_lens_sum = self.host_seq_lens(batch, draft_input, w)
        try:
            verify_fb, _ = verify_input.prepare_for_verify(batch, dflash.target_worker)
        finally:
            batch.seq_lens_cpu, batch.seq_lens_sum = cpu_backup, sum_backup
        target_out = dflash.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_fb, is_verify=True, skip_attn_backend_init=True
        )
        self.graph_stats.runner = dflash.model_runner.decode_cuda_graph_runner
        self.graph_stats.record(w, bs, bool(target_out.can_run_cuda_graph), sglang_graphs)
        logits_output = target_out.logits_output
        logits = logits_output.next_token_logits  # [bs * W, V]
        grammar_mask = None
        if grammar_tree is not None:  # host work, overlapping the target forward
            grammar_mask = build_grammar_vocab_mask(
                reqs=batch.reqs, tree=grammar_tree, sampling_info=sampling_info,
                device=logits.device, barrier=grammar_barrier,
            )  # fmt: skip
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

        commit = self.accept(key, tree, logits, sampling_info, rows=rows)
        if self.tp_group is not None:
            self._check_ranks_agree(tree, commit)
        if penalty_state is not None:  # the emitted tokens count from the next step on
            self.penalty_rows.record(batch.req_pool_indices, commit.out_tokens, penalty_state)
        if getattr(batch, "return_logprob", False):
            self._write_step_logprobs(logits_output, logits, commit, batch, sampling_info)
        # A clone: graph outputs are overwritten by the next replay.
        new_seq_lens = commit.new_seq_lens.clone()
        if on_publish is not None:
            on_publish(new_seq_lens)
        self.commit_kv(key, target_hidden, commit, tree)
        logits_output.hidden_states = None
        return StepResult(
            logits_output=logits_output,
            next_token_ids=commit.next_token_ids.clone(),
            accept_lens=commit.commit_lens.clone(),
            bonus=commit.bonus.clone(),
            new_seq_lens=new_seq_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            accept_width=s,
        )

    def capture(self, batch, sampling_infos) -> None:
        """Every glue graph of ``batch``'s size, before serving: the phases of `run` on a
        placeholder batch (``ddtree_glue_warmup``), the target verify on SGLang's graph, its
        logits zeroed (defined values: uniform rows), then the accept and the KV commit once per
        item of ``sampling_infos`` (SamplingBatchInfo's fields the accept reads, one per accept
        mode; None: greedy), each made as the previous one's commit is launched."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        bs = len(batch.seq_lens)
        key, rows = (bs,), self.glue_rows(bs)
        tree = self.draft(batch, key, rows)
        verify_input = self.verify_input(tree, batch)
        runner = self.dflash.target_worker.model_runner
        forward_batch = self._verify_batch(
            batch, tree.tokens.shape[1], input_ids=tree.tokens.reshape(-1),
            out_cache_loc=tree.verify_loc, positions=tree.layout.positions.reshape(-1),
            spec_algorithm=runner.spec_algorithm, spec_info=verify_input,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )  # fmt: skip
        with torch.inference_mode():
            out = runner.forward(forward_batch)
        logits = out.logits_output.next_token_logits
        logits.zero_()
        for sampling_info in sampling_infos:
            commit = self.accept(key, tree, logits, sampling_info, rows=rows)
            self.commit_kv(key, out.logits_output.hidden_states, commit, tree)

    # Request penalties, logprobs and the ranks' agreement, around the accept.
    def _penalized(self, batch) -> bool:
        """Whether any request of the batch has a penalty (host: a set lookup per request)."""
        penalized = self.penalty_rows.penalized
        return bool(penalized) and any(r.req_pool_idx in penalized for r in batch.reqs)

    def _apply_penalties(self, logits, tree: TreeStep, batch, sampling_info):
        """Each node's penalties (`core.penalties`), then ``logit_bias``, in place on the verify
        logits ``[bs * W, V]``; SGLang's own speculative penalty (one linear term for every
        node) is not applied on top. Returns the rows' state it read (the step's count after
        the accept starts from it)."""
        bs, w = tree.tokens.shape
        if logits.shape[-1] != self.penalty_rows.vocab:
            raise RuntimeError(
                f"DDTREE penalties: logits of {logits.shape[-1]} tokens, state of "
                f"{self.penalty_rows.vocab}."
            )
        rows = logits.view(bs, w, -1)
        state = self.penalty_rows.gather(
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
            logits_output, logits, commit.keep_nodes, commit.next_token_ids,
            sampling_info.temperatures, bool(sampling_info.is_all_greedy),
            getattr(batch, "top_logprobs_nums", None), getattr(batch, "token_ids_logprobs", None),
            before_temperature=bool(SGLANG_RETURN_ORIGINAL_LOGPROB),
        )  # fmt: skip

    def _check_ranks_agree(self, tree: TreeStep, commit: CommitPlan) -> None:
        """Tensor parallel: one all-reduce of a fingerprint of the tree and the accepted path;
        ranks that disagree (which would commit different KV) stop the server with a device
        assert instead of corrupting it silently. No host sync."""
        both = rank_fingerprint(tree.tokens, commit.next_token_ids, commit.keep_index)
        torch.distributed.all_reduce(
            both, op=torch.distributed.ReduceOp.MAX, group=self.tp_group.device_group
        )
        torch._assert_async(
            ranks_agree(both), "DDTREE: tensor-parallel ranks built different trees or paths"
        )
