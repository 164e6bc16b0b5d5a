"""Benchmark instruments inside SGLang's scheduler processes: per-step GPU time, profilers,
host-device sync stacks, MoE expert counts and the allocator around DDTREE's startup glue
capture. The serving package neither imports nor reads any of this.

A benchmark that starts engines calls `install_from_env` when it is imported (``bench_step.py``
does): SGLang spawns its scheduler processes, each of which imports the launching module again,
so the instruments the environment names are registered there with SGLang's hook registry and
applied when the process loads its plugins, before its scheduler is built. Variables (``Knob``,
parsed as the plugin parses its own; a value that does not parse stops the install):

- ``SGLANG_DDTREE_STEP_TIMING=<dir>`` wraps ``Scheduler.run_batch`` (an AROUND hook): every
  batch gets a CUDA event on the forward stream when the scheduler starts it and one when it has
  enqueued it. Events are read back lazily with ``Event.query()`` (never a sync), and each
  scheduler process appends one JSON line per batch to ``<dir>/steps.<pid>.jsonl``:

  - ``t``: host ``time.monotonic()`` at the start of ``run_batch`` (system-wide clock on Linux,
    so a driver process can cut windows with its own ``time.monotonic()``);
  - ``bs``: requests in the batch; ``mode``: the batch's forward mode name (``DECODE`` for a
    decode / speculative decode step);
  - ``span_ms``: GPU time from the start event to the end event of this batch;
  - ``period_ms``: GPU time from this batch's start event to the next batch's start event
    (``null`` for the last batch before a pause): the step cost the GPU actually sees, idle gaps
    included, so it is also the cost of a launch-bound step;
  - ``host_ms``: host time inside ``run_batch`` for this batch (its launches, and any wait on
    the GPU there): beside ``period_ms``, how close a step is to the host bound.

  Applies to every worker (no speculation, DFLASH, DDTREE), so all are timed the same way. It
  also adds the allocator's view to DDTREE's startup glue capture summary
  (``graph_stats.startup``, `StartupMemory`).
- ``SGLANG_DDTREE_CPROFILE=<skip>`` (with the above) also profiles the scheduler thread's host
  time with cProfile: a segment starts after ``skip`` decode batches of one batch size in a row
  and ends at the next non-decode batch or batch-size change; each segment is written as
  ``<dir>/cprofile.<pid>.<k>.txt`` (top functions by own time and by cumulative time).
  ``SGLANG_DDTREE_CPROFILE=window`` instead profiles everything the scheduler thread does (all
  batches and the host work between them) while the file ``<dir>/cprofile.window`` exists, and
  writes ``<dir>/cprofile_window.<pid>.<k>.txt`` when it disappears (a benchmark driver creates
  it for the length of one measurement).
- ``SGLANG_DDTREE_TORCH_PROFILE=<skip>`` does the same with the torch profiler (CPU + CUDA
  activities; ``<dir>/torchprof.<pid>.<k>.txt``: ops by device time and by own CPU time, and the
  summed device time per decode step, and where the device sat idle between kernels:
  ``device_gaps``), which shows whether a step is GPU-bound or launch-bound.
- ``SGLANG_DDTREE_SYNC_TRACE=1`` (with the above) records the Python stack of every host-device
  synchronization inside a decode batch: torch's sync debug mode (``.item()``, device-to-host
  copies, ...) and explicit ``Stream`` / ``Event`` / device synchronizes. Unique stacks with
  their counts go to ``<dir>/syncs.<pid>.txt``, rewritten at every non-decode batch.
- ``SGLANG_DDTREE_MEMORY_HISTORY=1`` (with the above) records allocation stacks during the
  startup glue capture: its summary then names the code (file, line, function) that allocated
  the largest live blocks outside the glue graphs' pool.
- ``SGLANG_DDTREE_EXPERT_COUNT=<E>`` (with the above; CUDA graphs off) counts the distinct routed
  experts (ids below E) of every MoE top-k call and appends ``<tokens> <distinct>`` lines to
  ``<dir>/experts.<pid>.txt``: what an MoE layer reads per forward (one host sync per call).
"""

