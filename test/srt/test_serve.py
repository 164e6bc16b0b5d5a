"""The README's main job: `make run` / `python -m sglang_ddtree.serve` (the launch command, the
shipped pair by default, progress and the ready line, the no-GPU behaviour) and `make install`'s
choice of what to install."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_ddtree import serve
from sglang_ddtree.pair import DRAFTER_DIR, TARGET_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_launch_command_defaults_to_tree_mask_backend():
    cmd = serve.launch_command("/t", "/d", 33, ["--port", "1234"])
    i = cmd.index("--speculative-algorithm")
    assert cmd[i + 1] == "DDTREE"
    assert cmd[cmd.index("--speculative-draft-model-path") + 1] == "/d"
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "33"
    assert cmd[cmd.index("--attention-backend") + 1] == "triton"
    assert cmd[-2:] == ["--port", "1234"]


def test_launch_command_keeps_user_backend():
    cmd = serve.launch_command("/t", "/d", None, ["--attention-backend", "flashinfer"])
    assert cmd.count("--attention-backend") == 1
    assert "--speculative-num-draft-tokens" not in cmd


def test_no_server_without_gpu_or_sglang(capsys):
    reason = serve.serving_unavailable()
    if reason is None:
        pytest.skip("this machine can serve")
    assert serve.main(["--no-demo"]) == 2
    assert (
        capsys.readouterr().err == f"sglang_ddtree.serve: cannot launch a server here: {reason}.\n"
    )


def test_without_gpu_one_line_then_the_demo(monkeypatch, capsys):
    """`make run` on a CPU machine: one line saying why there is no server, then the demo."""
    from sglang_ddtree import demo

    reason = "no CUDA GPU is visible and SGLang is not installed"
    monkeypatch.setattr(serve, "serving_unavailable", lambda: reason)
    ran = []
    monkeypatch.setattr(demo, "main", lambda argv: ran.append(argv))
    assert serve.main([]) == 0
    assert ran == [[]]
    assert capsys.readouterr().err == (
        f"sglang_ddtree.serve: no server on this machine ({reason}); running the CPU demo "
        "instead.\n"
    )


def test_a_server_asked_for_without_gpu_fails_naming_what_it_drops(capsys):
    """With a model or launcher arguments the user wants a server, not the demo."""
    if serve.serving_unavailable() is None:
        pytest.skip("this machine can serve")
    argv = ["--model-path", "/m", "--speculative-draft-model-path", "/d", "--port", "9"]
    assert serve.main(argv) == 2
    err = capsys.readouterr().err
    assert "Not serving --model-path /m --port 9" in err
    assert serve.main(["--pair", "tiny"]) == 2
    assert "Not serving --pair tiny" in capsys.readouterr().err


@pytest.fixture
def launched(monkeypatch):
    """serve.main on a machine that can serve, with the server's run recorded, not started:
    ``[(cmd, url, model_name)]``."""
    runs = []
    monkeypatch.setattr(serve, "serving_unavailable", lambda: None)
    monkeypatch.setattr(serve, "run_server", lambda *a: runs.append(a) or 0)
    return runs


def _value(cmd, flag):
    assert cmd.count(flag) == 1, cmd
    return cmd[cmd.index(flag) + 1]


def test_the_default_server_is_the_trained_pair(launched):
    """A first server answers with the trained pair under a fixed model name, at SGLang's
    default address."""
    assert serve.main([]) == 0
    [(cmd, url, model)] = launched
    assert _value(cmd, "--model-path") == str(TARGET_DIR)
    assert _value(cmd, "--speculative-draft-model-path") == str(DRAFTER_DIR)
    assert _value(cmd, "--speculative-algorithm") == "DDTREE"
    assert _value(cmd, "--served-model-name") == model == "sglang-ddtree-pair"
    assert url == "http://127.0.0.1:30000"
    launched.clear()
    assert serve.main(["--pair", "--port", "8123", "--host", "0.0.0.0"]) == 0
    [(cmd, url, model)] = launched
    assert _value(cmd, "--model-path") == str(TARGET_DIR) and url == "http://127.0.0.1:8123"


def test_the_tiny_pair_stays_reachable(launched, monkeypatch):
    from sglang_ddtree.testing import tiny_models

    monkeypatch.setattr(tiny_models, "make_tiny_pair", lambda out: (f"{out}/t", f"{out}/d"))
    assert serve.main(["--pair", "tiny", "--served-model-name", "mine"]) == 0
    [(cmd, _, model)] = launched
    assert _value(cmd, "--model-path").endswith("/t") and model == "mine"
    assert _value(cmd, "--speculative-draft-model-path").endswith("/d")


def test_a_given_model_takes_sglang_flag_names(launched):
    argv = ["--model-path", "/m", "--speculative-draft-model-path", "/d", "--port=9"]
    assert serve.main(argv) == 0
    [(cmd, url, model)] = launched
    assert _value(cmd, "--speculative-draft-model-path") == "/d" and cmd[-1] == "--port=9"
    assert "--served-model-name" not in cmd and model == "/m"  # SGLang names it by its path
    assert url == "http://127.0.0.1:9"
    launched.clear()
    assert serve.main(["--model-path", "/m", "--draft-model-path", "/d"]) == 0  # the old name
    assert _value(launched[0][0], "--speculative-draft-model-path") == "/d"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model-path", "/m"], "--model-path needs --speculative-draft-model-path"),
        (["--speculative-draft-model-path", "/d"], "needs --model-path (its target)"),
        (["--model-path", "/m", "--speculative-draft-model-path", "/d", "--pair"], "drop it"),
    ],
)
def test_half_a_pair_is_refused_naming_the_flag(argv, message, launched, capsys):
    with pytest.raises(SystemExit) as e:
        serve.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err and not launched


# A stand-in server: /health answers 503 twice (SGLang's warm-up), then 200; it exits after.
_STAND_IN = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Health(BaseHTTPRequestHandler):
        calls = 0

        def log_message(self, *args):
            pass

        def do_GET(self):
            Health.calls += 1
            self.send_response(200 if Health.calls > 2 else 503)
            self.end_headers()

    server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Health)
    while Health.calls < 3:
        server.handle_request()
    print("stand-in server done", flush=True)
    """
)


