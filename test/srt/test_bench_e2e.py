"""CPU checks of benchmark/ddtree/bench_e2e.py against a fake streaming server (no GPU, no SGLang).

The fake server speaks SGLang's two streaming APIs over chunked HTTP/1.1 on 127.0.0.1, on a fixed
schedule: the first token after ``ttft`` s, then one verify step every ``gap`` s committing
STEP_TOKENS tokens (``gap`` doubles for prompts "p3", "p7", ...). /generate ends with SGLang's
final meta_info (spec_verify_ct, spec_accept_histogram); /v1/completions carries cumulative usage
in every chunk. So TTFT, TPOT, tokens/s and accept lengths have known values. Run as a script
(``--serve PORT``) it is the stand-in "server process" for the launch/stop tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEP_TOKENS = [1, 4, 2, 5, 3]  # tokens committed by each verify step after the first token
NUM_TOKENS = 1 + sum(STEP_TOKENS)  # 16
VERIFY_CT = len(STEP_TOKENS)  # 5 -> SGLang accept length 16 / 5 = 3.2
HIST = [1, 1, 1, 1, 1]  # steps with k correct drafts, k = tokens - 1: one each of k = 0..4


# --------------------------------------------------------------------------- the fake server


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        srv = self.server
        if self.path == "/health":
            ready = time.time() - srv.t_created >= srv.ready_after
            self._json(200 if ready else 503, {})
        elif self.path == "/server_info":
            self._json(
                200,
                {
                    "speculative_num_draft_tokens": 33,
                    "disable_cuda_graph": False,
                    "child_pid": srv.child_pid,
                    "internal_states": [{"avg_spec_accept_length": 3.25}],
                },
            )
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self):
        srv = self.server
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = req.get("text", req.get("prompt"))
        if prompt == "bad" or self.path not in ("/generate", "/v1/completions"):
            self._json(400, {"object": "error", "message": "bad request"})
            return
        gap = srv.gap * (2 if prompt.startswith("p") and int(prompt[1:]) % 4 == 3 else 1)
        params = req.get("sampling_params") or req
        with srv.lock:
            srv.max_tokens_seen.append(params.get("max_new_tokens", params.get("max_tokens")))
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
        self._left = False
        try:
            self._stream(self.path == "/generate", prompt, gap)
        finally:
            self._leave()

    def _leave(self) -> None:
        """Stop counting this request as in flight (once). Called before its last token is
        sent: a closed-loop client sends its next request as soon as it has read this one's
        end, possibly before this handler thread gets to run again."""
        if not self._left:
            self._left = True
            with self.server.lock:
                self.server.in_flight -= 1

    def _record(self, mode: str, period_s: float) -> None:
        """With SGLANG_DDTREE_STEP_TIMING set, write a batch record the way the real server's
        `step_timing` does (one JSON line per batch in ``<dir>/steps.<pid>.jsonl``)."""
        out = os.environ.get("SGLANG_DDTREE_STEP_TIMING")
        if not out:
            return
        rec = {"t": time.monotonic(), "bs": self.server.in_flight, "mode": mode}
        rec.update(span_ms=period_s * 1e3, period_ms=period_s * 1e3)
        with self.server.lock:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, f"steps.{os.getpid()}.jsonl"), "a") as f:
                f.write(json.dumps(rec) + "\n")

    def _stream(self, native: bool, prompt: str, gap: float) -> None:
        self._record("EXTEND", self.server.ttft)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        t0 = time.perf_counter()
        schedule = [(self.server.ttft, 1)] + [
            (self.server.ttft + (i + 1) * gap, k) for i, k in enumerate(STEP_TOKENS)
        ]
        n = 0
        for i, (at, k) in enumerate(schedule):
            time.sleep(max(0.0, t0 + at - time.perf_counter()))
            if i:
                self._record("DECODE", gap)
            n += k
            last = i == len(schedule) - 1
            if last:
                self._leave()
            if native:
                meta = {"id": prompt, "completion_tokens": n, "prompt_tokens": 3}
                if last:
                    meta.update(spec_verify_ct=VERIFY_CT, spec_accept_histogram=HIST)
                    meta["spec_accept_length"] = n / VERIFY_CT
                self._send({"text": "x" * n, "meta_info": meta})
            else:
                self._send(
                    {
                        "choices": [{"index": 0, "text": "x" * k}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": n},
                    }
                )
        if not native:
            self._send({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _send(self, obj: dict) -> None:
        self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


def make_server(port=0, ttft=0.10, gap=0.04, ready_after=0.0, child_pid=None):
    srv = ThreadingHTTPServer(("127.0.0.1", port), FakeHandler)
    srv.daemon_threads = True
    srv.ttft, srv.gap, srv.ready_after, srv.child_pid = ttft, gap, ready_after, child_pid
    srv.t_created = time.time()
    srv.lock = threading.Lock()
    srv.in_flight = srv.max_in_flight = 0
    srv.max_tokens_seen = []
    return srv


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("bench_e2e")


@pytest.fixture
def fake():
    srv = make_server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


PROMPTS = ["p0", "p1", "p2", "p3"]
TPOT_FAST = 0.04 * VERIFY_CT / (NUM_TOKENS - 1)  # 13.33 ms
TPOT_SLOW = 2 * TPOT_FAST  # prompt p3


# --------------------------------------------------------------------------- launch commands


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_launch_commands(bench, capsys):
    cfgs = bench.build_configs(["none", "dflash", "ddtree", "ddtree-adaptive"], [16, 32, 64])
    labels = ["none", "dflash", "ddtree-16", "ddtree-32", "ddtree-64", "ddtree-adaptive"]
    assert [c.label for c in cfgs] == labels
    for cfg in cfgs:
        cmd = bench.launch_command(cfg, "/m/target", "/m/drafter", 31000, max_concurrency=64)
        assert cmd[1:3] == ["-m", "sglang.launch_server"]
        assert _flag(cmd, "--model-path") == "/m/target"
        assert _flag(cmd, "--attention-backend") == "triton"
        assert int(_flag(cmd, "--cuda-graph-max-bs-decode")) >= 64
        assert int(_flag(cmd, "--max-running-requests")) >= 64
        assert _flag(cmd, "--host") == "127.0.0.1" and _flag(cmd, "--port") == "31000"
        assert not any("disable-cuda-graph" in a for a in cmd)
        assert 0 < float(_flag(cmd, "--mem-fraction-static")) <= 0.5
        assert int(_flag(cmd, "--context-length")) == 2048
        algo = _flag(cmd, "--speculative-algorithm")
        if cfg.method == "none":
            assert algo is None and not any(a.startswith("--speculative") for a in cmd)
            continue
        assert _flag(cmd, "--speculative-draft-model-path") == "/m/drafter"
        if cfg.method == "dflash":
            assert algo == "DFLASH" and _flag(cmd, "--speculative-num-draft-tokens") == "16"
        elif cfg.budget is None:  # the plugin's default adaptive budget: W left to the plugin
            assert algo == "DDTREE" and _flag(cmd, "--speculative-num-draft-tokens") is None
        else:
            assert algo == "DDTREE"
            assert _flag(cmd, "--speculative-num-draft-tokens") == str(cfg.budget + 1)

    assert bench.main(["--out", "/tmp/unused", "--dry-run", "--configs", "ddtree"]) == 0
    out = capsys.readouterr().out
    assert "--speculative-num-draft-tokens 17" in out and "--speculative-num-draft-tokens 65" in out
    with pytest.raises(SystemExit):
        bench.main(["--out", "/tmp/unused", "--dry-run", "--server-args", "--disable-cuda-graph"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--out", "/tmp/unused", "--budgets", "8"])  # W = 9 < block 16


# --------------------------------------------------------------------------- measurement


def test_one_request_generate(bench, fake):
    _, base = fake
    r = bench.stream_request(base, "generate", "p0", 0, 0.0, 1.0, NUM_TOKENS)
    assert r.ok and r.error is None
    assert r.output_tokens == NUM_TOKENS and r.verify_ct == VERIFY_CT
    assert r.ttft == pytest.approx(0.10, abs=0.03)
    assert r.tpot == pytest.approx(TPOT_FAST, abs=1e-3)
    assert r.accept_length == pytest.approx(NUM_TOKENS / VERIFY_CT)
    assert r.correct_drafts_hist == HIST


@pytest.mark.parametrize("api", ["generate", "openai"])
def test_level_metrics(bench, fake, api):
    srv, base = fake
    results, wall = bench.run_level(base, api, PROMPTS, 2, 4, 1.0, 0.95, NUM_TOKENS)
    row = bench.summarize_level(results, wall)
    assert srv.max_in_flight == 2  # closed loop at the requested concurrency
    # Two waves of two: p0, p1 (0.30 s each), then p2 (0.30 s) and p3 (0.10 + 0.40 s).
    assert wall == pytest.approx(0.80, abs=0.12)  # 1 or 4 in flight: 1.4 s / 0.5 s
    assert row["num_ok"] == 4 and row["num_errors"] == 0
    assert row["output_tokens"] == 4 * NUM_TOKENS
    assert row["output_tok_s"] == pytest.approx(4 * NUM_TOKENS / wall)
    assert row["output_tok_s"] == pytest.approx(80.0, rel=0.15)
    tpots = [TPOT_FAST] * 3 + [TPOT_SLOW]
    assert row["tpot_ms_mean"] == pytest.approx(1e3 * statistics.fmean(tpots), abs=1.0)
    assert row["tpot_ms_median"] == pytest.approx(1e3 * TPOT_FAST, abs=1.0)
    assert row["ttft_ms_median"] == pytest.approx(100.0, abs=30.0)
    if api == "generate":
        assert row["accept_length"] == pytest.approx(NUM_TOKENS / VERIFY_CT)  # 3.2
        assert row["accept_length_req_mean"] == pytest.approx(NUM_TOKENS / VERIFY_CT)
        assert row["accept_len_hist"] == [0, 4, 4, 4, 4, 4]  # index = tokens per verify step
        assert row["accept_length_hist_mean"] == pytest.approx(3.0)
    else:  # the OpenAI stream has no per-request speculative counters
        assert row["accept_length"] is None and row["accept_len_hist"] == []


def test_warmup_sweep_walks_the_batch_down(bench, fake):
    """All requests at once, staggered lengths (1, 18, 35, ... capped), so the running batch
    passes through every size from the concurrency down to 1."""
    srv, base = fake
    res = bench.warmup_sweep(base, "generate", PROMPTS, 5, 1.0, 0.95, desc="w")
    assert len(res) == 5 and all(r.ok for r in res)
    assert srv.max_in_flight == 5
    assert sorted(srv.max_tokens_seen) == [1, 18, 35, 52, 69]
    srv.max_tokens_seen.clear()
    bench.warmup_sweep(base, "generate", PROMPTS, 3, 0.0, 1.0, token_step=600)
    assert sorted(srv.max_tokens_seen) == [1, 601, bench.WARMUP_MAX_TOKENS]


def test_errors_are_counted(bench, fake):
    _, base = fake
    results, wall = bench.run_level(base, "generate", ["p0", "bad"], 2, 2, 0.0, 1.0, NUM_TOKENS)
    row = bench.summarize_level(results, wall)
    assert row["num_ok"] == 1 and row["num_errors"] == 1
    assert "HTTP 400" in row["first_error"]
    assert row["output_tokens"] == NUM_TOKENS


# --------------------------------------------------------------------------- outputs


def test_rows_table_json_merge(bench, fake, tmp_path):
    srv, base = fake
    srv.ttft, srv.gap = 0.02, 0.005
    rows = []
    for label, method, budget in (("none", "none", None), ("ddtree-32", "ddtree", 32)):
        cfg = bench.Config(label, method, budget)
        rows += bench.bench_server(
            base, cfg, PROMPTS, [0.0, 1.0], [1, 2], NUM_TOKENS, requests_per_level=2, warmup=False
        )
    assert len(rows) == 8
    r = next(r for r in rows if r["config"] == "ddtree-32" and r["temperature"] == 1.0)
    assert (r["method"], r["budget"], r["num_draft_tokens"], r["top_p"]) == ("ddtree", 32, 33, 0.95)
    assert r["server_avg_spec_accept_length_lifetime"] == 3.25
    assert r["accept_length"] == pytest.approx(3.2)
    r0 = next(r for r in rows if r["config"] == "none" and r["temperature"] == 0.0)
    assert r0["top_p"] == 1.0 and r0["server_avg_spec_accept_length_lifetime"] is None

    doc = {"meta": {"command": ["python", "bench_e2e.py"], "git_commit": "abc"}, "rows": rows}
    paths = bench.write_outputs(doc, tmp_path / "a")
    saved = json.loads(paths["json"].read_text())
    assert len(saved["rows"]) == 8 and saved["meta"]["git_commit"] == "abc"
    for s in saved["rows"]:
        ref = next(
            x
            for x in saved["rows"]
            if x["config"] == "none"
            and (x["temperature"], x["concurrency"]) == (s["temperature"], s["concurrency"])
        )
        assert s["x_none"] == pytest.approx(s["output_tok_s"] / ref["output_tok_s"])
    table = paths["md"].read_text().split("\n")
    header = next(i for i, ln in enumerate(table) if ln.startswith("| T |"))
    body = [ln for ln in table[header + 2 :] if ln.startswith("|")]
    assert len(body) == 8
    assert body[0].startswith("| 0 | 1 | none | 2 |") and body[1].startswith(
        "| 0 | 1 | ddtree-32 |"
    )
    cells = [c.strip() for c in body[1].strip("|").split("|")]
    assert cells[5:7] == [f"{rows[4]['output_tok_s'] / rows[0]['output_tok_s']:.2f}", "–"]
    assert cells[-1] == "3.20"  # accept length (x dflash is "–": no dflash rows here)
    if importlib.util.find_spec("matplotlib") is not None:
        assert paths["png_throughput"].stat().st_size > 0
        assert paths["png_accept_hist"].stat().st_size > 0
    else:
        assert "png_throughput" not in paths

    # Two runs (split over two device commands) merge into one table; the later file wins.
    half_a = {"meta": {"command": ["a"]}, "rows": [r for r in rows if r["config"] == "none"]}
    later = [dict(r, output_tok_s=123.0) for r in rows if r["config"] != "none"]
    half_b = {"meta": {"command": ["b"]}, "rows": later}
    bench.write_json(half_a, tmp_path / "a.json")
    bench.write_json(half_b, tmp_path / "b.json")
    bench.write_json({"rows": rows[4:5]}, tmp_path / "old.json")
    merged = bench.merge(
        [str(tmp_path / p) for p in ("old.json", "a.json", "b.json")], tmp_path / "m"
    )
    assert len(merged["rows"]) == 8
    assert all(r["output_tok_s"] == 123.0 for r in merged["rows"] if r["config"] != "none")
    assert (tmp_path / "m" / "bench_e2e.md").exists()


# --------------------------------------------------------------------------- server process


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _fake_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--serve", str(port), *extra]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_server_lifecycle(bench, tmp_path):
    port = bench.free_port()
    with bench.Server(_fake_cmd(port, "--ready-after", "0.5"), port, tmp_path / "s.log") as srv:
        assert srv.startup_s >= 0.5  # waited for /health to turn 200
        info = bench.server_info(srv.base)
        assert info["avg_spec_accept_length"] == 3.25 and info["disable_cuda_graph"] is False
        child, leader = bench.http_json(srv.base + "/server_info")[1]["child_pid"], srv.proc.pid
        assert _alive(child)
        r = bench.stream_request(srv.base, "generate", "p0", 0, 0.0, 1.0, NUM_TOKENS)
        assert r.ok and r.output_tokens == NUM_TOKENS
    assert not _alive(leader) and not _alive(child)  # the whole process group is gone
    assert bench.cuda_graph_evidence(tmp_path / "s.log")["decode_cuda_graph_true"] == 1

    with pytest.raises(RuntimeError, match="exited with 3"):
        with bench.Server([sys.executable, "-c", "exit(3)"], port, tmp_path / "x.log"):
            pass
    with pytest.raises(ZeroDivisionError):  # an error while benchmarking still stops the server
        with bench.Server(_fake_cmd(port), port, tmp_path / "y.log") as srv:
            leader = srv.proc.pid
            1 / 0  # noqa: B018
    assert not _alive(leader)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_main_end_to_end(bench, tmp_path, monkeypatch):
    """main() with the launch command swapped for the fake server: one server per config."""
    launched = []

    def fake_launch(cfg, target, drafter, port, max_concurrency, *a, **k):
        launched.append((cfg.label, max_concurrency))
        return _fake_cmd(port, "--ttft", "0.01", "--gap", "0.002")

    monkeypatch.setattr(bench, "launch_command", fake_launch)
    monkeypatch.setattr(bench, "preflight", lambda configs: None)
    out = tmp_path / "run"
    argv = ["--out", str(out), "--configs", "none,ddtree", "--budgets", "16", "--concurrency"]
    argv += [
        "1",
        "2",
        "--temperatures",
        "0",
        "1",
        "--max-tokens",
        "16",
        "--requests-per-level",
        "2",
    ]
    assert bench.main(argv) == 0
    assert launched == [("none", 2), ("ddtree-16", 2)]
    doc = json.loads((out / "bench_e2e.json").read_text())
    assert doc["meta"]["command"][:2] == ["python", "benchmark/ddtree/bench_e2e.py"]
    assert doc["meta"]["git_commit"]
    assert len(doc["rows"]) == 8 and all(r["num_ok"] == 2 for r in doc["rows"])
    assert [s["config"] for s in doc["servers"]] == ["none", "ddtree-16"]
    assert all(s["decode_cuda_graph_true"] == 1 and "error" not in s for s in doc["servers"])
    assert (out / "server_none.log").exists() and (out / "bench_e2e.md").exists()

    # --repeats 2: A B then B A; every row knows its repeat; logs per server.
    launched.clear()
    assert bench.main([*argv[:2], "--repeats", "2", *argv[2:]]) == 0
    assert [c for c, _ in launched] == ["none", "ddtree-16", "ddtree-16", "none"]
    doc = json.loads((out / "bench_e2e.json").read_text())
    assert sorted({(r["config"], r["repeat"]) for r in doc["rows"]}) == [
        ("ddtree-16", 1),
        ("ddtree-16", 2),
        ("none", 1),
        ("none", 2),
    ]
    assert len(doc["rows"]) == 16 and (out / "server_none_r2.log").exists()
    assert "Over the repeats" in (out / "bench_e2e.md").read_text()

    # Past --deadline-s nothing more starts; what was not measured is listed and the exit is 1.
    launched.clear()
    assert bench.main([*argv[:2], "--deadline-s", "0", *argv[2:]]) == 1
    doc = json.loads((out / "bench_e2e.json").read_text())
    assert launched == [] and doc["rows"] == [] and len(doc["meta"]["not_measured"]) == 8


KILLED_PARENT = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("bench_e2e", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_e2e"] = bench
spec.loader.exec_module(bench)
port = bench.free_port()
srv = bench.Server([sys.executable, sys.argv[2], "--serve", str(port)], port, sys.argv[3])
srv.__enter__()
print(srv.proc.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_server_dies_with_killed_benchmark(tmp_path):
    """SIGKILL of the benchmark (no finally runs) still takes its server down."""
    bench_path = REPO / "benchmark" / "ddtree" / "bench_e2e.py"
    args = [str(bench_path), str(Path(__file__).resolve()), str(tmp_path / "s.log")]
    parent = subprocess.Popen(
        [sys.executable, "-c", KILLED_PARENT, *args], stdout=subprocess.PIPE, text=True
    )
    try:
        leader = int(parent.stdout.readline())
        assert _alive(leader)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.time() + 5
    while _alive(leader) and time.time() < deadline:
        time.sleep(0.05)
    try:
        assert not _alive(leader)
    finally:  # the stand-in's own child has no SGLang parent watchdog: end it here
        try:
            os.killpg(leader, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _serve_main() -> None:
    """Stand-in server process: prints a decode log line, owns a child, serves until killed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", type=int, required=True)
    ap.add_argument("--ready-after", type=float, default=0.0)
    ap.add_argument("--ttft", type=float, default=0.10)
    ap.add_argument("--gap", type=float, default=0.04)
    a = ap.parse_args()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print("Decode batch, #running-req: 1, cuda graph: True, gen throughput (token/s): 1.0")
    sys.stdout.flush()
    srv = make_server(a.serve, a.ttft, a.gap, a.ready_after, child.pid)
    srv.serve_forever()


