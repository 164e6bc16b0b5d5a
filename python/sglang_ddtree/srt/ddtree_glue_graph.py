"""CUDA graphs for the tensor glue of a DDTREE decode step.

A DDTREE step runs two SGLang forwards (the drafter block and the target tree verify), both replayed
from SGLang's CUDA graphs. Around them sit about a hundred small kernels (top-K, tree build, layout,
accept, commit, KV moves, drafter-KV append); launched one by one from Python they made the step
host-bound. `SegmentGraphs` captures such a run of kernels once per key and replays it.

Terms:

- **segment**: a function of tensors whose output shapes depend on the key alone and which
  never reads the device from the host (so it can be captured).
- **key**: a hashable host value fixing every shape and every host branch of the segment
  (batch size, tree width W, sampling mode).
- **bound input**: a tensor the graph reads in place, e.g. a static output of an SGLang graph
  (drafter hidden states, target logits) or of an earlier segment. A replay requires the same
  address, shape, strides and dtype as at capture; otherwise the key is captured again.
- **copied input**: a small tensor (sequence lengths, bonus tokens, sampling parameters) copied
  into the graph's own buffer before every replay.
- **outputs**: tensors allocated outside the graph memory pool and written by the graph's last
  kernels; overwritten by the next replay of the same key. Callers clone what outlives the step.
- **output group** (``outputs_by(key)``): keys whose outputs share one set of buffers where
  their shapes and dtypes agree, so a later segment that binds them (the KV commit binding the
  accept's, over the accept modes of one batch size) replays one graph for all of them; a
  replay of any key of the group overwrites them.

One memory pool serves every graph (a private pool per graph would pin a copy of the sampled
path's ``[bs x W, V]`` intermediates per key). Sharing is safe for intermediates because the
graphs replay one at a time on one stream; it is not safe for outputs: a graph captured later
may place its outputs in blocks that an earlier graph uses as scratch, and replaying the earlier
graph between the two (e.g. the KV segment after a sampled-accept graph first captured when
greedy keys already existed) would overwrite them. Hence the copy into outside buffers.

The first call of a key runs the segment eagerly (that run is the step's result; it also
compiles Triton kernels and creates cuBLAS handles, which must not happen during a capture)
and then captures it on a side stream. A ``pure`` segment (no side effects) then replays once so
that its outputs already have their stable graph addresses; a segment with side effects (KV
writes) is not replayed, since running it twice is not idempotent.

A key whose capture fails, or whose bound inputs keep moving (``max_captures`` per key), runs
eagerly from then on, with one warning. Eager and graph runs compute the same tensors, so the
output law never depends on which one ran.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from contextlib import contextmanager
from typing import Any

import torch

logger = logging.getLogger(__name__)


def padded_size(runner, bs: int) -> int | None:
    """The batch size a SGLang CUDA-graph ``runner`` pads ``bs`` requests to (the smallest
    captured size >= bs), or None (no runner, no padding, or none that large)."""
    sizes = sorted(getattr(runner, "capture_bs", None) or ())
    if not sizes or getattr(runner, "disable_padding", False):
        return None
    i = bisect.bisect_left(sizes, int(bs))
    return int(sizes[i]) if i < len(sizes) else None


def _signature(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


class _Entry:
    """One captured key: the graph, its bound inputs (kept alive), copy buffers and outputs."""

    def __init__(self, graph, bound: dict, copied: dict, outputs: Any):
        self.graph = graph
        self.bound = bound
        self.signature = {name: _signature(t) for name, t in bound.items()}
        self.copied = copied
        self.outputs = outputs

    def binds(self, bound: Mapping[str, torch.Tensor]) -> bool:
        return all(_signature(t) == self.signature[name] for name, t in bound.items())


class SegmentGraphs:
    """CUDA graphs of one segment ``fn(**bound, **copied)``, one per key.

    ``counts`` (host numbers): ``graph`` replays, ``eager`` runs (first runs of a key,
    disabled, failed or given-up keys), ``captures``, ``recaptures`` (bound inputs moved),
    ``capture_failures``, ``capture_ms`` (host wall time spent in first calls: the eager run,
    the capture and the first replay; no device sync, so GPU work still queued is not in it).
    """

    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        enabled: bool = True,
        pure: bool = True,
        pool=None,
        stream: torch.cuda.Stream | None = None,
        max_captures: int = 4,
        outputs_by: Callable[[Hashable], Hashable] | None = None,
    ):
        self.name = name
        self.fn = fn
        self.enabled = enabled
        self.pure = pure
        self.pool = pool
        self.max_captures = max_captures
        self.outputs_by = outputs_by
        self._group_outputs: dict[Hashable, Any] = {}  # (group, output layout) -> buffers
        self.entries: dict[Hashable, _Entry] = {}
        self.captures_of: dict[Hashable, int] = {}
        self.eager_keys: set[Hashable] = set()
        # A capture while serving costs that request a step's delay: one line each. The startup
        # capture (`quiet_captures`) logs its keys at DEBUG and a summary instead.
        self.capture_log_level = logging.INFO
        self.counts = {
            "graph": 0,
            "eager": 0,
            "captures": 0,
            "recaptures": 0,
            "capture_failures": 0,
            "capture_ms": 0.0,
        }
        # Segments that share a pool share the capture stream too: the caching allocator
        # reuses a freed block only for allocations on the stream that allocated it.
        self._stream = stream

    def __call__(
        self,
        key: Hashable,
        bound: Mapping[str, torch.Tensor],
        copied: Mapping[str, torch.Tensor] | None = None,
        static: Mapping[str, Any] | None = None,
    ) -> Any:
        """``fn(**bound, **copied, **static)``, replayed from the key's graph when it has one.

        ``static``: host arguments of ``fn`` (flags, sizes); they must be fixed by ``key``.
        ``key=None``: run eagerly, capture nothing (e.g. a batch SGLang runs without graphs,
        whose bound inputs would move every step).
        """
        copied = dict(copied or {})
        static = dict(static or {})
        if key is None:
            return self._eager(bound, copied, static)
        entry = self.entries.get(key)
        if entry is not None and entry.binds(bound):
            for name, src in copied.items():
                dst = entry.copied[name]
                assert dst.shape == src.shape, (self.name, key, name, dst.shape, src.shape)
                dst.copy_(src, non_blocking=True)
            entry.graph.replay()
            self.counts["graph"] += 1
            return entry.outputs
        if not self.enabled or key in self.eager_keys or not _capturable(bound, copied):
            return self._eager(bound, copied, static)
        if entry is not None:
            self.counts["recaptures"] += 1
            del self.entries[key]  # its pool blocks return to the shared pool
        if self.captures_of.get(key, 0) >= self.max_captures:
            self.eager_keys.add(key)
            logger.warning(
                "DDTREE glue graph %s, key %s: bound inputs moved %d times; running it eagerly "
                "from now on.",
                self.name,
                key,
                self.max_captures,
            )
            return self._eager(bound, copied, static)
        t0 = time.perf_counter()
        try:
            return self._capture(key, bound, copied, static)
        finally:
            self.counts["capture_ms"] += (time.perf_counter() - t0) * 1e3

    def _output_buffers(self, key, result) -> Any:
        """Buffers shaped like ``result`` for the key's outputs: its own, or its output
        group's where the group already has buffers of the same layout."""
        if self.outputs_by is None:
            return _map_tensors(torch.empty_like, result)
        group = (self.outputs_by(key), type(result), _layout(result))
        if group not in self._group_outputs:
            self._group_outputs[group] = _map_tensors(torch.empty_like, result)
        return self._group_outputs[group]

    def _eager(self, bound, copied, static) -> Any:
        self.counts["eager"] += 1
        return self.fn(**bound, **copied, **static)

    def _capture(self, key, bound, copied, static) -> Any:
        result = self._eager(bound, copied, static)  # the step's result; also the warm-up
        self.captures_of[key] = self.captures_of.get(key, 0) + 1
        buffers = {name: torch.empty_like(t) for name, t in copied.items()}
        out_buffers = self._output_buffers(key, result)  # outside the pool (see above)
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        graph = torch.cuda.CUDAGraph()
        generator = torch.cuda.default_generators[torch.cuda.current_device()]
        rng_before = generator.clone_state()
        stream.wait_stream(torch.cuda.current_stream())
        began = False
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                began = True
                try:
                    _copy_tensors(out_buffers, self.fn(**bound, **buffers, **static))
                finally:
                    graph.capture_end()
        except Exception as e:  # e.g. a host sync inside fn: this key stays eager
            if began:
                _undo_failed_capture(graph, generator, rng_before)
            self.counts["capture_failures"] += 1
            self.eager_keys.add(key)
            logger.warning(
                "DDTREE glue graph %s, key %s: capture failed (%s: %s); running it eagerly.",
                self.name,
                key,
                type(e).__name__,
                e,
            )
            return result
        finally:
            torch.cuda.current_stream().wait_stream(stream)
        self.counts["captures"] += 1
        logger.log(self.capture_log_level, "DDTREE glue graph %s: captured key %s.", self.name, key)
        entry = _Entry(graph, dict(bound), buffers, out_buffers)
        self.entries[key] = entry
        if not self.pure:
            return result
        # Pure: replay now so later segments bind to the stable graph outputs from step one.
        for name, src in copied.items():
            buffers[name].copy_(src, non_blocking=True)
        graph.replay()
        return out_buffers