from __future__ import annotations

import cProfile
import io
import json
import logging
import os
import pstats
import time
import traceback
import warnings
from collections import Counter, deque
from collections.abc import Mapping

from sglang_ddtree.srt.ddtree_envs import Knob

logger = logging.getLogger(__name__)

WINDOW = "window"  # SGLANG_DDTREE_CPROFILE value: profile while WINDOW_FILE exists
WINDOW_FILE = "cprofile.window"


def _cprofile_setting(value: str) -> str | int:
    """``window``, or the decode batches to skip (an integer)."""
    if value == WINDOW:
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"is neither {WINDOW!r} nor an integer") from None


def _switch(value: str) -> bool:
    """``1`` (on) or ``0`` (off)."""
    if value not in ("0", "1"):
        raise ValueError("is not 0 or 1")
    return value == "1"


class InstrumentEnvs:
    """The instruments' variables (see the module's docstring)."""

    SGLANG_DDTREE_STEP_TIMING = Knob(
        str, None, "a directory; per-step GPU time of every scheduler batch is written there"
    )
    SGLANG_DDTREE_CPROFILE = Knob(
        str,
        None,
        "cProfile the scheduler's host time after this many decode batches of one size, or "
        "window (while <dir>/cprofile.window exists)",
        parse=_cprofile_setting,
        fix=f"set it to {WINDOW} or to the decode batches to skip, e.g. 20",
    )
    SGLANG_DDTREE_TORCH_PROFILE = Knob(
        int, None, "torch-profile decode steps after this many decode batches of one size"
    )
    SGLANG_DDTREE_SYNC_TRACE = Knob(
        str,
        None,
        "1: record the Python stack of every host-device sync in a decode batch",
        parse=_switch,
        fix="set it to 1 or 0",
    )
    SGLANG_DDTREE_MEMORY_HISTORY = Knob(
        str,
        None,
        "1: record allocation stacks during the startup glue capture; its summary names the code "
        "that allocated the largest live blocks outside the graphs' pool",
        parse=_switch,
        fix="set it to 1 or 0",
    )
    SGLANG_DDTREE_EXPERT_COUNT = Knob(
        int, None, "count the distinct routed experts (ids below this) of every MoE top-k call"
    )


envs = InstrumentEnvs()
KNOBS: tuple[Knob, ...] = tuple(v for v in vars(InstrumentEnvs).values() if isinstance(v, Knob))
ENV = envs.SGLANG_DDTREE_STEP_TIMING.name
CPROFILE_ENV = envs.SGLANG_DDTREE_CPROFILE.name
TORCH_PROFILE_ENV = envs.SGLANG_DDTREE_TORCH_PROFILE.name
SYNC_TRACE_ENV = envs.SGLANG_DDTREE_SYNC_TRACE.name
MEMORY_HISTORY_ENV = envs.SGLANG_DDTREE_MEMORY_HISTORY.name
EXPERT_COUNT_ENV = envs.SGLANG_DDTREE_EXPERT_COUNT.name
TORCH_PROFILE_STEPS = 20
TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"
TOPK_TARGET = "sglang.srt.layers.moe.topk.TopK.forward_cuda"
# DDTREE's startup glue capture and its capture of each batch size.
STARTUP_TARGET = "sglang_ddtree.srt.ddtree_glue_warmup.capture_glue_at_startup"
BATCH_CAPTURE_TARGET = "sglang_ddtree.srt.ddtree_glue_warmup.capture_batch_size"
# Batches farther apart than this on the host are not consecutive steps of one run.
MAX_GAP_S = 0.5


