"""Per-step GPU timing of SGLang's scheduler, for benchmarks (off unless an env var is set).

``SGLANG_DDTREE_STEP_TIMING=<dir>`` makes the plugin wrap ``Scheduler.run_batch`` (an AROUND
hook): every batch gets a CUDA event on the forward stream when the scheduler starts it and one
when it has enqueued it. Events are read back lazily with ``Event.query()`` (never a sync), and
each scheduler process appends one JSON line per batch to ``<dir>/steps.<pid>.jsonl``:

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

Applies to every worker (no speculation, DFLASH, DDTREE), so all are timed the same way.

``SGLANG_DDTREE_CPROFILE=<skip>`` (with the above) also profiles the scheduler thread's host time
with cProfile: a segment starts after ``skip`` decode batches of one batch size in a row and
ends at the next non-decode batch or batch-size change; each segment is written as
``<dir>/cprofile.<pid>.<k>.txt`` (top functions by own time and by cumulative time).
``SGLANG_DDTREE_CPROFILE=window`` instead profiles everything the scheduler thread does (all
batches and the host work between them) while the file ``<dir>/cprofile.window`` exists, and
writes ``<dir>/cprofile_window.<pid>.<k>.txt`` when it disappears (a benchmark
driver creates it for the length of one measurement).
``SGLANG_DDTREE_TORCH_PROFILE=<skip>`` does the same with the torch profiler (CPU + CUDA
activities; ``<dir>/torchprof.<pid>.<k>.txt``: ops by device time and by own CPU time, and the
summed device time per decode step, and where the device sat idle between kernels:
``device_gaps``), which shows whether a step is GPU-bound or launch-bound.
``SGLANG_DDTREE_SYNC_TRACE=1`` (with the above) records the Python stack of every host-device
synchronization inside a decode batch: torch's sync debug mode (``.item()``, device-to-host
copies, ...) and explicit ``Stream`` / ``Event`` / device synchronizes. Unique stacks with their
counts go to ``<dir>/syncs.<pid>.txt``, rewritten at every non-decode batch.
``SGLANG_DDTREE_EXPERT_COUNT=<E>`` (with the above; CUDA graphs off) counts the distinct routed
experts (ids below E) of every MoE top-k call and appends ``<tokens> <distinct>`` lines to
``<dir>/experts.<pid>.txt``: what an MoE layer reads per forward (one host sync per call).
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import time
import traceback
import warnings
from collections import Counter, deque

from sglang_ddtree.srt.ddtree_envs import CPROFILE_WINDOW, envs

ENV = envs.SGLANG_DDTREE_STEP_TIMING.name
CPROFILE_ENV = envs.SGLANG_DDTREE_CPROFILE.name
TORCH_PROFILE_ENV = envs.SGLANG_DDTREE_TORCH_PROFILE.name
SYNC_TRACE_ENV = envs.SGLANG_DDTREE_SYNC_TRACE.name
TORCH_PROFILE_STEPS = 20
WINDOW = CPROFILE_WINDOW  # SGLANG_DDTREE_CPROFILE value: profile while WINDOW_FILE exists
WINDOW_FILE = "cprofile.window"
TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"
EXPERT_COUNT_ENV = envs.SGLANG_DDTREE_EXPERT_COUNT.name
# Every instrument's setting, parsed when the plugin loads so that a bad value fails then.
INSTRUMENTS = (
    envs.SGLANG_DDTREE_STEP_TIMING,
    envs.SGLANG_DDTREE_CPROFILE,
    envs.SGLANG_DDTREE_TORCH_PROFILE,
    envs.SGLANG_DDTREE_SYNC_TRACE,
    envs.SGLANG_DDTREE_EXPERT_COUNT,
)
TOPK_TARGET = "sglang.srt.layers.moe.topk.TopK.forward_cuda"
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


def register_if_enabled() -> bool:
    """Install the ``run_batch`` hook when ``SGLANG_DDTREE_STEP_TIMING`` is set (and the MoE
    top-k counter when ``SGLANG_DDTREE_EXPERT_COUNT`` is set too). ValueError, before any hook
    is installed, when an instrument's value does not parse."""
    settings = {knob.name: knob.get() for knob in INSTRUMENTS}
    out_dir = settings[ENV]
    if out_dir is None:
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _run_batch_hook, HookType.AROUND)
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
