"""The request fuzzer (`sglang_ddtree.testing.fuzz`) on the CPU: its draws are reproducible and
reach every parameter family at valid, boundary and invalid values (read from the bodies, not
from the draw's own labels); its classifier sorts constructed outcome pairs; and its runner,
against two stand-in HTTP servers, passes a healthy pair and catches a known fault (a 500 on one
parameter, a server that dies mid-run, greedy tokens that drift, KV tokens left in use). On a
CUDA machine with SGLang, a short fuzz runs against the real servers."""

from __future__ import annotations

import json
import math
import pickle
import random
import sys
import threading
import types
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sglang_ddtree.testing import fuzz

VOCAB, CTX = 128, 1024
DOCS = Path(__file__).resolve().parents[2] / "docs" / "requests.md"


@pytest.fixture(scope="module")
def draws():
    return [fuzz.request_at(0, i, VOCAB, CTX) for i in range(5000)]


def params(request: dict) -> dict:
    """A request's parameters under the native names, wherever its endpoint puts them."""
    body = request["body"]
    merged = {**body, **body.get("sampling_params", {})}
    for native, openai in fuzz.OPENAI_NAMES.items():
        if openai in merged:
            merged[native] = merged.pop(openai)
    return merged


def test_draws_are_reproducible_one_by_one(draws):
    """Any index drawn alone, in any order, is the request the whole fuzz drew there (what
    ``--only`` sends); another seed draws other requests."""
    again = [fuzz.request_at(0, i, VOCAB, CTX) for i in (4321, 7, 7)]
    assert json.dumps(again) == json.dumps([draws[4321], draws[7], draws[7]])
    assert json.dumps([fuzz.request_at(1, i, VOCAB, CTX) for i in range(50)]) != json.dumps(
        draws[:50]
    )
    rng = random.Random("x")
    assert fuzz.draw_request(rng, VOCAB, CTX) != fuzz.draw_request(rng, VOCAB, CTX)


def test_every_family_and_tier_is_drawn(draws):
    tiers = Counter((f, t) for r in draws for f, t in r["families"].items())
    families = {f for f, _ in tiers}
    expected = {
        "prompt", "max_tokens", "min_tokens", "temperature", "top_k", "top_p", "min_p",
        "frequency_penalty", "presence_penalty", "repetition_penalty", "stop", "stop_regex",
        "stop_token_ids", "logit_bias", "grammar", "logprobs", "custom_logit_processor", "seed",
        "n", "ignore_eos", "stream_interval", "detokenize", "chat", "completion", "native",
        "abort",
    }  # fmt: skip
    assert expected <= families, expected - families
    with_invalid = expected - {"custom_logit_processor", "seed", "n", "ignore_eos",
                               "stream_interval", "detokenize", "abort"}  # fmt: skip
    for f in with_invalid:
        assert tiers[(f, "invalid")] >= 5, (f, tiers[(f, "invalid")])
        assert tiers[(f, "valid")] >= 20, f
    assert Counter(r["endpoint"] for r in draws).keys() == set(fuzz.ENDPOINTS)
    # Invalid values are a minority: most requests run and load the servers' batches.
    invalid = sum(any(t == "invalid" for t in r["families"].values()) for r in draws)
    assert 0.15 < invalid / len(draws) < 0.5