if __name__ == "__main__":
    _serve_main()


def test_level_step_stats(bench):
    recs = [
        {"t": 0.5, "mode": "DECODE", "bs": 4, "period_ms": 9.0},  # before the level
        {"t": 1.0, "mode": "EXTEND", "bs": 2, "period_ms": 30.0},
        {"t": 1.1, "mode": "DECODE", "bs": 2, "period_ms": 5.0},
        {"t": 1.2, "mode": "DECODE", "bs": 3, "period_ms": 7.0},
        {"t": 1.3, "mode": "DECODE", "bs": 3, "period_ms": None},  # no successor: not summed
        {"t": 2.5, "mode": "DECODE", "bs": 1, "period_ms": 1.0},  # after the level
    ]
    st = bench.level_step_stats(recs, 1.0, 2.0)
    assert st["decode_steps"] == 3 and st["other_batches"] == 1
    assert st["decode_step_ms_median"] == 6.0 and st["decode_bs_median"] == 3
    assert st["decode_gpu_s"] == pytest.approx(0.012) and st["other_gpu_s"] == pytest.approx(0.03)
    assert bench.render_step_table([{"config": "x", "temperature": 0, "concurrency": 1}]) == ""


def test_server_passes_env(bench, tmp_path):
    code = "import os, sys; sys.exit(int(os.environ['BENCH_E2E_TEST_CODE']))"
    port = bench.free_port()
    env = {"BENCH_E2E_TEST_CODE": "7"}
    with pytest.raises(RuntimeError, match="exited with 7"):
        with bench.Server([sys.executable, "-c", code], port, tmp_path / "e.log", env=env):
            pass


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_main_step_timing(bench, tmp_path, monkeypatch):
    """--step-timing: each server times its batches; every level gets its decode steps (the
    fake server's period is its verify gap, 2 ms) and the markdown a second table."""
    monkeypatch.setattr(
        bench, "launch_command", lambda cfg, t, d, port, *a, **k: _fake_cmd(port, "--gap", "0.002")
    )
    monkeypatch.setattr(bench, "preflight", lambda configs: None)
    out = tmp_path / "run"
    argv = ["--out", str(out), "--configs", "dflash", "--concurrency", "1", "2"]
    argv += ["--temperatures", "0", "--max-tokens", "16", "--requests-per-level", "3"]
    assert bench.main([*argv, "--step-timing"]) == 0
    doc = json.loads((out / "bench_e2e.json").read_text())
    for row in doc["rows"]:
        st = row["steps"]
        assert st["decode_steps"] == 3 * VERIFY_CT and st["other_batches"] == 3, st
        assert st["decode_step_ms_median"] == pytest.approx(2.0)
    assert "Server-side batch timing" in (out / "bench_e2e.md").read_text()
    assert list((out / "steps_dflash").glob("steps.*.jsonl"))


