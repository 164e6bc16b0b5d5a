"""A request fuzzer: the same requests to DDTREE and to the non-speculative server, side by side.

``python -m sglang_ddtree.testing.fuzz --requests 5000 --seed 0 --out DIR [--pair tiny|trained]
[--concurrency N] [--only 12,40-47]`` starts DDTREE and the non-speculative server (``nospec``,
the reference) of one target at once on one GPU (`server_flags`, custom logit processors
enabled on both; the plugin is installed in both, so the reference carries its SGLang fixes
too), sends every request to both and writes ``DIR/fuzz_summary.json`` after every
chunk (a run cut short keeps what it found): counts by category, endpoint and family tier, and
every mismatch with its index and outcomes (its body too, for the first ``MISMATCH_BODIES``).
No chunk starts after ``--max-seconds`` (360: with the servers' start and the end checks, the
run fits a 10-minute command). Exit status 0 when the fuzz passed. Terms:

- request: an endpoint (``/generate`` with ``input_ids`` or ``text``, ``/v1/completions``,
  ``/v1/chat/completions``), a body, a stream flag and an abort point (the client hangs up after
  some chunks of a stream, or some seconds into a plain request), drawn by `draw_request` from a
  generator of its own (``random.Random(f"fuzz/{seed}/{index}")``): ``--only INDEX`` sends it
  again.
- family: parameters drawn together, each at a valid, boundary or invalid value (its tier).
- outcome class of one server's answer: ``2xx``, ``4xx``, ``5xx`` (an error chunk inside a stream
  counts as its code), ``conn`` (refused, reset, timed out, a stream cut short) or ``dropped``
  (the client hung up before any answer, as the request's abort point says).
- category (`classify`, DDTREE's class against the reference's): ``ok`` (the same class; two
  200s also with as many answers), ``ddtree_own_400`` (DDTREE refused with one of its per-request
  refusals of docs/requests.md where the reference served), ``ddtree_accepts`` (DDTREE served
  what the reference refused), ``aborted`` (a hang-up left a side without an answer),
  ``nospec_error`` / ``both_error`` (the reference failed: SGLang's own fault, listed), and
  ``mismatch``, anything else (a DDTREE 5xx or broken connection where the reference did not
  fail, an unlisted DDTREE 400 where it served, another number of answers): the fuzz fails.
- chunk: ``CHUNK`` consecutive requests, ``--concurrency`` in flight on each server, so that
  penalized, constrained, streamed and plain requests share batches. After each chunk both
  servers drain (nothing running or waiting; SGLang's scheduler then runs its idle KV-leak check,
  which stops the server on a leak) and must answer `faults.alive`; the fuzz stops at a death.
- stop-id edge chunk: every ``EDGE_EVERY``-th one. Only there are stop ids drawn outside the
  vocabulary (negative, >= it, >= 2**63), and there no request sets min_new_tokens: SGLang's
  min-new-tokens penalizer scatters every stop id of its batch into the logits' width, so such an
  id beside a min_new_tokens request stops the reference itself. Not drawn, as they test SGLang
  rather than DDTREE: input ids outside the vocabulary (SGLang 0.5.17 never calls its check),
  ``text: ""`` on ``/generate``, ``n`` < 1, top_k above ``1 << 30``, non-finite logit biases,
  stop ids covering the whole vocabulary (DDTREE refuses them beside min_new_tokens; SGLang's
  sampler can die on such a row).

At the end both servers idle ``IDLE_SECONDS`` and must still serve with no KV token in use
(``/v1/loads``) and no leak report in their logs, and ``GREEDY_PROMPTS`` greedy requests must
give DDTREE the reference's tokens up to near-ties (`near_tie`).
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
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace

from sglang_ddtree.testing.faults import alive, generate, greedy_differences, top2
from sglang_ddtree.testing.http import free_port, http_json, launched_server
from sglang_ddtree.testing.near_tie import judge

CONTEXT = 1024
KV_TOKENS = 16384  # below MAX_RUNNING whole contexts: long requests retract and requeue
CHUNKED_PREFILL = 256  # a maximal prompt prefills in four chunks
MAX_RUNNING = 32
MEM_FRACTION = 0.3  # each of two servers on one GPU
CHUNK = 256
EDGE_EVERY = 4
REQUEST_TIMEOUT = 120
DRAIN_TIMEOUT = 60
IDLE_SECONDS = 10
MISMATCH_BODIES = 500  # a body can hold thousands of ids: the summary stays a few MiB
GREEDY_PROMPTS, GREEDY_TOKENS = 16, 32
SERVERS = ("ddtree", "nospec")
ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
CATEGORIES = ("ok", "ddtree_own_400", "ddtree_accepts", "aborted", "nospec_error",
              "both_error", "mismatch")  # fmt: skip
EXAMPLES = ("ddtree_own_400", "ddtree_accepts", "nospec_error", "both_error")  # 20 of each kept
# Native sampling parameters under their OpenAI names; the native-only ones are not sent there.
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens",
                "sampling_seed": "seed"}  # fmt: skip
NATIVE_ONLY = {"spaces_between_special_tokens", "stream_interval", "structural_tag"}
# SGLang's DisallowedTokensLogitsProcessor in its wire format (a pickle of the class, by
# reference, in hex, in JSON); both servers run with --enable-custom-logit-processor.
PROCESSOR = json.dumps({"callable": (b"csglang.srt.sampling.custom_logit_processor\n"
                                     b"DisallowedTokensLogitsProcessor\n.").hex()})  # fmt: skip
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TAG = {"type": "structural_tag", "triggers": ["<a>"],
       "structures": [{"begin": "<a>", "schema": SCHEMA, "end": "</a>"}]}  # fmt: skip
GRAMMARS = {  # constraint: (a valid value, an invalid one)
    "json_schema": (json.dumps(SCHEMA), '{"type": "object", "properties": 7'),
    "regex": ("(yes|no)[0-9]{1,4}", "([a-"),
    "ebnf": ('root ::= "a" | "b" root', "root ::= ("),
    "structural_tag": (json.dumps(TAG), "{}"),
}
GRAMMAR_FIELDS = {
    "/generate": list(GRAMMARS),
    "/v1/completions": ["json_schema", "regex", "ebnf"],
    "/v1/chat/completions": ["regex", "ebnf"],
}  # chat's JSON: response_format
TOOL = {"type": "function", "function": {"name": "pick", "parameters": SCHEMA}}
COMPLETION_EXTRAS = ([{"echo": True}, {"suffix": "z"}, {"user": "u"}, {"return_token_ids": True}],
                     [{"best_of": 1}], [{"suffix": 5}, {"echo": [1]}])  # fmt: skip
NATIVE_EXTRAS = ([{"log_metrics": False}, {"return_text_in_logprobs": True}, {"priority": 1}],
                 [{"return_prompt_token_ids": True}],
                 [{"return_hidden_states": True}, {"session_id": "no-such-session"},
                  {"lora_path": "none"}])  # fmt: skip


# ------------------------------------------------------------------------------------ draws
class _Draw:
    """One request being drawn: its body in the endpoint's names, each family's tier."""

    def __init__(self, rng: random.Random, vocab: int, context_len: int, endpoint: str):
        self.rng, self.vocab, self.ctx, self.endpoint = rng, vocab, context_len, endpoint
        self.native, self.chat = endpoint == "/generate", endpoint == "/v1/chat/completions"
        self.body: dict = {"sampling_params": {}} if self.native else {"model": "default"}
        self.families: dict[str, str] = {}
        self.prompt_len, self.max_new = 0, None

    def pick(self, family: str, valid=(), boundary=(), invalid=()):
        """A value from a tier drawn 0.7 / 0.22 / 0.08 among the given ones (callables are
        called: values drawn lazily)."""
        tiers = [t for t in (("valid", valid, 0.7), ("boundary", boundary, 0.22),
                             ("invalid", invalid, 0.08)) if t[1]]  # fmt: skip
        tier, values, _ = self.rng.choices(tiers, weights=[w for *_, w in tiers])[0]
        self.families[family] = tier
        value = self.rng.choice(values)
        return value() if callable(value) else value

    def param(self, name: str, value) -> None:
        """A sampling parameter, under the endpoint's name."""
        if self.native:
            self.body["sampling_params"][name] = value
        elif name not in NATIVE_ONLY:
            self.body[OPENAI_NAMES.get(name, name)] = value

    def ids(self, n: int, lo: int = 0, hi: int | None = None) -> list[int]:
        return [self.rng.randrange(lo, hi or self.vocab) for _ in range(n)]

    def text(self, n: int) -> str:
        return "".join(self.rng.choice([chr(c) for c in range(32, 127)] + ["\n", "é", "漢", "🙂"])
                       for _ in range(n))  # fmt: skip


