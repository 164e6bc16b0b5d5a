"""The README's first request, exactly as written, against a server launched the README's way.

On a CUDA machine with SGLang (``gpu``): ``python -m sglang_ddtree.serve`` (the shipped trained
pair, as ``make run`` starts it) on a free port; once ``/health`` answers, the README's
commands, with only the port changed:

- the first ``bash`` block that contains ``/v1/chat/completions`` (curl), run by bash; its
  stdout must be the reply's JSON, and curl's status code is read from a ``.curlrc`` that sends
  it to stderr;
- the first ``python`` block that contains ``from openai import OpenAI``, run with the
  ``openai`` package (SGLang 0.5.17 depends on it; skipped where it is not installed); every
  completion it creates is recorded;
- ``docker/kimi-k2.6/client.py --temperature 0.7 --top-p 0.9 --max-tokens 32 --stream``.

Each must get HTTP 200, non-empty text, a finish reason and token counts. The README's blocks
are found by ``readme_blocks``, whose CPU tests run everywhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang_ddtree.serve import DEFAULT_PORT

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLIENT = ROOT / "docker" / "kimi-k2.6" / "client.py"
CURL_NEEDLE = "/v1/chat/completions"
PYTHON_NEEDLE = "from openai import OpenAI"
# The README's address of the server: `make run`'s, SGLang's default port.
README_ADDRESS = re.compile(rf"\b(localhost|127\.0\.0\.1):{DEFAULT_PORT}\b")
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)$")


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced code block, in order (the language is the info
    string's first word, lower-cased; the fence's indentation is removed from the code)."""
    blocks, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, body = opening["indent"], []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        words = opening["info"].split()
        blocks.append((words[0].lower() if words else "", "\n".join(body) + "\n"))
        i += 1
    return blocks


def first_block(markdown: str, languages: tuple[str, ...], needle: str) -> str | None:
    """The first block in one of ``languages`` whose code contains ``needle``, or None."""
    for language, code in fenced_blocks(markdown):
        if language in languages and needle in code:
            return code
    return None


def readme_blocks(markdown: str) -> tuple[str, str]:
    """The README's curl block and Python block (see the module docstring); an AssertionError
    says which one is missing and what it must contain."""
    curl = first_block(markdown, ("bash", "sh", "shell"), CURL_NEEDLE)
    python = first_block(markdown, ("python", "py"), PYTHON_NEEDLE)
    missing = []
    if curl is None:
        missing.append(f"a ```bash block with a curl request to {CURL_NEEDLE}")
    if python is None:
        missing.append(f"a ```python block with `{PYTHON_NEEDLE}`")
    assert not missing, f"README.md has no {' and no '.join(missing)}"
    for name, code in (("bash", curl), ("python", python)):
        assert README_ADDRESS.search(code), (
            f"README.md's {name} block does not address the server at localhost:{DEFAULT_PORT} "
            f"(where `make run` serves): {code!r}"
        )
    return curl, python


def at_port(code: str, port: int) -> str:
    """``code`` addressing the server at ``port`` instead of the README's default port."""
    return README_ADDRESS.sub(rf"\g<1>:{port}", code)


# --- CPU: finding the blocks -----------------------------------------------------------------

SAMPLE = textwrap.dedent(
    """
    # Title

    ```bash
    make install && make run
    ```

    1. Then, in another shell:

       ```bash
       curl -s http://localhost:30000/v1/chat/completions \\
         -H 'Content-Type: application/json' -d '{"model": "m"}'
       ```

    ```python
    print("no client here")
    ```

    ```Python title="first.py"
    from openai import OpenAI

    client = OpenAI(base_url="http://localhost:30000/v1", api_key="EMPTY")
    ```

    ```bash
    curl http://localhost:30000/v1/chat/completions  # a second one, not taken
    ```
    """
)


def test_fenced_blocks_in_order_with_languages_and_indents():
    blocks = fenced_blocks(SAMPLE)
    assert [language for language, _ in blocks] == ["bash", "bash", "python", "python", "bash"]
    assert blocks[0][1] == "make install && make run\n"
    assert blocks[1][1].startswith("curl -s http://localhost:30000/v1/chat/completions \\\n")
    assert blocks[1][1].endswith("  -H 'Content-Type: application/json' -d '{\"model\": \"m\"}'\n")


def test_readme_blocks_takes_the_first_match_of_each():
    curl, python = readme_blocks(SAMPLE)
    assert curl.startswith("curl -s ") and "a second one" not in curl
    assert python.startswith("from openai import OpenAI\n")
    assert at_port(curl, 8123).startswith("curl -s http://localhost:8123/v1/chat/completions")
    assert 'base_url="http://localhost:8123/v1"' in at_port(python, 8123)
    assert at_port("http://127.0.0.1:30000/v1 :300001", 9) == "http://127.0.0.1:9/v1 :300001"