def test_run_server_reports_progress_and_the_ready_url(monkeypatch, capfd, tmp_path):
    from sglang_ddtree.testing.http import free_port

    monkeypatch.setattr(serve, "POLL_S", 0.05)
    monkeypatch.setattr(serve, "NOTICE_S", 0.0)  # a progress line at every poll
    port = free_port()
    (tmp_path / "stand_in.py").write_text(_STAND_IN)
    cmd = [sys.executable, str(tmp_path / "stand_in.py"), str(port)]
    assert serve.run_server(cmd, f"http://127.0.0.1:{port}", "sglang-ddtree-pair") == 0
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("sglang_ddtree.serve: ")]
    assert lines[0] == f"sglang_ddtree.serve: {' '.join(cmd)}"
    assert lines[1].startswith("sglang_ddtree.serve: starting SGLang")
    assert any("still starting" in ln for ln in lines[2:-1])
    assert lines[-1] == (
        f"sglang_ddtree.serve: ready: http://127.0.0.1:{port}/v1 (OpenAI-compatible, model "
        '"sglang-ddtree-pair"); Ctrl-C stops it'
    )


def test_run_server_says_when_the_server_exits_before_it_answers(capfd):
    from sglang_ddtree.testing.http import free_port

    base = f"http://127.0.0.1:{free_port()}"
    assert serve.run_server([sys.executable, "-c", "raise SystemExit(3)"], base, "m") == 3
    err = capfd.readouterr().err
    assert f"the server exited with code 3 before it answered {base}/health" in err


_TERMINATED_CHILD = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time

    def stop(signum, frame):
        pathlib.Path(sys.argv[1]).write_text("terminated")
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("child up", os.getpid(), flush=True)
    while True:
        time.sleep(0.1)
    """
)


def test_a_sigterm_to_the_launcher_stops_the_server(tmp_path):
    """A service manager or a test stops the launcher with SIGTERM: the server must not be left
    running (SGLang shuts down its own processes on SIGTERM)."""
    import os
    import signal

    from sglang_ddtree.testing.http import free_port

    (tmp_path / "child.py").write_text(_TERMINATED_CHILD)
    marker = tmp_path / "marker"
    child = [sys.executable, str(tmp_path / "child.py"), str(marker)]
    code = (
        "import sys; from sglang_ddtree import serve; "
        f"sys.exit(serve.run_server({child!r}, 'http://127.0.0.1:{free_port()}', 'm'))"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    child_pid = None
    try:
        up, child_pid = launcher.stdout.readline().rsplit(" ", 1)
        assert up == "child up"
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 0  # the server's exit code
        assert marker.read_text() == "terminated"
    finally:
        launcher.kill()
        if child_pid is not None and not marker.exists():  # left running: stop it here
            os.kill(int(child_pid), signal.SIGKILL)


def _make(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(
        ["make", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60
    )


def test_make_run_names_the_missing_half_of_a_pair():
    """`make run MODEL=x` without DRAFT= says so in make's words (not argparse's "expected one
    argument"), before anything runs."""
    out = _make("run", "MODEL=/models/x", "PYTHON=false")
    assert out.returncode == 2
    assert "make run: MODEL=/models/x needs DRAFT=<its DFlash drafter>" in out.stderr
    out = _make("run", "DRAFT=/models/d", "PYTHON=false")
    assert out.returncode == 2 and "DRAFT=/models/d needs MODEL=" in out.stderr
    out = _make("-n", "run", "MODEL=/m", "DRAFT=/d")
    assert "-m sglang_ddtree.serve --model-path /m --speculative-draft-model-path /d" in out.stdout


