"""CPU tests of the serving image and the Kimi K2.6 recipe (``docker/``): the argv that
``launch.sh`` builds for each HW (and, where SGLang imports, SGLang's own parser accepting it),
the Dockerfile's pin / install / health check, and ``client.py`` against a stand-in server."""

from __future__ import annotations

import argparse
import json
import os
import py_compile
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
RECIPE = DOCKER / "kimi-k2.6"
LAUNCH = RECIPE / "launch.sh"
CLIENT = RECIPE / "client.py"
MODULE_PREFIX = ["python3", "-m", "sglang.launch_server"]
MEM_FRACTION = {"h200": 0.85, "b300": 0.9}


def launch_argv(*extra: str, **env: str) -> list[str]:
    """The argv ``launch.sh`` would exec, printed one argument a line under DRY_RUN=1."""
    full_env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "1", **env}
    out = subprocess.run(
        ["bash", str(LAUNCH), *extra],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def flag_value(argv: list[str], name: str) -> str:
    assert argv.count(name) == 1, f"{name} appears {argv.count(name)} times in {argv}"
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("hw", ["h200", "b300"])
def test_launch_flags(hw):
    argv = launch_argv(HW=hw)
    assert argv[:3] == MODULE_PREFIX
    expected = {
        "--model-path": "moonshotai/Kimi-K2.6",
        "--speculative-algorithm": "DDTREE",
        "--speculative-draft-model-path": "z-lab/Kimi-K2.6-DFlash",
        "--tp": "8",
        # FlashMLA at its page size on Hopper; triton where FlashMLA's kernel does not run.
        "--attention-backend": {"h200": "flashmla", "b300": "triton"}[hw],
        "--page-size": {"h200": "64", "b300": "1"}[hw],
        # Bounds the glue graphs DDTREE captures at startup (SGLang's default there is 512).
        "--cuda-graph-max-bs-decode": "128",
        "--reasoning-parser": "kimi_k2",
        "--tool-call-parser": "kimi_k2",
        "--host": "0.0.0.0",
        "--port": "30000",
    }
    for name, value in expected.items():
        assert flag_value(argv, name) == value, name
    assert "--trust-remote-code" in argv
    assert float(flag_value(argv, "--mem-fraction-static")) == MEM_FRACTION[hw]
    # The tree budget is left to DDTREE's default adaptive schedule.
    assert "--speculative-num-draft-tokens" not in argv


def test_launch_env_and_extra_args():
    argv = launch_argv(
        "--log-level",
        "debug",
        MODEL="/models/k26",
        DRAFT="/models/k26-dflash",
        HW="b300",
        PORT="8123",
        MEM_FRACTION_STATIC="0.8",
    )
    assert flag_value(argv, "--model-path") == "/models/k26"
    assert flag_value(argv, "--speculative-draft-model-path") == "/models/k26-dflash"
    assert flag_value(argv, "--port") == "8123"
    assert flag_value(argv, "--mem-fraction-static") == "0.8"
    assert argv[-2:] == ["--log-level", "debug"]
    # HW defaults to h200.
    assert flag_value(launch_argv(), "--mem-fraction-static") == str(MEM_FRACTION["h200"])


def test_launch_flashmla_on_h200_only():
    """ATTENTION=flashmla: FlashMLA at its page size 64, on H200 (Hopper) only; ATTENTION=triton
    at page size 1 on either; other values are refused with a message and exit 2."""
    argv = launch_argv(ATTENTION="flashmla")
    assert flag_value(argv, "--attention-backend") == "flashmla"
    assert flag_value(argv, "--page-size") == "64"
    for hw in ("h200", "b300"):
        argv = launch_argv(ATTENTION="triton", HW=hw)
        assert flag_value(argv, "--attention-backend") == "triton"
        assert flag_value(argv, "--page-size") == "1"
    for env, needle in (({"ATTENTION": "flashmla", "HW": "b300"}, "HW=h200"),
                        ({"ATTENTION": "fa3"}, "ATTENTION must be triton or flashmla")):  # fmt: skip
        out = subprocess.run(
            ["bash", str(LAUNCH)],
            env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", **env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 2 and out.stdout == "" and needle in out.stderr


def test_launch_refuses_unknown_hw():
    out = subprocess.run(
        ["bash", str(LAUNCH)],
        env={"PATH": "/usr/bin:/bin", "DRY_RUN": "1", "HW": "a100"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert "HW must be h200 or b300" in out.stderr and "a100" in out.stderr


def _server_args_or_skip():
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception as e:  # not installed (CPU CI), or not importable here
        pytest.skip(f"sglang not importable: {type(e).__name__}: {e}")
    return ServerArgs


@pytest.mark.parametrize("hw", ["h200", "b300"])
def test_launch_argv_parses_with_sglang(hw):
    """SGLang's own parser, as ``prepare_server_args`` builds it. Full ``ServerArgs``
    construction (``from_cli_args``) would resolve the model from the hub, so the test stops at
    the parsed namespace."""
    ServerArgs = _server_args_or_skip()
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    argv = launch_argv(HW=hw)
    ns = parser.parse_args(argv[len(MODULE_PREFIX) :])
    assert ns.model_path == "moonshotai/Kimi-K2.6"
    assert ns.speculative_algorithm == "DDTREE"
    assert ns.speculative_draft_model_path == "z-lab/Kimi-K2.6-DFlash"
    assert ns.speculative_num_draft_tokens is None
    assert ns.tp_size == 8
    assert ns.attention_backend == {"h200": "flashmla", "b300": "triton"}[hw]
    assert ns.page_size == {"h200": 64, "b300": 1}[hw]
    assert ns.cuda_graph_max_bs_decode == 128
    assert ns.trust_remote_code is True
    assert ns.reasoning_parser == "kimi_k2" and ns.tool_call_parser == "kimi_k2"
    assert ns.host == "0.0.0.0" and ns.port == 30000
    assert ns.mem_fraction_static == MEM_FRACTION[hw]


def dockerfile_text() -> str:
    """The Dockerfile with line continuations joined, as Docker reads it."""
    return (DOCKER / "Dockerfile").read_text().replace("\\\n", "")


def test_dockerfile_pin_install_and_healthcheck():
    text = dockerfile_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    pin = re.search(r'"sglang==([0-9][0-9.]*)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml pins no sglang version"
    assert f"ARG BASE=lmsysorg/sglang:v{pin.group(1)}" in lines
    assert next(ln for ln in lines if ln.startswith("FROM")) == "FROM ${BASE}"
    installs = [ln for ln in lines if "pip install" in ln]
    assert len(installs) == 1
    install = installs[0]
    # The image installs the plugin with the step of `make install-plugin` (the GPU runs' one).
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^install-plugin:[^\n]*\n\t\$\(PIP\) (install [^\n]*)", make, re.M)
    assert recipe, "Makefile has no install-plugin target"
    image_step = re.search(r"python3 -m pip (install [^&]*?)\s*&&", install).group(1)
    assert image_step.replace(" --no-cache-dir", "") == recipe.group(1)
    assert "--no-deps" in recipe.group(1)
    health = [ln for ln in lines if ln.startswith("HEALTHCHECK")]
    assert len(health) == 1
    assert 'curl -fsS "http://localhost:${PORT:-30000}/health"' in health[0]
    # The recipe is in the image where the usage line says (WORKDIR-relative).
    assert "WORKDIR /opt/sglang-ddtree" in lines
    assert "COPY docker/kimi-k2.6 ./kimi-k2.6" in lines
    # The editable install finds our kernel sources beside the package, as in a checkout.
    assert "COPY sgl-kernel ./sgl-kernel" in lines
    assert "bash kimi-k2.6/launch.sh" in (DOCKER / "Dockerfile").read_text()


def build_check_code() -> str:
    match = re.search(r'python3 -c "([^"]*)"', dockerfile_text())
    assert match, "the Dockerfile runs no build-time python3 -c check"
    return match.group(1)


def test_dockerfile_build_check():
    code = build_check_code()
    assert "entry_points(group='sglang.srt.plugins')" in code and "'ddtree'" in code
    compile(code, "Dockerfile build check", "exec")
    _server_args_or_skip()
    from importlib.metadata import entry_points

    if not [e for e in entry_points(group="sglang.srt.plugins") if e.name == "ddtree"]:
        pytest.skip("sglang-ddtree is not installed (no sglang.srt.plugins entry point)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sglang-ddtree: DDTREE registered" in out.stdout


IN_TREE = DOCKER / "in-tree" / "Dockerfile"


def in_tree_lines() -> list[str]:
    """The in-tree image's Dockerfile as Docker reads it (continuations joined), no comments."""
    text = IN_TREE.read_text().replace("\\\n", "")
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_in_tree_dockerfile_forks_the_pinned_release_and_installs_no_plugin(gen):
    """The in-tree image: the official image of a base of the generator (pyproject.toml's pin by
    default), the committed series of that base applied by ``upstream/fork.py`` and installed
    over the image's SGLang, no plugin; what it copies exists here."""
    lines = in_tree_lines()
    pin = re.search(r'"sglang==([0-9][0-9.]*)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert lines[:4] == [
        f"ARG SGLANG_VERSION={pin}",
        "ARG BASE=lmsysorg/sglang:v${SGLANG_VERSION}",
        "FROM ${BASE}",
        "ARG SGLANG_VERSION",
    ]
    assert pin == gen.BASES[0]
    for base in gen.BASES:  # --build-arg SGLANG_VERSION=<any base> finds its series
        assert sorted(gen.series_dir(base).glob("[0-9][0-9]-*.patch")), base
    copies = [ln.split()[1:] for ln in lines if ln.startswith("COPY")]
    assert copies == [["upstream", "./upstream"]]
    assert all((ROOT / src).exists() for src, _ in copies)
    workdir = next(ln.split()[1] for ln in lines if ln.startswith("WORKDIR"))
    run = next(ln for ln in lines if ln.startswith("RUN"))
    fork = re.search(r"python3 (upstream/fork\.py [^&]*?)\s*&&", run).group(1).split()
    assert fork == ["upstream/fork.py", "--base", "${SGLANG_VERSION}", "--dir", "/opt/sglang-fork",
                    "--install-over"]  # fmt: skip
    assert (ROOT / fork[0]).is_file() and workdir == "/opt/sglang-ddtree-in-tree"
    helped = subprocess.run([sys.executable, str(ROOT / fork[0]), "--help"], capture_output=True,
                            text=True, timeout=120).stdout  # fmt: skip
    assert all(flag in helped for flag in ("--base", "--dir", "--install-over"))
    # No plugin: nothing pip-installs this repository, nor copies its package in.
    assert not any("pip install" in ln or ln.startswith("COPY python") for ln in lines)
    health = [ln for ln in lines if ln.startswith("HEALTHCHECK")]
    assert health == [ln for ln in dockerfile_text().splitlines() if ln.startswith("HEALTHCHECK")]
    assert "docker build -f docker/in-tree/Dockerfile" in IN_TREE.read_text()


def test_in_tree_dockerfile_build_check():
    """The build-time check: no plugin entry point, DDTREE resolves to the enum member
    (run on a patched tree by ``smoke_series.py --cpu``'s registered check)."""
    code = re.search(r'python3 -c "([^"]*)"', "\n".join(in_tree_lines())).group(1)
    compile(code, "in-tree Dockerfile build check", "exec")
    assert "entry_points(group='sglang.srt.plugins')" in code and "assert not" in code
    assert "SpeculativeAlgorithm.DDTREE" in code and "from_string('DDTREE')" in code


def test_client_compiles():
    py_compile.compile(str(CLIENT), doraise=True, cfile=None)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_client(base_url: str, *extra: str, env: dict | None = None):
    return subprocess.run(
        [sys.executable, str(CLIENT), "--base-url", base_url, "--timeout", "5", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_client_unreachable_server():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    out = run_client(url)
    assert out.returncode == 2
    assert "server unreachable" in out.stderr and url in out.stderr
    assert "Traceback" not in out.stderr


# The reply the stand-in gives, as streamed deltas (the first one is SGLang's role chunk).
DELTAS = [
    {"role": "assistant", "content": ""},
    {"reasoning_content": "Rayleigh "},
    {"reasoning_content": "scattering."},
    {"content": "Short "},
    {"content": "waves scatter."},
]
USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}


class _StandIn(BaseHTTPRequestHandler):
    """An OpenAI-compatible stand-in: one model, one chat completion, streamed or whole; a
    negative temperature is answered with SGLang's HTTP 400 error body. A streamed reply
    waits after its first token until ``release`` is set (if the test gave one)."""

    requests: list = []
    release: threading.Event | None = None

    def log_message(self, *args):
        pass

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": "kimi-k2.6", "object": "model"}]}
            self._send(200, json.dumps(body).encode(), "application/json")
        else:
            self._send(404, b"{}", "application/json")

    def do_POST(self):
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        self.requests.append((self.path, body))
        if body["temperature"] < 0:
            error = {"object": "error", "message": "temperature must be >= 0", "code": 400}
            self._send(400, json.dumps(error).encode(), "application/json")
            return
        if not body["stream"]:
            message = {"role": "assistant", "reasoning_content": "Rayleigh scattering.",
                       "content": "Short waves scatter."}  # fmt: skip
            reply = {"object": "chat.completion", "model": body["model"], "usage": USAGE,
                     "choices": [{"index": 0, "message": message, "finish_reason": "length"}]}  # fmt: skip
            self._send(200, json.dumps(reply).encode(), "application/json")
            return
        # Streamed: no Content-Length, the connection closes at the end (HTTP/1.0).
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, delta in enumerate(DELTAS):
            finish = "stop" if i == len(DELTAS) - 1 else None
            chunk = {"object": "chat.completion.chunk", "model": body["model"],
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            if i == 1 and self.release is not None:
                assert self.release.wait(timeout=10), "the client never printed the first token"
        if body.get("stream_options", {}).get("include_usage"):
            chunk = {"object": "chat.completion.chunk", "choices": [], "usage": USAGE}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture
def stand_in():
    _StandIn.requests = []
    _StandIn.release = None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", _StandIn.requests
    server.shutdown()
    server.server_close()


def test_client_streams_with_the_sampling_it_is_given(stand_in):
    url, requests = stand_in
    out = run_client(url, "Why is the sky blue?", "--temperature", "0.7", "--top-p", "0.9",
                     "--max-tokens", "32", "--stream")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.index("=== reasoning ===") < out.stdout.index("Rayleigh scattering.")
    assert out.stdout.index("Rayleigh scattering.") < out.stdout.index("=== answer ===")
    assert out.stdout.index("=== answer ===") < out.stdout.index("Short waves scatter.")
    assert out.stderr == "[finish_reason: stop; tokens: prompt 7, completion 5]\n"
    [(path, body)] = requests
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "kimi-k2.6",
        "messages": [{"role": "user", "content": "Why is the sky blue?"}],
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 32,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_client_prints_streamed_tokens_as_they_arrive(stand_in):
    """The stand-in holds the rest of the reply until the first token is on the client's
    stdout: a client that printed only at the end would never get it."""
    url, _ = stand_in
    _StandIn.release = threading.Event()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe buffers
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), "--base-url", url, "--stream", "hi"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        seen = b""
        while b"Rayleigh" not in seen:  # raw reads: the token comes without a newline
            data = os.read(proc.stdout.fileno(), 4096)
            assert data, f"the client ended before printing a token: {proc.stderr.read()}"
            seen += data
        _StandIn.release.set()
        rest, err = proc.communicate(timeout=60)
    finally:
        _StandIn.release.set()
        proc.kill()
    assert proc.returncode == 0, err
    assert b"Short waves scatter." in seen + rest


def test_client_without_stream_prints_the_whole_reply(stand_in):
    url, requests = stand_in
    out = run_client(url, "--prompt", "Why?", "--model", "mine", "--temperature", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "\n=== reasoning ===\nRayleigh scattering.\n=== answer ===\nShort waves scatter.\n"
    )
    assert out.stderr == "[finish_reason: length; tokens: prompt 7, completion 5]\n"
    [(_, body)] = requests
    assert body["stream"] is False and "stream_options" not in body
    assert body["model"] == "mine" and body["temperature"] == 0.0  # --model: no /v1/models
    assert body["top_p"] == 0.95 and body["max_tokens"] == 2048  # the defaults
    assert body["messages"] == [{"role": "user", "content": "Why?"}]


def test_client_reports_the_servers_refusal(stand_in):
    url, _ = stand_in
    for extra in ([], ["--stream"]):
        out = run_client(url, "--temperature", "-1", *extra)
        assert out.returncode == 3 and "Traceback" not in out.stderr
        assert out.stderr == "client.py: server answered HTTP 400: temperature must be >= 0\n"


def test_client_needs_no_openai_package(stand_in, tmp_path):
    """Standard library only: an ``openai`` that cannot import changes nothing."""
    url, _ = stand_in
    fake = tmp_path / "openai"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('hidden for the test')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}
    out = run_client(url, "--stream", "hi", env=env)
    assert out.returncode == 0, out.stderr
    assert "Short waves scatter." in out.stdout


def test_client_takes_the_prompt_once(stand_in):
    url, _ = stand_in
    out = run_client(url, "one", "--prompt", "two")
    assert out.returncode == 2 and "give the prompt once" in out.stderr
