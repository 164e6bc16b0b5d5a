"""Serving throughput measured with SGLang's own client: DDTREE vs the DFLASH chain vs none.

For each repeat (configurations in alternating order: forward on even repeats, reversed on odd
ones) one server per configuration is launched (``serve.launch_command``: triton attention,
CUDA graphs and overlap on), warmed up through every (temperature, concurrency) cell, then
measured with SGLang's client (``sglang.benchmark.serving --backend sglang --dataset-name
random-ids``) per cell: output tokens/s, the client's own ``output_throughput``. The client's
cells run in one Python process per phase (``CLIENT_LOOP`` calls its ``cli_main`` per cell), so
its import is paid twice per server, not once per cell. DDTREE glue graphs a server captured
during the measured phase (its log's "captured key" lines after the warm-up) are recorded per
server: a capture while measuring delays that step.

Results accumulate in ``OUT/bench_serving.json``: a rerun with the same ``--out`` skips the
measured (repeat, configuration) pairs, so one measurement can be split over several invocations.
The file records the measurement's settings and a fingerprint of the plugin's sources; a rerun
with other settings or other code is refused (a median over two versions measures neither).
``OUT/bench_serving.md`` has the median and range per cell and the DDTREE / DFLASH ratio of
the medians.

    python benchmark/ddtree/bench_serving.py --out DIR       # the trained pair, 3 repeats
    python benchmark/ddtree/bench_serving.py --model-path T --speculative-draft-model-path D --out DIR
    python benchmark/ddtree/bench_serving.py --server-args=--disable-prefill-cuda-graph --out DIR

``sglang.benchmark.serving`` imports HF ``datasets`` for its MMMU dataset only; where it is not
installed a stub on the client's ``PYTHONPATH`` lets ``random-ids`` run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = {"none": None, "dflash": "DFLASH", "ddtree": "DDTREE"}
TEMPS = {"T0": (0.0, 1.0), "T1_p0.95": (1.0, 0.95)}


# One process runs many client cells: argv lists in sys.argv[1] (JSON), one cli_main each.
CLIENT_LOOP = """import json, sys
from sglang.benchmark.serving import cli_main
for argv in json.loads(sys.argv[1]):
    sys.argv = ["sglang.benchmark.serving", *argv]
    cli_main()
"""
CAPTURE_LINE = ": captured key "  # ddtree_glue_graph: one such INFO line per capture while serving


def client_argv(base_url: str, model: str, temp: str, concurrency: int, args, out_file: str,
                num: int | None = None) -> list[str]:  # fmt: skip
    """The arguments of one ``sglang.benchmark.serving`` run: ``num`` (default ``max(--prompts-per-level x c,
    32)``) requests of ``--input-len`` random token ids and ``--output-len`` output tokens,
    ``c`` in flight."""
    temperature, top_p = TEMPS[temp]
    num = num or max(args.prompts_per_level * concurrency, 32)
    return [
        "--backend", "sglang",
        "--base-url", base_url, "--model", model, "--tokenizer", model,
        "--dataset-name", "random-ids", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0",
        "--num-prompts", str(num), "--max-concurrency", str(concurrency),
        "--temperature", str(temperature), "--top-p", str(top_p),
        "--seed", "0", "--disable-tqdm", "--output-file", out_file,
    ]  # fmt: skip


def datasets_stub(workdir: str) -> str | None:
    """A directory holding an empty ``datasets`` package, or None where HF datasets exists."""
    try:
        import datasets  # noqa: F401

        return None
    except ImportError:
        path = os.path.join(workdir, "stub")
        os.makedirs(os.path.join(path, "datasets"), exist_ok=True)
        with open(os.path.join(path, "datasets", "__init__.py"), "w") as f:
            f.write("def load_dataset(*args, **kwargs):\n    raise ImportError('stub')\n")
        return path


def run_client_cells(argvs: list[list[str]], env: dict) -> None:
    """Run ``client_argv`` cells in one client process (``CLIENT_LOOP``)."""
    proc = subprocess.run([sys.executable, "-c", CLIENT_LOOP, json.dumps(argvs)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"the benchmark client failed: {proc.stderr[-2000:]}")


def count_captures(log_path: str) -> int:
    """Glue-graph captures a server has logged so far."""
    with open(log_path, errors="replace") as f:
        return sum(CAPTURE_LINE in line and "glue graph" in line for line in f)


def read_throughput(path: str) -> float:
    """``output_throughput`` of the last run the client appended to ``path`` (JSON lines)."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    if not lines:
        raise RuntimeError(f"the benchmark client wrote nothing to {path}")
    return float(json.loads(lines[-1])["output_throughput"])


