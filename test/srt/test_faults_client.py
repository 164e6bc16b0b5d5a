"""The client side of the fault and load checks (`sglang_ddtree.testing.faults`) against a
stand-in HTTP server that speaks SGLang's /generate (plain and streamed): a dropped stream is
counted as dropped, a finished one with its length, a server error as an error."""

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sglang_ddtree.testing import faults


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        sp = req["sampling_params"]
        n = int(sp.get("max_new_tokens", 8))
        held_back = sp.get("min_new_tokens") and len(sp.get("stop_token_ids", [])) >= VOCAB
        if held_back and _Handler.refuses:
            return self._answer(
                400, {"error": {"message": "min_new_tokens 8 holds back every token"}}
            )
        if req.get("token_ids_logprob") and _Handler.breaks_on_token_ids:
            return self._answer(500, {"error": {"message": "Internal server error"}})
        fail = req["input_ids"][:1] == [999]
        if req["input_ids"] == [10, 11, 12] and not req["sampling_params"].get("ignore_eos"):
            n = 1  # a random tiny target whose greedy answer to the liveness prompt is EOS
        if not req.get("stream"):
            body = json.dumps({"output_ids": list(range(n)), "meta_info": {}}).encode()
            self.send_response(500 if fail else 200)
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.end_headers()
        for i in range(1, n + 1):
            meta = {"completion_tokens": i, "finish_reason": {"type": "length"} if i == n else None}
            msg = {"error": "boom"} if fail and i == 2 else {"meta_info": meta}
            try:
                self.wfile.write(f"data: {json.dumps(msg)}\n\n".encode())
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return
        self.wfile.write(b"data: [DONE]\n\n")

    def _answer(self, code: int, body: dict):
        self.send_response(code)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    refuses = True  # DDTREE's refusal of a request that holds back every token
    breaks_on_token_ids = False  # a server that fails token_ids_logprob requests


VOCAB = 128


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # bursts of 32-64 connections, as a real server takes them
    daemon_threads = True


@pytest.fixture(scope="module")
def base():
    srv = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_stream_full_dropped_and_error(base):
    full = faults.stream(base, [1, 2], {"max_new_tokens": 6}, None)
    assert full["status"] == 200 and full["tokens"] == 6 and full["finish"] == {"type": "length"}
    dropped = faults.stream(base, [1, 2], {"max_new_tokens": 50}, 2)
    assert dropped["dropped"] and dropped["chunks"] == 2 and dropped["finish"] is None
    err = faults.stream(base, [999], {"max_new_tokens": 6}, None)
    assert err["error"] == "boom"
    assert faults.alive(base)


def test_load_case_counts_drops_and_flags_errors(base, monkeypatch):
    monkeypatch.setattr(faults, "LOAD_REQUESTS", 40)
    monkeypatch.setattr(faults, "LOAD_CONCURRENCY", 8)
    res = faults.case_load(base, random.Random(1), vocab=100)
    assert res["ok"] and res["requests"] == 40 and 0 < res["dropped"] < 40, res
    monkeypatch.setattr(faults, "prompts", lambda rng, n, lo, hi, v: [[999]] * n)
    bad = faults.case_load(base, random.Random(1), vocab=100)
    assert not bad["ok"] and bad["errors"] > 0


def test_greedy_cases_run_against_a_deterministic_server(base):
    """The stand-in answers every request deterministically, so 'alone' equals 'together'."""
    rng = random.Random(2)
    for case in (faults.case_context_limit, faults.case_chunked_prefill, faults.case_radix):
        res = case(base, rng, vocab=100)
        assert res["ok"], (case.__name__, res)


def test_greedy_differences_are_faults_unless_near_ties():
    """A batch-vs-alone greedy difference passes only as a near-tie of the non-speculative
    server (its top two tokens, within NEAR_TIE_NATS); a third token, a wider margin or a
    different length fails the case, and with no difference the probe is never called."""
    prompt = [7, 8]
    diffs = faults.greedy_differences(
        [prompt] * 5,
        [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3], [4, 5]],
        [[1, 2, 9], [1, 2, 9], [1, 6, 3], [1, 2], [4, 5]],
    )
    assert diffs["ok"] and diffs["greedy_compared"] == 5 and diffs["greedy_mismatches"] == 4
    assert [d["position"] for d in diffs["differences"]] == [2, 2, 1, 2]
    assert diffs["differences"][2]["prefix"] == [7, 8, 1]
    probes = iter([([3, 9], 0.002), ([3, 9], 0.5), ([3, 5], 0.001), ([3, 4], 0.0)])

    def judged(which: list[int]) -> dict:
        res = dict(diffs, differences=[dict(diffs["differences"][i]) for i in which])
        summary = {"c": dict(res, serving_after=True)}
        faults.judge_differences(summary, ["c"], lambda prefix: next(probes))
        return summary["c"]

    tie = judged([0])
    assert tie["passed"] and tie["near_ties"] == 1 and tie["differences"][0]["near_tie"]
    for which in ([1], [2], [3]):  # wider margin; a token outside the top two; a length
        bad = judged(which)
        assert not bad["passed"] and bad["near_ties"] == 0, bad

    def broken(prefix):
        raise RuntimeError("HTTP 500")

    failed = {"c": dict(diffs, differences=[dict(diffs["differences"][0])], serving_after=True)}
    faults.judge_differences(failed, ["c"], broken)
    assert not failed["c"]["passed"] and "HTTP 500" in failed["c"]["differences"][0]["probe_error"]
    clean = {"c": {"ok": True, "serving_after": True, "differences": []}}
    faults.judge_differences(clean, ["c"], None)
    assert clean["c"]["passed"]
    missing = faults.greedy_differences([prompt], [[1]], [None])
    assert not missing["ok"] and missing["greedy_mismatches"] == 0