def _prompt(d: _Draw) -> None:
    r, c = d.rng, d.ctx
    p = d.pick("prompt", [lambda: d.ids(r.randint(1, 64)), lambda: d.text(r.randint(1, 200)),
                          lambda: d.ids(r.randint(65, 600))],
               [lambda: d.ids(c - 1), lambda: d.ids(1), "" if d.chat else []],  # maximal, empty
               [lambda: d.ids(c), lambda: d.ids(c + r.randint(1, 64))])  # fmt: skip
    d.prompt_len = len(p)
    if d.native:
        d.body["input_ids" if isinstance(p, list) else "text"] = p
    elif not d.chat:
        d.body["prompt"] = p
    elif isinstance(p, list):  # chat's own token-id prompt (no template)
        d.body.update(messages=[{"role": "user", "content": ""}], input_ids=p)
    else:
        d.body["messages"] = [{"role": "user", "content": p}]


def _max_tokens(d: _Draw) -> None:
    room = max(d.ctx - d.prompt_len, 1)
    if d.prompt_len > d.ctx // 2 and d.rng.random() < 0.7:  # most long prompts fit their room
        d.families["max_tokens"], d.max_new = "boundary", room
    else:
        d.max_new = d.pick("max_tokens", [lambda: d.rng.randint(1, 48)], [0, 1, 2, room],
                           [room + 1, -1, 2**31, 2**63])  # fmt: skip
    d.param("max_new_tokens", d.max_new)


