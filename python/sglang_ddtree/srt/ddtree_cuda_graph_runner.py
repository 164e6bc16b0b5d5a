"""Target-verify CUDA graphs that carry the DDTREE tree mask, one set per W of the schedule.

Tree mask. SGLang's DFlash-family graph dummy is mask-less on triton/flashinfer (a DFLASH block
is plain causal), which freezes the captured attention metadata to "no custom mask": a replayed
tree verify would then silently attend causally. Where the target's verify backend reads the
FULL_MASK (``reads_full_mask``), the runner below captures the target's TARGET_VERIFY graphs with
the runner's static all-True mask buffer, so the backend's replay path copies each step's tree
mask in; one that reads the tree's own mask fills buffers of its own before each capture and
replay (``init_forward_metadata``). The drafter's graphs are untouched (its block is B wide).

Budget buckets (``sglang_ddtree.srt.ddtree_budget``). The verify width W depends on the batch size: bucket
i of the schedule captures ITS batch sizes (``BudgetSchedule.buckets``: SGLang's capture sizes
inside the bucket plus the bucket's top) at ITS W. Design: ONE runner whose width
``captured_req_width`` is a function of bs, rather than one runner per bucket:

- The attention backend's CUDA-graph state is allocated once. ``DecodeCudaGraphRunner.__init__``
  calls ``attn_backend.init_cuda_graph_state(max_bs, max_bs * W)``, which for triton REPLACES
  ``cuda_graph_attn_logits / _lse / _num_kv_splits / _kv_indices`` and the verify mask buffer
  (flashinfer: ``cuda_graph_kv_indices``, ``cuda_graph_custom_mask``). A second runner would
  reallocate the buffers the first runner's graphs point to (freed memory, stale metadata).
  One runner calls it once, sized for the largest W (the backend's verify mask already uses
  SGLang's ``speculative_num_draft_tokens`` = the schedule's largest W).
- Model code, the scheduler and ``DFlashVerifyInput.prepare_for_verify`` all use
  ``model_runner.decode_cuda_graph_runner``; nothing has to be swapped per step.
- The padded capture sizes of different buckets are disjoint, so bs alone picks W: flashinfer's
  per-bs wrapper dicts (``prefill_cuda_graph_metadata[bs]``) never see one bs at two widths, and
  SGLang's own padding (smallest captured size >= bs) never crosses a bucket.

The width is set from the batch size in ``can_run_graph`` (called by both
``prepare_for_verify`` and ``ModelRunner.forward`` before ``load_batch`` / ``execute``) and per
bucket during capture; the graph key carries it (``variant_label`` ``"w<W>"``), so a replay at a
width without a graph fails loudly (KeyError) instead of running the wrong one. A verify whose
per-request width differs from the schedule's W for its bs falls back to eager in SGLang; this
runner counts those (``width_mismatches``) and logs them, and the worker counts every eager
verify step that had a graph (``graph_stats`` in ``ddtree_worker_v2``).

Cost: the static input buffers and the shared logits buffer are sized ``max_bs * max W`` (as a
fixed-W engine at the largest W would be), although no captured shape needs more than
``max(bs * W(bs))`` rows.

Installed on the *target* model runner through its ``_decode_cuda_graph_runner_cls`` override
point, from the worker's constructor (which runs before any capture); it reads the schedule from
the server arguments, as the worker does (``schedule_from_args``).
"""

from __future__ import annotations

import contextlib
import logging

from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.model_executor.runner.shape_key import ShapeKey

from sglang_ddtree.srt.ddtree_attention.attention_registry import verify_backend_of
from sglang_ddtree.srt.ddtree_budget import capture_union, schedule_from_args

logger = logging.getLogger(__name__)


