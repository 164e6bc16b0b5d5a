"""``python -m sglang.launch_server ... --speculative-algorithm DDTREE`` serves
the OpenAI API with temperature, JSON mode (``response_format`` with a JSON schema: the reply
parses and satisfies it) and forced tool calls through Kimi K2's tool-call parser
(``tool_choice`` required and named: SGLang turns them into a grammar, and the reply's
``tool_calls`` name the tool with arguments its schema accepts), reports the accept length, serves min_p, the penalties, min_tokens and logprobs (completions' ``logprobs``, chat's ``top_logprobs``: one entry per output token),
answers HTTP 400 for invalid sampling parameters and custom logit processors (DDTREE's message), and keeps serving afterwards; DDTREE's own flags (``FLAGS``), given on the command
line, reach the worker (its start-up log line), and the verifies take DDTREE's split attention
(its first-verify log line). Only the standard library talks to the server.
"""

from __future__ import annotations

import json
import os

from sglang_ddtree.srt.ddtree_attention.verify_backend import SPLIT_LOG_LINE
from sglang_ddtree.testing.fuzz import PROCESSOR
from sglang_ddtree.testing.grammar_check import SCHEMA, valid_json
from sglang_ddtree.testing.http import free_port, http_json, launched_server

# DDTREE's server flags, off their defaults (the tiny drafter's block is 8), and what the
# worker's start-up line must then say: the schedule, and K = 6 at both widths.
FLAGS = ["--speculative-ddtree-budget-schedule", "1:33,4:17", "--speculative-ddtree-topk", "6"]
FLAGS_IN_LOG = ("budget schedule 1:33,4:17", "K={17: 6, 33: 6}")
# The first user's parser (Kimi K2.x); its tags are spelled in the tiny tokenizer's characters.
TOOL_CALL_PARSER = "kimi_k2"
CITIES = ["paris", "oslo", "lima"]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": CITIES}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def launch_cmd(target: str, draft: str, port: int) -> list[str]:
    from sglang_ddtree.serve import launch_command

    return launch_command(
        target,
        draft,
        None,
        [
            "--mem-fraction-static", "0.25",
            "--max-total-tokens", "16384",  # fixed, so that servers can share a GPU
            "--cuda-graph-max-bs-decode", "8",
            "--max-running-requests", "8",
            "--context-length", "1024",
            "--port", str(port),
            "--host", "127.0.0.1",
            "--enable-metrics",
            # A random model may pad a JSON object with whitespace up to the token limit.
            "--constrained-json-disable-any-whitespace",
            "--tool-call-parser", TOOL_CALL_PARSER,
            "--enable-custom-logit-processor",  # so that DDTREE's own refusal answers
            *FLAGS,
        ],
    )  # fmt: skip


def check_server(target: str, draft: str, summary: dict, log_dir: str | None = None) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(log_dir or os.environ.get("OUT", "."), "server.log")
    res: dict = {"log": log_path}
    with launched_server(launch_cmd(target, draft, port), base, log_path):
        res.update(_exercise(base))
    with open(log_path, errors="replace") as f:
        log = f.read()
    res["ok_flags_reach_the_worker"] = all(s in log for s in FLAGS_IN_LOG)
    # The verifies took DDTREE's split attention (decided when the backend was built), not the
    # backend's own extend kernel.
    res["ok_split_attention"] = SPLIT_LOG_LINE in log
    res["passed"] = all(v is True for k, v in res.items() if k.startswith("ok_"))
    summary["server"] = res


def _chat(base: str, content: str, **params) -> tuple[int, dict, dict]:
    """One user turn on ``/v1/chat/completions``: (status, body, the reply's message; empty
    unless 200)."""
    code, body = http_json(
        base + "/v1/chat/completions",
        {"model": "default", "messages": [{"role": "user", "content": content}], **params},
    )
    message = body.get("choices", [{}])[0].get("message", {}) if code == 200 else {}
    return code, body, message