def test_bodies_reach_the_issue_values(draws):
    """What each family must reach, read from the request bodies themselves."""
    ps = [params(r) for r in draws]

    def some(pred, n=3):
        return sum(1 for p in ps if pred(p)) >= n

    native = [r for r in draws if r["endpoint"] == "/generate"]
    assert any("input_ids" in r["body"] for r in native) and any(
        "text" in r["body"] for r in native
    )
    assert some(lambda p: p.get("temperature") == 0.0) and some(
        lambda p: (p.get("temperature") or 0) > 0
    )
    assert some(lambda p: isinstance(p.get("temperature"), float) and math.isnan(p["temperature"]))
    for name, limits in (("frequency_penalty", (-2.0, 2.0)), ("presence_penalty", (-2.0, 2.0)),
                         ("repetition_penalty", (2.0,)), ("min_p", (0.0, 1.0))):  # fmt: skip
        for limit in limits:
            assert some(lambda p, n=name, x=limit: p.get(n) == x), (name, limit)
    assert some(lambda p: p.get("min_new_tokens") is not None
                and p.get("min_new_tokens") == p.get("max_new_tokens"))  # fmt: skip
    assert some(lambda p: p.get("min_new_tokens") == -1)
    assert some(lambda p: p.get("top_k") == 1 << 30) and some(lambda p: p.get("top_p") == 0.0)
    assert some(lambda p: p.get("n", 1) > 1)
    for value in (0, 1, -1, 2**63):
        assert some(lambda p, v=value: p.get("max_new_tokens") == v), value
    bias_keys = [int(k) for p in ps for k in (p.get("logit_bias") or {}) if k.lstrip("-").isdigit()]
    assert min(bias_keys) < 0 and max(bias_keys) >= 2**63 and VOCAB in bias_keys
    assert some(lambda p: p.get("stop") == "") and some(lambda p: isinstance(p.get("stop"), list))
    for kind, (valid, invalid) in fuzz.GRAMMARS.items():
        assert some(lambda p, k=kind, v=valid: p.get(k) == v), kind
        assert some(lambda p, k=kind, v=invalid: p.get(k) == v, 1), kind
    assert some(lambda p: (p.get("response_format") or {}).get("type") == "json_schema")
    assert some(lambda p: p.get("return_logprob")) and some(
        lambda p: p.get("top_logprobs") is not None
    )
    assert some(lambda p: p.get("custom_logit_processor") == fuzz.PROCESSOR)
    assert some(lambda p: "sampling_seed" in p) and some(lambda p: p.get("ignore_eos") is True)
    assert some(lambda p: "stream_options" in p)
    assert {k for r in draws if r["abort"] for k in r["abort"]} == {"after_chunks", "after_seconds"}
    assert all(r["stream"] for r in draws if r["abort"] and "after_chunks" in r["abort"])
    tools = {str(p.get("tool_choice")) for p in ps if "tools" in p}
    assert {"auto", "required", "none"} <= tools and len(tools) == 5
    lengths = Counter(len(p.get("input_ids", p.get("prompt", p.get("text", "x")))) for p in ps)
    assert lengths[0] and lengths[CTX - 1] and lengths[CTX]  # empty, maximal, past the context
    assert any(p.get("messages") == [] for p in ps)


