"""CPU tests of the benchmark instruments (``benchmark/ddtree/instruments.py``: step timing,
profilers, sync stacks, the allocator around the startup glue capture) and of
``benchmark/ddtree/bench_step.py``'s bookkeeping (windows, medians, accept length, table).

The CUDA-event side runs only on a GPU (bench_step on the H200); here the event objects are
stand-ins with the same ``query`` / ``elapsed_time`` interface, so the resolution logic
(which record gets a period, which waits) is checked exactly.
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def ins(load_benchmark):
    return load_benchmark("instruments")


class FakeEvent:
    """A CUDA event stand-in: a device timestamp (ms) and whether the GPU has reached it."""

    def __init__(self, at_ms: float, done: bool = True):
        self.at_ms, self.done = at_ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.at_ms - self.at_ms


def _rec(t, bs, start_ms, end_ms, mode="DECODE", done=True, host_ms=1.25):
    return {"t": t, "bs": bs, "mode": mode, "ev": FakeEvent(start_ms, done),
            "end": FakeEvent(end_ms, done), "host_ms": host_ms}  # fmt: skip


def _lines(path):
    with open(path) as f:
        return [json.loads(x) for x in f]


def test_recorder_periods_spans_and_pending(ins, tmp_path):
    path = tmp_path / "steps.jsonl"
    rec = ins.StepRecorder(str(path))
    now = time.monotonic()
    # Three consecutive decode steps 5 ms apart, then a fourth whose start the GPU has not
    # reached yet: the third must wait for it (its period is not known).
    rec.pending = deque(
        [
            _rec(now, 4, 0.0, 3.0),
            _rec(now + 0.005, 4, 5.0, 8.5),
            _rec(now + 0.010, 4, 10.0, 14.0),
            _rec(now + 0.015, 4, 15.0, 19.0, done=False),
        ]
    )
    rec.flush(force=True)
    rows = _lines(path)
    assert [r["period_ms"] for r in rows] == [5.0, 5.0]
    assert [r["span_ms"] for r in rows] == [3.0, 3.5]
    assert [r["host_ms"] for r in rows] == [1.25, 1.25]
    assert len(rec.pending) == 2  # the third waits for the fourth's start event
    # A non-forced flush with few pending records writes nothing (no per-step file I/O).
    rec.pending[1]["ev"].done = rec.pending[1]["end"].done = True
    rec.flush(force=False)
    assert len(_lines(path)) == 2
    rec.flush(force=True)
    assert [r["period_ms"] for r in _lines(path)] == [5.0, 5.0, 5.0]


def test_recorder_no_period_across_a_pause(ins, tmp_path):
    path = tmp_path / "steps.jsonl"
    rec = ins.StepRecorder(str(path))
    t = time.monotonic() - 10.0
    # Host gap > MAX_GAP_S between the two batches: not consecutive steps of one run.
    rec.pending = deque([_rec(t, 8, 0.0, 2.0), _rec(t + 5.0, 1, 900.0, 901.0, mode="EXTEND")])
    rec.flush(force=True)
    rows = _lines(path)
    assert rows[0]["period_ms"] is None and rows[0]["span_ms"] == 2.0
    # The last record is old and finished: written with no successor.
    assert rows[1]["mode"] == "EXTEND" and rows[1]["period_ms"] is None
    assert not rec.pending


def test_cprofile_segments_per_decode_run(ins, tmp_path):
    prof = ins.HostProfiler(str(tmp_path), skip=2)
    modes = ["EXTEND"] + ["DECODE"] * 6 + ["EXTEND"] + ["DECODE"] * 2 + ["EXTEND"]
    for m in modes:
        prof.on_batch(m)
    files = sorted(p.name for p in tmp_path.iterdir())
    # Run 1: 6 decode batches, 2 skipped -> 4 profiled. Run 2: only 2 decode batches -> none.
    assert len(files) == 1 and files[0].startswith("cprofile.") and files[0].endswith(".0.txt")
    text = (tmp_path / files[0]).read_text()
    assert text.startswith("decode batches profiled: 4\n")
    assert "Ordered by: internal time" in text and "Ordered by: cumulative time" in text


def test_torch_profile_segments_numbered_per_decode_run(ins, tmp_path):
    """The torch-profiler kind: one numbered table per run of decode batches (CPU activity
    only here; the device kernel time per step is then 0)."""
    prof = ins.HostProfiler(str(tmp_path), skip=1, kind="torch")
    modes = ["EXTEND"] + ["DECODE"] * 4 + ["EXTEND"] + ["DECODE"] * 3 + ["EXTEND"]
    for m in modes:
        prof.on_batch(m, 8 if m == "DECODE" else None)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert [f.split(".")[0] for f in files] == ["torchprof", "torchprof"]
    assert [f.split(".")[-2] for f in files] == ["0", "1"]
    heads = [(tmp_path / f).read_text().splitlines()[:2] for f in files]
    # Run 1: 4 decode batches, 1 skipped -> 3; run 2: 3 - 1 = 2.
    assert [h[0] for h in heads] == ["decode batches profiled: 3", "decode batches profiled: 2"]
    assert all(h[1].startswith("device kernel time per step: ") for h in heads)
    assert prof.prof is None


def test_profile_segments_hold_one_batch_size(ins, tmp_path):
    """A batch-size change ends a segment and restarts the skip count (a run being filled or
    drained, or DDTREE's first steps at a new size, are never profiled)."""
    prof = ins.HostProfiler(str(tmp_path), skip=2)
    sizes = [7, 8, 8, 8, 8, 8, 6, 6, 6, 5, 5, 5, 5]  # decode batches, one run
    for bs in sizes:
        prof.on_batch("DECODE", bs)
    prof.on_batch("EXTEND", 4)
    heads = [p.read_text().splitlines()[0] for p in sorted(tmp_path.iterdir())]
    # bs 7: 1 batch (none); bs 8: 5 - 2 = 3; bs 6: 3 - 2 = 1; bs 5: 4 - 2 = 2.
    assert heads == [f"decode batches profiled: {n}" for n in (3, 1, 2)]


def test_window_profile_covers_batches_while_the_file_exists(ins, tmp_path):
    """The window profile: one table per window, every batch mode inside it counted,
    nothing profiled outside it."""
    prof = ins.WindowProfiler(str(tmp_path))
    window = tmp_path / ins.WINDOW_FILE
    prof.on_batch("DECODE", 4)  # no window yet
    window.touch()
    for m in ["DECODE", "EXTEND", "DECODE", "DECODE"]:
        prof.on_batch(m, 4)
    window.unlink()
    prof.on_batch("DECODE", 4)  # closes the first window
    prof.on_batch("DECODE", 4)
    window.touch()
    prof.on_batch("EXTEND", 1)
    window.unlink()
    prof.on_batch("DECODE", 1)
    tables = sorted(p for p in tmp_path.iterdir() if p.name.startswith("cprofile_window."))
    assert [p.name.rsplit(".", 2)[-2] for p in tables] == ["0", "1"]
    heads = [p.read_text().splitlines()[0] for p in tables]
    assert heads == [
        "batches profiled: {'DECODE': 3, 'EXTEND': 1}",
        "batches profiled: {'EXTEND': 1}",
    ]
    assert "Ordered by: cumulative time" in tables[0].read_text()


def test_read_steps_merges_processes_in_time_order(ins, tmp_path):
    (tmp_path / "steps.1.jsonl").write_text(json.dumps({"t": 2.0, "bs": 1}) + "\n")
    (tmp_path / "steps.2.jsonl").write_text(
        json.dumps({"t": 1.0, "bs": 2}) + "\n" + json.dumps({"t": 3.0, "bs": 3}) + "\n"
    )
    (tmp_path / "other.txt").write_text("not a record")
    assert [r["bs"] for r in ins.read_steps(str(tmp_path))] == [2, 1, 3]
    assert ins.read_steps(str(tmp_path / "missing")) == []


def test_hook_registration_is_off_without_the_env(ins, monkeypatch):
    monkeypatch.delenv(ins.ENV, raising=False)
    assert ins.install_from_env() is False


def test_instrument_variables_are_the_benchmark_s(ins):
    """The instruments declare their own variables, parsed by the plugin's rules; none is a
    serving knob (no server reads them)."""
    from sglang_ddtree.srt.ddtree_envs import KNOBS

    names = [k.name for k in ins.KNOBS]
    assert len(names) == len(set(names)) == 6
    assert not set(names) & {k.name for k in KNOBS}
    for knob in ins.KNOBS:
        assert knob.name.startswith("SGLANG_DDTREE_") and getattr(ins.envs, knob.name) is knob
        assert knob.meaning and "\n" not in knob.meaning
        assert knob.default is None or isinstance(knob.default, knob.type)
        assert knob.get({}) == knob.default
    assert ins.ENV == "SGLANG_DDTREE_STEP_TIMING"


def test_cprofile_is_window_or_an_integer(ins):
    knob = ins.envs.SGLANG_DDTREE_CPROFILE
    assert knob.get({knob.name: "window"}) == "window"
    assert knob.get({knob.name: "0"}) == 0 and knob.get({knob.name: " 20 "}) == 20
    for bad in ("Window", "w", "1.5"):
        with pytest.raises(ValueError) as e:
            knob.get({knob.name: bad})
        assert str(e.value).startswith(f"SGLANG_DDTREE_CPROFILE={bad!r} is neither 'window' nor ")
        assert "set it to window or to the decode batches to skip" in str(e.value)


def test_install_refuses_a_bad_instrument_before_any_hook(ins, monkeypatch):
    monkeypatch.setenv("SGLANG_DDTREE_STEP_TIMING", "/tmp/unused")
    monkeypatch.setenv("SGLANG_DDTREE_TORCH_PROFILE", "all")
    with pytest.raises(ValueError, match="SGLANG_DDTREE_TORCH_PROFILE='all' is not an integer"):
        ins.install_from_env()  # raises before importing SGLang's hook registry
    env = {"SGLANG_DDTREE_STEP_TIMING": "/tmp/unused", "SGLANG_DDTREE_SYNC_TRACE": "2"}
    with pytest.raises(
        ValueError, match="SGLANG_DDTREE_SYNC_TRACE='2' is not 0 or 1; set it to 1 or 0"
    ):
        ins.install_from_env(env)  # a mapping given: read instead of the environment
    monkeypatch.delenv("SGLANG_DDTREE_STEP_TIMING")
    monkeypatch.delenv("SGLANG_DDTREE_TORCH_PROFILE")
    assert ins.install_from_env() is False


def test_startup_memory_joins_the_capture_summary(ins, monkeypatch):
    """Around the startup glue capture (the device's counters stubbed): the capture's own
    summary comes back with the allocator's view added (live bytes, the keys' buffers, the
    graph pool's segments, the growth after each batch size's capture, what the constructor
    measured), in the worker's startup summary too; without a capture in flight a batch size's
    capture records nothing."""
    from types import SimpleNamespace

    import torch

    counters = {"reserved": 100 << 20, "allocated": 10 << 20}
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: counters["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: counters["allocated"])
    snapshots = [[], [{"address": 1, "segment_pool_id": (0, 7), "total_size": 6 << 20,
                       "allocated_size": 2 << 20}]]  # fmt: skip
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: snapshots.pop(0))
    out = torch.zeros(4, dtype=torch.int64)
    segment = SimpleNamespace(pool=(0, 7), entries={(2,): SimpleNamespace(outputs=out, copied={})})
    reserve = SimpleNamespace(working_set=1 << 30, captured=None)
    worker = SimpleNamespace(device="cpu", ps=SimpleNamespace(tp_rank=1), glue_reserve=reserve,
                             graph_stats=SimpleNamespace(glue_segments=[segment], startup={}))  # fmt: skip

    def capture_batch_size(worker, bs):
        counters["reserved"] += bs << 20

    def capture(worker):
        for bs in (2, 1):
            ins._batch_capture_hook(capture_batch_size, worker, bs)
        counters["allocated"] += 1 << 20
        worker.graph_stats.startup = {"captures": 9}
        return worker.graph_stats.startup

    info = ins._startup_capture_hook(capture, worker)
    assert info is worker.graph_stats.startup
    assert info == {
        "captures": 9, "allocated_gib": round(1 / 1024, 3), "key_buffers_gib": 0.0,
        "pool_gib": round(6 / 1024, 3), "pool_allocated_gib": round(2 / 1024, 3),
        "outside_pool": {}, "growth_mib_by_bs": [[2, 2.0], [1, 3.0]],
        "reserved_working_set_gib": 1.0,
    }  # fmt: skip
    ins._batch_capture_hook(capture_batch_size, worker, 4)  # no capture in flight
    assert info["growth_mib_by_bs"] == [[2, 2.0], [1, 3.0]]


def test_key_buffer_bytes_counts_each_storage_once(ins):
    """The startup capture's count of the keys' own buffers: outputs and copied inputs of every
    captured key, a storage shared by two views (or two segments) counted once."""
    from types import SimpleNamespace

    import torch

    key_buffer_bytes = ins.key_buffer_bytes

    out = torch.zeros(4, 8, dtype=torch.float32)  # 128 bytes
    seq = torch.zeros(3, dtype=torch.int64)  # 24 bytes
    first = SimpleNamespace(outputs=(out, out[1:]), copied={"seq_lens": seq})
    second = SimpleNamespace(outputs=[torch.zeros(5, dtype=torch.int32)], copied={"x": out[0]})
    segments = [SimpleNamespace(entries={(1,): first}), SimpleNamespace(entries={(2,): second})]
    assert key_buffer_bytes(segments) == 128 + 24 + 20
    assert key_buffer_bytes([SimpleNamespace(entries={})]) == 0


def test_pool_segment_bytes_sums_the_glue_pool_only(ins):
    """Segments of the glue graphs' pool (matched by the snapshot's pool id) against the rest."""
    pool_segment_bytes = ins.pool_segment_bytes

    snapshot = [
        {"segment_pool_id": (0, 7), "total_size": 4 << 20, "allocated_size": 1 << 20},
        {"segment_pool_id": (0, 0), "total_size": 64 << 20, "allocated_size": 64 << 20},
        {"segment_pool_id": (0, 7), "total_size": 2 << 20, "allocated_size": 0},
        {"total_size": 2 << 20, "allocated_size": 2 << 20},  # no pool id: not the glue's
    ]
    assert pool_segment_bytes(snapshot, (0, 7)) == (6 << 20, 1 << 20)
    assert pool_segment_bytes(snapshot, (0, 9)) == (0, 0)


def test_new_segments_outside_the_pool_are_counted_per_type(ins):
    """The startup's fragmentation figure: segments new since the first snapshot, outside the
    glue graphs' pool, per type, with their live bytes; old segments and the pool's are not."""
    new_segments_outside_pool = ins.new_segments_outside_pool

    mib = 1 << 20
    before = [{"address": 1, "segment_type": "large", "total_size": 64 * mib, "allocated_size": 0}]
    after = before + [
        {"address": 2, "segment_type": "small", "total_size": 2 * mib, "allocated_size": 512},
        {"address": 3, "segment_type": "small", "total_size": 2 * mib, "allocated_size": 0},
        {"address": 4, "segment_type": "large", "total_size": 20 * mib, "allocated_size": 4 * mib,
         "blocks": [{"size": 3 * mib, "state": "active_allocated"},
                    {"size": 16 * mib, "state": "inactive"},
                    {"size": mib, "state": "active_allocated"}]},
        {"address": 5, "segment_type": "large", "total_size": 8 << 30, "allocated_size": 0,
         "segment_pool_id": (0, 7)},
    ]  # fmt: skip
    got = new_segments_outside_pool(before, after, (0, 7))
    assert got == {
        "large": {"segments": 1, "gib": round(20 / 1024, 3), "allocated_gib": round(4 / 1024, 3),
                  "largest_live_mib": [3.0, 1.0]},  # the live blocks pinning it, largest first
        "small": {"segments": 2, "gib": round(4 / 1024, 3), "allocated_gib": 0.0,
                  "largest_live_mib": []},
    }  # fmt: skip
    assert new_segments_outside_pool(after, after, (0, 7)) == {}
    # Without the pool's id its segment counts as outside.
    assert new_segments_outside_pool(before, after, None)["large"]["segments"] == 2


def test_live_blocks_outside_the_pool_name_the_code_that_allocated_them(ins):
    """With allocation stacks recorded (``SGLANG_DDTREE_MEMORY_HISTORY``), each of the largest
    live blocks outside the pool is named by its innermost frames outside torch's own files,
    largest block first; without stacks the summary has no such field."""
    allocation_site = ins.allocation_site
    new_segments_outside_pool = ins.new_segments_outside_pool

    mib = 1 << 20

    def frame(path, line, name):
        return {"filename": path, "line": line, "name": name}

    torch_frame = frame("/site/torch/_tensor.py", 10, "new_empty")
    big = {
        "size": 8 * mib,
        "state": "active_allocated",
        "frames": [
            torch_frame,
            frame("/repo/python/sglang_ddtree/srt/ddtree_step.py", 195, "accept_tree"),
            frame("<built-in>", 0, "??"),
            frame("/repo/x/ddtree_glue_graph.py", 211, "_capture"),
            frame("/repo/x/ddtree_glue_graph.py", 190, "__call__"),
            frame("/repo/x/a.py", 1, "f"),
        ],
    }
    small = {"size": mib, "state": "active_allocated", "frames": [torch_frame]}
    after = [{"address": 9, "segment_type": "large", "total_size": 1 << 30,
              "allocated_size": 9 * mib, "blocks": [small, big, {"size": mib, "state": "inactive"}]}]  # fmt: skip
    got = new_segments_outside_pool([], after, None)["large"]
    assert got["largest_live_mib"] == [8.0, 1.0]
    assert got["largest_live_sites"] == [
        ["ddtree_step.py:195 accept_tree", "ddtree_glue_graph.py:211 _capture",
         "ddtree_glue_graph.py:190 __call__"],  # three frames, torch's and built-ins skipped
        [],  # only torch's own frames
    ]  # fmt: skip
    assert allocation_site({"size": mib}) == []
    for block in (big, small):
        del block["frames"]
    assert "largest_live_sites" not in new_segments_outside_pool([], after, None)["large"]


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_step")


def test_step_stats_window_batch_size_and_warmup(bench):
    recs = [{"t": 10.0 + i, "bs": 8, "mode": "DECODE", "span_ms": 1.0, "period_ms": 2.0 + i}
            for i in range(7)]  # fmt: skip
    recs += [
        {"t": 12.5, "bs": 7, "mode": "DECODE", "span_ms": 9.0, "period_ms": 99.0},  # tail batch
        {"t": 12.6, "bs": 8, "mode": "EXTEND", "span_ms": 9.0, "period_ms": 99.0},  # prefill
        {"t": 30.0, "bs": 8, "mode": "DECODE", "span_ms": 9.0, "period_ms": 99.0},  # other run
    ]
    st = bench.step_stats(recs, 10.0, 20.0, 8)
    # 7 decode steps of bs 8 in the window, the first DROP_FIRST_STEPS (2) dropped.
    assert st["steps"] == 7 - bench.DROP_FIRST_STEPS
    assert st["step_ms"] == 6.0  # median of periods 4, 5, 6, 7, 8
    assert st["span_ms"] == 1.0
    assert bench.step_stats(recs, 10.0, 20.0, 64) == {"steps": 0, "step_ms": None, "span_ms": None}


def test_cell_stats_over_repeated_runs(bench):
    """--repeats: a cell's step is the median over every run's steps (each run's first
    DROP_FIRST_STEPS dropped), and each run's own median is kept (their spread)."""
    drop = bench.DROP_FIRST_STEPS
    recs = [{"t": 10.0 + i, "bs": 1, "mode": "DECODE", "span_ms": 1.0, "period_ms": 10.0}
            for i in range(drop + 3)]  # fmt: skip
    recs += [{"t": 30.0 + i, "bs": 1, "mode": "DECODE", "span_ms": 1.0, "period_ms": 20.0}
             for i in range(drop + 5)]  # fmt: skip
    st = bench.cell_stats(recs, [(10.0, 20.0), (30.0, 40.0)], 1)
    assert st["steps"] == 8 and st["step_ms"] == 20.0  # 3 at 10 ms, 5 at 20 ms
    assert "host_ms" not in st  # records without it (older files)
    host = [dict(r, host_ms=4.0 if r["t"] < 30 else 6.0) for r in recs]
    assert bench.cell_stats(host, [(10.0, 20.0), (30.0, 40.0)], 1)["host_ms"] == 6.0
    assert st["repeat_step_ms"] == [10.0, 20.0]
    assert "repeat_step_ms" not in bench.cell_stats(recs, [(10.0, 20.0)], 1)
    result = {"rows": [{"config": "dflash", "step": [
        {"bs": 1, "prompt_len": None, "temp": "T0", "accept_length": 1.0, "tok_per_s": 50.0,
         **st}]}]}  # fmt: skip
    md = bench.table(result)
    assert "20.00 [10.00-20.00] (1.00, 50)" in md and "range of the repeats' medians" in md


def test_accept_length_is_tokens_per_verify_step(bench):
    outs = [{"meta_info": {"completion_tokens": 30, "spec_verify_ct": 10}},
            {"meta_info": {"completion_tokens": 10, "spec_verify_ct": 10}}]  # fmt: skip
    assert bench.accept_length(outs) == 2.0
    assert bench.accept_length([{"meta_info": {"completion_tokens": 5}}]) is None


def test_table_lists_accept_and_step_cells(bench):
    result = {
        "model": "pair",
        "rows": [
            {"config": "dflash", "accept": {"T0": {"accept_length": 4.16}}, "step": [
                {"bs": 1, "temp": "T0", "step_ms": 2.63, "accept_length": 3.28, "tok_per_s": 1247}]},
            {"config": "ddtree-64", "accept": {"T0": {"accept_length": 5.91}}, "step": []},
            {"config": "broken", "error": "RuntimeError: x"},
        ],
    }  # fmt: skip
    md = bench.table(result)
    assert "| dflash | 4.16 | - |" in md and "| ddtree-64 | 5.91 | - |" in md
    assert "| T0 | 1 | 2.63 (3.28, 1247) | - |" in md
    assert "broken" not in md


def test_engine_kwargs_per_configuration(bench, tmp_path):
    spec = bench.model_spec("8b", str(tmp_path))
    with open(Path(spec["drafter_b8"]) / "config.json") as f:
        b8 = json.load(f)
    with open(Path(spec["drafter"]) / "config.json") as f:
        b16 = json.load(f)
    assert b8["dflash_config"]["block_size"] == 8 and b16["dflash_config"]["block_size"] == 16
    assert b8["num_hidden_layers"] == b16["num_hidden_layers"] == 5
    kw = {c: bench.engine_kwargs(spec, c, 64) for c in
          ("none", "dflash", "dflash-b8", "ddtree", "ddtree-64")}  # fmt: skip
    for k in kw.values():  # CUDA graphs stay on; the tree-mask-capable backend
        assert k["attention_backend"] == "triton" and k["cuda_graph_max_bs_decode"] == 64
        assert k["load_format"] == "dummy" and "disable_cuda_graph" not in k
    assert "speculative_algorithm" not in kw["none"]
    assert kw["dflash"]["speculative_num_draft_tokens"] == 16
    assert kw["dflash-b8"]["speculative_num_draft_tokens"] == 8
    assert kw["dflash-b8"]["speculative_draft_model_path"] == spec["drafter_b8"]
    assert kw["ddtree"]["speculative_algorithm"] == "DDTREE"
    assert "speculative_num_draft_tokens" not in kw["ddtree"]  # the adaptive default
    assert kw["ddtree-64"]["speculative_num_draft_tokens"] == 65
    pair = bench.model_spec("pair", str(tmp_path))
    with pytest.raises(SystemExit, match="needs --model 8b"):
        bench.engine_kwargs(pair, "dflash-b8", 8)


def test_bench_step_variants(bench, tmp_path):
    attn = "speculative_ddtree_verify_attention"  # a DDTREE engine keyword
    default = {}  # the worker's default verify attention: the split
    assert bench.split_variant("ddtree-64") == ("ddtree-64", default)
    both = bench.split_variant("ddtree+extendattn+baseline")
    assert both == ("ddtree", {**default, attn: "triton_extend"})
    assert bench.split_variant("ddtree-64+extendattn") == (
        "ddtree-64", {**default, attn: "triton_extend"}
    )  # fmt: skip
    assert bench.split_variant("dflash") == ("dflash", default)
    # The backend after "@", the variant before it.
    config, backend = bench.split_backend("ddtree-8+baseline@flashmla", "triton")
    assert backend == "flashmla"
    assert bench.split_variant(config) == ("ddtree-8", default)
    with pytest.raises(SystemExit, match="unknown variant"):
        bench.split_variant("ddtree+fast")
    # +baseline: the worker's defaults, the engine's processes on another checkout's plugin.
    assert bench.split_variant("ddtree+baseline") == ("ddtree", default)
    assert bench.engine_pythonpath("ddtree", "/old/python", "/site") is None
    assert bench.engine_pythonpath("ddtree+baseline", "/old/python", "/site") == "/old/python:/site"
    assert bench.engine_pythonpath("ddtree+baseline", "/old/python", None) == "/old/python"
    with pytest.raises(SystemExit, match="needs --baseline-python"):
        bench.engine_pythonpath("ddtree+baseline", None, "/site")
    # A plugin that times the steps itself would record each step twice beside the instruments.
    (tmp_path / "sglang_ddtree").mkdir()
    (tmp_path / "sglang_ddtree" / "step_timing.py").write_text("")
    with pytest.raises(SystemExit, match="recorded twice"):
        bench.engine_pythonpath("ddtree+baseline", str(tmp_path), "/site")


def test_bench_step_prompt_len(bench, tmp_path):
    default = bench.model_spec("8b", str(tmp_path))
    assert {len(p) for p in default["prompts"]} <= set(range(64, 129))
    long = bench.model_spec("8b", str(tmp_path), prompt_len=3000)
    assert {len(p) for p in long["prompts"]} == {3000} and len(long["prompts"]) == 64
    assert long["engine"]["context_length"] >= 3000 + 128  # prompt + generated tokens fit


def test_sync_tracer_records_sync_stacks_and_restores(ins, tmp_path):
    import warnings

    import torch

    tracer = ins.SyncTracer(str(tmp_path / "syncs.txt"))
    original = torch.cuda.synchronize

    def step_with_a_sync():
        # What torch's sync debug mode raises for e.g. ``.item()`` on a CUDA tensor.
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
        try:
            torch.cuda.synchronize()  # recorded before the call (it raises without CUDA)
        except (AssertionError, RuntimeError):
            pass
        warnings.warn("an unrelated warning", stacklevel=1)
        return 7

    with pytest.warns(UserWarning, match="unrelated"):
        for _ in range(2):  # one call site: the same stacks, counted twice
            assert tracer.run(step_with_a_sync) == 7
    assert torch.cuda.synchronize is original  # the wrappers are removed after each batch
    kinds = sorted(s.split("\n", 1)[0] for s in tracer.stacks)
    assert kinds == [
        "explicit torch.cuda.synchronize",
        "torch sync debug: called a synchronizing CUDA operation",
    ]
    assert all(n == 2 for n in tracer.stacks.values())
    assert all("step_with_a_sync" in s for s in tracer.stacks)
    tracer.dump()
    text = (tmp_path / "syncs.txt").read_text()
    assert text.startswith("decode batches traced: 2\nsynchronizations: 4\n")
    assert text.count("=== 2 x ") == 2


def test_device_gaps_sum_idle_between_kernels_per_pair(ins):
    """Two steps of three kernels: 10 us idle after `gemm` in each, 30 us after the first
    `accept` (between the steps); an activity overlapping others (a second stream) adds none."""
    acts = []
    for t0 in (0.0, 100.0):
        acts += [("gemm", t0, t0 + 40), ("attn", t0 + 50, t0 + 60), ("accept", t0 + 60, t0 + 70)]
    acts.append(("copy", 55.0, 65.0))  # overlaps attn and accept
    lines = ins.device_gaps(acts, steps=2).splitlines()
    # 10 + 10 + 30 = 50 us idle over 2 steps; first start 0, last end 170.
    assert lines[0] == (
        "device idle between kernels per step: 0.025 ms (first start to last end: 0.085 ms)"
    )
    assert lines[2].split() == ["15.0", "0.5", "accept", "->", "gemm"]
    assert lines[3].split() == ["10.0", "1.0", "gemm", "->", "attn"]
    assert len(lines) == 4
    assert ins.device_gaps([], steps=3).endswith("no device activity\n")


def test_kimi_one_rank_shapes(bench):
    """``--tp-rank-of 8``: one TP-8 rank of K2.6 as a tp-1 model, its routed experts in INT4."""
    target, drafter = bench.kimi_rank_configs(61, 8)
    assert target["num_hidden_layers"] == 61 and target["n_routed_experts"] == 384
    assert (target["num_attention_heads"], target["num_key_value_heads"]) == (8, 8)
    assert target["moe_intermediate_size"] == 256 and target["intermediate_size"] == 2304
    assert target["vocab_size"] == drafter["vocab_size"] == 20480
    assert target["kv_lora_rank"] == 512 and target["q_lora_rank"] == 1536  # not split by TP
    assert max(target["bos_token_id"], target["eos_token_id"]) < 20480
    assert drafter["dflash_config"]["mask_token_id"] < 20480
    assert (drafter["num_attention_heads"], drafter["num_key_value_heads"]) == (8, 1)
    assert drafter["intermediate_size"] == 18432 // 8
    quant = target["quantization_config"]
    weights = quant["config_groups"]["group_0"]["weights"]
    assert quant["quant_method"] == "compressed-tensors"
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"]) == (4, 32, True)
    # Only routed experts are quantized: attention, dense and shared MLPs stay in bf16.
    import re

    ignored = [p[3:] for p in quant["ignore"] if p.startswith("re:")]

    def kept_bf16(name):
        return any(re.fullmatch(p, name) for p in ignored)

    assert kept_bf16("model.layers.3.self_attn.kv_a_proj_with_mqa")
    assert kept_bf16("model.layers.0.mlp.gate_up_proj")
    assert kept_bf16("model.layers.5.mlp.shared_experts.down_proj")
    assert not kept_bf16("model.layers.5.mlp.experts.17.gate_proj")


def test_configs_name_their_attention_backend(bench):
    assert bench.split_backend("dflash@flashmla", "triton") == ("dflash", "flashmla")
    assert bench.split_backend("ddtree-15+extendattn", "triton") == (
        "ddtree-15+extendattn",
        "triton",
    )
    with pytest.raises(SystemExit, match="unknown attention backend"):
        bench.split_backend("dflash@fa3", "triton")


def test_table_has_a_prompt_column_when_lengths_were_set(bench):
    step = {"temp": "T1", "step_ms": 19.0, "accept_length": None, "tok_per_s": 52.6}
    result = {
        "rows": [
            {"config": "dflash@flashmla", "step": [{**step, "bs": 1, "prompt_len": 16384},
                                                   {"bs": 16, "prompt_len": 65536,
                                                    "skipped": "KV"}]},
        ],
    }  # fmt: skip
    md = bench.table(result)
    assert "| T | prompt | bs | dflash@flashmla |" in md
    assert "| T1 | 16384 | 1 | 19.00 (1, 53) |" in md