class StepRecorder:
    """Pending CUDA-event pairs of recent batches; resolved without blocking."""

    def __init__(self, path: str):
        self.path = path
        self.pending: deque = deque()

    def start(self, batch, stream):
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        mode = getattr(batch.forward_mode, "name", str(batch.forward_mode))
        return {"t": time.monotonic(), "bs": int(batch.batch_size()), "mode": mode, "ev": ev}

    def finish(self, rec, stream) -> None:
        import torch

        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        rec["end"] = end
        rec["host_ms"] = (time.monotonic() - rec["t"]) * 1e3
        self.pending.append(rec)
        self.flush(force=rec["mode"] != "DECODE")

    def flush(self, force: bool = False) -> None:
        """Write every finished record whose successor's start event has also completed."""
        if not force and len(self.pending) < 64:
            return
        lines = []
        while len(self.pending) >= 2 and self.pending[1]["ev"].query():
            rec = self.pending.popleft()
            nxt = self.pending[0]
            consecutive = nxt["t"] - rec["t"] < MAX_GAP_S
            lines.append(
                self._line(rec, rec["ev"].elapsed_time(nxt["ev"]) if consecutive else None)
            )
        if len(self.pending) == 1 and self.pending[0]["end"].query():
            rec = self.pending[0]
            if time.monotonic() - rec["t"] > MAX_GAP_S:  # a pause followed: no successor
                self.pending.popleft()
                lines.append(self._line(rec, None))
        if lines:
            with open(self.path, "a") as f:
                f.write("".join(lines))

    @staticmethod
    def _line(rec, period_ms) -> str:
        span = rec["ev"].elapsed_time(rec["end"])
        out = {"t": rec["t"], "bs": rec["bs"], "mode": rec["mode"], "span_ms": span}
        out["period_ms"] = period_ms
        out["host_ms"] = rec.get("host_ms")
        return json.dumps(out) + "\n"


def write_cprofile(prof: cProfile.Profile, path: str, head: str, by_own: int, by_cum: int):
    """Stop ``prof`` and write ``head``, then its top functions by own and by cumulative time."""
    prof.disable()
    buf = io.StringIO()
    buf.write(head + "\n")
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(by_own)
    stats.sort_stats("cumulative").print_stats(by_cum)
    with open(path, "w") as f:
        f.write(buf.getvalue())


def device_gaps(kernels: list[tuple[str, float, float]], steps: int, top: int = 12) -> str:
    """Where the device sat idle, from ``(name, start_us, end_us)`` of every device activity
    (kernels, copies) of ``steps`` decode steps: the idle time between the first start and the
    last end, per step, and the ``top`` largest idle spans summed per (kernel before -> kernel
    after) pair. Overlapping activities (several streams) leave no gap."""
    per = max(steps, 1)
    if not kernels:
        return "device idle between kernels per step: no device activity\n"
    kernels = sorted(kernels, key=lambda k: k[1])
    busy_until, last = kernels[0][2], kernels[0][0]
    gaps: Counter = Counter()
    calls: Counter = Counter()
    for name, start, end in kernels[1:]:
        if start > busy_until:
            pair = (last[:60], name[:60])
            gaps[pair] += start - busy_until
            calls[pair] += 1
        if end >= busy_until:
            busy_until, last = end, name
    idle = sum(gaps.values())
    span = busy_until - kernels[0][1]
    lines = [
        f"device idle between kernels per step: {idle / per / 1e3:.3f} ms "
        f"(first start to last end: {span / per / 1e3:.3f} ms)",
        "idle us per step, gaps per step: kernel before -> kernel after",
    ]
    for pair, us in gaps.most_common(top):
        lines.append(f"{us / per:9.1f} {calls[pair] / per:5.1f}  {pair[0]} -> {pair[1]}")
    return "\n".join(lines) + "\n"