@contextmanager
def quiet_captures(segments):
    """Within the block, ``segments`` (``SegmentGraphs``) log each capture at DEBUG: the
    startup capture of every batch size's keys (thousands at a large max batch size) reports
    one summary line instead."""
    levels = [seg.capture_log_level for seg in segments]
    for seg in segments:
        seg.capture_log_level = logging.DEBUG
    try:
        yield
    finally:
        for seg, level in zip(segments, levels):
            seg.capture_log_level = level


def _map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], tree: Any) -> Any:
    """``fn`` applied to every tensor of a nest of tuples / NamedTuples / lists / dicts."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(_map_tensors(fn, x) for x in tree))
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map_tensors(fn, x) for x in tree)
    if isinstance(tree, dict):
        return {k: _map_tensors(fn, v) for k, v in tree.items()}
    return tree


def _layout(tree: Any) -> tuple:
    """The shape, dtype and device of every tensor of a nest, in `_map_tensors`' order."""
    leaves: list = []
    _map_tensors(lambda t: leaves.append((tuple(t.shape), t.dtype, t.device)) or t, tree)
    return tuple(leaves)


def _copy_tensors(dst: Any, src: Any) -> None:
    """``dst_t.copy_(src_t)`` for the tensors of two nests of the same structure."""
    if isinstance(dst, torch.Tensor):
        assert isinstance(src, torch.Tensor) and src.shape == dst.shape, (dst, src)
        dst.copy_(src)
    elif isinstance(dst, (tuple, list)):
        assert isinstance(src, (tuple, list)) and len(src) == len(dst)
        for d, x in zip(dst, src):
            _copy_tensors(d, x)
    elif isinstance(dst, dict):
        for k, d in dst.items():
            _copy_tensors(d, src[k])


def _undo_failed_capture(graph, generator, rng_before) -> None:
    """Leave no capture state behind after ``capture_end`` raised.

    PyTorch's ``capture_end`` raises before its own clean-up when the capture was invalidated:
    the CUDA generator would stay in capture mode (every later ``torch.rand`` fails with
    "Offset increment outside graph capture") and the capture stream would keep allocating
    from the graph pool. Restore the generator's pre-capture state and end the pool routing.
    """
    try:
        generator.graphsafe_set_state(rng_before)
    except Exception as e:  # pragma: no cover - depends on the torch build
        logger.error("DDTREE glue graph: could not restore the CUDA RNG state: %s", e)
    try:
        torch._C._cuda_endAllocateToPool(torch.cuda.current_device(), graph.pool())
    except Exception as e:  # pragma: no cover
        logger.error("DDTREE glue graph: could not end the capture's pool routing: %s", e)


def _capturable(bound: Mapping[str, torch.Tensor], copied: Mapping[str, torch.Tensor]) -> bool:
    tensors = list(bound.values()) + list(copied.values())
    return bool(tensors) and all(t.is_cuda for t in tensors)