def code_fingerprint() -> str:
    """sha256 (first 12 hex digits) over the plugin package's Python sources."""
    import hashlib
    from pathlib import Path

    import sglang_ddtree

    root = Path(sglang_ddtree.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def measurement_settings(args, configs: list[str], models: str | None = None) -> dict:
    """What every server and cell of one measurement must share, to be resumed. ``models``
    names the pair where its path is not the point (the shipped pair moves with the checkout)."""
    return {
        "code": code_fingerprint(),
        "models": models or [args.model_path, args.draft_model_path],
        "configs": sorted(configs),
        "concurrency": list(args.concurrency),
        "temps": list(args.temps),
        "prompts_per_level": args.prompts_per_level,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "server_args": args.server_args,
    }


def resume_error(results: dict, settings: dict) -> str | None:
    """Why ``results`` (an earlier ``bench_serving.json``) cannot be resumed with ``settings``."""
    if not results.get("runs"):
        return None
    saved = results.get("settings")
    if saved is None:
        return "it records no settings (an older format); measure into a new --out"
    changed = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
    if changed:
        return f"its {', '.join(changed)} differ from this run's; measure into a new --out"
    return None


def order(configs: list[str], repeat: int) -> list[str]:
    return configs if repeat % 2 == 0 else configs[::-1]


def summarize(results: dict) -> dict:
    """{temp: {c: {config: {median, min, max, n}, "ddtree/dflash": ratio of medians}}} from
    ``results["runs"]`` = [{repeat, config, cells: {temp: {c: tok/s}}}]."""
    table: dict = {}
    for run in results["runs"]:
        for temp, levels in run["cells"].items():
            for c, tps in levels.items():
                table.setdefault(temp, {}).setdefault(c, {}).setdefault(run["config"], []).append(
                    tps
                )
    out: dict = {}
    for temp, levels in table.items():
        for c, by_config in levels.items():
            row = {
                cfg: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
                for cfg, v in by_config.items()
            }
            if "ddtree" in row and "dflash" in row:
                row["ddtree/dflash"] = row["ddtree"]["median"] / row["dflash"]["median"]
            out.setdefault(temp, {})[c] = row
    return out


def markdown(summary: dict, configs: list[str]) -> str:
    lines = []
    for temp, levels in summary.items():
        lines += [f"### {temp}", "", "| c | " + " | ".join(configs) + " | DDTREE / DFLASH |"]
        lines.append("|---:|" + "---:|" * (len(configs) + 1))
        for c in sorted(levels, key=int):
            row = levels[c]
            cells = [
                f"{row[k]['median']:.0f} ({row[k]['min']:.0f}-{row[k]['max']:.0f}, n={row[k]['n']})"
                if k in row
                else "-"
                for k in configs
            ]
            ratio = row.get("ddtree/dflash")
            shown = f"{ratio:.2f}" if ratio is not None else "-"
            lines.append(f"| {c} | " + " | ".join(cells) + f" | {shown} |")
        lines.append("")
    return "\n".join(lines)


def captures_line(runs: list[dict]) -> str:
    """Per configuration, the glue-graph captures each server made while being measured."""
    by_config: dict = {}
    for run in runs:
        by_config.setdefault(run["config"], []).append(run.get("captures_measured"))
    shown = "; ".join(f"{cfg} {counts}" for cfg, counts in by_config.items())
    return f"Glue-graph captures while measuring, per server: {shown}.\n"


def measure(config: str, args, workdir: str, stub: str | None) -> dict:
    """Launch one server, warm it up, and measure every (temperature, concurrency)."""
    from sglang_ddtree.serve import launch_command
    from sglang_ddtree.testing.http import free_port, launched_server

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    top = max(args.concurrency)
    extra = ["--port", str(port), "--host", "127.0.0.1", "--mem-fraction-static", "0.5",
             "--max-running-requests", str(top), "--cuda-graph-max-bs-decode", str(top),
             "--context-length", str(2 * (args.input_len + args.output_len) + 256),
             *shlex.split(args.server_args)]  # fmt: skip
    cmd = launch_command(args.model_path, args.draft_model_path, None, extra, CONFIGS[config])
    env = dict(os.environ)
    if stub:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [stub, env.get("PYTHONPATH")]))
    log = os.path.join(args.out, f"server_{config}_{int(time.time())}.log")
    cells: dict = {}
    t0 = time.monotonic()
    with launched_server(cmd, base, log, timeout=600):
        startup_s = round(time.monotonic() - t0, 1)
        # Warm-up: every (temperature, concurrency) cell once, so each batch size and sampling
        # mode the measurement meets has met the server before.
        warm = os.path.join(workdir, "warmup.jsonl")
        run_client_cells([client_argv(base, args.model_path, temp, c, args, warm, num=2 * c)
                          for temp in args.temps for c in args.concurrency], env)  # fmt: skip
        captured_in_warmup = count_captures(log)
        files = {(temp, c): os.path.join(workdir, f"{config}_{temp}_{c}.jsonl")
                 for temp in args.temps for c in args.concurrency}  # fmt: skip
        for path in files.values():
            if os.path.exists(path):
                os.remove(path)
        run_client_cells([client_argv(base, args.model_path, temp, c, args, path)
                          for (temp, c), path in files.items()], env)  # fmt: skip
        captures = count_captures(log) - captured_in_warmup
    for (temp, c), path in files.items():
        tps = read_throughput(path)
        cells.setdefault(temp, {})[str(c)] = tps
        print(f"[bench_serving] {config} {temp} c={c}: {tps:.1f} tok/s", flush=True)
    print(f"[bench_serving] {config}: {captured_in_warmup} glue-graph captures in the warm-up, "
          f"{captures} while measuring", flush=True)  # fmt: skip
    return {
        "cells": cells,
        "startup_s": startup_s,
        "captures_warmup": captured_in_warmup,
        "captures_measured": captures,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-path", help="target (default: the shipped trained pair)")
    ap.add_argument(
        "--speculative-draft-model-path",
        "--draft-model-path",
        dest="draft_model_path",
        help="its DFlash drafter (SGLang's flag)",
    )
    ap.add_argument("--configs", default="none,dflash,ddtree")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--temps", default=",".join(TEMPS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts-per-level", type=int, default=4, help="requests per level / c")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument(
        "--server-args",
        default="",
        help="more launch_server flags for every server (--server-args='--flag value')",
    )
    ap.add_argument("--deadline-s", type=float, default=540, help="start no server after this")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    args.temps = [t for t in args.temps.split(",") if t]
    bad = [c for c in configs if c not in CONFIGS] + [t for t in args.temps if t not in TEMPS]
    if bad:
        ap.error(f"unknown {bad}; configs: {list(CONFIGS)}, temps: {list(TEMPS)}")
    if bool(args.model_path) != bool(args.draft_model_path):
        ap.error("pass --model-path and --speculative-draft-model-path together (or neither)")
    models = None if args.model_path else "the shipped trained pair"
    if not args.model_path:
        from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR

        args.model_path, args.draft_model_path = str(TARGET_DIR), str(DRAFTER_DIR)
    path = os.path.join(args.out, "bench_serving.json")
    results = {"command": " ".join(sys.argv), "runs": []}
    if os.path.exists(path):
        with open(path) as f:
            results = json.load(f)
    settings = measurement_settings(args, configs, models)
    error = resume_error(results, settings)
    if error:
        print(f"bench_serving.py: cannot resume {path}: {error}.", file=sys.stderr)
        return 2
    results["settings"] = settings
    from sglang_ddtree.serve import serving_unavailable

    missing = serving_unavailable()
    if missing:
        print(f"bench_serving.py launches SGLang servers on a GPU: {missing}.", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    done = {(r["repeat"], r["config"]) for r in results["runs"]}
    workdir = tempfile.mkdtemp(prefix="bench_serving_")
    stub = datasets_stub(workdir)
    t0 = time.monotonic()
    for repeat in range(args.repeats):
        for config in order(configs, repeat):
            if (repeat, config) in done:
                continue
            if time.monotonic() - t0 > args.deadline_s:
                print(f"[bench_serving] deadline: not started {config} repeat {repeat}")
                continue
            measured = measure(config, args, workdir, stub)
            results["runs"].append({"repeat": repeat, "config": config, **measured})
            with open(path, "w") as f:
                json.dump(results, f, indent=1)
    results["summary"] = summarize(results)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    md = markdown(results["summary"], configs) + captures_line(results["runs"])
    with open(os.path.join(args.out, "bench_serving.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