def _min_tokens(d: _Draw) -> None:
    top = d.max_new if isinstance(d.max_new, int) and 0 <= d.max_new < 2**31 else None
    fits = [x for x in (1, 4) if top is None or x <= top] or [0]  # at most max_new_tokens
    edge, bad = ([8], [-1]) if top is None else ([top], [-1, top + 1])
    d.param("min_new_tokens", d.pick("min_tokens", fits, edge, bad))


def _sampling(d: _Draw) -> None:
    v, r = d.vocab, d.rng
    d.param("temperature", d.pick("temperature", [0.0, 0.7, 1.0, 1.3], [1e-7, 2.0, 100.0],
                                  [-0.5, float("nan"), float("inf")]))  # fmt: skip
    for name, share, valid, edge, bad in (
        ("top_k", 0.5, [1, 5, 20, -1], [v, v + 1, 1 << 30], [0, -2]),
        ("top_p", 0.5, [0.9, 0.95, 1.0], [1e-6, 0.5], [0.0, 1.5, -0.1]),
        ("min_p", 0.3, [0.05, 0.1], [0.0, 1.0], [-0.1, 1.1]),
        ("frequency_penalty", 0.2, [-0.5, 0.5], [-2.0, 2.0], [2.5, -2.01]),
        ("presence_penalty", 0.2, [-0.5, 0.5], [-2.0, 2.0], [-2.5, 2.01]),
        ("repetition_penalty", 0.2, [0.9, 1.1], [1e-3, 2.0], [0.0, 2.5, -1.0]),
    ):
        if r.random() < share:
            d.param(name, d.pick(name, valid, edge, bad))


def _stop(d: _Draw, edge: bool) -> None:
    v, r = d.vocab, d.rng
    if r.random() < 0.5:
        d.param("stop", d.pick("stop", ["a", "\n", ["x", "yz"]],
                               ["", lambda: d.text(200), lambda: [d.text(3) for _ in range(64)]],
                               [5, [None]]))  # fmt: skip
    if r.random() < 0.15:
        d.param("stop_regex", d.pick("stop_regex", ["[0-9]", "ab+"], [""], ["("]))
    if r.random() < (0.8 if edge else 0.5):  # outside the vocabulary only in edge chunks
        outside = [[-1], [v], [v + 7, -5], [2**63, 2**64 - 1], lambda: d.ids(3000, -100, 2 * v)]
        # Duplicated, numerous; never the whole vocabulary, whose refusal beside min_new_tokens
        # is DDTREE's alone: SGLang's sampler can die on that row (its CPU test has it).
        inside = [lambda: [r.randrange(v)] * 5, lambda: d.ids(3000, 0, v - 1)]
        d.param("stop_token_ids", d.pick("stop_token_ids", [lambda: d.ids(3)],
                                         outside if edge else inside, [["a"]]))  # fmt: skip


def _logit_bias(d: _Draw) -> None:
    v, tok = d.vocab, str(d.rng.randrange(d.vocab))
    d.param("logit_bias", d.pick("logit_bias", [{tok: 5.0}, {tok: -5.0}],
                                 [{tok: 100.0}, {tok: -100.0}, {str(i): 0.1 for i in range(v)}],
                                 [{str(v): 1.0}, {"-1": 1.0}, {"abc": 1.0}, {str(2**63): 1.0}]))  # fmt: skip


