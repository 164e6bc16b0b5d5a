"""Launch an OpenAI-compatible SGLang server with DDTREE: ``python -m sglang_ddtree.serve``.

Without ``--model-path`` it serves the shipped trained pair (``sglang_ddtree.pair``: a small Qwen3
code model trained on Python's standard library, and its DFlash drafter) under the model name
``sglang-ddtree-pair``, so the whole path can be tried without any checkpoint; ``--pair tiny``
serves the tiny random-weight pair of `sglang_ddtree.testing.tiny_models` instead (the pair the
end-to-end checks run on). Any other target goes with its drafter, named as in SGLang; every
other argument goes to ``sglang.launch_server`` unchanged, e.g.::

    python -m sglang_ddtree.serve --model-path /models/target \\
        --speculative-draft-model-path /models/dflash-drafter --port 30000

It prints the launch command, a line every 30 s while the server starts (SGLang's own log shows
the stage), and the URL once ``/health`` answers (just after SGLang's "The server is fired up
and ready to roll!"). Ctrl-C or a SIGTERM stops the server.

On a machine without CUDA or without SGLang there is nothing to serve: it says so in one line
and runs the CPU demo (``python -m sglang_ddtree.demo``) instead, unless ``--no-demo`` is given
or a server was asked for (a model, a pair, or launcher arguments), which then fails with exit
code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR

# The name each shipped pair is served under (what /v1/models lists and requests may name).
PAIR_MODEL_NAMES = {"trained": "sglang-ddtree-pair", "tiny": "sglang-ddtree-tiny"}
# SGLang's own defaults for where the server listens.
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 30000
# How often a starting server is polled, and how often the wait is reported.
POLL_S, NOTICE_S = 2.0, 30.0


def serving_unavailable() -> str | None:
    """Why this machine cannot serve, or None."""
    has_sglang = importlib.util.find_spec("sglang") is not None
    import torch

    has_cuda = torch.cuda.is_available()
    if not has_cuda and not has_sglang:
        return "no CUDA GPU is visible and SGLang is not installed"
    if not has_cuda:
        return "no CUDA GPU is visible"
    if not has_sglang:
        return "SGLang is not installed (make install on a CUDA machine installs it)"
    return None


def launch_command(
    target: str,
    draft: str | None,
    num_nodes: int | None,
    extra: list[str],
    algorithm: str | None = "DDTREE",
) -> list[str]:
    """``python -m sglang.launch_server`` for ``target`` with ``algorithm`` (DDTREE, DFLASH, or
    None for no speculation; ``draft`` is its drafter, ``num_nodes`` its
    ``--speculative-num-draft-tokens``), triton attention unless ``extra`` names a backend,
    then ``extra``. The one launch builder of the server launcher, the checks and benchmarks."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", target]
    if algorithm is not None:
        cmd += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", draft]
        if num_nodes is not None:
            cmd += ["--speculative-num-draft-tokens", str(num_nodes)]
    if "--attention-backend" not in extra:
        cmd += ["--attention-backend", "triton"]  # fa3, the Hopper default, ignores tree masks
    return cmd + extra


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in launcher arguments (``--flag v`` or ``--flag=v``; the last one
    wins, as in argparse), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def server_url(extra: list[str]) -> str:
    """Where the launched server answers on this machine (``--host`` / ``--port`` in ``extra``,
    else SGLang's defaults; a wildcard host is reached through the loopback)."""
    host = flag_value(extra, "--host") or DEFAULT_HOST
    if host in ("0.0.0.0", "::", "[::]"):
        host = DEFAULT_HOST
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address in a URL
    return f"http://{host}:{flag_value(extra, '--port') or DEFAULT_PORT}"


