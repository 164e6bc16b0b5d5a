"""Chat with the Kimi K2.6 DDTREE server through its OpenAI-compatible API, streaming.

    pip install openai
    python3 docker/kimi-k2.6/client.py [--base-url http://localhost:30000/v1] [--prompt "..."]

The model name comes from /v1/models. The reasoning (``reasoning_content``, split out by
``--reasoning-parser kimi_k2``) and the answer (``content``) print as separate sections.
Exits 2 with a message when the server cannot be reached, 1 when ``openai`` is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request


def fail(code: int, message: str) -> None:
    print(f"client.py: {message}", file=sys.stderr)
    sys.exit(code)


def served_model(base_url: str, timeout: float) -> str:
    """The first model id from ``GET {base_url}/models`` (standard library only, so an
    unreachable server is reported the same with or without ``openai`` installed)."""
    url = base_url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            models = json.load(resp)["data"]
    except urllib.error.HTTPError as e:
        fail(2, f"{url} answered HTTP {e.code} {e.reason}")
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        fail(2, f"server unreachable at {url} ({reason}); is it up? (docker/kimi-k2.6/README.md)")
    except (ValueError, KeyError, TypeError) as e:
        fail(2, f"unexpected answer from {url}: {type(e).__name__}: {e}")
    if not models:
        fail(2, f"{url} lists no model")
    return models[0]["id"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default="http://localhost:30000/v1")
    p.add_argument("--prompt", default="In three sentences: why is the sky blue?")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for the model lookup")
    args = p.parse_args()

    model = served_model(args.base_url, args.timeout)
    try:
        import openai
    except ImportError:
        fail(1, "the 'openai' package is missing: pip install openai")

    client = openai.OpenAI(base_url=args.base_url, api_key="EMPTY")
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": args.prompt}],
            temperature=1.0,
            top_p=0.95,
            max_tokens=args.max_tokens,
            stream=True,
        )
        section = None
        for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            for name in ("reasoning_content", "content"):
                text = getattr(delta, name, None)
                if text:
                    if section != name:
                        header = "reasoning" if name == "reasoning_content" else "answer"
                        print(f"\n=== {header} ===", flush=True)
                        section = name
                    print(text, end="", flush=True)
        print()
    except openai.APIConnectionError as e:
        fail(2, f"lost the server at {args.base_url}: {e}")
    except openai.APIStatusError as e:
        fail(3, f"server answered HTTP {e.status_code}: {e.message}")


if __name__ == "__main__":
    main()