def test_stop_ids_outside_the_vocabulary_only_where_min_tokens_is_not(draws):
    """Stop ids outside the vocabulary (negative, >= it, >= 2**63, thousands) are drawn only in
    the stop-id edge chunks, and no request there sets min_new_tokens (the reference's own
    penalizer would index its logits by them)."""
    edge = {r["index"] for r in draws if (r["index"] // fuzz.CHUNK) % fuzz.EDGE_EVERY == 3}
    outside, lists = Counter(), []
    for r in draws:
        p, ids = params(r), params(r).get("stop_token_ids") or []
        ints = [i for i in ids if isinstance(i, int)]
        off = [i for i in ints if not 0 <= i < VOCAB]
        if r["index"] in edge:
            assert "min_new_tokens" not in p, r["index"]
            outside.update(("negative" if i < 0 else "huge" if i >= 2**63 else "past") for i in off)
        else:
            assert not off, r["index"]
        lists.append(ints)
    assert outside["negative"] and outside["huge"] and outside["past"]
    assert any(len(x) >= 1000 for x in lists) and any(len(set(x)) < len(x) < 10 for x in lists)
    assert any("min_new_tokens" in params(r) for r in draws if r["index"] not in edge)


def test_refusals_are_those_docs_list():
    refusals = fuzz.own_refusals()
    assert len(refusals) == 2 and "DDTREE" in refusals[0]  # logprobs are served
    refused = DOCS.read_text().split("Refused per request with HTTP 400")[1]
    assert "custom logit processors" in refused
    assert "holds back every token" in refusals[1] and "holds back every token" in refused


def test_processor_names_sglangs_class(monkeypatch):
    """The wire format SGLang's ``CustomLogitProcessor.from_str`` reads: JSON with a hex pickle
    of the class, here resolved against a stand-in module."""
    cls = type("DisallowedTokensLogitsProcessor", (), {})
    for name in ("sglang", "sglang.srt", "sglang.srt.sampling"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = types.ModuleType("sglang.srt.sampling.custom_logit_processor")
    module.DisallowedTokensLogitsProcessor = cls
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert pickle.loads(bytes.fromhex(json.loads(fuzz.PROCESSOR)["callable"])) is cls


def outcome(status=200, code=None, message="", answers=1, dropped=False, error=None):
    return {"status": status, "code": code, "message": message, "chunks": 0, "answers": answers,
            "dropped": dropped, "error": error}  # fmt: skip


PLAIN = {"endpoint": "/v1/completions", "body": {"prompt": "x"}}
LOGPROBS = {"endpoint": "/v1/completions", "body": {"prompt": "x", "logprobs": 0}}
PROCESSOR = {"endpoint": "/generate",
             "body": {"text": "x", "custom_logit_processor": fuzz.PROCESSOR}}  # fmt: skip


@pytest.mark.parametrize(
    "request_, ddtree, nospec, category",
    [
        (PLAIN, outcome(), outcome(), "ok"),
        (PLAIN, outcome(400, message="top_p"), outcome(400, message="top_p"), "ok"),
        (PLAIN, outcome(200, code=400, answers=None), outcome(400), "ok"),  # in-stream 400
        (PROCESSOR, outcome(400, message="x: REFUSAL1 y"), outcome(), "ddtree_own_400"),
        (PROCESSOR, outcome(200, code=400, answers=None), outcome(), "ddtree_own_400"),
        (LOGPROBS, outcome(200, code=400, answers=None), outcome(), "mismatch"),  # served now
        (PLAIN, outcome(200, code=400, answers=None), outcome(), "mismatch"),  # unasked abort
        (PLAIN, outcome(400, message="input too long"), outcome(), "mismatch"),
        (PLAIN, outcome(500), outcome(), "mismatch"),
        (PLAIN, outcome(500), outcome(400), "mismatch"),
        (PLAIN, outcome(200, code=500, answers=None), outcome(), "mismatch"),  # in-stream 500
        (PLAIN, outcome(None, error="ConnectionResetError"), outcome(), "mismatch"),
        (PLAIN, outcome(answers=1), outcome(answers=2), "mismatch"),
        (PLAIN, outcome(), outcome(400), "ddtree_accepts"),
        (PLAIN, outcome(None, dropped=True), outcome(), "aborted"),
        (PLAIN, outcome(answers=None, dropped=True), outcome(answers=2), "ok"),
        (PLAIN, outcome(None, error="timeout"), outcome(None, dropped=True), "mismatch"),
        (PLAIN, outcome(), outcome(503), "nospec_error"),
        (PLAIN, outcome(500), outcome(None, error="refused"), "both_error"),
    ],
)
def test_classify(request_, ddtree, nospec, category):
    assert fuzz.classify(request_, ddtree, nospec, ["REFUSAL1", "REFUSAL2"]) == category


@pytest.mark.parametrize(
    "body, refused",
    [({"logprobs": 0}, False), ({"logprobs": 2}, False), ({"logprobs": True}, False),
     ({"logprobs": False}, False), ({"logprobs": None}, False), ({}, False),
     ({"return_logprob": True}, False), ({"return_logprob": False}, False),
     ({"custom_logit_processor": fuzz.PROCESSOR}, True),
     ({"custom_logit_processor": fuzz.PROCESSOR, "logprobs": 2}, True)],
)  # fmt: skip
def test_asks_refused_follows_ddtrees_check(body, refused):
    """A streamed refusal without its message is judged by DDTREE's check: a custom logit
    processor is refused; logprobs, under each endpoint's name (completions' an int, 0 asking
    too, chat's a bool, the native ``return_logprob``), are served."""
    assert fuzz.asks_refused({"body": body}) is refused


@pytest.mark.parametrize(
    "body, refused",
    [({"min_tokens": 4, "stop_token_ids": list(range(8)) * 3}, True),
     ({"sampling_params": {"min_new_tokens": 4, "stop_token_ids": list(range(8))}}, True),
     ({"min_tokens": 4, "stop_token_ids": list(range(1, 8))}, False),
     ({"min_tokens": 0, "stop_token_ids": list(range(8))}, False),
     ({"stop_token_ids": list(range(8))}, False),
     ({"min_tokens": 4, "stop_token_ids": [-1, 8, 2**63] + list(range(1, 8))}, False),
     ({"min_tokens": 4, "stop_token_ids": ["a"]}, False)],
)  # fmt: skip
def test_asks_refused_judges_every_token_held_back(body, refused):
    """The judge of a streamed refusal knows DDTREE's refusal of a min_new_tokens request whose
    stop ids cover the vocabulary (8 tokens here), under both endpoints' names, and its words
    are among the refusals a message is matched against."""
    assert fuzz.asks_refused({"body": body, "vocab": 8}) is refused
    assert any("holds back every token" in r for r in fuzz.own_refusals())


def test_parse_indices_and_json_lines():
    assert fuzz.parse_indices("12,40-43,,7") == [12, 40, 41, 42, 43, 7]
    summary = {"counts": {"ok": 2}, "mismatches": [{"index": 3, "body": {"x": [1] * 9}}] * 2}
    text = fuzz.json_lines(summary)
    assert json.loads(text) == summary and len(text.splitlines()) == 7


# ------------------------------------------------------------------ stand-in servers
class _Fake(ThreadingHTTPServer):
    """A stand-in for SGLang's HTTP server: the three endpoints (plain and streamed), /health,
    /v1/loads. As DDTREE it refuses custom logit processors with DDTREE's own message (and
    serves logprobs); ``fail_on``: a 500 for requests with that parameter; ``die_after``: the server
    stops at that request; ``greedy_shift``: its tokens drift; ``kv_used``: tokens reported in
    use when idle."""

    daemon_threads = True
    request_queue_size = 512

    def __init__(self, ddtree=False, fail_on=None, die_after=None, greedy_shift=0, kv_used=0):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ddtree, self.fail_on, self.die_after = ddtree, fail_on, die_after
        self.greedy_shift, self.kv_used, self.seen, self.lock = (
            greedy_shift,
            kv_used,
            0,
            threading.Lock(),
        )
        self.refusals = fuzz.own_refusals()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up, as its abort point said

    def do_GET(self):
        load = {
            "num_running_reqs": 0,
            "num_waiting_reqs": 0,
            "num_used_tokens": self.server.kv_used,
        }
        self._send(200, {"loads": [load]} if self.path.startswith("/v1/loads") else {})

    def do_POST(self):
        srv = self.server
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.seen += 1
            if srv.die_after is not None and srv.seen >= srv.die_after:
                threading.Thread(target=srv.stop).start()
                return  # no answer: the connection closes
        p = {**req, **(req.get("sampling_params") or {})}
        native = self.path == "/generate"
        status, error = 200, None
        if srv.fail_on and srv.fail_on in p:
            status, error = 500, "internal error"
        elif srv.ddtree and p.get("custom_logit_processor"):
            status, error = 400, srv.refusals[0]
        elif isinstance(p.get("temperature"), float) and not p["temperature"] >= 0:
            status, error = 400, "temperature must be a non-negative finite number"
        n = p["n"] if p.get("n") in (2, 3) else 1
        if req.get("stream") and status == 400:  # SGLang: 200, then the refusal in the stream
            reason = {"type": "abort", "status_code": 400, "message": error}
            # The OpenAI stream's chunk for a scheduler abort carries no reason.
            chunks = (
                [{"meta_info": {"finish_reason": reason}}]
                if native
                else [{"choices": [{"index": 0, "finish_reason": "abort"}]}]
            )
            return self._stream(chunks)
        if req.get("stream") and status == 200:
            return self._stream([{"text": "x", "meta_info": {}}] * 3)
        if error:
            return self._send(
                status, {"error": {"message": error}} if native else {"message": error}
            )
        if not native:
            return self._send(200, {"choices": [{"index": i, "text": "x"} for i in range(n)]})
        k = p.get("max_new_tokens", 8)
        ids = [(sum(req.get("input_ids") or [1]) + i + srv.greedy_shift) % 100
               for i in range(k if isinstance(k, int) and 0 <= k <= 64 else 3)]  # fmt: skip
        one = {"text": "x", "output_ids": ids, "meta_info": {}}
        if req.get("top_logprobs_num") == 2 and ids:  # the near-tie probe: a wide margin
            one["meta_info"]["output_top_logprobs"] = [
                [[0.0, ids[0], None], [-5.0, ids[0] + 1, None]]
            ]
        self._send(200, [one] * n if n > 1 else one)

    def _stream(self, chunks) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for c in chunks:
                self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def fuzz_on(monkeypatch):
    """``fuzz_on(ddtree, nospec, n)``: the runner's summary over requests 0..n-1 (small chunks,
    no idle wait), the stand-ins stopped afterwards."""
    monkeypatch.setattr(fuzz, "CHUNK", 40)
    monkeypatch.setattr(fuzz, "IDLE_SECONDS", 0)
    monkeypatch.setattr(fuzz, "REQUEST_TIMEOUT", 10)
    servers = []

    def run(ddtree: _Fake, nospec: _Fake, n: int) -> dict:
        servers.extend([ddtree, nospec])
        requests = [fuzz.request_at(0, i, VOCAB, CTX) for i in range(n)]
        return fuzz.run_fuzz({"ddtree": ddtree.base, "nospec": nospec.base}, requests, VOCAB, 8)

    yield run
    for s in servers:
        if s.die_after is None:
            s.stop()


def test_runner_passes_a_healthy_pair(fuzz_on):
    s = fuzz_on(_Fake(ddtree=True), _Fake(), 240)
    assert s["passed"], s["failures"]
    assert s["sent"] == 240 and sum(s["counts"].values()) == 240
    assert s["counts"]["ok"] > 150 and s["counts"]["ddtree_own_400"] > 0
    # Only a request that hangs up after a time limit can read as aborted here (a stand-in slower
    # than 0.05 s on a busy machine): never more of them than such requests.
    timed = sum("after_seconds" in (fuzz.request_at(0, i, VOCAB, CTX).get("abort") or {})
                for i in range(240))  # fmt: skip
    assert s["counts"]["aborted"] <= timed and not s["mismatches"] and not s["deaths"]
    assert sum(sum(c.values()) for c in s["by_endpoint"].values()) == 240
    assert s["greedy"]["passed"] and s["greedy"]["greedy_compared"] == fuzz.GREEDY_PROMPTS


def test_runner_catches_a_500_on_one_parameter(fuzz_on):
    n = 240
    s = fuzz_on(_Fake(ddtree=True, fail_on="min_p"), _Fake(), n)
    with_min_p = {i for i in range(n) if "min_p" in params(fuzz.request_at(0, i, VOCAB, CTX))}
    assert with_min_p and {m["index"] for m in s["mismatches"]} == with_min_p
    assert all(m["ddtree"]["status"] == 500 for m in s["mismatches"])
    assert not s["passed"] and f"{len(with_min_p)} mismatches" in s["failures"]


def test_runner_catches_a_server_that_dies(fuzz_on):
    # The 60th POST is a request of chunk 1 (chunk 0: 40 requests and one liveness probe).
    s = fuzz_on(_Fake(ddtree=True, die_after=60), _Fake(), 240)
    assert [d["server"] for d in s["deaths"]] == ["ddtree"] and s["deaths"][0]["chunk"] == 1
    assert s["sent"] == 80 and not s["passed"]  # the fuzz stops at the death
    assert any("ddtree died" in f for f in s["failures"])
    assert any("ddtree after idling: alive False" in f for f in s["failures"])
    assert s["counts"]["mismatch"] > 0  # the requests it cut off


def test_end_checks_catch_drifting_tokens_and_kv_in_use(fuzz_on):
    s = fuzz_on(_Fake(ddtree=True, greedy_shift=1, kv_used=7), _Fake(), 40)
    assert not s["mismatches"]
    assert s["greedy"]["greedy_mismatches"] == fuzz.GREEDY_PROMPTS and not s["greedy"]["passed"]
    assert not any(d["near_tie"] for d in s["greedy"]["differences"])
    assert any("KV tokens in use 7" in f for f in s["failures"]) and not s["passed"]


@pytest.mark.gpu
def test_fuzz_on_the_servers(tmp_path, run_gpu_check):
    """A short fuzz (two chunks) against DDTREE and the non-speculative server, tiny pair."""
    s = run_gpu_check(str(tmp_path), "sglang_ddtree.testing.fuzz",
                      ["--requests", "300", "--concurrency", "32"], "fuzz_summary.json", 900)  # fmt: skip
    assert s["passed"], json.dumps({k: s[k] for k in ("failures", "counts")})
    assert s["sent"] == 300 and s["counts"]["ok"] > 150


# A server process for `two_servers`: it answers the liveness probe on the port its command
# line names, or exits at once when its command line says DDTREE and FAIL_DDTREE is set.
_SERVER = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
if "DDTREE" in sys.argv and os.environ.get("FAIL_DDTREE"):
    sys.exit(1)
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._send({})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._send({"output_ids": [1] * req["sampling_params"]["max_new_tokens"]})
HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), H).serve_forever()
"""


@pytest.fixture
def stand_in_launch(monkeypatch):
    from sglang_ddtree import serve

    def launch(target, draft, nodes, extra, algorithm="DDTREE"):
        return [sys.executable, "-c", _SERVER, str(algorithm), *extra]

    monkeypatch.setattr(serve, "launch_command", launch)


def test_two_servers_start_together_and_stop(tmp_path, stand_in_launch):
    from sglang_ddtree.testing.faults import alive

    with fuzz.two_servers("target", "draft", str(tmp_path)) as (bases, logs):
        assert set(bases) == set(logs) == set(fuzz.SERVERS)
        assert all(alive(b) for b in bases.values())
    assert not any(alive(b) for b in bases.values())


def test_two_servers_a_failed_start_stops_the_other(tmp_path, stand_in_launch, monkeypatch):
    from sglang_ddtree.testing.faults import alive

    monkeypatch.setenv("FAIL_DDTREE", "1")
    started = {}
    real = fuzz.launched_server

    def recording(cmd, base, log, ready):
        started[base] = cmd
        return real(cmd, base, log, ready=ready)

    monkeypatch.setattr(fuzz, "launched_server", recording)
    with pytest.raises(RuntimeError, match="exited"):
        with fuzz.two_servers("target", "draft", str(tmp_path)):
            pass
    assert len(started) == 2 and not any(alive(b) for b in started)


def test_main_writes_the_summary_and_reads_the_logs(tmp_path, monkeypatch):
    """``main`` over stand-in servers: ``--only`` sends those indices; a leak report in the
    DDTREE server's log fails the fuzz with exit status 1."""
    from contextlib import contextmanager

    monkeypatch.setattr(fuzz, "IDLE_SECONDS", 0)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    monkeypatch.setattr(fuzz, "pair_dirs", lambda pair: (str(tmp_path), "draft"))
    fakes = {"ddtree": _Fake(ddtree=True), "nospec": _Fake()}
    logs = {s: tmp_path / f"{s}.log" for s in fuzz.SERVERS}
    logs["ddtree"].write_text("token_to_kv_pool_allocator memory leak detected! total=1")
    logs["nospec"].write_text("all well")

    @contextmanager
    def servers(target, draft, out_dir):
        yield {s: f.base for s, f in fakes.items()}, {s: str(p) for s, p in logs.items()}

    monkeypatch.setattr(fuzz, "two_servers", servers)
    out = tmp_path / "out"
    try:
        code = fuzz.main(["--out", str(out), "--only", "3,10-12", "--concurrency", "4"])
    finally:
        for f in fakes.values():
            f.stop()
    s = json.loads((out / "fuzz_summary.json").read_text())
    assert code == 1 and s["requests"] == s["sent"] == 4 and s["only"] == "3,10-12"
    assert s["idle"]["ddtree"]["leak"] and not s["idle"]["nospec"]["leak"]
    assert s["failures"] == [
        "ddtree after idling: alive True, KV tokens in use 0, leak reported True"
    ]