class _Segments:
    """What the profilers share: the open profiler (or None) and one numbered file per
    closed segment."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir
        self.prof = None
        self.segment = 0

    def _close(self, prefix: str):
        """``(profiler, file path)`` of the segment being closed; the next segment starts
        empty with the next number."""
        prof, self.prof = self.prof, None
        path = os.path.join(self.out_dir, f"{prefix}.{os.getpid()}.{self.segment}.txt")
        self.segment += 1
        return prof, path


class HostProfiler(_Segments):
    """Profiler segments (cProfile or torch) of the scheduler thread, one per run of decode
    batches."""

    def __init__(self, out_dir: str, skip: int, kind: str = "cprofile"):
        super().__init__(out_dir)
        self.skip, self.kind = skip, kind
        self.decode_batches = 0
        self.profiled = 0
        self.bs = None  # batch size of the current run of decode batches

    def on_batch(self, mode: str, bs: int | None = None) -> None:
        """A segment is one run of decode batches of one batch size: a prefill or a new size
        ends it and restarts the skip count, so a segment never holds the first steps at a
        size (where DDTREE captures its glue graphs) or a batch being filled or drained."""
        if mode != "DECODE" or bs != self.bs:
            self.dump()
            self.decode_batches = 0
            self.bs = bs
            if mode != "DECODE":
                return
        self.decode_batches += 1
        if self.prof is not None:
            if self.kind == "torch" and self.profiled >= TORCH_PROFILE_STEPS:
                self.dump()  # the torch profiler's tables get slow to build beyond a few steps
            else:
                self.profiled += 1
            return
        if self.decode_batches == self.skip + 1:
            self.profiled = 1  # this batch is the segment's first
            if self.kind == "torch":
                import torch

                acts = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():  # CPU-only: the tests run the segment logic
                    acts.append(torch.profiler.ProfilerActivity.CUDA)
                self.prof = torch.profiler.profile(activities=acts)
                self.prof.__enter__()
            else:
                self.prof = cProfile.Profile()
                self.prof.enable()

    def dump(self) -> None:
        """Close the open segment (``profiled`` whole decode batches) and write its tables."""
        if self.prof is None:
            return
        steps = self.profiled
        if self.kind == "torch":
            self._dump_torch(steps)
            return
        prof, path = self._close("cprofile")
        write_cprofile(prof, path, f"decode batches profiled: {steps}", 45, 60)

    def _dump_torch(self, steps: int) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()  # benchmark-only: the segment is over
        prof, path = self._close("torchprof")
        prof.__exit__(None, None, None)
        avg = prof.key_averages()
        # Kernel time only: SGLang's record_function ranges also show up as device events
        # (user annotations) spanning whole steps, and would count the same time twice.
        device_us = sum(
            e.self_device_time_total
            for e in avg
            if e.device_type != torch.autograd.DeviceType.CPU
            and not getattr(e, "is_user_annotation", False)
        )
        cpu_us = sum(e.self_cpu_time_total for e in avg)
        activity = [
            (e.name, e.time_range.start, e.time_range.end)
            for e in prof.events()
            if e.device_type != torch.autograd.DeviceType.CPU
            and not getattr(e, "is_user_annotation", False)
        ]
        head = (
            f"decode batches profiled: {steps}\n"
            f"device kernel time per step: {device_us / max(steps, 1) / 1e3:.3f} ms\n"
            f"host CPU time per step (profiler on): {cpu_us / max(steps, 1) / 1e3:.3f} ms\n"
            + device_gaps(activity, steps)
            + "\n"
        )
        by_dev = avg.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=70)
        by_cpu = avg.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70)
        with open(path, "w") as f:
            f.write(head + by_dev + "\n\n" + by_cpu)


class WindowProfiler(_Segments):
    """cProfile of the scheduler thread while ``<out_dir>/cprofile.window`` exists (a driver
    creates and removes it around a serving level); one table per window."""

    def __init__(self, out_dir: str):
        super().__init__(out_dir)
        self.trigger = os.path.join(out_dir, WINDOW_FILE)
        self.modes: Counter = Counter()

    def on_batch(self, mode: str, bs: int | None = None) -> None:
        on = os.path.exists(self.trigger)
        if on and self.prof is None:
            self.modes = Counter()
            self.prof = cProfile.Profile()
            self.prof.enable()
        elif not on and self.prof is not None:
            self.dump()
        if self.prof is not None:
            self.modes[mode] += 1

    def dump(self) -> None:
        if self.prof is None:
            return
        prof, path = self._close("cprofile_window")
        write_cprofile(prof, path, f"batches profiled: {dict(self.modes)}", 60, 90)


class SyncTracer:
    """Stacks of the host-device synchronizations made inside decode batches (benchmarks only).

    ``run(fn)`` calls ``fn`` with torch's sync debug mode on "warn" (the warnings it raises for
    syncing ops are turned into stack records, not printed) and with ``torch.cuda.synchronize``,
    ``Stream.synchronize`` and ``Event.synchronize`` wrapped to record their callers too.
    """

    MARK = "called a synchronizing CUDA operation"  # torch's sync debug warning

    def __init__(self, path: str, stack_limit: int = 14):
        self.path, self.stack_limit = path, stack_limit
        self.stacks: Counter = Counter()
        self.batches = 0

    def record(self, kind: str) -> None:
        frames = traceback.format_stack(limit=self.stack_limit)[:-2]  # drop the tracer's frames
        self.stacks[kind + "\n" + "".join(frames)] += 1

    def run(self, fn):
        import torch

        self.batches += 1
        originals = {
            (torch.cuda, "synchronize"): torch.cuda.synchronize,
            (torch.cuda.Stream, "synchronize"): torch.cuda.Stream.synchronize,
            (torch.cuda.Event, "synchronize"): torch.cuda.Event.synchronize,
        }

        def wrap(name, original):
            def traced(*args, **kwargs):
                self.record(f"explicit {name}")
                return original(*args, **kwargs)

            return traced

        def show(message, category, filename, lineno, file=None, line=None):
            if self.MARK in str(message):
                self.record("torch sync debug: " + str(message).splitlines()[0])
            else:
                shown(message, category, filename, lineno, file, line)

        shown = warnings.showwarning
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            for (owner, attr), original in originals.items():
                setattr(owner, attr, wrap(f"{getattr(owner, '__name__', owner)}.{attr}", original))
            cuda = torch.cuda.is_available()
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                return fn()
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
                for (owner, attr), original in originals.items():
                    setattr(owner, attr, original)

    def dump(self) -> None:
        """Rewrite ``self.path``: decode batches traced, then each unique stack by count."""
        lines = [f"decode batches traced: {self.batches}\n"]
        lines.append(f"synchronizations: {sum(self.stacks.values())}\n\n")
        for stack, count in self.stacks.most_common():
            lines.append(f"=== {count} x {stack}\n")
        with open(self.path, "w") as f:
            f.write("".join(lines))


_recorder: StepRecorder | None = None
_profiler: HostProfiler | WindowProfiler | None = None
_sync_tracer: SyncTracer | None = None


def _run_batch_hook(original_fn, scheduler, batch, *args, **kwargs):
    import torch

    global _recorder, _profiler, _sync_tracer
    if _recorder is None:
        out_dir = envs.SGLANG_DDTREE_STEP_TIMING.get()
        os.makedirs(out_dir, exist_ok=True)
        _recorder = StepRecorder(os.path.join(out_dir, f"steps.{os.getpid()}.jsonl"))
        if envs.SGLANG_DDTREE_SYNC_TRACE.get():
            _sync_tracer = SyncTracer(os.path.join(out_dir, f"syncs.{os.getpid()}.txt"))
        cprofile = envs.SGLANG_DDTREE_CPROFILE.get()
        torch_profile = envs.SGLANG_DDTREE_TORCH_PROFILE.get()
        if cprofile == WINDOW:
            _profiler = WindowProfiler(out_dir)
        elif cprofile is not None:
            _profiler = HostProfiler(out_dir, cprofile)
        elif torch_profile is not None:
            _profiler = HostProfiler(out_dir, torch_profile, kind="torch")
    stream = getattr(scheduler, "forward_stream", None) or torch.cuda.current_stream()
    rec = _recorder.start(batch, stream)
    if _profiler is not None:
        _profiler.on_batch(rec["mode"], rec["bs"])
    if _sync_tracer is not None and rec["mode"] == "DECODE":
        result = _sync_tracer.run(lambda: original_fn(scheduler, batch, *args, **kwargs))
    else:
        if _sync_tracer is not None:
            _sync_tracer.dump()
        result = original_fn(scheduler, batch, *args, **kwargs)
    _recorder.finish(rec, stream)
    return result


def distinct_routed_experts(topk_ids, num_routed: int) -> int:
    """Distinct routed experts in ``topk_ids`` [tokens, k] (ids in [0, num_routed); a fused
    shared expert's id and -1 padding are not routed experts). Reads the device."""
    import torch

    flat = topk_ids.reshape(-1)
    return int(torch.unique(flat[(flat >= 0) & (flat < num_routed)]).numel())


def _topk_hook(original_fn, topk, *args, **kwargs):
    import torch

    out = original_fn(topk, *args, **kwargs)
    ids = getattr(out, "topk_ids", None)
    if ids is not None and not torch.cuda.is_current_stream_capturing():
        n = distinct_routed_experts(ids, envs.SGLANG_DDTREE_EXPERT_COUNT.get())
        out_dir = envs.SGLANG_DDTREE_STEP_TIMING.get()
        with open(os.path.join(out_dir, f"experts.{os.getpid()}.txt"), "a") as f:
            f.write(f"{ids.shape[0]} {n}\n")
    return out


def read_expert_counts(out_dir: str) -> list[tuple[int, int]]:
    """Every ``(tokens, distinct routed experts)`` MoE top-k call written under ``out_dir``."""
    rows = []
    for name in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []:
        if name.startswith("experts.") and name.endswith(".txt"):
            with open(os.path.join(out_dir, name)) as f:
                rows += [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    return rows


# --- the allocator around DDTREE's startup glue capture -------------------------------------


def key_buffer_bytes(segments) -> int:
    """Bytes of the buffers the captured keys of ``segments`` (``SegmentGraphs``) keep outside
    the graph pool: their outputs and copied inputs, each storage once."""
    from sglang_ddtree.srt.ddtree_glue_graph import _map_tensors

    seen: dict[int, int] = {}

    def add(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    for seg in segments:
        for entry in seg.entries.values():
            _map_tensors(add, (entry.outputs, entry.copied))
    return sum(seen.values())


def _in_pool(segment: dict, pool) -> bool:
    """Whether a ``torch.cuda.memory_snapshot()`` segment belongs to the graph memory pool
    ``pool`` (a ``torch.cuda.graph_pool_handle()``; None: no pool)."""
    return pool is not None and tuple(segment.get("segment_pool_id", ())) == tuple(pool)


def pool_segment_bytes(snapshot: list[dict], pool) -> tuple[int, int]:
    """(reserved, allocated) bytes of the allocator segments that belong to the graph memory
    pool ``pool`` (a ``torch.cuda.graph_pool_handle()``), from ``torch.cuda.memory_snapshot()``."""
    mine = [seg for seg in snapshot if _in_pool(seg, pool)]
    return sum(seg["total_size"] for seg in mine), sum(seg["allocated_size"] for seg in mine)


LIVE_BLOCKS_SHOWN = 8
FRAMES_SHOWN = 3


def allocation_site(block: dict) -> list[str]:
    """Where a snapshot block was allocated: its innermost ``FRAMES_SHOWN`` Python frames
    outside torch's own files, as ``file:line function`` (empty unless allocation stacks were
    recorded, ``SGLANG_DDTREE_MEMORY_HISTORY``)."""
    sites = []
    for frame in block.get("frames") or ():
        filename = str(frame.get("filename", ""))
        if "/torch/" in filename or not filename.endswith(".py"):
            continue
        sites.append(f"{filename.rsplit('/', 1)[-1]}:{frame.get('line')} {frame.get('name')}")
        if len(sites) == FRAMES_SHOWN:
            break
    return sites


def new_segments_outside_pool(before: list[dict], after: list[dict], pool) -> dict:
    """The allocator segments in ``after`` that are neither in ``before`` (by address) nor in
    the graph pool ``pool``, per segment type (``small``: 2 MiB segments of allocations up to 1
    MiB; ``large``): ``{type: {"segments", "gib", "allocated_gib", "largest_live_mib"}}``, from
    two ``torch.cuda.memory_snapshot()``s; ``largest_live_mib``: the sizes of the largest live
    blocks there (up to ``LIVE_BLOCKS_SHOWN``), and where allocation stacks were recorded
    ``largest_live_sites``: the code that allocated each (`allocation_site`). Where the startup
    capture's growth outside the pool is much more than what lives there, segments pinned by a
    few live blocks (fragmentation)."""
    known = {seg.get("address") for seg in before}
    out: dict = {}
    for seg in after:
        if seg.get("address") in known or _in_pool(seg, pool):
            continue
        kind = out.setdefault(seg.get("segment_type", "?"), [0, 0, 0, []])
        kind[0] += 1
        kind[1] += seg["total_size"]
        kind[2] += seg["allocated_size"]
        kind[3] += [b for b in seg.get("blocks", ()) if b.get("state") == "active_allocated"]
    summary = {}
    for kind, (n, total, live, blocks) in sorted(out.items()):
        largest = sorted(blocks, key=lambda b: b["size"], reverse=True)[:LIVE_BLOCKS_SHOWN]
        summary[kind] = {"segments": n, "gib": round(total / 2**30, 3),
                         "allocated_gib": round(live / 2**30, 3),
                         "largest_live_mib": [round(b["size"] / 2**20, 2) for b in largest]}  # fmt: skip
        if any(b.get("frames") for b in largest):
            summary[kind]["largest_live_sites"] = [allocation_site(b) for b in largest]
    return summary


def _snapshot() -> list[dict] | None:
    """``torch.cuda.memory_snapshot()``, or None with a warning."""
    import torch

    try:
        return torch.cuda.memory_snapshot()
    except Exception as e:
        logger.warning("DDTREE instruments: no memory snapshot (%s: %s).", type(e).__name__, e)
        return None


def _record_stacks(on: bool) -> bool:
    """Start (or stop) recording the Python stack of every live allocation (no event history);
    whether that worked (a warning if not)."""
    import torch

    try:
        torch.cuda.memory._record_memory_history(enabled="state" if on else None, stacks="python")
        return True
    except Exception as e:
        logger.warning("DDTREE instruments: no allocation stacks (%s: %s).", type(e).__name__, e)
        return False


class StartupMemory:
    """The allocator around one startup glue capture: opened before it, ``after_step`` after
    each batch size's capture, ``summary`` once it is over: {"allocated_gib" (of what the
    capture took, what live tensors hold), "key_buffers_gib" (of that, the keys' outputs and
    copied inputs), "pool_gib" and "pool_allocated_gib" (the segments of the glue graphs' memory
    pool, and their live bytes), "outside_pool" (the new segments outside that pool per type,
    `new_segments_outside_pool`), "growth_mib_by_bs" ([bs, MiB reserved since the start] after
    each batch size's capture: where the growth happens), "reserved_working_set_gib" and
    "reserved_captured_gib" (what the constructor's two measures gave: the eager working set
    and, where they ran, the measuring captures)}."""

    def __init__(self, device, stacks: bool):
        import torch

        self.device = device
        torch.cuda.synchronize()
        self.reserved = torch.cuda.memory_reserved(device)
        self.allocated = torch.cuda.memory_allocated(device)
        self.stacks = stacks and _record_stacks(True)
        self.before = _snapshot()
        self.growth: list[list] = []

    def after_step(self, bs: int) -> None:
        import torch

        # The allocator's host-side count: no device sync.
        grown_mib = (torch.cuda.memory_reserved(self.device) - self.reserved) / 2**20
        self.growth.append([bs, round(grown_mib, 1)])

    def summary(self, worker) -> dict:
        import torch

        after = _snapshot()
        if self.stacks:
            _record_stacks(False)
        segments = worker.graph_stats.glue_segments
        # Allocated: blocks held by live tensors (the keys' buffers, the graphs' pool blocks);
        # the rest of the reserved growth is cached but free (rounding and fragmentation).
        held = torch.cuda.memory_allocated(self.device) - self.allocated
        info = {"allocated_gib": round(held / 2**30, 3),
                "key_buffers_gib": round(key_buffer_bytes(segments) / 2**30, 3)}  # fmt: skip
        pool = segments[0].pool if segments else None
        if pool is not None and after is not None:
            in_pool, live = pool_segment_bytes(after, pool)
            info["pool_gib"] = round(in_pool / 2**30, 3)
            info["pool_allocated_gib"] = round(live / 2**30, 3)
            if self.before is not None:
                info["outside_pool"] = new_segments_outside_pool(self.before, after, pool)
        info["growth_mib_by_bs"] = self.growth
        reserve = worker.glue_reserve
        if reserve is not None:
            info["reserved_working_set_gib"] = round(reserve.working_set / 2**30, 3)
            if reserve.captured is not None:
                info["reserved_captured_gib"] = round(reserve.captured / 2**30, 3)
        return info


_startup: StartupMemory | None = None


def _startup_capture_hook(original_fn, worker, *args, **kwargs):
    """Around DDTREE's startup glue capture: `StartupMemory`'s summary joins the capture's own
    (the worker's ``graph_stats.startup``)."""
    global _startup
    _startup = StartupMemory(worker.device, envs.SGLANG_DDTREE_MEMORY_HISTORY.get())
    try:
        info = original_fn(worker, *args, **kwargs)
        info.update(_startup.summary(worker))
    finally:
        _startup = None
    if worker.ps.tp_rank == 0:
        logger.info("DDTREE glue graphs at startup, the allocator: %s", info)
    return info


def _batch_capture_hook(original_fn, worker, bs, *args, **kwargs):
    out = original_fn(worker, bs, *args, **kwargs)
    if _startup is not None:
        _startup.after_step(bs)
    return out


def install_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Register the instruments ``environ`` (default ``os.environ``) names with SGLang's hook
    registry: the ``run_batch`` and startup-capture hooks when ``SGLANG_DDTREE_STEP_TIMING`` is
    set, the MoE top-k counter when ``SGLANG_DDTREE_EXPERT_COUNT`` is set too. Whether any was;
    ValueError, before SGLang is imported, when a value does not parse."""
    settings = {knob.name: knob.get(environ) for knob in KNOBS}
    out_dir = settings[ENV]
    if out_dir is None:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _run_batch_hook, HookType.AROUND)
    HookRegistry.register(STARTUP_TARGET, _startup_capture_hook, HookType.AROUND)
    HookRegistry.register(BATCH_CAPTURE_TARGET, _batch_capture_hook, HookType.AROUND)
    if settings[EXPERT_COUNT_ENV] is not None:
        os.makedirs(out_dir, exist_ok=True)
        HookRegistry.register(TOPK_TARGET, _topk_hook, HookType.AROUND)
    return True


def read_steps(out_dir: str) -> list[dict]:
    """All records written under ``out_dir`` (every scheduler process), sorted by ``t``."""
    rows = []
    for name in sorted(os.listdir(out_dir)) if os.path.isdir(out_dir) else []:
        if name.startswith("steps.") and name.endswith(".jsonl"):
            with open(os.path.join(out_dir, name)) as f:
                rows.extend(json.loads(line) for line in f if line.strip())
    return sorted(rows, key=lambda r: r["t"])