# The server is on this machine: no proxy from the environment between.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def answers_health(base: str) -> bool:
    """Whether ``base``/health answers 200 (SGLang answers 503 until its warm-up is done)."""
    try:
        with _LOCAL.open(base + "/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_until_ready(proc: subprocess.Popen, base: str, say) -> bool:
    """Poll ``base``/health until it answers (True) or ``proc`` exits (False), calling ``say``
    with a progress line every ``NOTICE_S`` seconds."""
    start = last_notice = time.monotonic()
    while proc.poll() is None:
        if answers_health(base):
            return True
        now = time.monotonic()
        if now - last_notice >= NOTICE_S:
            say(f"still starting ({now - start:.0f} s; SGLang's log above shows the stage)")
            last_notice = now
        time.sleep(POLL_S)
    return False


def _say(line: str) -> None:
    print(f"sglang_ddtree.serve: {line}", file=sys.stderr, flush=True)


def run_server(cmd: list[str], base: str, model_name: str) -> int:
    """Run the server ``cmd`` in the foreground: progress while it starts, the URL once it
    answers, its exit code in the end (Ctrl-C stops it)."""
    _say(" ".join(cmd))
    _say(
        "starting SGLang: loading the models, capturing CUDA graphs; usually 1-2 minutes for a "
        "small model (the first start on a machine also builds DDTREE's top-p CUDA kernel)"
    )
    proc = subprocess.Popen(cmd)
    # A SIGTERM to this launcher (a service manager, a container's stop) stops the server too.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.terminate())
    try:
        if wait_until_ready(proc, base, _say):
            _say(f'ready: {base}/v1 (OpenAI-compatible, model "{model_name}"); Ctrl-C stops it')
        else:
            _say(f"the server exited with code {proc.returncode} before it answered {base}/health")
        return proc.wait()
    except KeyboardInterrupt:
        # The terminal's Ctrl-C reached SGLang too; give it time to shut down its processes.
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.terminate()
            return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        allow_abbrev=False,  # a prefix of one of SGLang's flags must reach SGLang
    )
    ap.add_argument("--model-path", help="target model (default: the shipped trained pair)")
    ap.add_argument(
        "--speculative-draft-model-path",
        "--draft-model-path",
        dest="draft_model_path",
        help="the DFlash drafter of --model-path (SGLang's flag)",
    )
    ap.add_argument(
        "--pair",
        nargs="?",
        const="trained",
        choices=sorted(PAIR_MODEL_NAMES),
        help="a shipped pair instead of --model-path: trained (the default) or tiny (random "
        "weights, made on the fly)",
    )
    ap.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help="FIXED tree nodes verified per request, root included (budget + 1); default: the "
        "adaptive schedule (--speculative-ddtree-budget-schedule, else DDTREE's default)",
    )
    ap.add_argument("--no-demo", action="store_true", help="fail instead of running the demo")
    args, extra = ap.parse_known_args(argv)
    if args.model_path and not args.draft_model_path:
        ap.error("--model-path needs --speculative-draft-model-path (its DFlash drafter)")
    if args.draft_model_path and not args.model_path:
        ap.error(
            "--speculative-draft-model-path needs --model-path (its target); drop both to "
            "serve the shipped pair"
        )
    if args.model_path and args.pair:
        ap.error("--pair serves a shipped pair; drop it to serve --model-path")

    reason = serving_unavailable()
    if reason is not None:
        asked = list(extra)
        if args.model_path:
            asked.insert(0, f"--model-path {args.model_path}")
        if args.pair:
            asked.append(f"--pair {args.pair}")
        if args.speculative_num_draft_tokens is not None:
            asked.append(f"--speculative-num-draft-tokens {args.speculative_num_draft_tokens}")
        if asked:  # a server was asked for: the demo would silently drop these
            _say(f"cannot launch a server here: {reason}.")
            print(
                f"Not serving {' '.join(asked)}; run this on a CUDA machine with SGLang 0.5.17.",
                file=sys.stderr,
            )
            return 2
        if args.no_demo:
            _say(f"cannot launch a server here: {reason}.")
            return 2
        _say(f"no server on this machine ({reason}); running the CPU demo instead.")
        from sglang_ddtree import demo

        demo.main([])
        return 0

    model_name = None
    if args.model_path:
        target, draft = args.model_path, args.draft_model_path
    elif args.pair == "tiny":
        from sglang_ddtree.testing.tiny_models import make_tiny_pair

        target, draft = make_tiny_pair(tempfile.mkdtemp(prefix="ddtree-tiny-"))
        model_name = PAIR_MODEL_NAMES["tiny"]
    else:
        target, draft = str(TARGET_DIR), str(DRAFTER_DIR)
        model_name = PAIR_MODEL_NAMES["trained"]
    if model_name is not None and flag_value(extra, "--served-model-name") is None:
        extra = [*extra, "--served-model-name", model_name]
    model_name = flag_value(extra, "--served-model-name") or target  # SGLang's default: the path
    cmd = launch_command(target, draft, args.speculative_num_draft_tokens, extra)
    return run_server(cmd, server_url(extra), model_name)


if __name__ == "__main__":
    sys.exit(main())