class DDTreeDecodeCudaGraphRunner(DecodeCudaGraphRunner):
    """Decode/verify graph runner: tree-mask capture dummy, verify width W(bs) per bucket."""

    def __init__(self, model_runner, **kwargs):
        # Set before super().__init__, which captures at its end. The target's runner only.
        self.budget_schedule = schedule_from_args(model_runner.server_args)
        self.width_mismatches = 0
        self._warned_mismatch: set[tuple[int, int]] = set()
        self.capture_plan: list[tuple[int, list[int]]] = []
        super().__init__(model_runner, **kwargs)

    # --- width per batch size ----------------------------------------------------------------
    def width_for(self, bs: int) -> int:
        """W of the graphs that serve a batch of ``bs`` requests."""
        return self.budget_schedule.num_nodes_for(max(1, int(bs)))

    @contextlib.contextmanager
    def _width(self, width: int):
        saved = self.captured_req_width
        self.captured_req_width = int(width)
        try:
            yield
        finally:
            self.captured_req_width = saved

    def _make_graph_key(self, size, stream_idx=None, variant_label=None):
        width = f"w{self.captured_req_width}"
        label = width if variant_label is None else f"{width}/{variant_label}"
        return ShapeKey(size=size, stream_idx=stream_idx, variant_label=label)

    # --- capture -----------------------------------------------------------------------------
    def capture(self) -> None:
        schedule = self.budget_schedule
        if schedule.max_num_nodes != self.captured_req_width:
            raise RuntimeError(
                f"DDTREE: budget schedule {schedule} has largest W {schedule.max_num_nodes}, but "
                f"the runner was sized for W={self.captured_req_width} "
                "(speculative_num_draft_tokens); they must agree."
            )
        self.capture_plan = [(w, s) for w, s in schedule.buckets(self.capture_bs) if s]
        # SGLang pads a batch to the smallest of these sizes >= bs, always inside bs's bucket.
        # Same largest size as SGLang's list, so max_bs and the buffers sized from it still hold.
        self.capture_bs = capture_union(self.capture_plan)
        if not self.model_runner.is_draft_worker:
            logger.info(
                "DDTREE target-verify graphs: schedule %s, capture plan %s",
                schedule,
                "; ".join(f"W={w}: bs {s}" for w, s in self.capture_plan),
            )
        super().capture()

    def _capture_one_stream(self, stream_idx=None) -> None:
        all_bs = self.capture_bs
        # Largest token count first, so smaller graphs reuse the shared graph memory pool.
        plan = sorted(self.capture_plan, key=lambda p: -max(p[1]) * p[0])
        try:
            for width, sizes in plan:
                self.capture_bs = sizes
                with self._width(width):
                    super()._capture_one_stream(stream_idx)
        finally:
            self.capture_bs = all_bs

    def get_spec_info(self, num_tokens: int):
        # DFLASH's dummy has draft_token_num = captured_req_width, i.e. this bucket's W.
        spec_info = super().get_spec_info(num_tokens)
        if spec_info is not None and not self.model_runner.is_draft_worker:
            verify = verify_backend_of(self.model_runner)
            if verify is None or verify.reads_full_mask:  # else its own buffers (its metadata)
                # [(max_bs * fill + max_tokens) * width] bool, all True: mask mode on at capture.
                spec_info.custom_mask = self.buffers.custom_mask
        return spec_info

    # --- replay ------------------------------------------------------------------------------
    def can_run_graph(self, forward_batch) -> bool:
        """Select W(bs) for this step (kept for load_batch / execute), then SGLang's checks."""
        width = self.width_for(forward_batch.batch_size)
        self.captured_req_width = width
        spec_info = forward_batch.spec_info
        got = int(getattr(spec_info, "num_tokens_per_req", -1) or -1)
        if got > 0 and got != width:
            self.width_mismatches += 1
            key = (int(forward_batch.batch_size), got)
            if key not in self._warned_mismatch:
                self._warned_mismatch.add(key)
                logger.warning(
                    "DDTREE: verify of bs=%d has %d nodes per request but the schedule %s gives "
                    "W=%d: runs WITHOUT CUDA graphs.",
                    forward_batch.batch_size,
                    got,
                    self.budget_schedule,
                    width,
                )
        return super().can_run_graph(forward_batch)

    def has_graph_for(self, bs: int) -> bool:
        """Whether a verify of ``bs`` requests should replay a captured graph."""
        if self.disable_padding:
            return int(bs) in self.capture_bs
        return 1 <= int(bs) <= self.max_bs


def install_target_graph_runner(model_runner) -> None:
    """Make ``model_runner`` build `DDTreeDecodeCudaGraphRunner` (in-tree, its
    ``_decode_cuda_graph_runner_cls`` picks it for DDTREE)."""
    model_runner._decode_cuda_graph_runner_cls = lambda: DDTreeDecodeCudaGraphRunner
