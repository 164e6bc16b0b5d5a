"""Faults and load against a launched DDTREE server (tiny pair, CUDA graphs and overlap on).

``python -m sglang_ddtree.testing.faults --out DIR`` starts ``sglang.launch_server`` with a small
context (``CONTEXT``) and a small KV pool (``KV_TOKENS``), so every fault below is reached in
seconds, then runs each case over HTTP and writes ``DIR/faults_summary.json``:

- ``context_limit``: 16 requests whose prompt plus ``max_new_tokens`` is the context length (or
  with no ``max_new_tokens``, which run to it), greedy and T = 1, at once with 16 short greedy
  witnesses: HTTP 200, lengths within the limit, and every greedy request equal to its output
  sent alone (a reservation past the end of a req_to_token row would corrupt a neighbour).
- ``aborts``: streaming requests dropped by the client after their first chunks.
- ``retraction``: more long requests at once than the KV pool holds (SGLang retracts and
  re-queues some): every one completes with its full length.
- ``chunked_prefill``: a prompt longer than the chunk size arrives while others decode; greedy
  outputs equal those of the same requests sent alone.
- ``radix``: requests sharing a long prefix (radix-cache hits) equal the same requests sent
  alone (greedy).
- ``load``: ``LOAD_REQUESTS`` streaming requests with mixed sampling parameters, ``LOAD_CONCURRENCY``
  at a time, a quarter dropped mid-stream: no error in the rest.
- ``logprob_mix``: ``token_ids_logprob`` beside other logprob requests and plain ones, once a
  scheduler death: every one is served.
- ``every_token_held_back``: min_new_tokens with stop ids covering the vocabulary, beside plain
  requests, once a scheduler death: DDTREE's HTTP 400, the plain ones served.

A greedy request that differs from its lone output is a fault unless the difference is a
near-tie: at the first differing position the two tokens are the non-speculative server's top
two there (``top_logprobs_num=2``; that server starts only when some output differs) and their
logit margin is at most ``NEAR_TIE_NATS``. A batch changes the tree width, so the attention
kernels' blocking, which moves a float16 logit by ~1e-3; a corrupted KV mapping changes the
distribution itself. With ``--floor`` the greedy cases (``GREEDY_CASES``) also run on the
non-speculative server, whose own alone-versus-batch differences are the floor: on a MoE pair
in bfloat16 a router near-tie swaps an expert between batch shapes at logit margins far above
a near-tie, for any server. A case whose differences are not all near-ties then passes when
they are not more than the floor's (one-sided Fisher p > ``FLOOR_EXCESS_P``; `e2e.excess_p`).
Each case draws its prompts from its own seed, so the floor's requests are the case's own.

After every case the server must answer ``/health`` and a fresh request; at the end it idles
(SGLang's scheduler checks for leaked KV slots when idle and stops on a leak) and must still
serve, and its log must hold no traceback and no leak report.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import random
import sys
import tempfile
import time

from sglang_ddtree.testing import tiny_models
from sglang_ddtree.testing.e2e import backend_settings, excess_p, tp_check_cli
from sglang_ddtree.testing.http import free_port, http_json, launched_server
from sglang_ddtree.testing.near_tie import first_difference, judge, top2_of

CONTEXT = 512
KV_TOKENS = 4096
CHUNK = 64
MAX_RUNNING = 32
LOAD_REQUESTS = 512
LOAD_CONCURRENCY = 64
ABORT_FRACTION = 0.25
FLOOR_EXCESS_P = 0.01


def launch_cmd(
    target: str,
    draft: str,
    port: int,
    algorithm: str = "DDTREE",
    tp: int = 1,
    backend: list[str] | None = None,
) -> list[str]:
    """The server of the cases; ``backend``: extra flags (`backend_flags`) that pick the
    attention backend, page size and dtype."""
    from sglang_ddtree.serve import launch_command

    return launch_command(
        target,
        draft,
        None,
        [
            "--context-length", str(CONTEXT),
            "--max-total-tokens", str(KV_TOKENS),
            "--chunked-prefill-size", str(CHUNK),
            "--max-running-requests", str(MAX_RUNNING),
            "--cuda-graph-max-bs-decode", str(MAX_RUNNING),
            "--mem-fraction-static", "0.3",
            "--port", str(port),
            "--host", "127.0.0.1",
            "--tp-size", str(tp),
            *(tp_check_cli() if tp > 1 else []),
            *(backend or []),
        ],
        algorithm=algorithm,
    )  # fmt: skip


def backend_flags(
    attention_backend: str | None,
    page_size: int | None,
    draft_attention_backend: str | None,
    dtype: str | None,
) -> list[str]:
    """`e2e.backend_settings` and the dtype as server flags (none: triton at page 1)."""
    settings = backend_settings(attention_backend, page_size, draft_attention_backend)
    if dtype:
        settings["dtype"] = dtype
    return [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def generate(base: str, ids: list[int], params: dict, timeout: float = 300) -> tuple[int, dict]:
    return http_json(
        base + "/generate", {"input_ids": ids, "sampling_params": params}, timeout=timeout
    )


def top2(base: str, ids: list[int]) -> tuple[list[int], float]:
    """A server's two most likely next tokens after ``ids`` and their logit margin (nats)."""
    code, body = http_json(
        base + "/generate",
        {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
         "return_logprob": True, "top_logprobs_num": 2},
        timeout=120,
    )  # fmt: skip
    if code != 200:
        raise RuntimeError(f"top-2 probe failed: HTTP {code} {str(body)[:200]}")
    return top2_of(body["meta_info"])