def test_readme_blocks_say_what_is_missing():
    with pytest.raises(AssertionError, match=r"no a ```bash block with a curl request to"):
        readme_blocks("```python\nfrom openai import OpenAI\n```\n")
    with pytest.raises(AssertionError, match=r"no a ```python block with `from openai"):
        readme_blocks("```bash\ncurl http://localhost:30000/v1/chat/completions\n```\n")
    elsewhere = "```bash\ncurl http://example.org/v1/chat/completions\n```\n"
    with pytest.raises(AssertionError, match="does not address the server at localhost:30000"):
        readme_blocks(elsewhere + "```python\nfrom openai import OpenAI\n```\n")


# --- GPU: the README's commands against a launched server -------------------------------------


def check_reply(reply: dict) -> None:
    """A whole chat completion: text, a finish reason, token counts."""
    assert reply.get("object") == "chat.completion", reply
    choice = reply["choices"][0]
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length"), choice
    usage = reply["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0, usage
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage


class Launched:
    """The server of the README's way and the README's blocks addressed to it."""

    def __init__(self, port: int, curl: str, python: str):
        self.base = f"http://127.0.0.1:{port}"
        self.curl, self.python = at_port(curl, port), at_port(python, port)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """``python -m sglang_ddtree.serve --port P`` until ``/health`` answers and the launcher
    has printed its ready line; skipped where it cannot serve, failed without the README's
    blocks (before anything starts)."""
    from sglang_ddtree.serve import serving_unavailable
    from sglang_ddtree.testing.http import free_port, healthy

    why = serving_unavailable()
    if why is not None:
        pytest.skip(why)
    curl, python = readme_blocks(README.read_text())
    port = free_port()
    here = Launched(port, curl, python)
    log_path = tmp_path_factory.mktemp("readme") / "serve.log"
    with open(log_path, "w") as log:
        # Its own session, so the teardown reaches SGLang's processes whatever happens.
        proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_ddtree.serve", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 900
        while not healthy(here.base):
            assert proc.poll() is None, f"the server exited: {log_path.read_text()[-4000:]}"
            assert time.time() < deadline, f"no /health in 900 s: {log_path.read_text()[-4000:]}"
            time.sleep(2)
        ready = f"sglang_ddtree.serve: ready: {here.base}/v1"
        for _ in range(30):  # the launcher polls /health too
            if ready in log_path.read_text():
                break
            time.sleep(1)
        assert ready in log_path.read_text(), log_path.read_text()[-4000:]
        yield here
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.gpu
def test_readme_curl_request(launched, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed on this machine")
    # curl's status code on stderr, the body alone on stdout (the block's own flags kept).
    (tmp_path / ".curlrc").write_text('write-out = "%{stderr}HTTP %{http_code}\\n"\n')
    out = subprocess.run(
        ["bash", "-e", "-c", launched.curl],
        env=dict(os.environ, CURL_HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "HTTP 200\n" in out.stderr, out.stderr
    check_reply(json.loads(out.stdout))


# Runs the README's Python block, recording what each chat completion it creates returns.
_RECORDING_RUNNER = textwrap.dedent(
    """
    import json, sys
    from openai.resources.chat import Completions

    created, original = [], Completions.create

    def create(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        created.append(result.model_dump() if hasattr(result, "model_dump") else None)
        return result

    Completions.create = create
    code = open(sys.argv[1]).read()
    exec(compile(code, "README.md's python block", "exec"), {"__name__": "__main__"})
    with open(sys.argv[2], "w") as f:
        json.dump(created, f)
    """
)


@pytest.mark.gpu
def test_readme_python_request(launched, tmp_path):
    try:
        import openai  # noqa: F401
    except ImportError:
        pytest.skip("the openai package is not installed here (pip install openai runs it)")
    (tmp_path / "block.py").write_text(launched.python)
    (tmp_path / "runner.py").write_text(_RECORDING_RUNNER)
    created = tmp_path / "created.json"
    out = subprocess.run(
        [sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "block.py"), str(created)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]  # the openai client raises on HTTP errors
    assert out.stdout.strip(), "the README's Python block printed nothing"
    replies = json.loads(created.read_text())
    assert replies, "the README's Python block created no chat completion"
    for reply in replies:
        if reply is not None:  # a streamed one is judged by what the block printed
            check_reply(reply)


@pytest.mark.gpu
def test_client_streams_with_temperature(launched):
    cmd = [sys.executable, str(CLIENT), "--base-url", f"{launched.base}/v1", "--temperature", "0.7",
           "--top-p", "0.9", "--max-tokens", "32", "--stream"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr  # exit 3 on an HTTP error
    text = out.stdout.replace("=== answer ===", "").replace("=== reasoning ===", "")
    assert text.strip(), out.stdout
    summary = re.fullmatch(
        r"\[finish_reason: (stop|length); tokens: prompt (\d+), completion (\d+)\]\n", out.stderr
    )
    assert summary, out.stderr
    assert int(summary[2]) > 0 and 0 < int(summary[3]) <= 32
