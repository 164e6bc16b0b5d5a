"""Launch an OpenAI-compatible SGLang server with DDTREE: ``python -m sglang_ddtree.serve``.

Without ``--model-path`` it serves the tiny random-weight Qwen3 target + DFlash drafter pair
from `sglang_ddtree.testing.tiny_models` (the pair the H200 end-to-end checks run on), so the
whole path can be tried without any checkpoint. With ``--pair`` it serves the shipped trained
pair instead. Every other argument goes to ``sglang.launch_server`` unchanged, e.g.::

    python -m sglang_ddtree.serve --model-path /models/target \\
        --draft-model-path /models/dflash-drafter --speculative-num-draft-tokens 32 --port 30000

On a machine without CUDA or without SGLang there is nothing to serve: it says so, and runs the
CPU demo (``python -m sglang_ddtree.demo``) instead, unless ``--no-demo`` is given or a server
was asked for (a model, the pair, or launcher arguments), which then fails with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PAIR_DIR = Path(__file__).parent / "pair" / "assets"


def serving_unavailable() -> str | None:
    """Why this machine cannot serve, or None."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (pip install -e '.[serve]')"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", help="target model (default: tiny random-weight pair)")
    ap.add_argument("--draft-model-path", help="DFlash drafter for --model-path")
    ap.add_argument("--pair", action="store_true", help="serve the shipped trained pair")
    ap.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help="FIXED tree nodes verified per request, root included (budget + 1); default: the "
        "adaptive schedule (SGLANG_DDTREE_BUDGET_SCHEDULE, else budget.default_schedule)",
    )
    ap.add_argument("--no-demo", action="store_true", help="fail instead of running the demo")
    args, extra = ap.parse_known_args(argv)

    reason = serving_unavailable()
    if reason is not None:
        print(f"sglang_ddtree.serve: cannot launch a server here: {reason}.", file=sys.stderr)
        asked = list(extra)
        if args.model_path:
            asked.insert(0, f"--model-path {args.model_path}")
        if args.pair:
            asked.append("--pair")
        if args.speculative_num_draft_tokens is not None:
            asked.append(f"--speculative-num-draft-tokens {args.speculative_num_draft_tokens}")
        if asked:  # a server was asked for: the demo would silently drop these
            print(
                f"Not serving {' '.join(asked)}; run this on a CUDA machine with SGLang 0.5.17.",
                file=sys.stderr,
            )
            return 2
        if args.no_demo:
            return 2
        print("Running the CPU demo instead (python -m sglang_ddtree.demo).\n", file=sys.stderr)
        from sglang_ddtree import demo

        demo.main([])
        return 0

    if args.model_path:
        if not args.draft_model_path:
            ap.error("--model-path needs --draft-model-path (a DFlash drafter)")
        target, draft = args.model_path, args.draft_model_path
    elif args.pair:
        target, draft = str(PAIR_DIR / "target"), str(PAIR_DIR / "drafter")
    else:
        from sglang_ddtree.testing.tiny_models import make_tiny_pair

        target, draft = make_tiny_pair(tempfile.mkdtemp(prefix="ddtree-tiny-"))
        print(f"serving the tiny random-weight pair: {target}, {draft}", file=sys.stderr)
    cmd = launch_command(target, draft, args.speculative_num_draft_tokens, extra)
    print(" ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd, env=dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