def greedy_differences(prompts_: list, alone: list, together: list) -> dict:
    """Greedy outputs sent alone vs in a batch: how many differ, and each first difference
    (judged later by ``judge_differences``). ``ok``: every request answered."""
    diffs = [
        first_difference(p, a, t)
        for p, a, t in zip(prompts_, alone, together)
        if a is not None and t is not None and a != t
    ]
    missing = sum(a is None or t is None for a, t in zip(alone, together))
    return {"greedy_compared": len(alone), "greedy_mismatches": len(diffs),
            "differences": diffs, "ok": missing == 0}  # fmt: skip


def judge_differences(summary: dict, cases: list[str], probe, floor: dict | None = None) -> None:
    """Classify every case's greedy differences with ``probe(prefix) -> (top2 ids, margin)``
    (the non-speculative server) and set each case's ``passed``: ``ok``, serving after it, and
    every difference a near-tie, or, for a case in ``floor`` ({case: the non-speculative
    server's own result of it}), differences not more than that floor's (``floor_excess_p``
    above ``FLOOR_EXCESS_P``)."""
    for name in cases:
        res = summary[name]
        diffs = [judge(d, probe) for d in res.get("differences", [])]
        res["differences"] = diffs
        res["near_ties"] = sum(d["near_tie"] for d in diffs)
        greedy_ok = res["near_ties"] == len(diffs)
        if floor and name in floor and not greedy_ok:
            base = floor[name]
            res["floor_mismatches"] = base.get("greedy_mismatches")
            if base.get("ok") and base.get("greedy_compared") == res.get("greedy_compared"):
                res["floor_excess_p"] = excess_p(
                    len(diffs), base["greedy_mismatches"], res["greedy_compared"]
                )
                greedy_ok = res["floor_excess_p"] > FLOOR_EXCESS_P
        res["passed"] = bool(res["ok"] and res["serving_after"] and greedy_ok)


