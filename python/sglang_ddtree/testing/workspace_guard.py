"""No captured graph binds memory that moves: a launched DDTREE server (the tiny pair, or with
``--pair trained`` the shipped trained pair; CUDA graphs and overlap on) serves a prefill chunk
longer than the KV segment's presized drafter-KV rows and decode steps above the largest
captured batch size, with every workspace DFLASH's fused materializer replaces kept as a
sentinel (`inject.KV_SENTINEL_ENV`).

``python -m sglang_ddtree.testing.workspace_guard --out DIR`` writes ``DIR/workspace_summary.json``
and passes when:

- DFLASH's helper did replace its workspace (else nothing was exercised) and every sentinel is
  intact after every forward: no graph replay wrote into a replaced workspace;
- every greedy output equals the non-speculative server's for the same requests sent the same
  way, or differs at a near-tie (`near_tie`, its bound for the dtype: one bfloat16 step is
  0.0625 nats at the trained pair's logits); the random pair ties at many positions in
  bfloat16, the trained pair's logits rarely do (its prompts: the held-out snippets);
- the server still serves after an idle period (SGLang's KV-leak check) with no traceback.

The phases: a prefill of ``LONG`` tokens in one chunk (``CHUNK``) beside short requests, decode
at batch sizes up to ``GRAPH_BS`` (graph replays), ``EAGER`` requests at once (eager steps above
``GRAPH_BS``), and graph-replayed decode again. ``--known-error`` binds the KV segment to
DFLASH's own workspace (`inject.BIND_DFLASH_WORKSPACE_ENV`), which the sentinels must catch
(the non-speculative server is then not started).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

from sglang_ddtree.testing import inject, tiny_models
from sglang_ddtree.testing.faults import _pool, alive, generate, prompts, top2
from sglang_ddtree.testing.http import free_port, launched_server
from sglang_ddtree.testing.near_tie import first_difference, judge, near_tie_nats

CONTEXT = 4096
CHUNK = 2048
LONG = 2000  # > GRAPH_BS x S, the KV segment's rows: DFLASH's helper grows past them
TRAINED_CONTEXT = 2048  # the trained pair's positions
TRAINED_LONG = 1900
GRAPH_BS = 4
EAGER = 12
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def random_prompts(vocab: int):
    """``draw(rng, n, lo, hi)``: n prompts of lo-hi random ids below ``vocab``."""
    return lambda rng, n, lo, hi: prompts(rng, n, lo, hi, vocab)


def snippet_prompts(snippets: list[list[int]]):
    """``draw(rng, n, lo, hi)``: n prompts of lo-hi ids cut from the concatenated ``snippets``
    at random offsets (a long prompt reads many snippets in a row)."""
    text = [t for ids in snippets for t in ids]

    def draw(rng, n, lo, hi):
        out = []
        for _ in range(n):
            length = rng.randint(lo, hi)
            start = rng.randrange(len(text) - length)
            out.append(text[start : start + length])
        return out

    return draw


def phases(draw, long: int = LONG) -> list[list[tuple[list[int], dict]]]:
    """Groups of (prompt, sampling params), each sent at once, in order; ``draw`` makes the
    prompts (`random_prompts`, `snippet_prompts`)."""
    rng = random.Random("workspace_guard")

    def group(n: int, lo: int, hi: int, tokens: int) -> list:
        return [(p, {**GREEDY, "max_new_tokens": tokens}) for p in draw(rng, n, lo, hi)]

    return [
        group(GRAPH_BS, 10, 40, 24),  # graphs captured and replayed
        group(1, long, long, 48) + group(GRAPH_BS - 1, 10, 40, 48),  # the long prefill chunk
        group(GRAPH_BS, 10, 40, 64),  # replays after it
        group(EAGER, 20, 200, 48),  # eager steps above the captured sizes
        group(GRAPH_BS, 10, 40, 64),  # replays after them
    ]


def launch_cmd(
    target: str,
    draft: str,
    port: int,
    algorithm: str | None,
    dtype: str | None = None,
    context: int = CONTEXT,
) -> list[str]:
    from sglang_ddtree.serve import launch_command

    cmd = launch_command(
        target,
        draft,
        None,
        [
            "--context-length", str(context),
            "--chunked-prefill-size", str(CHUNK),
            "--max-running-requests", str(EAGER + GRAPH_BS),
            "--cuda-graph-max-bs-decode", str(GRAPH_BS),
            "--mem-fraction-static", "0.3",
            "--max-total-tokens", str(2 * (EAGER + GRAPH_BS) * context),  # fixed: a shared GPU
            "--port", str(port),
            "--host", "127.0.0.1",
            *(["--dtype", dtype] if dtype else []),
        ],
        algorithm=algorithm,
    )  # fmt: skip
    # Through the testing launcher: `inject`'s changes are made in every server process.
    cmd[cmd.index("sglang.launch_server")] = "sglang_ddtree.testing.launch_server"
    return cmd


def serve_phases(base: str, groups) -> list[list[int] | None]:
    """Each group's greedy outputs (None: not answered, the server's death included)."""

    def one(req) -> list[int] | None:
        try:
            code, body = generate(base, *req)
        except OSError:
            return None
        return body.get("output_ids") if code == 200 else None

    return [out for reqs in groups for out in _pool(one, reqs, len(reqs))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument(
        "--known-error",
        action="store_true",
        help="bind the KV segment to DFLASH's workspace: the check must fail",
    )
    ap.add_argument("--dtype", default=None, help="both servers' dtype (default: SGLang's auto)")
    ap.add_argument(
        "--pair",
        choices=("tiny", "trained"),
        default="tiny",
        help="the tiny random pair, or the shipped trained pair on its held-out snippets",
    )
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.pair == "trained":
        from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR
        from sglang_ddtree.testing.law import tokenized_prompts

        target, draft, context, long = (
            str(TARGET_DIR),
            str(DRAFTER_DIR),
            TRAINED_CONTEXT,
            TRAINED_LONG,
        )
        groups = phases(snippet_prompts(tokenized_prompts()[:64]), long)
    else:
        target, draft, cfg = tiny_models.make_pair("qwen3", tempfile.mkdtemp(prefix="ddtree_ws_"))
        context, long = CONTEXT, LONG
        groups = phases(random_prompts(cfg.vocab_size), long)
    sentinel_path = os.path.join(args.out, "workspace_sentinels.json")
    env = {inject.KV_SENTINEL_ENV: sentinel_path}
    if args.known_error:
        env[inject.BIND_DFLASH_WORKSPACE_ENV] = "1"
    summary: dict = {"known_error": args.known_error, "dtype": args.dtype, "pair": args.pair,
                     "long_prompt": long, "chunk": CHUNK, "graph_bs": GRAPH_BS,
                     "eager_requests": EAGER}  # fmt: skip

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(args.out, "workspace_server.log")
    os.environ.update(env)  # the launched scheduler processes inherit them
    try:
        with launched_server(
            launch_cmd(target, draft, port, "DDTREE", args.dtype, context), base, log_path, alive
        ):
            ddtree = serve_phases(base, groups)
            time.sleep(10)  # idle: SGLang's scheduler runs its KV-leak check
            summary["serving_after_idle"] = alive(base)
    finally:
        for k in env:
            os.environ.pop(k, None)
    with open(sentinel_path) as f:  # written after the first forward
        summary["sentinels"] = json.load(f)
    with open(log_path, errors="replace") as f:
        text = f.read()
    summary["log_traceback"] = "Traceback" in text
    summary["log_leak"] = "leak detected" in text.lower()

    diffs = []
    if not args.known_error:  # the known error is judged by its sentinels alone
        port = free_port()
        ref = f"http://127.0.0.1:{port}"
        ref_log = os.path.join(args.out, "nospec_server.log")
        with launched_server(
            launch_cmd(target, draft, port, None, args.dtype, context), ref, ref_log, alive
        ):
            nospec = serve_phases(ref, groups)
            reqs = [r for g in groups for r in g]
            nats = near_tie_nats(args.dtype)
            diffs = [
                judge(first_difference(p, a, b), lambda ids: top2(ref, ids), nats)
                for (p, _), a, b in zip(reqs, nospec, ddtree)
                if a is not None and b is not None and a != b
            ]
    sentinels = summary["sentinels"]
    summary.update(
        requests=len(ddtree),
        answered=sum(o is not None for o in ddtree),
        greedy_differences=len(diffs),
        near_ties=sum(d["near_tie"] for d in diffs),
        near_tie_nats=near_tie_nats(args.dtype),
        differences=diffs[:8],
    )
    summary["passed"] = bool(
        sentinels["replaced"] > 0
        and sentinels["intact"]
        and summary["answered"] == len(ddtree)
        and summary["near_ties"] == len(diffs)
        and summary["serving_after_idle"]
        and not summary["log_traceback"]
        and not summary["log_leak"]
    )
    with open(os.path.join(args.out, "workspace_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"[workspace_guard] {json.dumps(summary)[:1500]}", flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
