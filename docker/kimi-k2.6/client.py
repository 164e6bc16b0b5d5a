"""Chat with a DDTREE server through its OpenAI-compatible API (``/v1/chat/completions``).

    python3 docker/kimi-k2.6/client.py "Why is the sky blue?" --temperature 0.7 --top-p 0.9 \\
        --max-tokens 256 --stream [--base-url http://localhost:30000/v1]

Standard library only (no ``openai`` package needed). The model name comes from ``/v1/models``
unless ``--model`` names one. The reasoning (``reasoning_content``, which the Kimi K2.6 server
splits out with ``--reasoning-parser kimi_k2``) and the answer (``content``) print as separate
sections, token by token as they arrive with ``--stream``; then one line on stderr gives the
finish reason and the token counts the server reported. Exits 2 when the server cannot be
reached, 3 when it answers with an error (its message printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

# Kimi K2.6's recommended sampling (its model card); any other values may be passed.
DEFAULT_TEMPERATURE, DEFAULT_TOP_P = 1.0, 0.95
DEFAULT_PROMPT = "In three sentences: why is the sky blue?"
# Seconds one read of the completion may wait: a large model's prefill of a long prompt, or a
# whole answer without --stream, takes far longer than the model lookup.
COMPLETION_READ_S = 600.0
SECTION_HEADERS = {"reasoning_content": "reasoning", "content": "answer"}


def fail(code: int, message: str) -> None:
    print(f"client.py: {message}", file=sys.stderr)
    sys.exit(code)


def _unreachable(url: str, error: BaseException) -> None:
    reason = getattr(error, "reason", error)
    fail(2, f"server unreachable at {url} ({reason}); is it up? (docker/kimi-k2.6/README.md)")


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body (``{"message": ...}`` or ``{"error":
    {"message": ...}}``), else the body itself."""
    text = body.decode(errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if data.get("message"):
            return str(data["message"])
    return text[:500]


def served_model(base_url: str, timeout: float) -> str:
    """The first model id from ``GET {base_url}/models``."""
    url = base_url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            models = json.load(resp)["data"]
    except urllib.error.HTTPError as e:
        fail(2, f"{url} answered HTTP {e.code}: {_error_message(e.read())}")
    except (urllib.error.URLError, OSError) as e:
        _unreachable(url, e)
    except (ValueError, KeyError, TypeError) as e:
        fail(2, f"unexpected answer from {url}: {type(e).__name__}: {e}")
    if not models:
        fail(2, f"{url} lists no model")
    return models[0]["id"]


class Printer:
    """Prints the reply's sections as text arrives, a header where a section starts."""

    def __init__(self) -> None:
        self.section: str | None = None

    def add(self, message: dict) -> None:
        for name, header in SECTION_HEADERS.items():
            text = message.get(name)
            if text:
                if self.section != name:
                    print(f"\n=== {header} ===", flush=True)
                    self.section = name
                print(text, end="", flush=True)

    def done(self, finish_reason: str | None, usage: dict | None) -> None:
        print(flush=True)
        tokens = "not reported"
        if usage:
            tokens = (
                f"prompt {usage.get('prompt_tokens')}, completion {usage.get('completion_tokens')}"
            )
        print(f"[finish_reason: {finish_reason}; tokens: {tokens}]", file=sys.stderr, flush=True)


def post(url: str, payload: dict, timeout: float):
    """POST ``payload`` as JSON; the open response, or an exit with the server's message."""
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        fail(3, f"server answered HTTP {e.code}: {_error_message(e.read())}")
    except (urllib.error.URLError, OSError) as e:
        _unreachable(url, e)


def stream_reply(resp, printer: Printer) -> None:
    """Read a streamed completion (server-sent events, ``data: {chunk}`` lines ending with
    ``data: [DONE]``), printing each delta as it comes."""
    finish_reason, usage = None, None
    for raw in resp:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("object") == "error" or "error" in chunk:
            fail(3, f"server error while streaming: {_error_message(data.encode())}")
        for choice in chunk.get("choices") or []:
            printer.add(choice.get("delta") or {})
            finish_reason = choice.get("finish_reason") or finish_reason
        usage = chunk.get("usage") or usage
    printer.done(finish_reason, usage)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prompt", nargs="?", help=f"the user message (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--prompt", dest="prompt_flag", help="the user message, as a flag")
    p.add_argument("--base-url", default="http://localhost:30000/v1")
    p.add_argument("--model", help="the model name to send (default: the first of /v1/models)")
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE)
    p.add_argument("--top-p", type=float, default=DEFAULT_TOP_P)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for the model lookup")
    args = p.parse_args()
    if args.prompt is not None and args.prompt_flag is not None:
        p.error("give the prompt once: as the argument or with --prompt")
    prompt = args.prompt if args.prompt is not None else args.prompt_flag or DEFAULT_PROMPT

    base = args.base_url.rstrip("/")
    model = args.model or served_model(base, args.timeout)
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": args.max_tokens,
        "stream": args.stream,
    }
    if args.stream:
        payload["stream_options"] = {"include_usage": True}
    url = base + "/chat/completions"
    printer = Printer()
    with post(url, payload, COMPLETION_READ_S) as resp:
        try:
            if args.stream:
                stream_reply(resp, printer)
                return
            reply = json.load(resp)
        except (OSError, urllib.error.URLError) as e:
            fail(2, f"lost the server at {url}: {e}")
        except ValueError as e:
            fail(2, f"unexpected answer from {url}: {type(e).__name__}: {e}")
    choice = (reply.get("choices") or [{}])[0]
    printer.add(choice.get("message") or {})
    printer.done(choice.get("finish_reason"), reply.get("usage"))


if __name__ == "__main__":
    main()