def test_make_install_installs_sglang_on_a_cuda_machine_only():
    """GPU=1 / GPU=0 stand for what `nvidia-smi -L` finds; each says in one line what it
    installs, and pip runs without -q (its progress shows)."""
    gpu = _make("-n", "install", "GPU=1").stdout
    assert 'pip install -e ".[serve,test]"' in gpu and "CUDA GPU found" in gpu
    cpu = _make("-n", "install", "GPU=0").stdout
    assert 'pip install -e ".[test]"' in cpu and "[serve" not in cpu and "no CUDA GPU" in cpu
    assert " -q" not in gpu + cpu


def test_server_check_launches_with_ddtree_flags():
    """The server check's launch line carries DDTREE's flags through SGLang's CLI, and the log
    lines it looks for are the ones those values produce."""
    from sglang_ddtree.srt.ddtree_budget import BudgetSchedule
    from sglang_ddtree.testing import server_check

    cmd = server_check.launch_cmd("/t", "/d", 1234)
    value = {f: cmd[cmd.index(f) + 1] for f in server_check.FLAGS[::2]}
    assert value["--speculative-ddtree-budget-schedule"] == "1:33,4:17"
    assert value["--speculative-ddtree-topk"] == "6"
    schedule = str(BudgetSchedule.parse(value["--speculative-ddtree-budget-schedule"]))
    assert server_check.FLAGS_IN_LOG[0] == f"budget schedule {schedule}"


def test_server_check_judges_forced_tool_calls(monkeypatch):
    """The server check launches with Kimi K2's tool-call parser, and a forced tool call passes
    only when the reply names the tool with arguments its schema allows."""
    import json

    from sglang_ddtree.testing import server_check

    cmd = server_check.launch_cmd("/t", "/d", 1234)
    assert cmd[cmd.index("--tool-call-parser") + 1] == "kimi_k2"
    sent = []

    def reply(calls, code=200):
        def http_json(url, payload=None):
            sent.append(payload)
            message = {"role": "assistant", "content": None, "tool_calls": calls}
            return code, {"choices": [{"message": message}]}

        return http_json

    def call(name, arguments):
        return [{"type": "function", "function": {"name": name, "arguments": arguments}}]

    cases = [
        (call("get_weather", json.dumps({"city": "oslo"})), True),
        (call("get_weather", json.dumps({"city": "rome"})), False),  # not in the enum
        (call("get_time", json.dumps({"city": "oslo"})), False),  # another tool
        (call("get_weather", '{"city": "os'), False),  # cut off
        (None, False),  # no tool call
    ]
    for calls, want in cases:
        monkeypatch.setattr(server_check, "http_json", reply(calls))
        assert server_check._tool_call("http://x", "required")[1] is want
    assert sent[0]["tool_choice"] == "required" and sent[0]["tools"] == [server_check.TOOL]


def test_generation_defaults_check(tmp_path, monkeypatch):
    """The defaults check's target keeps every file of the original and adds the defaults to
    its generation_config.json; the check passes only when every plain request is served."""
    import contextlib
    import json

    from sglang_ddtree.testing import server_check

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("{}")
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    copy = server_check.with_generation_defaults(str(target), str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "config.json").read_text() == "{}"
    config = json.loads((tmp_path / "copy" / "generation_config.json").read_text())
    assert config == {"eos_token_id": 0, **server_check.GENERATION_DEFAULTS}
    assert json.loads((target / "generation_config.json").read_text()) == {"eos_token_id": 0}
    assert copy == str(tmp_path / "copy")

    monkeypatch.setattr(server_check, "launched_server", lambda *a: contextlib.nullcontext())
    for code, want in ((200, True), (400, False)):
        monkeypatch.setattr(server_check, "http_json", lambda url, payload, code=code: (code, {}))
        summary: dict = {}
        server_check.check_generation_defaults(str(target), "/d", summary, log_dir=str(tmp_path))
        assert summary["defaults"]["passed"] is want and len(summary["defaults"]["requests"]) == 4