def test_repeats_alternate_and_compare_within_a_repeat(bench):
    a, b = bench.Config("dflash", "dflash", None), bench.Config("ddtree-adaptive", "ddtree", None)
    assert bench.server_order([a, b], 3) == [(1, a), (1, b), (2, b), (2, a), (3, a), (3, b)]

    def row(cfg, rep, tok):
        return {"config": cfg, "temperature": 0.0, "concurrency": 32, "repeat": rep,
                "output_tok_s": tok}  # fmt: skip

    rows = [row("dflash", 1, 100.0), row("ddtree-adaptive", 1, 90.0)]
    rows += [row("ddtree-adaptive", 2, 150.0), row("dflash", 2, 125.0)]
    rows += [row("dflash", 3, 100.0), row("ddtree-adaptive", 3, 130.0)]
    by = {(r["config"], r["repeat"]): r for r in bench.add_speedups(rows)}
    # Each repeat's ratio uses that repeat's DFLASH server, not another one's.
    assert [by[("ddtree-adaptive", k)]["x_dflash"] for k in (1, 2, 3)] == pytest.approx(
        [0.9, 1.2, 1.3]
    )
    summary = {s["config"]: s for s in bench.repeat_summary(rows)}
    dd = summary["ddtree-adaptive"]
    assert dd["repeats"] == 3 and dd["tok_s_each"] == [90.0, 150.0, 130.0]
    assert dd["tok_s_median"] == 130.0
    assert dd["x_dflash_median"] == pytest.approx(1.2) and dd["x_dflash_min"] == pytest.approx(0.9)
    table = bench.render_table(rows).splitlines()
    assert table[0].startswith("| T | conc | config | rep |") and len(table) == 2 + 6
    text = bench.render_repeat_summary(rows)
    assert (
        "| 0 | 32 | ddtree-adaptive | 3 | 90, 150, 130 | 130 | 0.90, 1.20, 1.30 | 1.20 | 0.90 |"
        in text
    )
    assert bench.render_repeat_summary([{**r, "repeat": 1} for r in rows[:2]]) == ""


def test_level_requests_waves(bench):
    assert bench.level_requests(1, None) == 32  # at least 32
    assert bench.level_requests(32, None) == 64  # 2 waves by default
    assert bench.level_requests(32, None, waves=8) == 256
    assert bench.level_requests(64, 10, waves=8) == 10  # an explicit count wins
    assert bench.parse_args(["--out", "x", "--waves", "8"]).waves == 8