def stream(base: str, ids: list[int], params: dict, drop_after: int | None) -> dict:
    """One streaming /generate; ``drop_after`` chunks, then the client hangs up (None: read to
    the end). Returns {status, chunks, dropped, tokens, finish, error}."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = json.dumps({"input_ids": ids, "sampling_params": params, "stream": True})
    out = {
        "status": None,
        "chunks": 0,
        "dropped": False,
        "tokens": 0,
        "finish": None,
        "error": None,
    }
    try:
        conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            msg = json.loads(line[5:])
            if "error" in msg:
                out["error"] = str(msg["error"])[:200]
            out["chunks"] += 1
            meta = msg.get("meta_info") or {}
            out["tokens"] = int(meta.get("completion_tokens", out["tokens"]))  # cumulative
            out["finish"] = meta.get("finish_reason") or out["finish"]
            if drop_after is not None and out["chunks"] >= drop_after:
                out["dropped"] = True
                break
    except Exception as e:  # noqa: BLE001 - recorded as this request's error
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


def alive(base: str) -> bool:
    try:
        if http_json(base + "/health", timeout=30)[0] != 200:
            return False
        # ignore_eos: a random tiny target may emit its EOS first, and a short answer is not
        # a server that is down.
        params = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}
        code, body = generate(base, [10, 11, 12], params)
        return code == 200 and len(body.get("output_ids", [])) == 4
    except OSError:
        return False


def prompts(rng: random.Random, n: int, lo: int, hi: int, vocab: int) -> list[list[int]]:
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _pool(fn, items, workers):
    with cf.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


def case_context_limit(base, rng, vocab) -> dict:
    """Requests that run to the context limit, next to short greedy "witness" requests.

    Near the limit SGLang's spec-decode reservation (committed + 2 W slots) can pass the end of
    a request's req_to_token row, and a write past it lands in the neighbouring row, i.e. in
    another request's KV mapping, silently. So besides HTTP 200 and lengths within the limit,
    every greedy request here (witnesses and limit requests) must equal its output when sent
    alone, up to near-ties."""
    greedy = {"temperature": 0.0, "ignore_eos": True}
    witnesses = [(p, dict(greedy, max_new_tokens=96)) for p in prompts(rng, 16, 20, 60, vocab)]
    limit = []
    for i, p in enumerate(prompts(rng, 16, 40, 300, vocab)):
        sp = {"temperature": 0.0 if i % 2 == 0 else 1.0, "ignore_eos": True}
        if i % 4 < 2:
            sp["max_new_tokens"] = CONTEXT - len(p)  # exactly at the limit
        limit.append((p, sp))  # else no max_new_tokens: SGLang runs it to the limit
    lone = [generate(base, p, sp) for p, sp in witnesses + limit if sp["temperature"] == 0.0]
    together = _pool(lambda r: generate(base, *r), witnesses + limit, len(witnesses + limit))
    together_greedy = [
        r for r, (_, sp) in zip(together, witnesses + limit) if sp["temperature"] == 0.0
    ]
    ids = lambda res: [b.get("output_ids") for _, b in res]  # noqa: E731
    greedy_prompts = [p for p, sp in witnesses + limit if sp["temperature"] == 0.0]
    diff = greedy_differences(greedy_prompts, ids(lone), ids(together_greedy))
    errors = [str(b)[:200] for code, b in lone + together if code != 200]
    longest = max(
        len(p) + len(b.get("output_ids", [])) for (p, _), (_, b) in zip(witnesses + limit, together)
    )
    return {"requests": len(together), **diff, "longest_total": longest, "context": CONTEXT,
            "errors": errors, "ok": not errors and diff["ok"] and longest <= CONTEXT}  # fmt: skip


def case_aborts(base, rng, vocab) -> dict:
    items = [
        (p, {"max_new_tokens": 200, "temperature": 1.0 if i % 2 else 0.0}, 1 + i % 3)
        for i, p in enumerate(prompts(rng, 32, 10, 60, vocab))
    ]
    got = _pool(lambda r: stream(base, *r), items, 32)
    bad = [g for g in got if g["status"] != 200 or (g["error"] and not g["dropped"])]
    return {"requests": len(got), "dropped": sum(g["dropped"] for g in got), "bad": bad[:3],
            "ok": not bad}  # fmt: skip


def case_retraction(base, rng, vocab) -> dict:
    items = [(p, {"max_new_tokens": 380, "temperature": 1.0, "ignore_eos": True})
             for p in prompts(rng, MAX_RUNNING, 100, 120, vocab)]  # fmt: skip
    res = _pool(lambda r: generate(base, *r), items, MAX_RUNNING)
    full = [code == 200 and len(b.get("output_ids", [])) == 380 for code, b in res]
    # Needed KV: MAX_RUNNING * ~500 tokens, far above KV_TOKENS: SGLang must retract some.
    return {"requests": len(res), "complete": sum(full), "ok": all(full),
            "kv_needed": MAX_RUNNING * 500, "kv_pool": KV_TOKENS}  # fmt: skip


def _greedy_alone_vs_together(base, reqs) -> dict:
    alone = [generate(base, p, sp)[1].get("output_ids") for p, sp in reqs]
    together = [
        b.get("output_ids") for _, b in _pool(lambda r: generate(base, *r), reqs, len(reqs))
    ]
    return {"requests": len(reqs), **greedy_differences([p for p, _ in reqs], alone, together)}


def case_chunked_prefill(base, rng, vocab) -> dict:
    greedy = {"max_new_tokens": 64, "temperature": 0.0, "ignore_eos": True}
    reqs = [(p, greedy) for p in prompts(rng, 8, 10, 30, vocab)]
    reqs.append((prompts(rng, 1, 6 * CHUNK, 6 * CHUNK, vocab)[0], greedy))  # 6 chunks
    return _greedy_alone_vs_together(base, reqs)


def case_radix(base, rng, vocab) -> dict:
    prefix = prompts(rng, 1, 200, 200, vocab)[0]
    greedy = {"max_new_tokens": 48, "temperature": 0.0, "ignore_eos": True}
    reqs = [(prefix + tail, greedy) for tail in prompts(rng, 16, 1, 8, vocab)]
    return _greedy_alone_vs_together(base, reqs)


def case_load(base, rng, vocab) -> dict:
    items = []
    for p in prompts(rng, LOAD_REQUESTS, 5, 80, vocab):
        sp = {"max_new_tokens": rng.randint(8, 96), "temperature": rng.choice([0.0, 0.7, 1.0, 1.3])}
        if rng.random() < 0.5:
            sp["top_p"] = rng.choice([0.8, 0.95])
        if rng.random() < 0.5:
            sp["top_k"] = rng.choice([5, 20, 50])
        drop = rng.randint(1, 4) if rng.random() < ABORT_FRACTION else None
        items.append((p, sp, drop))
    t0 = time.time()
    got = _pool(lambda r: stream(base, *r), items, LOAD_CONCURRENCY)
    kept = [(g, it) for g, it in zip(got, items) if not g["dropped"]]
    bad = [g for g, _ in kept if g["status"] != 200 or g["error"] or not g["finish"]]
    short = [g for g, it in kept if g["tokens"] != it[1]["max_new_tokens"]
             and (g["finish"] or {}).get("type") == "length"]  # fmt: skip
    return {"requests": len(got), "dropped": len(got) - len(kept), "errors": len(bad),
            "bad": bad[:3], "wrong_length": len(short), "seconds": round(time.time() - t0, 1),
            "ok": not bad and not short}  # fmt: skip


def case_logprob_mix(base, rng, vocab) -> dict:
    """``token_ids_logprob`` requests beside requests asking top logprobs only and plain sampled
    ones (so that they share batches): once a scheduler death (SGLang 0.5.17's placeholder,
    mended by the plugin); every one must be served."""
    plain = {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True}
    bodies = []
    for i, p in enumerate(prompts(rng, 24, 5, 40, vocab)):
        body = {"input_ids": p, "sampling_params": dict(plain)}
        if i % 3 == 0:
            body.update(return_logprob=True, token_ids_logprob=[1, 2])
        elif i % 3 == 1:
            body.update(return_logprob=True, top_logprobs_num=2)
        bodies.append(body)
    got = _pool(lambda b: http_json(base + "/generate", b, timeout=300), bodies, len(bodies))
    codes = [code for code, _ in got]
    errors = [str(b)[:300] for code, b in got if code != 200][:2]
    return {"requests": len(bodies), "served": codes.count(200), "errors": errors,
            "alive": alive(base), "ok": codes.count(200) == len(bodies) and alive(base)}  # fmt: skip


def case_every_token_held_back(base, rng, vocab) -> dict:
    """min_new_tokens requests whose stop ids cover the vocabulary, beside plain sampled ones:
    once a scheduler death (SGLang's sampler asserts on a row with every token banned); each
    must get HTTP 400 with DDTREE's message, the plain ones 200."""
    plain = {"max_new_tokens": 16, "temperature": 1.0, "ignore_eos": True}
    items = [("plain", {"input_ids": p, "sampling_params": dict(plain)})
             for p in prompts(rng, 12, 5, 40, vocab)]  # fmt: skip
    for p in prompts(rng, 4, 5, 40, vocab):
        sp = dict(plain, min_new_tokens=8, stop_token_ids=list(range(vocab)))
        items.append(("held_back", {"input_ids": p, "sampling_params": sp}))
    got = _pool(lambda it: http_json(base + "/generate", it[1], timeout=300), items, len(items))
    plain_codes = [code for (kind, _), (code, _) in zip(items, got) if kind == "plain"]
    refused = [(code, str(b)[:300]) for (kind, _), (code, b) in zip(items, got)
               if kind == "held_back"]  # fmt: skip
    ok_refusals = all(c == 400 and "holds back every token" in m for c, m in refused)
    return {"requests": len(items), "plain_served": plain_codes.count(200),
            "refusals": refused[:2], "alive": alive(base),
            "ok": plain_codes.count(200) == len(plain_codes) and ok_refusals and alive(base)}  # fmt: skip


CASES = {
    "context_limit": case_context_limit,
    "aborts": case_aborts,
    "retraction": case_retraction,
    "chunked_prefill": case_chunked_prefill,
    "radix": case_radix,
    "load": case_load,
    "logprob_mix": case_logprob_mix,
    "every_token_held_back": case_every_token_held_back,
}
GREEDY_CASES = ("context_limit", "chunked_prefill", "radix")  # alone against together


def case_rng(name: str) -> random.Random:
    """A case's own prompt stream: the same requests on every server and in any case order."""
    return random.Random(f"faults/{name}")


def main(argv: list[str] | None = None) -> int:
    global LOAD_CONCURRENCY
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument(
        "--algorithm",
        default="DDTREE",
        help="DDTREE, or DFLASH to hold SGLang's own chain to the same cases",
    )
    ap.add_argument("--arch", choices=tiny_models.TINY_ARCHS, default="qwen3", help="tiny pair")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the server")
    ap.add_argument(
        "--concurrency", type=int, default=LOAD_CONCURRENCY, help="load: requests in flight"
    )
    ap.add_argument(
        "--attention-backend",
        default=None,
        choices=("triton", "flashmla", "flashinfer"),
        help="the server's attention backend (default triton; flashmla: MLA pairs, page 64)",
    )
    ap.add_argument("--page-size", type=int, default=None, help="the server's KV page size")
    ap.add_argument(
        "--draft-attention-backend", default=None, help="the drafter's attention backend"
    )
    ap.add_argument(
        "--dtype", default=None, help="weights and server dtype (default: float32 weights)"
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also run the greedy cases on the non-speculative server: its own alone-versus-"
        "batch differences are the floor a case's differences are held to",
    )
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        ap.error(f"unknown cases {sorted(unknown)}; choose from {', '.join(CASES)}")

    LOAD_CONCURRENCY = args.concurrency
    os.makedirs(args.out, exist_ok=True)
    target, draft, cfg = tiny_models.make_pair(
        args.arch, tempfile.mkdtemp(prefix="ddtree_faults_"), args.dtype or "float32"
    )
    backend = backend_flags(
        args.attention_backend, args.page_size, args.draft_attention_backend, args.dtype
    )
    vocab = cfg.vocab_size
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(args.out, "faults_server.log")

    def write_summary(partial: dict) -> None:
        with open(os.path.join(args.out, "faults_summary.json"), "w") as f:
            json.dump(partial, f, indent=1)

    summary: dict = {
        "algorithm": args.algorithm, "arch": args.arch, "tp": args.tp,
        "concurrency": args.concurrency, "context": CONTEXT, "kv_tokens": KV_TOKENS, "chunk": CHUNK,
        "server_flags": backend,
    }  # fmt: skip
    with launched_server(
        launch_cmd(target, draft, port, args.algorithm, args.tp, backend),
        base,
        log_path,
        ready=alive,
    ):
        for name in cases:
            t0 = time.time()
            try:
                res = CASES[name](base, case_rng(name), vocab)
            except Exception as e:  # noqa: BLE001 - a case that raises has failed
                res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            res["serving_after"] = alive(base)
            res["seconds"] = round(time.time() - t0, 1)
            summary[name] = res
            # Each case's raw result as it ends (its near-tie verdict comes last): a run
            # stopped later keeps what it measured.
            print(f"[faults] {name} (raw): {json.dumps(res)[:600]}", flush=True)
            write_summary(summary)
        time.sleep(10)  # idle: SGLang's scheduler runs its KV-leak check
        summary["serving_after_idle"] = alive(base)
    with open(log_path, errors="replace") as f:
        text = f.read()
    summary["log_traceback"] = "Traceback" in text
    summary["log_leak"] = "leak detected" in text.lower()  # SGLang: "memory leak detected"
    write_summary(summary)

    def verdict(probe, floor=None) -> None:
        judge_differences(summary, cases, probe, floor)
        for name in cases:
            print(f"[faults] {name}: {json.dumps(summary[name])[:600]}", flush=True)
        summary["passed"] = (
            all(summary[c]["passed"] for c in cases)
            and summary["serving_after_idle"]
            and not summary["log_traceback"]
            and not summary["log_leak"]
        )
        write_summary(summary)

    # Greedy differences, if any, are judged by the non-speculative server's top two tokens
    # (and with --floor held to its own differences in the same cases); the verdict is written
    # before that server shuts down (a slow exit keeps it).
    if any(summary[c].get("differences") for c in cases):
        port = free_port()
        ref, ref_log = f"http://127.0.0.1:{port}", os.path.join(args.out, "nospec_server.log")
        ref_cmd = launch_cmd(target, draft, port, None, args.tp, backend)
        with launched_server(ref_cmd, ref, ref_log, ready=alive):
            floor = None
            if args.floor:
                floor = {c: CASES[c](ref, case_rng(c), vocab) for c in cases if c in GREEDY_CASES}
                summary["floor"] = {
                    c: {k: r.get(k) for k in ("greedy_compared", "greedy_mismatches", "ok")}
                    for c, r in floor.items()
                }
            verdict(lambda ids: top2(ref, ids), floor)
    else:
        verdict(None)
    print(f"[faults] passed={summary['passed']}", flush=True)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