def test_floor_passes_differences_the_non_speculative_server_has_too():
    """``--floor``: a case whose greedy differences are not near-ties passes when the
    non-speculative server's own alone-versus-batch differences in the same case are as many
    (one-sided Fisher p > FLOOR_EXCESS_P) and fails when they are clearly fewer; a floor that
    compared other requests, or failed, excuses nothing; near-ties pass without it."""
    pytest.importorskip("scipy")
    n = 24
    diff = {"prefix": [1], "position": 0, "tokens": [3, 4]}

    def case(mismatches: int) -> dict:
        return {"ok": True, "serving_after": True, "greedy_compared": n,
                "greedy_mismatches": mismatches,
                "differences": [dict(diff) for _ in range(mismatches)]}  # fmt: skip

    wide = lambda prefix: ([3, 4], 1.0)  # noqa: E731 - a margin far above a near-tie

    def verdict(mismatches: int, floor: dict | None) -> dict:
        summary = {"c": case(mismatches)}
        faults.judge_differences(summary, ["c"], wide, floor)
        return summary["c"]

    def floor_of(mismatches: int, **kw) -> dict:
        return {"c": {"ok": True, "greedy_compared": n, "greedy_mismatches": mismatches, **kw}}

    assert not verdict(21, None)["passed"]  # no floor: the margin fails it
    got = verdict(21, floor_of(24))  # the chain-like floor: more differences than DDTREE's
    assert got["passed"] and got["floor_excess_p"] > faults.FLOOR_EXCESS_P
    got = verdict(21, floor_of(2))  # a floor of 2: 21 is an excess
    assert not got["passed"] and got["floor_excess_p"] < faults.FLOOR_EXCESS_P
    assert not verdict(21, floor_of(24, greedy_compared=n - 1))["passed"]
    assert not verdict(21, floor_of(24, ok=False))["passed"]
    assert verdict(0, floor_of(0))["passed"]
    assert faults.case_rng("radix").random() == faults.case_rng("radix").random()
    assert faults.case_rng("radix").random() != faults.case_rng("context_limit").random()


def test_launch_commands_of_the_checks():
    """The fault check's server: DDTREE (or DFLASH), its small context and KV pool, and at
    tp > 1 the tensor-parallel size with NCCL's all-reduce."""
    from sglang_ddtree.testing import faults

    one = faults.launch_cmd("/t", "/d", 1234)
    flags = dict(zip(one[3::2], one[4::2]))
    assert flags["--speculative-algorithm"] == "DDTREE" and flags["--tp-size"] == "1"
    assert flags["--context-length"] == str(faults.CONTEXT)
    assert "--disable-custom-all-reduce" not in one
    two = faults.launch_cmd("/t", "/d", 1234, algorithm="DFLASH", tp=2)
    assert "--disable-custom-all-reduce" in two
    assert "--enforce-disable-flashinfer-allreduce-fusion" in two
    flags = dict(zip(two[3::2], two[4::2]))
    assert flags["--speculative-algorithm"] == "DFLASH" and flags["--tp-size"] == "2"


def test_backend_flags_of_the_checks():
    """flashmla runs at its page size 64 unless a page size is given; the drafter's backend and
    the dtype pass through; no flags keep the server on triton at page 1. The engines of the
    e2e and law checks take the same settings as fields."""
    from sglang_ddtree.testing import e2e, faults

    assert e2e.backend_settings("flashmla", draft_attention_backend="triton") == {
        "attention_backend": "flashmla",
        "page_size": 64,
        "speculative_draft_attention_backend": "triton",
    }
    assert e2e.backend_settings("flashmla", 128) == {"attention_backend": "flashmla",
                                                      "page_size": 128}  # fmt: skip

    assert faults.backend_flags(None, None, None, None) == []
    mla = faults.backend_flags("flashmla", None, "triton", "bfloat16")
    flags = dict(zip(mla[::2], mla[1::2]))
    assert flags == {
        "--attention-backend": "flashmla",
        "--page-size": "64",
        "--speculative-draft-attention-backend": "triton",
        "--dtype": "bfloat16",
    }
    assert faults.backend_flags("triton", 16, None, None) == [
        "--attention-backend", "triton", "--page-size", "16",
    ]  # fmt: skip
    cmd = faults.launch_cmd("/t", "/d", 1234, backend=mla)
    assert cmd.count("--attention-backend") == 1  # the launcher adds triton only when unnamed
    assert dict(zip(cmd[3::2], cmd[4::2]))["--page-size"] == "64"


def test_every_token_held_back_passes_the_refusal_and_catches_a_server_that_serves(
    base, monkeypatch
):
    res = faults.case_every_token_held_back(base, random.Random(0), VOCAB)
    assert res["ok"] and res["plain_served"] == 12 and res["refusals"][0][0] == 400, res
    monkeypatch.setattr(_Handler, "refuses", False)  # the request served, not refused: caught
    assert not faults.case_every_token_held_back(base, random.Random(0), VOCAB)["ok"]


def test_logprob_mix_passes_served_requests_and_catches_a_failed_one(base, monkeypatch):
    res = faults.case_logprob_mix(base, random.Random(0), VOCAB)
    assert res["ok"] and res["served"] == res["requests"] == 24, res
    monkeypatch.setattr(_Handler, "breaks_on_token_ids", True)
    res = faults.case_logprob_mix(base, random.Random(0), VOCAB)
    assert not res["ok"] and res["served"] == 16 and res["errors"], res