def _exercise(base: str) -> dict:
    out: dict = {}
    code, body = http_json(
        base + "/v1/completions",
        {"model": "default", "prompt": "hello world", "max_tokens": 32, "temperature": 0.8},
    )
    out["completions_status"] = code
    text = body.get("choices", [{}])[0].get("text") if code == 200 else None
    out["ok_completions"] = code == 200 and isinstance(text, str) and len(text) > 0
    out["completions_sample"] = (text or str(body))[:80]

    code, body, message = _chat(base, "hi there", max_tokens=32, temperature=0.7, top_p=0.9)
    out["chat_status"] = code
    msg = message.get("content")
    out["ok_chat"] = code == 200 and isinstance(msg, str)
    out["chat_sample"] = (msg or str(body))[:80]

    code, body, message = _chat(
        base, "pick one", max_tokens=64, temperature=1.0, top_p=0.95,
        response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}},
    )  # fmt: skip
    msg = message.get("content")
    out["json_mode_sample"] = (msg or str(body))[:120]
    out["ok_json_mode"] = code == 200 and isinstance(msg, str) and valid_json(msg)

    for name, choice in (
        ("required", "required"),
        ("named", {"type": "function", "function": {"name": "get_weather"}}),
    ):
        out[f"tool_call_{name}"], out[f"ok_tool_call_{name}"] = _tool_call(base, choice)

    # Accept length: per request from /generate meta_info, and the server-wide average.
    code, body = http_json(
        base + "/generate",
        {"text": "abc", "sampling_params": {"max_new_tokens": 48, "temperature": 0.0}},
    )
    acc = body.get("meta_info", {}).get("spec_accept_length") if code == 200 else None
    out["generate_accept_length"] = acc
    code, info = http_json(base + "/get_server_info")
    states = info.get("internal_states", [{}]) if code == 200 else [{}]
    out["server_avg_spec_accept_length"] = (states or [{}])[0].get("avg_spec_accept_length")
    out["ok_accept_length"] = isinstance(acc, (int, float)) and acc >= 1.0

    bad = {
        "negative_temperature": {"temperature": -1.0},
        "top_p_zero": {"top_p": 0.0},
        "custom_logit_processor": {
            "custom_logit_processor": PROCESSOR,
            "custom_params": {"token_ids": [5]},
        },  # fmt: skip
    }
    statuses = {}
    for name, params in bad.items():
        code, body = http_json(
            base + "/v1/completions",
            {"model": "default", "prompt": "x", "max_tokens": 8, **params},
        )
        statuses[name] = {"status": code, "message": str(body.get("message", body))[:160]}
    out["bad_requests"] = statuses
    out["ok_bad_requests_400"] = all(v["status"] == 400 for v in statuses.values())
    # DDTREE's own refusals name DDTREE, not the DFLASH checks they run before.
    out["ok_refusals_name_ddtree"] = "DDTREE" in statuses["custom_logit_processor"]["message"]
    # min_p (SGLang's min-p path over the tree), penalties and min_tokens (each node's path
    # counts) are served.
    served = {
        "min_p": {"min_p": 0.1},
        "penalties": {
            "frequency_penalty": 0.5,
            "presence_penalty": 0.3,
            "repetition_penalty": 1.1,
        },  # fmt: skip
        "min_tokens": {"min_tokens": 4},
    }
    codes = {}
    for name, params in served.items():
        codes[name], _ = http_json(
            base + "/v1/completions",
            {"model": "default", "prompt": "x", "max_tokens": 8, "temperature": 1.0, **params},
        )
    out["served_parameters"] = codes
    out["ok_parameters_served"] = all(c == 200 for c in codes.values())
    # A seed is accepted: without deterministic inference SGLang's own sampler ignores it too.
    code, _ = http_json(
        base + "/v1/completions",
        {"model": "default", "prompt": "x", "max_tokens": 8, "temperature": 1.0, "seed": 7},
    )
    out["ok_seed_accepted"] = code == 200
    out["logprobs"], out["ok_logprobs_served"] = _logprobs(base)

    code, body = http_json(
        base + "/v1/completions",
        {"model": "default", "prompt": "still alive?", "max_tokens": 16, "temperature": 1.0},
    )
    out["ok_still_serving"] = code == 200
    return out


