"""End-to-end serving benchmark: no speculation vs DFLASH vs DDTREE.

For each configuration a fresh ``python -m sglang.launch_server`` serves the shipped trained pair
(``python/sglang_ddtree/pair/assets/{target,drafter}``, DFlash block 16) with triton attention
and CUDA graphs on:

- ``none``: no speculation;
- ``dflash``: the DFlash chain, ``--speculative-algorithm DFLASH --speculative-num-draft-tokens 16``;
- ``ddtree-adaptive``: ``--speculative-algorithm DDTREE`` with no ``--speculative-num-draft-tokens``,
  i.e. the plugin's default adaptive budget (W per running batch size, ``budget.default_schedule``);
- ``ddtree-B`` for each ``--budgets`` value B (config name ``ddtree``): ``--speculative-algorithm
  DDTREE --speculative-num-draft-tokens B+1`` (B >= 15: W must reach the block size).

Against each server, first a warm-up per temperature (`warmup_sweep`: as many requests as the
largest concurrency, of staggered lengths, so the running batch passes every size once; DDTREE
captures its glue CUDA graphs at the first step of each batch size), then, for every
temperature (T=0, and T=1 with top-p 0.95) and every concurrency (1, 8, 32, 64),
``--requests-per-level`` (default max(``--waves`` x concurrency, 32), waves 2) streaming requests
with the held-out prompts (cycled; ``max_new_tokens`` = ``--max-tokens``, ``ignore_eos``) keep
``concurrency`` requests in flight. Measured per level:

- output tokens/s: all completion tokens / the level's wall time (first send to last byte);
- TPOT per request: (arrival of the last token - arrival of the first) / (tokens - 1); mean and
  median over the level's requests; TTFT likewise;
- accept length (speculative configs): SGLang's per-request ``completion_tokens /
  spec_verify_ct`` from the final ``meta_info`` (``sglang/srt/managers/tokenizer_manager.py``,
  ``_calculate_spec_decoding_metrics``), summed over the level's requests, plus the histogram of
  committed tokens per verify step built from ``meta_info["spec_accept_histogram"]`` (index k =
  verify steps with k correct drafts, i.e. accept length k + 1) and the server's lifetime
  ``avg_spec_accept_length`` from ``/server_info``.

With ``--step-timing`` every server also times its own batches (``SGLANG_DDTREE_STEP_TIMING``,
CUDA events read back without syncs): per level, the decode steps, their median GPU period and
batch size, and the GPU time of decode steps against everything else (prefills), in each row's
``steps`` and a second markdown table. That splits a level's wall time, and compares a serving
decode step with a fixed-batch one (``bench_step.py``).

``--repeats N`` launches every configuration's server N times, in A B, B A, ... order; each
repeat's ``x_dflash`` uses that repeat's DFLASH server, and a summary table lists every repeat's
ratio with their median and minimum. The trained pair's steps are host-bound, so a single
server's throughput varies up to 2x between runs (RESULTS.md): compare with
repeats. ``--cprofile-levels`` (with ``--step-timing``) also writes a cProfile table of each
server's scheduler thread per level (it slows the host: not a speed measurement).

Requests go to the native ``/generate`` endpoint (``--api generate``, the default) because only its
``meta_info`` carries the per-request speculative counters; ``--api openai`` uses
``/v1/completions`` (streaming, ``stream_options.continuous_usage_stats``) and then has only the
server-wide accept length. Only the standard library talks to the server; tqdm and matplotlib are
used when importable.

Outputs in ``--out``: ``bench_e2e.json`` (every row, the command line, git commit, GPU, each
server's launch command, resolved server args and CUDA-graph evidence from its log; rewritten
after every level), ``bench_e2e.md`` (the table, also printed), ``bench_e2e_throughput.png`` and
``bench_e2e_accept_hist.png``, and one ``server_<config>.log`` per configuration.

On the H200, through the ``run`` tool with ``carry: [".gpu"]`` and ``timeout_s: 600`` (``.gpu/``
holds the offline SGLang bundle of ``shared/gpu/build-bundle``; its JIT cache recompressed with
xz, 3-5 MB instead of 8.5, keeps the working tree plus bundle under the 64 MiB a call may carry;
with the JIT cache a pair server starts in ~25-75 s). One command may run 10 minutes,
so the six servers are split over three calls; each repeats the setup (a cold machine has
nothing installed) and starts no level after ``--deadline-s``. Estimated per server: ~1-2 min
of startup and CUDA-graph capture plus ~0.5-1 min of traffic (the 32 sequential requests at
concurrency 1 dominate), so ~4-5 min per call and ~15 min of device time in all. Call 1::

    mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu/sglang-0.5.17-cp312.tar.xz &&
    tar -C ~ -xJf .gpu/jit-cache-sm90a.txz && export PYTHONPATH=/tmp/site &&
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . &&
    python3 benchmark/ddtree/bench_e2e.py --out $OUT/a --configs none,dflash --deadline-s 480

calls 2 and 3: the same with ``--out $OUT/b --configs ddtree-adaptive,ddtree --budgets 16`` and
``--out $OUT/c --configs ddtree --budgets 32 64``. A run that ran out of time lists the levels it did NOT MEASURE
(and exits 1). Then one table and the plots of all (matplotlib makes the PNGs; the GPU host has
it)::

    python3 benchmark/ddtree/bench_e2e.py --merge A/bench_e2e.json B/bench_e2e.json \
        C/bench_e2e.json --out DIR

``--dry-run`` prints the launch commands and the plan without starting anything (works on a CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from sglang_ddtree.step_timing import CPROFILE_ENV, WINDOW, WINDOW_FILE, read_steps
from sglang_ddtree.step_timing import ENV as STEP_TIMING_ENV
from sglang_ddtree.testing.http import free_port, http_json

REPO = Path(__file__).resolve().parents[2]
PAIR_DIR = REPO / "python" / "sglang_ddtree" / "pair" / "assets"
HELDOUT_PROMPTS = PAIR_DIR / "heldout_prompts.json"

DFLASH_NUM_DRAFT_TOKENS = 16  # the pair's DFlash block size
CONTEXT_LENGTH = 2048  # the pair's max_position_embeddings
MAX_PROMPT_TOKENS = 192  # held-out prompts run 64-192 tokens
SERVER_INFO_KEYS = (
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "speculative_dflash_block_size",
    "attention_backend",
    "disable_cuda_graph",
    "cuda_graph_max_bs_decode",
    "cuda_graph_bs_decode",
    "max_running_requests",
    "mem_fraction_static",
    "context_length",
    "disable_overlap_schedule",
    "max_total_num_tokens",
    "version",
)


# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    label: str  # "none", "dflash", "ddtree-32"
    method: str  # "none", "dflash", "ddtree"
    budget: int | None = None  # DDTREE tree budget (nodes verified = budget + 1); None: adaptive

    @property
    def num_draft_tokens(self) -> int | None:
        if self.method == "dflash":
            return DFLASH_NUM_DRAFT_TOKENS
        if self.method == "ddtree" and self.budget is not None:
            return self.budget + 1
        return None  # no speculation, or DDTREE's default adaptive budget


def build_configs(names: list[str], budgets: list[int]) -> list[Config]:
    out = []
    for name in names:
        if name == "none":
            out.append(Config("none", "none"))
        elif name == "dflash":
            out.append(Config("dflash", "dflash"))
        elif name == "ddtree":
            out += [Config(f"ddtree-{b}", "ddtree", b) for b in budgets]
        elif name == "ddtree-adaptive":
            out.append(Config("ddtree-adaptive", "ddtree"))
        else:
            raise ValueError(f"unknown config {name!r} (none, dflash, ddtree, ddtree-adaptive)")
    return out


def launch_command(
    cfg: Config,
    target: str,
    drafter: str,
    port: int,
    max_concurrency: int,
    mem_fraction: float = 0.2,
    extra: list[str] | None = None,
) -> list[str]:
    """The ``sglang.launch_server`` command of one configuration (CUDA graphs stay on)."""
    from sglang_ddtree.serve import launch_command as serve_command

    flags = [
        "--cuda-graph-max-bs-decode", str(max_concurrency),  # 0.5.17 name of --cuda-graph-max-bs
        "--max-running-requests", str(max_concurrency),
        "--mem-fraction-static", str(mem_fraction),
        "--context-length", str(CONTEXT_LENGTH),
        "--random-seed", "0",
        "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    algorithm = None if cfg.method == "none" else cfg.method.upper()
    return serve_command(
        target, drafter, cfg.num_draft_tokens, flags + list(extra or []), algorithm=algorithm
    )


# --------------------------------------------------------------------------- server lifecycle


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Server:
    """A server process in its own process group: started, awaited on /health, always stopped."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        log_path: Path,
        ready_timeout: float = 600.0,
        env: dict[str, str] | None = None,
    ):
        self.cmd, self.port, self.log_path, self.ready_timeout = cmd, port, log_path, ready_timeout
        self.env = None if env is None else {**os.environ, **env}
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def __enter__(self) -> Server:
        t0 = time.perf_counter()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                env=self.env,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.time() + self.ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}; {self.log_path}:\n"
                    + log_tail(self.log_path)
                )
            try:
                if http_json(self.base + "/health", timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not healthy after {self.ready_timeout:.0f} s; {self.log_path}")

    def stop(self) -> None:
        """SIGTERM the process group; SIGKILL what is left of it after 30 s (+10 s grace)."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        if _group_alive(pgid, wait_s=10):
            _signal_group(pgid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            _group_alive(pgid, wait_s=5)
        self.proc = None


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM if this benchmark dies without stopping it (SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int, wait_s: float) -> bool:
    """Whether live (non-zombie) processes of the group remain after waiting up to ``wait_s``."""
    deadline = time.time() + wait_s
    while _group_members(pgid):
        if time.time() > deadline:
            return True
        time.sleep(0.2)
    return False


def _group_members(pgid: int) -> list[int]:
    """Live processes of a process group (from /proc; zombies only wait to be reaped)."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            pids.append(int(name))
    return pids


def server_info(base: str) -> dict:
    """Resolved server args worth recording plus the lifetime average accept length."""
    try:
        code, info = http_json(base + "/server_info", timeout=30)
    except OSError as e:
        return {"error": str(e)}
    if code != 200:
        return {"error": f"HTTP {code}"}
    out = {k: info.get(k) for k in SERVER_INFO_KEYS if k in info}
    states = info.get("internal_states") or [{}]
    out["avg_spec_accept_length"] = (states[0] or {}).get("avg_spec_accept_length")
    return out


def cuda_graph_evidence(log_path: Path) -> dict:
    """Counts of decode log lines (they end in 'gen throughput') run with/without a CUDA graph."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    decode = [ln for ln in text.splitlines() if "gen throughput" in ln]
    return {
        "decode_log_lines": len(decode),
        "decode_cuda_graph_true": sum("cuda graph: True" in ln for ln in decode),
        "decode_cuda_graph_false": sum("cuda graph: False" in ln for ln in decode),
        "capture_lines": sum("Capture" in ln for ln in text.splitlines()),
    }


# --------------------------------------------------------------------------- one request


@dataclass
class RequestResult:
    ok: bool
    prompt_index: int
    t_start: float
    t_end: float
    output_tokens: int = 0
    ttft: float | None = None  # s, first token arrival - send
    decode_s: float | None = None  # s, last token arrival - first token arrival
    verify_ct: int | None = None  # SGLang spec_verify_ct (final meta_info)
    correct_drafts_hist: list[int] = field(default_factory=list)  # [k] = steps with k drafts
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.decode_s is None or self.output_tokens < 2:
            return None
        return self.decode_s / (self.output_tokens - 1)

    @property
    def accept_length(self) -> float | None:
        return self.output_tokens / self.verify_ct if self.verify_ct else None


def request_payload(api: str, prompt: str, temperature: float, top_p: float, max_tokens: int):
    if api == "generate":
        return "/generate", {
            "text": prompt,
            "stream": True,
            "sampling_params": {
                "max_new_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "ignore_eos": True,
            },
        }
    return "/v1/completions", {
        "model": "default",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "ignore_eos": True,  # SGLang extra body field
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def stream_request(
    base: str,
    api: str,
    prompt: str,
    prompt_index: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    timeout: float = 600.0,
) -> RequestResult:
    """Send one streaming request; time the arrival of its tokens from the SSE events."""
    path, payload = request_payload(api, prompt, temperature, top_p, max_tokens)
    req = urllib.request.Request(
        base + path, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    res = RequestResult(ok=False, prompt_index=prompt_index, t_start=t0, t_end=t0)
    t_first = t_last = None
    n = 0
    meta: dict = {}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for line in resp:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                obj = json.loads(data)
                if "error" in obj:
                    raise RuntimeError(str(obj["error"])[:300])
                if api == "generate":
                    meta = obj.get("meta_info") or meta
                    count = meta.get("completion_tokens", n)
                    arrived = count > n
                else:
                    usage = obj.get("usage") or {}
                    count = usage.get("completion_tokens", n)
                    text = any(c.get("text") for c in obj.get("choices") or [])
                    arrived = count > n or ("completion_tokens" not in usage and text)
                if arrived:
                    t_first = now if t_first is None else t_first
                    t_last = now
                n = max(n, count)
    except urllib.error.HTTPError as e:
        res.error = f"HTTP {e.code}: {e.read().decode(errors='replace')[:300]}"
    except (OSError, ValueError, RuntimeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.t_end = time.perf_counter()
    res.output_tokens = n
    if t_first is not None:
        res.ttft, res.decode_s = t_first - t0, t_last - t_first
    res.verify_ct = meta.get("spec_verify_ct")
    res.correct_drafts_hist = list(
        meta.get("spec_accept_histogram") or meta.get("spec_correct_drafts_histogram") or []
    )
    res.ok = res.error is None and n > 0
    if res.error is None and n == 0:
        res.error = "no tokens received"
    return res


# --------------------------------------------------------------------------- one level


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)
    except ImportError:
        return _PlainProgress(total, desc)


class _PlainProgress:
    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.n, self.step = total, desc, 0, max(1, total // 4)

    def update(self, k: int = 1) -> None:
        self.n += k
        if self.n % self.step == 0 or self.n == self.total:
            print(f"  {self.desc}: {self.n}/{self.total}", flush=True)

    def close(self) -> None:
        pass


def send_all(
    base: str,
    api: str,
    prompts: list[str],
    max_tokens: list[int],
    concurrency: int,
    temperature: float,
    top_p: float,
    desc: str = "",
) -> list[RequestResult]:
    """Request i (prompt ``i % len(prompts)``, ``max_tokens[i]`` new tokens) for every i, with
    at most ``concurrency`` in flight; results in completion order."""
    bar = _progress(len(max_tokens), desc)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futs = [
            pool.submit(
                stream_request,
                base,
                api,
                prompts[i % len(prompts)],
                i % len(prompts),
                temperature,
                top_p,
                n,
            )  # fmt: skip
            for i, n in enumerate(max_tokens)
        ]
        results = []
        for f in as_completed(futs):
            results.append(f.result())
            bar.update(1)
    bar.close()
    return results


def run_level(
    base: str,
    api: str,
    prompts: list[str],
    concurrency: int,
    num_requests: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    desc: str = "",
) -> tuple[list[RequestResult], float]:
    """Closed loop: ``concurrency`` requests in flight until ``num_requests`` are done."""
    t0 = time.perf_counter()
    results = send_all(
        base, api, prompts, [max_tokens] * num_requests, concurrency, temperature, top_p, desc
    )
    t_end = max((r.t_end for r in results), default=t0)
    return sorted(results, key=lambda r: r.t_start), t_end - t0


# Above the most tokens one step commits (the drafter block, 16), so warm-up requests seldom end
# in the same step; the cap keeps prompt + output inside the servers' context (2048).
WARMUP_TOKEN_STEP = 17
WARMUP_MAX_TOKENS = 1024


def warmup_sweep(
    base: str,
    api: str,
    prompts: list[str],
    concurrency: int,
    temperature: float,
    top_p: float,
    token_step: int = WARMUP_TOKEN_STEP,
    desc: str = "",
) -> list[RequestResult]:
    """``concurrency`` requests at once, request i asking for ``1 + token_step * i`` tokens
    (at most ``WARMUP_MAX_TOKENS``).

    They finish one after another, so the running batch walks down from ``concurrency`` to 1
    and the server meets every batch size before any level is timed. DDTREE captures its glue
    CUDA graphs at the first step of each (batch size, W, sampling mode); SGLang's own graphs are
    captured at startup, so without this the first levels would time those captures.
    """
    lengths = [min(1 + token_step * i, WARMUP_MAX_TOKENS) for i in range(concurrency)]
    results = send_all(base, api, prompts, lengths, concurrency, temperature, top_p, desc)
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{desc}: {len(failed)} warm-up requests failed, e.g. {failed[0]}")
    return results


def add_hists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))]


def _mean(xs):
    return statistics.fmean(xs) if xs else None


def _median(xs):
    return statistics.median(xs) if xs else None


def _ms(x):
    return None if x is None else x * 1e3


def summarize_level(results: list[RequestResult], wall_s: float) -> dict:
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    tpots = [r.tpot for r in ok if r.tpot is not None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    spec = [r for r in ok if r.verify_ct]
    per_req = [r.accept_length for r in spec]
    hist: list[int] = []  # hist[L] = verify steps that committed L tokens (bonus included)
    for r in spec:
        hist = add_hists(hist, [0, *r.correct_drafts_hist])  # k correct drafts -> L = k + 1
    steps = sum(hist)
    errors = [r.error for r in results if r.error]
    return {
        "num_requests": len(results),
        "num_ok": len(ok),
        "num_errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall_s,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall_s if wall_s > 0 else None,
        "tpot_ms_mean": _ms(_mean(tpots)),
        "tpot_ms_median": _ms(_median(tpots)),
        "ttft_ms_mean": _ms(_mean(ttfts)),
        "ttft_ms_median": _ms(_median(ttfts)),
        # SGLang's accept length: completion tokens / verify steps, over the level's requests.
        "accept_length": (
            sum(r.output_tokens for r in spec) / sum(r.verify_ct for r in spec) if spec else None
        ),
        "accept_length_req_mean": _mean(per_req),
        "accept_length_req_median": _median(per_req),
        "accept_len_hist": hist,
        "accept_length_hist_mean": (
            sum(i * c for i, c in enumerate(hist)) / steps if steps else None
        ),
    }


def level_step_stats(records: list[dict], t0: float, t1: float) -> dict:
    """The server's own batch timings (``sglang_ddtree.step_timing`` records: host start ``t``
    on the system-wide monotonic clock, ``mode``, ``bs``, GPU ``period_ms``) of the batches
    started in ``[t0, t1]``: decode steps against everything else (prefills), so a level's wall
    time splits into decode and prefill GPU time, and its decode step can be compared with a
    fixed-batch step (``bench_step.py``)."""
    recs = [r for r in records if t0 <= r["t"] <= t1]
    dec = [r for r in recs if r["mode"] == "DECODE"]
    other = [r for r in recs if r["mode"] != "DECODE"]

    def total_s(rs):
        return sum(r["period_ms"] for r in rs if r["period_ms"] is not None) / 1e3

    periods = [r["period_ms"] for r in dec if r["period_ms"] is not None]
    return {
        "decode_steps": len(dec),
        "decode_step_ms_median": _median(periods),
        "decode_bs_median": _median([r["bs"] for r in dec]),
        "decode_gpu_s": total_s(dec),
        "other_batches": len(other),
        "other_gpu_s": total_s(other),
    }


# --------------------------------------------------------------------------- one server


def level_requests(concurrency: int, requests_per_level: int | None, waves: int = 2) -> int:
    """Requests of one level: ``requests_per_level`` if given, else ``waves`` full waves of
    ``concurrency`` requests, at least 32."""
    return requests_per_level or max(waves * concurrency, 32)


def bench_server(
    base: str,
    cfg: Config,
    prompts: list[str],
    temperatures: list[float],
    concurrencies: list[int],
    max_tokens: int,
    requests_per_level: int | None = None,
    top_p: float = 0.95,
    api: str = "generate",
    waves: int = 2,
    warmup: bool = True,
    on_row=None,
    deadline: float | None = None,
    profile_window: Path | None = None,
) -> list[dict]:
    """All (temperature, concurrency) levels against one running server; one row each.

    With ``warmup``, first a `warmup_sweep` per temperature up to the largest concurrency. No
    level starts after ``deadline`` (a ``time.time()`` value). With ``profile_window`` (the
    server's ``step_timing`` window file), that file exists exactly while a level runs."""
    if warmup:
        for t in sorted(set(temperatures)):
            warmup_sweep(
                base, api, prompts, max(concurrencies), t, top_p if t > 0 else 1.0,
                desc=f"{cfg.label} warmup T={t:g}",
            )  # fmt: skip
    rows = []
    for t in temperatures:
        p = top_p if t > 0 else 1.0
        for c in concurrencies:
            n = level_requests(c, requests_per_level, waves)
            desc = f"{cfg.label} T={t:g} c={c}"
            if deadline is not None and time.time() > deadline:
                print(f"  {desc}: skipped (past --deadline-s)", flush=True)
                continue
            if profile_window is not None:
                profile_window.touch()
            t_mono = time.monotonic()
            try:
                results, wall = run_level(base, api, prompts, c, n, t, p, max_tokens, desc=desc)
            finally:
                if profile_window is not None:
                    profile_window.unlink(missing_ok=True)
            row = {
                "config": cfg.label,
                "method": cfg.method,
                "budget": cfg.budget,
                "num_draft_tokens": cfg.num_draft_tokens,
                "api": api,
                "temperature": t,
                "top_p": p,
                "concurrency": c,
                "max_tokens": max_tokens,
                "t_monotonic": [t_mono, time.monotonic()],  # the level's window (step timing)
                **summarize_level(results, wall),
                "server_avg_spec_accept_length_lifetime": (
                    server_info(base).get("avg_spec_accept_length")
                    if cfg.method != "none"
                    else None
                ),
            }
            rows.append(row)
            print(f"  {desc}: {_row_brief(row)}", flush=True)
            if on_row is not None:
                on_row(row)
    return rows


def _row_brief(row: dict) -> str:
    acc = row.get("accept_length")
    return (
        f"{_fmt(row['output_tok_s'], 0)} tok/s, TPOT median {_fmt(row['tpot_ms_median'], 2)} ms"
        + (f", accept {acc:.2f}" if acc else "")
        + (f", {row['num_errors']} errors: {row['first_error']}" if row["num_errors"] else "")
    )


# --------------------------------------------------------------------------- outputs


def _fmt(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _config_order(label: str) -> tuple:
    if label == "none":
        return (0, 0)
    if label == "dflash":
        return (1, 0)
    if label == "ddtree-adaptive":
        return (2, 0)
    if label.startswith("ddtree-") and label.split("-", 1)[1].isdigit():
        return (3, int(label.split("-", 1)[1]))
    return (4, label)


def sort_rows(rows: list[dict]) -> list[dict]:
    return sorted(
        rows,
        key=lambda r: (
            r["temperature"],
            r["concurrency"],
            _config_order(r["config"]),
            r.get("repeat", 1),
        ),
    )


def _row_key(r: dict) -> tuple:
    """(config, T, concurrency, repeat): one measured level of one server."""
    return (r["config"], r["temperature"], r["concurrency"], r.get("repeat", 1))


def server_order(configs: list, repeats: int) -> list[tuple[int, object]]:
    """(repeat, config) for every server to launch: the configurations in order on odd
    repeats and reversed on even ones (A B, B A, ...), so a drift of the machine over the run
    (or whichever server goes first) does not favour one configuration."""
    order = []
    for k in range(1, repeats + 1):
        order += [(k, c) for c in (configs if k % 2 else configs[::-1])]
    return order


def add_speedups(rows: list[dict]) -> list[dict]:
    """x_none / x_dflash: output tok/s over that of no speculation / the chain at the same level."""
    ref = {_row_key(r): r["output_tok_s"] for r in rows}
    for r in rows:
        for name in ("none", "dflash"):  # the same repeat's server: side by side in time
            base = ref.get((name, *_row_key(r)[1:]))
            r[f"x_{name}"] = r["output_tok_s"] / base if base and r["output_tok_s"] else None
    return rows


LEVEL_COLUMNS = (  # what names a level in every table
    ("T", "temperature", lambda x: f"{x:g}"),
    ("conc", "concurrency", str),
    ("config", "config", str),
)
TABLE_COLUMNS = (
    *LEVEL_COLUMNS,
    ("reqs ok", "num_ok", str),
    ("out tok/s", "output_tok_s", lambda x: _fmt(x, 0)),
    ("x none", "x_none", _fmt),
    ("x dflash", "x_dflash", _fmt),
    ("TPOT mean ms", "tpot_ms_mean", _fmt),
    ("TPOT median ms", "tpot_ms_median", _fmt),
    ("TTFT median ms", "ttft_ms_median", lambda x: _fmt(x, 1)),
    ("accept len", "accept_length", _fmt),
)
STEP_COLUMNS = (
    *LEVEL_COLUMNS,
    ("wall s", "wall_s", _fmt),
    ("decode steps", "decode_steps", str),
    ("decode step median ms", "decode_step_ms_median", _fmt),
    ("decode bs median", "decode_bs_median", lambda x: _fmt(x, 1)),
    ("decode GPU s", "decode_gpu_s", _fmt),
    ("other batches", "other_batches", str),
    ("other GPU s", "other_gpu_s", _fmt),
)


def _markdown(rows: list[dict], columns) -> str:
    head = "| " + " | ".join(c[0] for c in columns) + " |"
    sep = "|" + "|".join("---" if c[1] == "config" else "---:" for c in columns) + "|"
    body = ["| " + " | ".join(_cell(r, k, f) for _, k, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def _repeated(rows: list[dict]) -> bool:
    """Whether some level ran more than once (``--repeats``)."""
    return max((r.get("repeat", 1) for r in rows), default=1) > 1


def _columns(rows: list[dict], columns) -> tuple:
    """``columns`` with a repeat column after the config when some level ran more than once."""
    if not _repeated(rows):
        return columns
    k = len(LEVEL_COLUMNS)
    return (*columns[:k], ("rep", "repeat", str), *columns[k:])


def render_table(rows: list[dict]) -> str:
    rows = add_speedups(sort_rows(rows))
    return _markdown(rows, _columns(rows, TABLE_COLUMNS))


def render_step_table(rows: list[dict]) -> str:
    """The servers' own batch timings per level (``--step-timing``); "" when none were taken."""
    rows = [{**r, **r["steps"]} for r in sort_rows(rows) if r.get("steps")]
    return _markdown(rows, _columns(rows, STEP_COLUMNS)) if rows else ""


def repeat_summary(rows: list[dict]) -> list[dict]:
    """Per (T, concurrency, config) over the repeats: tok/s and x_dflash of each repeat, their
    medians and the smallest x_dflash (each repeat's ratio uses that repeat's DFLASH server)."""
    groups: dict[tuple, list[dict]] = {}
    for r in add_speedups(sort_rows(rows)):
        groups.setdefault((r["temperature"], r["concurrency"], r["config"]), []).append(r)
    out = []
    for (t, c, cfg), rs in groups.items():
        tok = [r["output_tok_s"] for r in rs if r.get("output_tok_s")]
        xd = [r["x_dflash"] for r in rs if r.get("x_dflash") is not None]
        out.append(
            {
                "temperature": t,
                "concurrency": c,
                "config": cfg,
                "repeats": len(rs),
                "tok_s_each": tok,
                "tok_s_median": _median(tok),
                "x_dflash_each": xd,
                "x_dflash_median": _median(xd),
                "x_dflash_min": min(xd) if xd else None,
            }
        )
    return out


SUMMARY_COLUMNS = (
    *LEVEL_COLUMNS,
    ("repeats", "repeats", str),
    ("tok/s each", "tok_s_each", lambda xs: ", ".join(f"{x:,.0f}" for x in xs)),
    ("tok/s median", "tok_s_median", lambda x: _fmt(x, 0)),
    ("x dflash each", "x_dflash_each", lambda xs: ", ".join(f"{x:.2f}" for x in xs) or "–"),
    ("x dflash median", "x_dflash_median", _fmt),
    ("x dflash min", "x_dflash_min", _fmt),
)


def render_repeat_summary(rows: list[dict]) -> str:
    """The `repeat_summary` table; "" when every level ran once."""
    return _markdown(repeat_summary(rows), SUMMARY_COLUMNS) if _repeated(rows) else ""


def _cell(row: dict, key: str, fmt) -> str:
    return "–" if row.get(key) is None else fmt(row[key])


def write_json(doc: dict, path: Path) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def write_outputs(doc: dict, out_dir: Path) -> dict:
    """bench_e2e.json, bench_e2e.md and (with matplotlib) the PNGs; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc["rows"] = add_speedups(sort_rows(doc["rows"]))
    paths = {"json": out_dir / "bench_e2e.json", "md": out_dir / "bench_e2e.md"}
    write_json(doc, paths["json"])
    meta = doc.get("meta", {})
    cmds = meta.get("commands") or [meta.get("command")]
    md = ["# bench_e2e", ""]
    md += [f"- command: `{shlex.join(c)}`" for c in cmds if c]
    md += [
        f"- git commit: {meta.get('git_commit')}, GPU: {meta.get('gpu')}, "
        f"SGLang: {meta.get('sglang_version')}",
        "",
        render_table(doc["rows"]),
        "",
    ]
    summary = render_repeat_summary(doc["rows"])
    if summary:
        md += ["Over the repeats (`--repeats`):", "", summary, ""]
    steps = render_step_table(doc["rows"])
    if steps:
        md += ["Server-side batch timing per level (`--step-timing`):", "", steps, ""]
    paths["md"].write_text("\n".join(md))
    paths.update(plot(doc["rows"], out_dir))
    return paths


def _temp_title(rows: list[dict], t: float) -> str:
    top_p = next((r.get("top_p") for r in rows if r["temperature"] == t), None)
    return f"T={t:g}" + (f", top_p {top_p:g}" if top_p not in (None, 1.0) else "")


def _median_over_repeats(rows: list[dict], concurrencies: list[int], key: str) -> list:
    """Per concurrency, the median of ``key`` over the rows (the repeats of one config)."""
    vals = [[r.get(key) for r in rows if r["concurrency"] == c] for c in concurrencies]
    return [_median([v for v in vs if v is not None]) for vs in vals]


def plot(rows: list[dict], out_dir: Path) -> dict:
    """Throughput / TPOT vs concurrency and accept-length histograms; {} without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plots", flush=True)
        return {}
    temps = sorted({r["temperature"] for r in rows})
    concs = sorted({r["concurrency"] for r in rows})
    configs = sorted({r["config"] for r in rows}, key=_config_order)
    if not temps:
        return {}
    out = {}
    fig, axes = plt.subplots(2, len(temps), figsize=(6 * len(temps), 8), squeeze=False)
    for j, t in enumerate(temps):
        for cfg in configs:
            sel = [r for r in rows if r["temperature"] == t and r["config"] == cfg]
            xs = sorted({r["concurrency"] for r in sel})
            ys = _median_over_repeats(sel, xs, "output_tok_s")
            axes[0][j].plot(xs, ys, marker="o", label=cfg)
            ys = _median_over_repeats(sel, xs, "tpot_ms_median")
            axes[1][j].plot(xs, ys, marker="o", label=cfg)
        for i, ylabel in enumerate(("output tokens/s", "median TPOT (ms)")):
            ax = axes[i][j]
            ax.set_xscale("log", base=2)
            ax.set_xticks(concs, [str(c) for c in concs])
            ax.set_xlabel("concurrency")
            ax.set_ylabel(ylabel)
            ax.set_title(_temp_title(rows, t))
            ax.grid(True, alpha=0.3)
            ax.legend()
    fig.tight_layout()
    out["png_throughput"] = out_dir / "bench_e2e_throughput.png"
    fig.savefig(out["png_throughput"], dpi=120)
    plt.close(fig)

    spec_cfgs = [c for c in configs if c != "none"]
    if spec_cfgs:
        fig, axes = plt.subplots(1, len(temps), figsize=(7 * len(temps), 4), squeeze=False)
        width = 0.8 / len(spec_cfgs)
        for j, t in enumerate(temps):
            ax = axes[0][j]
            for k, cfg in enumerate(spec_cfgs):
                hist: list[int] = []
                for r in rows:
                    if r["temperature"] == t and r["config"] == cfg:
                        hist = add_hists(hist, r.get("accept_len_hist") or [])
                total = sum(hist)
                if not total:
                    continue
                mean = sum(i * c for i, c in enumerate(hist)) / total
                xs = [i + (k - (len(spec_cfgs) - 1) / 2) * width for i in range(len(hist))]
                ax.bar(xs, [c / total for c in hist], width, label=f"{cfg} (mean {mean:.2f})")
            ax.set_xlabel("tokens committed per verify step (bonus included)")
            ax.set_ylabel("fraction of verify steps")
            ax.set_xticks(range(1, DFLASH_NUM_DRAFT_TOKENS + 1))
            ax.set_title(_temp_title(rows, t) + ", all concurrencies")
            ax.legend()
        fig.tight_layout()
        out["png_accept_hist"] = out_dir / "bench_e2e_accept_hist.png"
        fig.savefig(out["png_accept_hist"], dpi=120)
        plt.close(fig)
    return out


# --------------------------------------------------------------------------- main


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def run_meta(argv: list[str]) -> dict:
    try:
        from importlib.metadata import version

        sglang_version = version("sglang")
    except Exception:
        sglang_version = None
    dirty = _run(["git", "-C", str(REPO), "status", "--porcelain"])
    return {
        "command": ["python", "benchmark/ddtree/bench_e2e.py", *argv],
        "git_commit": _run(["git", "-C", str(REPO), "rev-parse", "HEAD"]),
        "git_dirty": bool(dirty) if dirty is not None else None,
        "gpu": _run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        ),
        "sglang_version": sglang_version,
        "SGLANG_DDTREE_TOPK": os.environ.get("SGLANG_DDTREE_TOPK"),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def load_prompts(path: Path = HELDOUT_PROMPTS) -> list[str]:
    return [x["prompt"] for x in json.loads(Path(path).read_text())]


def merge(paths: list[str], out_dir: Path) -> dict:
    """Rows of several runs in one document (a later file wins for the same config, T,
    concurrency and repeat)."""
    rows: dict[tuple, dict] = {}
    metas, servers = [], []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        metas.append(doc.get("meta", {}))
        servers += doc.get("servers", [])
        for r in doc.get("rows", []):
            rows[_row_key(r)] = r
    doc = {
        "meta": {
            "merged_from": [str(p) for p in paths],
            "commands": [m.get("command") for m in metas],
            "git_commit": ", ".join(sorted({str(m.get("git_commit")) for m in metas})),
            "gpu": ", ".join(sorted({str(m.get("gpu")) for m in metas})),
            "sglang_version": ", ".join(sorted({str(m.get("sglang_version")) for m in metas})),
            "runs": metas,
        },
        "servers": servers,
        "rows": list(rows.values()),
    }
    write_outputs(doc, out_dir)
    return doc


def preflight(configs: list[Config]) -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not importable (see the setup in this file's docstring)"
    if any(c.method == "ddtree" for c in configs):
        from importlib.metadata import entry_points

        if not any(ep.name == "ddtree" for ep in entry_points(group="sglang.srt.plugins")):
            return "the DDTREE plugin is not registered: pip install --no-deps -e . first"
    return None


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument(
        "--configs",
        default="none,dflash,ddtree-adaptive,ddtree",
        help="comma list of none, dflash, ddtree-adaptive, ddtree (one server per --budgets)",
    )
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64], help="DDTREE budgets")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--top-p", type=float, default=0.95, help="top_p for T > 0 (T = 0 uses 1.0)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument(
        "--requests-per-level", type=int, default=None, help="default max(waves x concurrency, 32)"
    )
    ap.add_argument(
        "--waves",
        type=int,
        default=2,
        help="requests per level = waves x concurrency (at least 32): more waves, longer levels "
        "(at 2 waves a c >= 8 level of the trained pair lasts ~1-2 s; single runs varied "
        "+-30%% there)",
    )
    ap.add_argument("--target", default=str(PAIR_DIR / "target"))
    ap.add_argument("--drafter", default=str(PAIR_DIR / "drafter"))
    ap.add_argument("--prompts", default=str(HELDOUT_PROMPTS), help="JSON list of {prompt: ...}")
    ap.add_argument("--api", choices=("generate", "openai"), default="generate")
    ap.add_argument("--mem-fraction", type=float, default=0.2)
    ap.add_argument("--server-timeout", type=float, default=600.0, help="s to wait for /health")
    ap.add_argument("--server-args", default="", help="extra launch_server args (one string)")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="start no server or level after this many seconds (stay inside a wall-clock limit)",
    )
    ap.add_argument(
        "--step-timing",
        action="store_true",
        help="time every batch inside each server (SGLANG_DDTREE_STEP_TIMING): per level, "
        "decode steps and their median GPU period, decode vs prefill GPU time",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="launch every configuration's server this many times, in alternating order "
        "(A B, B A, ...); rows carry their repeat, x_dflash compares within a repeat, and a "
        "summary table gives each repeat's ratio and the median",
    )
    ap.add_argument(
        "--cprofile-levels",
        action="store_true",
        help="with --step-timing: cProfile each server's scheduler thread during every level "
        "(SGLANG_DDTREE_CPROFILE=window; tables in steps_<config>/cprofile_window.*.txt). The "
        "profiler slows the host: these levels' speeds are not measurements",
    )
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="merge earlier runs into --out")
    ap.add_argument("--dry-run", action="store_true", help="print the launch commands and exit")
    args = ap.parse_args(argv)
    if args.max_tokens + MAX_PROMPT_TOKENS + max(args.budgets) + 2 > CONTEXT_LENGTH:
        ap.error(f"--max-tokens too large for the context length {CONTEXT_LENGTH}")
    if any(b < DFLASH_NUM_DRAFT_TOKENS - 1 for b in args.budgets):
        ap.error("DDTREE budgets must be >= 15 (W = budget + 1 must reach the block size 16)")
    return args


# step_timing writes a batch's record lazily (no sync): at the next prefill or once 64 batches
# are pending, and only if its successor has started on the GPU. One request long enough for
# 64+ decode steps after the last level writes out every level's batches.
FLUSH_TOKENS = 512


def attach_step_stats(base: str, api: str, prompt: str, rows: list[dict], steps_dir) -> None:
    """Add ``level_step_stats`` of each level (``row["steps"]``) from the server's records."""
    stream_request(base, api, prompt, 0, 0.0, 1.0, FLUSH_TOKENS)
    records = read_steps(str(steps_dir))
    for row in rows:
        row["steps"] = level_step_stats(records, *row["t_monotonic"])


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.merge:
        doc = merge(args.merge, out_dir)
        print(render_table(doc["rows"]))
        return 0

    configs = build_configs([c.strip() for c in args.configs.split(",") if c.strip()], args.budgets)
    max_conc = max(args.concurrency)
    extra = shlex.split(args.server_args)
    if "--disable-cuda-graph" in extra:
        raise SystemExit("this benchmark measures with CUDA graphs on: drop --disable-cuda-graph")
    levels = [
        (t, c, level_requests(c, args.requests_per_level, args.waves))
        for t in args.temperatures
        for c in args.concurrency
    ]
    if args.dry_run:
        for cfg in configs:
            cmd = launch_command(
                cfg, args.target, args.drafter, 0, max_conc, args.mem_fraction, extra
            )
            print(f"{cfg.label}: {shlex.join(cmd)}")
        print("levels (T, concurrency, requests):", levels)
        return 0
    reason = preflight(configs)
    if reason:
        print(f"bench_e2e: {reason}", file=sys.stderr)
        return 2

    # SIGTERM (e.g. a wall-clock limit) unwinds like Ctrl-C, so every server gets stopped.
    signal.signal(signal.SIGTERM, _interrupt)
    prompts = load_prompts(Path(args.prompts))
    doc = {"meta": run_meta(argv), "servers": [], "rows": []}
    doc["meta"]["args"] = vars(args)
    n_servers = len(configs) * args.repeats
    print(f"bench_e2e: {n_servers} servers x {len(levels)} levels -> {out_dir}", flush=True)
    deadline = None if args.deadline_s is None else time.time() + args.deadline_s

    def on_row(row, repeat):
        row["repeat"] = repeat
        doc["rows"].append(row)
        write_json(doc, out_dir / "bench_e2e.json")

    try:
        for repeat, cfg in server_order(configs, args.repeats):
            name = cfg.label if args.repeats == 1 else f"{cfg.label}_r{repeat}"
            if deadline is not None and time.time() > deadline:
                print(f"[{name}] skipped (past --deadline-s)", flush=True)
                continue
            port = free_port()
            log_path = out_dir / f"server_{name}.log"
            cmd = launch_command(
                cfg, args.target, args.drafter, port, max_conc, args.mem_fraction, extra
            )
            entry = {"config": cfg.label, "repeat": repeat, "launch_command": cmd}
            entry["log"] = str(log_path)
            doc["servers"].append(entry)
            print(f"[{name}] {shlex.join(cmd)}", flush=True)
            steps_dir = out_dir / f"steps_{name}"
            env = {STEP_TIMING_ENV: str(steps_dir)} if args.step_timing else None
            window = None
            if args.step_timing and args.cprofile_levels:
                env[CPROFILE_ENV] = WINDOW
                window = steps_dir / WINDOW_FILE
                steps_dir.mkdir(parents=True, exist_ok=True)
            try:
                with Server(cmd, port, log_path, args.server_timeout, env=env) as srv:
                    entry["startup_s"] = srv.startup_s
                    entry["server_info_start"] = server_info(srv.base)
                    print(f"[{name}] up in {srv.startup_s:.0f} s", flush=True)
                    rows = bench_server(
                        srv.base, cfg, prompts, args.temperatures, args.concurrency,
                        args.max_tokens, args.requests_per_level, args.top_p, args.api,
                        waves=args.waves, deadline=deadline, profile_window=window,
                        on_row=lambda row, k=repeat: on_row(row, k),
                    )  # fmt: skip
                    entry["server_info_end"] = server_info(srv.base)
                    if args.step_timing:
                        attach_step_stats(srv.base, args.api, prompts[0], rows, steps_dir)
            except (RuntimeError, OSError) as e:
                entry["error"] = str(e)
                print(f"[{name}] FAILED: {e}", file=sys.stderr, flush=True)
            entry.update(cuda_graph_evidence(log_path))
            write_json(doc, out_dir / "bench_e2e.json")
    except KeyboardInterrupt:
        print("bench_e2e: interrupted; writing what was measured", file=sys.stderr)
        doc["meta"]["interrupted"] = True
    measured = {_row_key(r) for r in doc["rows"]}
    planned = [
        (c.label, t, n, k) for k, c in server_order(configs, args.repeats) for t, n, _ in levels
    ]
    doc["meta"]["not_measured"] = [x for x in planned if x not in measured]
    paths = write_outputs(doc, out_dir)
    print(render_table(doc["rows"]))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    if doc["meta"]["not_measured"]:
        print(f"NOT MEASURED: {doc['meta']['not_measured']}", file=sys.stderr)
    ok = not doc["meta"]["not_measured"] and not any(s.get("error") for s in doc["servers"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