def _grammar(d: _Draw) -> None:
    if d.chat and d.rng.random() < 0.5:  # the OpenAI way of asking for JSON
        d.body["response_format"] = d.pick(
            "grammar", [{"type": "json_object"}, {"type": "text"},
                        {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}],
            invalid=[{"type": "json_schema"}, {"type": "bogus"}])  # fmt: skip
        return
    kind = d.rng.choice(GRAMMAR_FIELDS[d.endpoint])
    how = d.pick("grammar", ["valid"], invalid=["invalid", "two"])
    d.param(kind, GRAMMARS[kind][1 if how == "invalid" else 0])
    if how == "two":  # two constraints at once: SGLang refuses
        other = "ebnf" if kind == "regex" else "regex"
        d.param(other, GRAMMARS[other][0])


def _logprobs(d: _Draw) -> None:
    b, r = d.body, d.rng
    if d.native:
        b.update(return_logprob=True, top_logprobs_num=d.pick("logprobs", [0, 2, 5], [20]))
        b.update(
            {"token_ids_logprob": r.choice([[1, 2], [d.vocab + 1]])} if r.random() < 0.3 else {}
        )
        b.update({"logprob_start_len": r.choice([-1, 0])} if r.random() < 0.3 else {})
    elif d.chat:
        b.update(logprobs=r.random() < 0.8, top_logprobs=d.pick("logprobs", [0, 3], [20], [21, -1]))
    else:
        b.update(logprobs=d.pick("logprobs", [0, 2], [5], [-1]), echo=r.random() < 0.3)


def _processor(d: _Draw) -> None:
    d.families["custom_logit_processor"] = "valid"
    d.body["custom_logit_processor"] = PROCESSOR
    # The same tokens in every request: the processor asserts one list over its batch.
    d.param("custom_params", {"token_ids": [5]})


