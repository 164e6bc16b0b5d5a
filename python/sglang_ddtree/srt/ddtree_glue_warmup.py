"""Glue CUDA graphs captured at startup.

``SegmentGraphs`` captures a glue segment the first time it meets a key (batch size, W, accept
mode). So that no request pays a capture, the worker's step (``ddtree_step.DDTreeStep.capture``)
runs once per batch size that SGLang's graphs serve, every accept mode after one verify, right
after SGLang captured the target and drafter graphs: every glue graph the server will replay is
captured before the first request.

It runs on a placeholder batch (`capture_batch_size`): request row 0 of ``req_to_token`` (all
zero at startup) with one cached token, so every KV write (the drafter block, the verify nodes,
the accepted-KV move, the drafter-KV append) lands in slot 0, SGLang's padding slot, which its
own graph captures write too. The drafter and the target verify replay SGLang's graphs, so the
glue graphs bind the same static outputs a live step binds. The verify logits are zeroed before
the accepts (defined values: uniform rows), and the coins come from the step's generator,
drawn alike on every rank.

Memory: SGLang sizes the KV pool from the free memory left after the worker's constructor, and
captures graphs afterwards from what the pool left over. So the constructor measures what the
glue graphs will keep and holds that many bytes (``GlueReserve``) while the pool is sized; they
are handed back just before the glue graphs are captured, which then keep them for good. The
measure is a capture (``glue_capture_footprint``): the tree and accept segments of the largest
key of each W, every accept mode, captured on placeholders into a throwaway pool the way the
startup capture does it, then freed. What a capture keeps exceeds the eager peak
(``glue_working_set``, the fallback): the shared pool holds every mode's allocation pattern,
and the keys' own buffers, carved from the eager first run's cached blocks, keep some of them
from being released. Every smaller key's own buffers are added (``glue_output_bytes``). The
KV segment (it needs the KV pool) is not counted, but the one buffer it keeps, its own
workspace for DFLASH's fused drafter-KV materializer (``ddtree_kv_commit``), is allocated in
the constructor at the size the largest key needs (``draft_kv_rows``) and never grown: grown
lazily during the capture instead, it would land in a segment of the largest key's eager
temporaries and keep that whole segment from being released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from types import SimpleNamespace

import torch

from sglang_ddtree.core.sampling import draw_coins
from sglang_ddtree.core.step import accept_and_commit
from sglang_ddtree.srt.ddtree_glue_graph import SegmentGraphs, _map_tensors, quiet_captures
from sglang_ddtree.srt.ddtree_step import TOP_K_ALL, accept_output_group, accept_tree

logger = logging.getLogger(__name__)

# The startup capture's memory may exceed what was held for it by this share plus these GiB:
# the KV segment (not measured: it needs the KV pool), the smaller keys' pool growth, and the
# allocator's 2 / 20 MiB segment rounding. Beyond it the startup warns.
GLUE_MEMORY_SLACK = (0.05, 0.0625)


def glue_memory_limit(held: float) -> float:
    """Bytes the startup capture may take when ``held`` bytes were held for it before the KV
    pool was sized: ``held`` and the slack (``GLUE_MEMORY_SLACK``)."""
    share, fixed_gib = GLUE_MEMORY_SLACK
    return held * (1 + share) + fixed_gib * 2**30


def glue_memory_excess(grown: int, held: int) -> int:
    """Bytes the startup capture took (``grown``) beyond `glue_memory_limit`; 0 within it."""
    return max(0, int(grown - glue_memory_limit(held)))


def glue_memory_warning(grown: int, held: int, max_bs: int) -> str | None:
    """The startup's warning where the glue graphs outgrew what was held for them (that memory
    came out of what SGLang leaves outside its static fraction), else None."""
    if not glue_memory_excess(grown, held):
        return None
    return (
        f"DDTREE glue graphs took {grown / 2**30:.2f} GiB at startup, "
        f"{(grown - held) / 2**30:.2f} GiB more than the {held / 2**30:.2f} GiB held for them "
        "before the KV pool was sized; the rest came out of the memory SGLang leaves outside "
        "--mem-fraction-static. If the server runs short of memory, lower --cuda-graph-max-bs "
        f"(now {max_bs}: every batch size up to it has its glue graphs) or "
        "--mem-fraction-static."
    )


def accept_modes() -> list[tuple]:
    """Every accept-graph mode (``ddtree_step.accept_mode``): greedy, the four sampled ones
    and the two min-p ones (with and without the top-k pass)."""
    sampled = [("sampled", k, p, False) for k in (False, True) for p in (False, True)]
    return [("greedy",), *sampled, ("sampled", False, True, True), ("sampled", True, True, True)]


def dummy_sampling_info(mode: tuple, bs: int, device) -> SimpleNamespace | None:
    """The fields of SGLang's SamplingBatchInfo that DDTREE's accept reads, for ``mode``, with
    SGLang's dtypes (temperatures [bs, 1] float32, top_ks [bs] int32, top_ps and min_ps [bs]
    float32)."""
    if mode == ("greedy",):
        return None
    _, need_k, need_p, need_min_p = mode
    return SimpleNamespace(
        is_all_greedy=False,
        need_top_k_sampling=need_k,
        need_top_p_sampling=need_p,
        need_min_p_sampling=need_min_p,
        temperatures=torch.ones(bs, 1, dtype=torch.float32, device=device),
        top_ks=torch.full((bs,), 20 if need_k else TOP_K_ALL, dtype=torch.int32, device=device),
        top_ps=torch.full((bs,), 0.9 if need_p else 1.0, dtype=torch.float32, device=device),
        min_ps=torch.full((bs,), 0.05 if need_min_p else 0.0, dtype=torch.float32, device=device),
    )


def largest_keys(schedule, max_bs: int) -> list[tuple[int, int]]:
    """``(bs, W)`` for each W of ``schedule`` (a ``BudgetSchedule``): the largest batch size
    up to ``max_bs`` that W serves, largest batch first (the startup capture's order, so a
    capture measuring them reuses the pool's blocks as that one does). Buckets that start above
    ``max_bs`` are left out."""
    keys = {}
    for bs in range(1, int(max_bs) + 1):
        keys[schedule.num_nodes_for(bs)] = bs
    return sorted(((bs, w) for w, bs in keys.items()), reverse=True)


def draft_kv_rows(schedule, shapes: Mapping, max_bs: int) -> int:
    """The most accepted-path rows one KV segment hands the drafter's KV append up to
    ``max_bs`` (``bs x S`` at each W's largest batch size; ``shapes``: W -> ``DDTreeShape``):
    the size of the KV segment's own drafter-KV workspace."""
    return max((bs * shapes[w].accept_width for bs, w in largest_keys(schedule, max_bs)), default=0)


BLOCK = 512  # bytes: the CUDA caching allocator's smallest block


def nest_bytes(obj) -> tuple[int, int]:
    """(bytes, tensors) of the tensors in a nest of tuples / NamedTuples / lists / dicts (the
    nests `SegmentGraphs` copies its outputs from)."""
    sizes: list[int] = []
    _map_tensors(lambda t: sizes.append(t.numel() * t.element_size()) or t, obj)
    return sum(sizes), len(sizes)


def glue_output_bytes(
    per_width: dict,
    schedule,
    max_bs: int,
    modes: int | None = None,
    skip: frozenset = frozenset(),
) -> int:
    """Bytes of every key's own buffers (captured outputs and copied inputs, allocated outside
    the graph pool) over batch sizes 1..``max_bs`` except ``skip``: per batch size, one tree
    key and ``modes`` accept keys (None: every mode of `accept_modes`), whose outputs are one
    set per batch size (`accept_output_group`) and whose copied inputs are each key's.
    ``per_width[W] = (tree bytes per request, tree tensors, accept output bytes per request,
    accept output tensors, accept copied bytes per request, accept copied tensors)``; each
    tensor may round up by one allocator block."""
    modes = len(accept_modes()) if modes is None else modes
    total = 0
    for bs in range(1, int(max_bs) + 1):
        if bs in skip:
            continue
        tree_b, tree_n, out_b, out_n, in_b, in_n = per_width[schedule.num_nodes_for(bs)]
        total += int(bs * (tree_b + out_b + modes * in_b))
        total += BLOCK * (tree_n + out_n + modes * in_n)
    return total


def glue_working_set(worker, max_bs: int) -> tuple[int, tuple[int, int], dict]:
    """Peak bytes the draft-tree and sampled-accept segments allocate over one step at their
    largest key, that key ``(bs, W)``, and the per-W buffer sizes `glue_output_bytes` takes
    (``per_width``). Runs the segments eagerly on placeholders (drafter hidden states and target
    logits count as SGLang's buffers, not the glue's); no KV pool needed."""
    device = worker.device
    vocab = int(worker.model_runner.model_config.vocab_size)
    lm_head = worker.target_worker.model_runner.model.lm_head.weight
    best, best_key, per_width = 0, (0, 0), {}
    for bs, w in largest_keys(worker.budget_schedule, max_bs):
        shape = worker.ddtree_shapes[w]
        b, s = shape.block_size, shape.accept_width
        hidden = torch.zeros(bs * b, lm_head.shape[1], dtype=lm_head.dtype, device=device)
        logits = torch.zeros(bs * w, vocab, dtype=torch.float32, device=device)
        zeros = torch.zeros(bs, dtype=torch.int64, device=device)
        req_to_token = torch.zeros(1, w + 1, dtype=torch.int32, device=device)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fns = _tree_fns(worker, w, lm_head[:vocab], req_to_token)
        if "shard" in fns:  # a stand-in gather: this rank's candidates, tp times
            packed = fns["shard"](hidden)
            gathered = packed[None].expand(worker.tp_size, *packed.shape).contiguous()
            del packed
            tree = fns["tree"](gathered, zeros, zeros, zeros)
        else:
            tree = fns["tree"](hidden, zeros, zeros, zeros)
        coins, final_coins = draw_coins(bs, w, device)
        # The min-p mode with top-k: both renorm passes and the min-p one, the most any mode
        # allocates.
        info = dummy_sampling_info(("sampled", True, True, True), bs, device)
        commit = accept_and_commit(
            logits, tree.tokens, tree.layout, zeros, accept_width=s,
            temperatures=info.temperatures.view(-1), top_ks=info.top_ks, top_ps=info.top_ps,
            coins=coins, final_coins=final_coins, min_ps=info.min_ps, need_min_p=True,
        )  # fmt: skip
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        if peak > best:
            best, best_key = peak, (bs, w)
        # A key's own buffers: the tree's outputs and copied inputs (bonus, lengths, pool rows);
        # the accept's outputs (one set per batch size) and copied sampling inputs (per mode).
        tree_b, tree_n = nest_bytes((tree, zeros, zeros, zeros))
        out_b, out_n = nest_bytes(commit)
        acc_in = (info.temperatures, info.top_ks, info.top_ps, info.min_ps, coins, final_coins)
        in_b, in_n = nest_bytes(acc_in)
        per_width[w] = (tree_b / bs, tree_n, out_b / bs, out_n, in_b / bs, in_n)
        del hidden, logits, tree, coins, final_coins, commit
    torch.cuda.empty_cache()  # the placeholders' blocks must not count as used
    return int(best), best_key, per_width


def glue_capture_footprint(worker, max_bs: int) -> int:
    """Bytes the glue graphs of the largest keys keep on the device after their capture.
    Measured by doing it: at each W's
    largest batch size (``largest_keys``) the tree segment and the accept segment in every mode
    (``accept_modes``) go through ``SegmentGraphs`` on placeholders, into one throwaway pool, as
    the startup capture does (eager first run, capture, replay); ``kept`` is the reserved
    growth after ``empty_cache`` (the pool, the keys' own buffers, and cached blocks those
    buffers pin), then all of it is freed. The KV segment (it needs the KV pool) is not in it."""
    device = worker.device
    vocab = int(worker.model_runner.model_config.vocab_size)
    lm_head = worker.target_worker.model_runner.model.lm_head.weight
    keys = largest_keys(worker.budget_schedule, max_bs)
    # Every placeholder before the baseline: only what the captures keep is counted.
    inputs = {}
    for bs, w in keys:
        shape = worker.ddtree_shapes[w]
        inputs[w] = SimpleNamespace(
            hidden=torch.zeros(bs * shape.block_size, lm_head.shape[1], dtype=lm_head.dtype,
                               device=device),
            logits=torch.zeros(bs * w, vocab, dtype=torch.float32, device=device),
            zeros=torch.zeros(bs, dtype=torch.int64, device=device),
            req_to_token=torch.zeros(1, w + 1, dtype=torch.int32, device=device),
            infos={mode: dummy_sampling_info(mode, bs, device) for mode in accept_modes()},
        )  # fmt: skip
    # A throwaway pool, but the glue graphs' own capture stream: what a capture allocates once
    # per stream (cuBLAS's workspace) is then allocated for the stream the real graphs use.
    stream = worker.glue_stream or torch.cuda.Stream()
    share = {"pool": torch.cuda.graph_pool_handle(), "stream": stream}
    segments: list[SegmentGraphs] = []
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(device)
    try:
        for bs, w in keys:
            _capture_largest_key(worker, share, segments, inputs[w], bs, w, lm_head[:vocab])
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        kept = torch.cuda.memory_reserved(device) - base
        failed = sum(seg.counts["capture_failures"] for seg in segments)
        if failed:
            raise RuntimeError(f"{failed} of the measuring captures failed")
    finally:
        torch.cuda.synchronize(device)  # no replay in flight when the graphs go
        segments.clear()  # the graphs, their buffers and the pool's blocks go
        inputs.clear()
        torch.cuda.empty_cache()
    return max(int(kept), 0)


def _tree_fns(worker, w: int, lm_head, req_to_token) -> dict:
    """The step's draft-tree segment functions for W = ``w`` (`DDTreeStep.tree_fns`) over
    placeholders: ``lm_head`` ([V, H]) and ``req_to_token`` stand in for the model's and the
    pool's (which does not exist yet)."""
    return worker.ddtree_step.tree_fns(
        worker.ddtree_shapes[w], lm_head=lambda: lm_head, req_to_token=lambda: req_to_token
    )


def _capture_largest_key(worker, share, segments, x, bs: int, w: int, lm_head) -> None:
    """One key of ``glue_capture_footprint``: its tree (under tensor parallelism: the shard
    candidates, a stand-in gather, the merged tree) and its accept in every mode."""
    shape = worker.ddtree_shapes[w]
    key = (bs,)
    copied = {"bonus": x.zeros, "seq_lens": x.zeros, "req_pool_indices": x.zeros}
    fns = _tree_fns(worker, w, lm_head, x.req_to_token)
    if "shard" in fns:
        shard = SegmentGraphs(f"measure_shard_w{w}", fns["shard"], **share)
        segments.append(shard)
        packed = shard(key, bound={"hidden": x.hidden})
        gathered = packed[None].expand(worker.tp_size, *packed.shape).contiguous()
        tree_seg = SegmentGraphs(f"measure_tree_w{w}", fns["tree"], **share)
        segments.append(tree_seg)
        tree = tree_seg(key, bound={}, copied={"gathered": gathered, **copied})
    else:
        tree_seg = SegmentGraphs(f"measure_tree_w{w}", fns["tree"], **share)
        segments.append(tree_seg)
        tree = tree_seg(key, bound={"hidden": x.hidden}, copied=copied)
    accept = SegmentGraphs(
        f"measure_accept_w{w}", worker.ddtree_step.accept_fn(shape),
        outputs_by=accept_output_group, **share,
    )  # fmt: skip
    segments.append(accept)
    for mode, info in x.infos.items():
        accept_tree(tree, x.logits, info, accept, key, None, mode)


class GlueReserve:
    """Bytes held for the glue graphs from the worker's constructor (before SGLang sizes the
    KV pool) until just before they are captured: what the largest keys' graphs keep
    (``glue_capture_footprint``) plus the other keys' own buffers (``glue_output_bytes``). If
    the measuring captures fail, the eager working set (``glue_working_set``) stands in for
    the graphs, with a warning."""

    def __init__(self, worker, max_bs: int):
        t0 = time.perf_counter()
        self.working_set, self.key, per_width = glue_working_set(worker, max_bs)
        schedule = worker.budget_schedule
        self.outputs = glue_output_bytes(per_width, schedule, max_bs) if per_width else 0
        self.captured = None
        try:
            self.captured = glue_capture_footprint(worker, max_bs)
        except Exception as e:  # the estimate must not stop the server; it says so
            logger.warning(
                "DDTREE glue graphs: could not measure them by capture (%s: %s); holding the "
                "eager working set instead, which undercounts the graph pool.",
                type(e).__name__, e,
            )  # fmt: skip
        if self.captured is None:
            self.nbytes = self.working_set + self.outputs
        else:
            # The measured keys' own buffers are in ``captured``; add every other key's.
            measured = frozenset(bs for bs, _ in largest_keys(schedule, max_bs))
            others = glue_output_bytes(per_width, schedule, max_bs, skip=measured)
            self.nbytes = self.captured + others
        self._held = torch.empty(self.nbytes, dtype=torch.uint8, device=worker.device)
        if worker.tp_rank == 0:
            logger.info(
                "DDTREE glue graphs: %.2f GiB held for them before the KV pool is sized "
                "(captured at the largest keys: %s; eager working set %.2f GiB at bs=%d, W=%d; "
                "per-key buffers %.2f GiB; measured in %.1f s).",
                self.nbytes / 2**30,
                "failed" if self.captured is None else f"{self.captured / 2**30:.2f} GiB",
                self.working_set / 2**30, *self.key, self.outputs / 2**30,
                time.perf_counter() - t0,
            )  # fmt: skip

    def release(self) -> None:
        """Hand the bytes back to the device (the glue graphs' pool takes them next)."""
        if self._held is not None:
            self._held = None
            torch.cuda.empty_cache()


def capture_glue_at_startup(worker) -> dict:
    """Capture every batch size's glue graphs (`capture_batch_size`) on ``worker`` (a
    ``DDTreeWorkerV2`` whose SGLang graphs are captured); returns {"batch_sizes", "captures",
    "seconds", "memory_gib" (what the capture took from the device), "reserved_gib" (what was
    held for it before the KV pool was sized)}."""
    runner = worker.target_worker.model_runner.decode_cuda_graph_runner
    max_bs = int(getattr(runner, "max_bs", 0) or 0)
    sizes = [bs for bs in range(1, max_bs + 1) if worker.ddtree_step.target_has_graph(bs)]
    segments = worker.graph_stats.glue_segments
    before = sum(seg.counts["captures"] for seg in segments)
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved(worker.device)
    t0 = time.perf_counter()
    # Largest batch first: a smaller key's buffers are carved from the blocks a larger one
    # freed (in increasing order every key would need new, larger blocks).
    with quiet_captures(segments):
        for bs in reversed(sizes):
            capture_batch_size(worker, bs)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the eager first runs' cached blocks; the graphs keep theirs
    grown = torch.cuda.memory_reserved(worker.device) - reserved
    reserve = worker.glue_reserve
    info = {
        "batch_sizes": len(sizes),
        "captures": sum(seg.counts["captures"] for seg in segments) - before,
        "seconds": round(time.perf_counter() - t0, 1),
        "memory_gib": round(grown / 2**30, 3),
        "reserved_gib": round(reserve.nbytes / 2**30, 3) if reserve is not None else None,
    }
    worker.graph_stats.startup = info
    if worker.tp_rank == 0:
        logger.info("DDTREE glue graphs captured at startup: %s", info)
        warning = glue_memory_warning(grown, reserve.nbytes, max_bs) if reserve else None
        if warning:
            logger.warning(warning)
    return info


def capture_batch_size(worker, bs: int) -> None:
    """The step's glue graphs at ``bs`` requests (`DDTreeStep.capture`), every accept mode, on
    a placeholder batch: request-pool row 0 with one cached token, root token 0."""
    device = worker.device
    batch = SimpleNamespace(
        seq_lens=torch.ones(bs, dtype=torch.int64, device=device),
        req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
        seq_lens_cpu=torch.ones(bs, dtype=torch.int64),
        seq_lens_sum=bs,
        spec_info=SimpleNamespace(
            bonus_tokens=torch.zeros(bs, dtype=torch.int64, device=device),
            reserved_seq_lens_cpu=None,
            reserved_seq_lens_sum=None,
        ),
    )
    worker.ddtree_step.capture(batch, (dummy_sampling_info(m, bs, device) for m in accept_modes()))