def _logprobs(base: str) -> tuple[dict, bool]:
    """Completions with ``logprobs`` 2 and chat with ``top_logprobs`` 2: (statuses and counts,
    whether each reply has a logprob and a top-2 per output token)."""
    code, body = http_json(
        base + "/v1/completions",
        {"model": "default", "prompt": "x", "max_tokens": 8, "temperature": 1.0, "logprobs": 2},
    )
    lp = body.get("choices", [{}])[0].get("logprobs") or {} if code == 200 else {}
    tokens = body.get("usage", {}).get("completion_tokens") if code == 200 else None
    values, tops = lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    completions = {"status": code, "tokens": tokens, "logprobs": len(values), "tops": len(tops)}
    ok = code == 200 and bool(tokens) and len(values) == len(tops) == tokens
    ok = ok and all(isinstance(v, float) and v <= 0 for v in values)
    code, body, _ = _chat(base, "hi", max_tokens=8, temperature=1.0, logprobs=True, top_logprobs=2)
    lp = body.get("choices", [{}])[0].get("logprobs") or {} if code == 200 else {}
    tokens = body.get("usage", {}).get("completion_tokens") if code == 200 else None
    content = lp.get("content") or []
    chat = {"status": code, "tokens": tokens, "logprobs": len(content)}
    ok = ok and code == 200 and bool(tokens) and len(content) == tokens
    ok = ok and all(c.get("logprob", 1) <= 0 and len(c.get("top_logprobs", [])) == 2
                    for c in content)  # fmt: skip
    return {"completions": completions, "chat": chat}, ok


def _tool_call(base: str, tool_choice) -> tuple[str, bool]:
    """A chat request that must call ``get_weather`` (``tool_choice``): (a sample of the reply,
    whether it named the tool with a city its schema allows)."""
    code, body, message = _chat(
        base, "weather?", tools=[TOOL], tool_choice=tool_choice, max_tokens=400,
        temperature=1.0, top_p=0.95,
    )  # fmt: skip
    calls = message.get("tool_calls") or []
    ok = False
    if calls:
        function = calls[0].get("function", {})
        try:
            arguments = json.loads(function.get("arguments") or "")
        except ValueError:
            arguments = None
        ok = function.get("name") == "get_weather" and arguments in [{"city": c} for c in CITIES]
    return (json.dumps(calls) if calls else str(body))[:200], ok


# A target whose generation_config.json sets penalty and min-p defaults: SGLang's default
# ``--sampling-defaults model`` copies them into every request that leaves them unset.
GENERATION_DEFAULTS = {"repetition_penalty": 1.05, "min_p": 0.05}


def with_generation_defaults(target: str, out_dir: str) -> str:
    """A copy of the ``target`` directory (links to its files) whose generation_config.json
    adds `GENERATION_DEFAULTS`."""
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(target):
        if name != "generation_config.json":
            os.symlink(os.path.join(os.path.abspath(target), name), os.path.join(out_dir, name))
    path = os.path.join(target, "generation_config.json")
    config = {}
    if os.path.exists(path):
        with open(path) as f:
            config = json.load(f)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({**config, **GENERATION_DEFAULTS}, f)
    return out_dir


def check_generation_defaults(
    target: str, draft: str, summary: dict, log_dir: str | None = None
) -> None:
    """A DDTREE server over a target whose generation_config sets `GENERATION_DEFAULTS`: plain
    chat and completion requests (no sampling parameter given) are served (the law of those
    settings is the law tool's ``penalties`` part, setting ``rep1.05_minp0.05_T1.0``)."""
    import tempfile

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(log_dir or os.environ.get("OUT", "."), "defaults_server.log")
    model = with_generation_defaults(target, tempfile.mkdtemp(prefix="ddtree_defaults_"))
    res: dict = {"log": log_path, "generation_defaults": GENERATION_DEFAULTS}
    statuses = []
    with launched_server(launch_cmd(model, draft, port), base, log_path):
        for i in range(3):
            code, body, _ = _chat(base, f"hi {i}", max_tokens=24)
            statuses.append({"status": code, "body": str(body)[:160]})
        code, body = http_json(
            base + "/v1/completions", {"model": "default", "prompt": "abc", "max_tokens": 24}
        )
        statuses.append({"status": code, "body": str(body)[:160]})
    res["requests"] = statuses
    res["passed"] = all(s["status"] == 200 for s in statuses)
    summary["defaults"] = res