def _misc(d: _Draw) -> None:
    """Seed, n, ignore_eos, stream interval and detokenization."""
    r = d.rng
    if r.random() < 0.4:
        d.param("sampling_seed", d.pick("seed", [0, 7], [-1, 2**63 - 1]))
    if r.random() < 0.3:
        d.param("n", d.pick("n", [2, 3], [1]))
    if r.random() < 0.5:
        d.param("ignore_eos", d.pick("ignore_eos", [True, False]))
    if r.random() < 0.2:
        d.param("stream_interval", d.pick("stream_interval", [1, 4]))
    if r.random() < 0.3:
        d.families["detokenize"] = "valid"
        for name in ("skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            d.param(name, r.random() < 0.5)


def _extras(d: _Draw) -> None:
    """Fields of one endpoint only: chat's turns, template and tools, completion's echo and
    suffix, the native request's own switches."""
    b = d.body
    if d.native:
        b.update(d.pick("native", *NATIVE_EXTRAS))
    elif not d.chat:
        b.update(d.pick("completion", *COMPLETION_EXTRAS))
    else:
        kind = d.pick("chat", ["system", "turns", "tools_auto", "tools_required", "tools_named",
                               "no_thinking", "max_completion_tokens"],
                      ["continue_final", "tools_none"], ["tool_missing", "no_messages"])  # fmt: skip
        msgs, turn = b["messages"], lambda role, n: {"role": role, "content": d.text(n)}
        if kind == "system":
            msgs.insert(0, turn("system", 20))
        elif kind in ("turns", "continue_final"):
            msgs[:0] = [turn("user", 10), turn("assistant", 10)]
        if kind == "continue_final":
            msgs.append(turn("assistant", 5))
            b["continue_final_message"] = True
        if kind.startswith("tool"):
            named = {
                "type": "function",
                "function": {"name": "pick" if "named" in kind else "nope"},
            }
            choice = {"tools_auto": "auto", "tools_required": "required", "tools_none": "none"}
            b.update(tools=[TOOL], tool_choice=choice.get(kind, named))
        b.update({"no_thinking": {"chat_template_kwargs": {"enable_thinking": False}},
                  "max_completion_tokens": {"max_completion_tokens": d.rng.randint(1, 32)},
                  "no_messages": {"messages": []}}.get(kind, {}))  # fmt: skip


FAMILIES = ((_max_tokens, 0.9), (_sampling, 0.8), (_min_tokens, 0.2), (_logit_bias, 0.12),
            (_grammar, 0.1), (_logprobs, 0.06), (_processor, 0.03), (_misc, 0.6),
            (_extras, 0.25))  # fmt: skip


def draw_request(rng: random.Random, vocab: int, context_len: int, stop_edge: bool = False) -> dict:
    """One request: ``{"endpoint", "body", "stream", "abort", "families"}``; ``abort``: None,
    ``{"after_chunks": k}`` (a stream) or ``{"after_seconds": s}``; ``families``: {family: tier}.
    ``stop_edge``: a request of a stop-id edge chunk."""
    d = _Draw(rng, vocab, context_len, rng.choice(ENDPOINTS))
    _prompt(d)
    for draw, share in FAMILIES:
        if rng.random() < share and not (stop_edge and draw is _min_tokens):
            draw(d)
    if rng.random() < 0.35:
        _stop(d, stop_edge)
    stream, abort = rng.random() < 0.35, None
    if stream:
        d.body["stream"] = True
        if not d.native and rng.random() < 0.5:
            d.body["stream_options"] = {"include_usage": rng.random() < 0.5,
                                        "continuous_usage_stats": rng.random() < 0.5}  # fmt: skip
    if rng.random() < 0.1:
        d.families["abort"] = "valid"
        abort = (
            {"after_chunks": rng.randint(1, 3)}
            if stream
            else {"after_seconds": rng.choice([0.05, 0.5])}
        )
    return {"endpoint": d.endpoint, "body": d.body, "stream": stream, "abort": abort,
            "families": d.families}  # fmt: skip


def request_at(seed: int, index: int, vocab: int, context_len: int) -> dict:
    """Request ``index`` of the fuzz of ``seed`` (the same whatever else is drawn)."""
    edge = (index // CHUNK) % EDGE_EVERY == EDGE_EVERY - 1
    rng = random.Random(f"fuzz/{seed}/{index}")
    return dict(draw_request(rng, vocab, context_len, edge), index=index, vocab=vocab)


# --------------------------------------------------------------------------------- outcomes
def _refusal(custom_logit_processor=None, return_logprob=False, params=None, vocab=None):
    """DDTREE's per-request check on a request asking for these (None: it serves it); ``params``
    the sampling parameters it reads (min_new_tokens, stop_token_ids), judged against a target
    of ``vocab`` tokens whose tokenizer adds no stop id."""
    from sglang_ddtree.srt import ddtree_requests

    params = params or {}
    ids = params.get("stop_token_ids")
    ids = {i for i in ids if isinstance(i, int)} if isinstance(ids, list) else set()
    req = SimpleNamespace(
        custom_logit_processor=custom_logit_processor,
        return_logprob=return_logprob,
        sampling_params=SimpleNamespace(
            min_new_tokens=params.get("min_new_tokens", params.get("min_tokens")) or 0,
            stop_token_ids=ids,
        ),
        tokenizer=SimpleNamespace(additional_stop_token_ids=None, eos_token_id=None),
    )
    active = ddtree_requests._vocab
    ddtree_requests._vocab = vocab
    try:
        return ddtree_requests.refuse_request(req)
    finally:
        ddtree_requests._vocab = active


def own_refusals() -> list[str]:
    """DDTREE's per-request refusals (docs/requests.md), as its request check words them: of a
    custom logit processor and logprobs (served), those it refuses; and the words of its refusal
    of a min_new_tokens request that holds back every token."""
    from sglang_ddtree.srt.ddtree_requests import EVERY_TOKEN_HELD_BACK

    return [m for m in (_refusal(PROCESSOR), _refusal(return_logprob=True)) if m] + [
        EVERY_TOKEN_HELD_BACK
    ]


def asks_refused(request: dict) -> bool:
    """Whether DDTREE's check refuses ``request``: the judge of a refusal whose message SGLang's
    OpenAI stream drops (a bare ``finish_reason: abort`` there)."""
    b, logprobs = request["body"], request["body"].get("logprobs")
    # completions: logprobs an int (0 too); chat: a bool
    asks_logprobs = bool(b.get("return_logprob")) or (
        logprobs is not None and logprobs is not False
    )
    params = b.get("sampling_params", b)
    return _refusal(b.get("custom_logit_processor"), asks_logprobs, params,
                    request.get("vocab")) is not None  # fmt: skip


def _message(body) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    msg = err.get("message") if isinstance(err, dict) else err
    if isinstance(body, dict):
        msg = msg or body.get("message") or body.get("detail")
    return str(msg or body)[:500]


def _stream_error(chunk: dict) -> tuple[int, str] | None:
    """(code, message) of an error carried by a stream chunk, or None."""
    if "error" in chunk:
        err = chunk["error"] if isinstance(chunk["error"], dict) else {}
        return int(err.get("code") or 400), _message(chunk)
    reason = (chunk.get("meta_info") or {}).get("finish_reason") or {}
    if reason.get("type") == "abort" and reason.get("status_code"):
        return int(reason["status_code"]), str(reason.get("message", ""))
    if any(c.get("finish_reason") == "abort" for c in chunk.get("choices") or []):
        return 400, ""  # a server abort whose reason the OpenAI stream does not carry
    return None


def send(base: str, request: dict) -> dict:
    """One request to one server: ``status`` (HTTP), ``code`` (an error chunk's, in a stream),
    ``message``, ``chunks``, ``answers`` (choices of a whole 200), ``dropped`` (the client hung
    up at the request's abort point) and ``error`` (the connection failed)."""
    host, port = base.removeprefix("http://").split(":")
    abort = request.get("abort") or {}
    out = {"status": None, "code": None, "message": "", "chunks": 0, "answers": None,
           "dropped": False, "error": None}  # fmt: skip
    conn = http.client.HTTPConnection(
        host, int(port), timeout=abort.get("after_seconds", REQUEST_TIMEOUT)
    )
    try:
        body = json.dumps(request["body"])
        conn.request("POST", request["endpoint"], body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out["status"] = resp.status
        if request["stream"] and resp.status == 200:
            for line in iter(resp.readline, b""):
                if line.strip() == b"data: [DONE]":
                    return out
                if line.startswith(b"data:"):
                    out["chunks"] += 1
                    err = _stream_error(json.loads(line[5:]))
                    if err and out["code"] is None:
                        out["code"], out["message"] = err
                    if out["chunks"] >= abort.get("after_chunks", float("inf")):
                        out["dropped"] = True
                        return out
            out["error"] = "the stream ended without [DONE]"
            return out
        raw = resp.read()
        answer = json.loads(raw) if raw.strip() else {}
        if resp.status != 200:
            out["message"] = _message(answer)
        elif isinstance(answer, list):  # /generate with n > 1
            out["answers"] = len(answer)
        else:
            out["answers"] = len(answer.get("choices") or [answer])
    except TimeoutError as e:
        out["dropped"] = "after_seconds" in abort
        out["error"] = None if out["dropped"] else f"timeout: {e}"
    except (OSError, http.client.HTTPException, ValueError) as e:
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        conn.close()
    return out


def outcome_class(o: dict) -> str:
    if o["error"]:
        return "conn"
    code = o["code"] or o["status"]
    return "dropped" if code is None else f"{code // 100}xx"


def classify(request: dict, ddtree: dict, nospec: dict, refusals: list[str]) -> str:
    """The category of one request from both servers' outcomes (the module docstring's)."""
    d, n = outcome_class(ddtree), outcome_class(nospec)
    failed = ("5xx", "conn")
    if d in failed:
        return "both_error" if n in failed else "mismatch"
    if n in failed:
        return "nospec_error"
    if "dropped" in (d, n):
        return "aborted"
    if d == n:
        whole = d == "2xx" and not (ddtree["dropped"] or nospec["dropped"])
        return "mismatch" if whole and ddtree["answers"] != nospec["answers"] else "ok"
    if (d, n) == ("4xx", "2xx"):
        msg = ddtree["message"]
        own = any(r in msg for r in refusals) if msg else asks_refused(request)
        return "ddtree_own_400" if own else "mismatch"
    return "ddtree_accepts" if (d, n) == ("2xx", "4xx") else "mismatch"


# ----------------------------------------------------------------------------------- runner
def loads(base: str) -> dict | None:
    """The server's load (``/v1/loads``, core): requests running and waiting, KV tokens used."""
    try:
        code, body = http_json(base + "/v1/loads?include=core", timeout=10)
        return body["loads"][0] if code == 200 else None
    except (OSError, LookupError, TypeError, ValueError):
        return None


def busy(load: dict | None) -> int:
    return (load or {}).get("num_running_reqs", 0) + (load or {}).get("num_waiting_reqs", 0)


def settle(base: str, done, timeout: float) -> dict | None:
    """Read the server's load until ``done(load)`` or ``timeout`` seconds (the scheduler
    publishes it once a step, so a read can lag the last step); the last read (None: no answer)."""
    deadline = time.time() + timeout
    while (load := loads(base)) and not done(load) and time.time() < deadline:
        time.sleep(0.25)
    return load


def _tally(summary: dict, request: dict, category: str, ddtree: dict, nospec: dict) -> None:
    summary["counts"][category] += 1
    per = summary["by_endpoint"].setdefault(request["endpoint"], dict.fromkeys(CATEGORIES, 0))
    per[category] += 1
    for family, tier in request["families"].items():
        tiers = summary["families"].setdefault(family, {})
        tiers[tier] = tiers.get(tier, 0) + 1
    record = {"category": category, **request, "ddtree": ddtree, "nospec": nospec}
    if category == "mismatch":  # every one; past MISMATCH_BODIES its index stands for its body
        if len(summary["mismatches"]) >= MISMATCH_BODIES:
            record.pop("body")
        summary["mismatches"].append(record)
    elif category in EXAMPLES and len(summary["examples"][category]) < 20:
        summary["examples"][category].append(record)


def run_fuzz(
    bases: dict,
    requests: list[dict],
    vocab: int,
    concurrency: int,
    max_seconds: float | None = None,
    logs=None,
    save=None,
) -> dict:
    """Send ``requests`` to both servers (``bases``: {server: URL}) chunk by chunk, stopping
    at a death, then `end_checks`; returns the summary. ``logs``: {server: log path};
    ``save(summary)`` after every chunk."""
    refusals, t0 = own_refusals(), time.time()
    summary: dict = {"requests": len(requests), "sent": 0, "counts": dict.fromkeys(CATEGORIES, 0),
                     "by_endpoint": {}, "families": {}, "mismatches": [], "deaths": [],
                     "stuck": [], "examples": {c: [] for c in EXAMPLES}}  # fmt: skip
    with cf.ThreadPoolExecutor(2 * concurrency) as pool:  # about `concurrency` on each server
        for start in range(0, len(requests), CHUNK):
            if max_seconds and time.time() - t0 > max_seconds:
                break
            chunk = requests[start : start + CHUNK]
            futures = [pool.submit(send, bases[s], r) for r in chunk for s in SERVERS]
            results = [f.result() for f in futures]
            for r, ddtree, nospec in zip(chunk, results[0::2], results[1::2]):
                _tally(summary, r, classify(r, ddtree, nospec, refusals), ddtree, nospec)
            summary["sent"] += len(chunk)
            where = {"chunk": start // CHUNK, "indices": [chunk[0]["index"], chunk[-1]["index"]]}
            for s in SERVERS:
                if busy(load := settle(bases[s], lambda x: not busy(x), DRAIN_TIMEOUT)):
                    summary["stuck"].append({"server": s, **where, "load": load})
                if not alive(bases[s]):
                    summary["deaths"].append({"server": s, **where})
            summary["seconds"] = round(time.time() - t0, 1)
            if save:
                save(summary)
            if summary["deaths"]:
                break
    end_checks(summary, bases, vocab, logs)
    if save:
        save(summary)
    return summary


def end_checks(summary: dict, bases: dict, vocab: int, logs=None) -> None:
    """Idle, then KV use, leak reports and greedy tokens; sets ``failures`` and ``passed``."""
    time.sleep(IDLE_SECONDS)  # SGLang's scheduler checks its pools for leaks when idle
    unused = lambda load: load.get("num_used_tokens") == 0  # noqa: E731
    idle = {s: {"load": settle(b, unused, 5), "alive": alive(b)} for s, b in bases.items()}
    for s, path in (logs or {}).items():
        with open(path, errors="replace") as f:
            text = f.read()
        idle[s].update(leak="leak detected" in text.lower(), tracebacks=text.count("Traceback"))
    summary["idle"] = idle
    summary["greedy"] = greedy_check(bases, vocab) if all(i["alive"] for i in idle.values()) else {}
    fails = [f"{summary['counts']['mismatch']} mismatches"] if summary["counts"]["mismatch"] else []
    if summary["sent"] < summary["requests"]:
        fails.append(f"sent {summary['sent']} of {summary['requests']} requests")
    fails += [f"{d['server']} died in chunk {d['chunk']}" for d in summary["deaths"]]
    fails += [f"{s['server']} still busy after chunk {s['chunk']}" for s in summary["stuck"]]
    for s, i in idle.items():
        used = (i["load"] or {}).get("num_used_tokens")
        if not i["alive"] or used != 0 or i.get("leak"):
            fails.append(f"{s} after idling: alive {i['alive']}, KV tokens in use {used}, "
                         f"leak reported {i.get('leak')}")  # fmt: skip
    if not summary["greedy"].get("passed"):
        fails.append("greedy tokens differ from the reference's beyond near-ties")
    summary["failures"], summary["passed"] = fails, not fails


def greedy_check(bases: dict, vocab: int) -> dict:
    """``GREEDY_PROMPTS`` greedy requests on both servers at once: DDTREE's tokens against the
    reference's, each difference judged by the reference's top two (`near_tie`)."""
    rng = random.Random("fuzz/greedy")
    prompts = [[rng.randrange(5, vocab) for _ in range(rng.randint(8, 40))]
               for _ in range(GREEDY_PROMPTS)]  # fmt: skip
    params = {"temperature": 0.0, "max_new_tokens": GREEDY_TOKENS, "ignore_eos": True}

    def tokens(base, prompt):
        try:
            return generate(base, prompt, params)[1].get("output_ids")
        except (OSError, ValueError):  # no answer, or not JSON: no tokens to compare
            return None

    with cf.ThreadPoolExecutor(2 * GREEDY_PROMPTS) as pool:
        futures = {s: [pool.submit(tokens, bases[s], p) for p in prompts] for s in SERVERS}
        got = {s: [f.result() for f in fs] for s, fs in futures.items()}
    res = greedy_differences(prompts, got["nospec"], got["ddtree"])
    probe = lambda ids: top2(bases["nospec"], ids)  # noqa: E731
    res["differences"] = [judge(d, probe) for d in res["differences"]]
    res["passed"] = res["ok"] and all(d["near_tie"] for d in res["differences"])
    return res


# ------------------------------------------------------------------------------------- main
def server_flags(port: int) -> list[str]:
    return ["--context-length", str(CONTEXT), "--max-total-tokens", str(KV_TOKENS),
            "--chunked-prefill-size", str(CHUNKED_PREFILL), "--max-running-requests",
            str(MAX_RUNNING), "--cuda-graph-max-bs-decode", str(MAX_RUNNING),
            "--mem-fraction-static", str(MEM_FRACTION), "--enable-custom-logit-processor",
            "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip


@contextmanager
def two_servers(target: str, draft: str, out_dir: str):
    """DDTREE and the non-speculative server of ``target``, started at once on one GPU; yields
    ({server: base URL}, {server: log path})."""
    from sglang_ddtree.serve import launch_command

    bases, logs, launches = {}, {}, []
    for s in SERVERS:
        port = free_port()
        bases[s], logs[s] = f"http://127.0.0.1:{port}", os.path.join(out_dir, f"{s}_server.log")
        cmd = launch_command(
            target, draft, None, server_flags(port), "DDTREE" if s == "ddtree" else None
        )
        launches.append(launched_server(cmd, bases[s], logs[s], ready=alive))
    with ExitStack() as stack, cf.ThreadPoolExecutor(len(launches)) as pool:
        for started in [pool.submit(stack.enter_context, c) for c in launches]:
            started.result()  # a failed start raises here, once the other has started or failed
        yield bases, logs


def json_lines(obj: dict) -> str:
    """``obj`` as JSON with a line per key and per record of a list: readable, and small where
    bodies hold thousands of ids (an indented dump gives each id a line)."""

    def value(v) -> str:
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return "[\n  " + ",\n  ".join(json.dumps(x) for x in v) + "\n ]"
        return json.dumps(v)

    return "{\n" + ",\n".join(f" {json.dumps(k)}: {value(v)}" for k, v in obj.items()) + "\n}\n"


def parse_indices(text: str) -> list[int]:
    """``"12,40-47"`` -> [12, 40, 41, ..., 47]."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def pair_dirs(pair: str) -> tuple[str, str]:
    if pair == "trained":
        from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR

        return str(TARGET_DIR), str(DRAFTER_DIR)
    from sglang_ddtree.testing import tiny_models

    target, draft, _ = tiny_models.make_pair("qwen3", tempfile.mkdtemp(prefix="ddtree_fuzz_"))
    return target, draft


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--pair", choices=("tiny", "trained"), default="tiny")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight per server")
    ap.add_argument("--max-seconds", type=float, default=360,
                    help="no new chunk after this long (the end checks still run); 0: no limit")  # fmt: skip
    ap.add_argument("--only", default=None, help="send only these indices, e.g. 12,40-47")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    target, draft = pair_dirs(args.pair)
    with open(os.path.join(target, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    indices = parse_indices(args.only) if args.only else range(args.requests)
    requests = [request_at(args.seed, i, vocab, CONTEXT) for i in indices]
    head = {"pair": args.pair, "seed": args.seed, "concurrency": args.concurrency,
            "only": args.only, "server_flags": server_flags(0)[:-2]}  # fmt: skip

    def save(summary: dict) -> None:
        with open(os.path.join(args.out, "fuzz_summary.json"), "w") as f:
            f.write(json_lines({**head, **summary}))

    with two_servers(target, draft, args.out) as (bases, logs):
        summary = run_fuzz(
            bases, requests, vocab, args.concurrency, args.max_seconds or None, logs, save
        )
    print(f"[fuzz] {json.dumps(summary['counts'])} passed={summary['passed']} "
          f"{summary['failures']}", flush=True)  # fmt: skip
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
