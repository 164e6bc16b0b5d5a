"""Tensor-parallel ranks that disagree are stopped, not served: a calibration of the rank check.

``python -m sglang_ddtree.testing.tp_check --out DIR [--tp 2] [--arch mla]`` launches a DDTREE
server at ``--tp`` whose ranks draw deliberately different verify coins (injected by
`sglang_ddtree.testing.inject` through `testing.launch_server`), sends sampled requests, and
writes ``DIR/tp_check_summary.json``. Every rank builds the same tree (gathered draft candidates), so
the first sampled step whose accepted paths differ must trip the worker's per-step rank check:
the server must stop with the device assert rather than return completions. (That ranks agree
when their coins agree is what the tensor-parallel end-to-end checks show: ``e2e --tp 2``.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from sglang_ddtree.testing import inject, tiny_models
from sglang_ddtree.testing.e2e import tp_check_cli
from sglang_ddtree.testing.http import free_port, http_json, launched_server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--arch", choices=tiny_models.TINY_ARCHS, default="mla")
    ap.add_argument(
        "--mem-fraction-static",
        default="0.3",
        help="the server's share of GPU memory (higher when another engine already holds some)",
    )
    args = ap.parse_args(argv)
    from sglang_ddtree.serve import launch_command

    os.makedirs(args.out, exist_ok=True)
    models = tempfile.mkdtemp(prefix="ddtree_tp_")
    target, draft, _ = tiny_models.make_pair(args.arch, models)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    extra = [
        "--tp-size",
        str(args.tp),
        "--mem-fraction-static",
        args.mem_fraction_static,
        "--port",
        str(port),
    ]
    extra += tp_check_cli()
    extra += ["--host", "127.0.0.1", "--context-length", "1024", "--cuda-graph-max-bs-decode", "8"]
    log_path = os.path.join(args.out, "tp_check_server.log")
    cmd = launch_command(target, draft, None, extra)
    cmd[cmd.index("sglang.launch_server")] = "sglang_ddtree.testing.launch_server"
    os.environ[inject.RANK_SKEW_ENV] = "1"
    summary: dict = {"tp": args.tp, "arch": args.arch}
    answers = []
    try:
        with launched_server(cmd, base, log_path):
            params = {"temperature": 1.0, "max_new_tokens": 64, "ignore_eos": True}
            for i in range(8):
                try:
                    code, body = http_json(
                        base + "/generate",
                        {"input_ids": [10 + i, 11, 12, 13], "sampling_params": params},
                        timeout=60,
                    )
                    answers.append({"status": code, "tokens": len(body.get("output_ids", []))})
                except OSError as e:
                    answers.append({"error": f"{type(e).__name__}: {e}"})
                if answers[-1].get("tokens") != 64:
                    break  # the ranks stopped: later requests would only wait out their timeouts
    except RuntimeError as e:
        summary["launch_error"] = str(e)
    finally:
        os.environ.pop(inject.RANK_SKEW_ENV, None)
    with open(log_path, errors="replace") as f:
        log = f.read()
    full = [a for a in answers if a.get("status") == 200 and a.get("tokens") == 64]
    summary["answers"] = answers
    summary["full_completions"] = len(full)
    summary["device_assert_in_log"] = "device-side assert" in log or "_assert_async" in log
    summary["skew_warning_in_log"] = "DIFFERENT verify coins" in log
    # Passed: the skew was on, the server started, and it stopped on the assert instead of
    # completing every sampled request.
    summary["passed"] = (
        "launch_error" not in summary
        and summary["skew_warning_in_log"]
        and summary["device_assert_in_log"]
        and len(full) < len(answers)
    )
    with open(os.path.join(args.out, "tp_check_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"[tp_check] {json.dumps(summary)}", flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
