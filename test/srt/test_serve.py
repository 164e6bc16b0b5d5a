"""The README's main job: `python -m sglang_ddtree.serve` (launch command, no-GPU behaviour)."""

import pytest

from sglang_ddtree import serve


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
    assert "cannot launch a server here" in capsys.readouterr().err


def test_a_server_asked_for_without_gpu_fails_naming_what_it_drops(capsys):
    """With a model or launcher arguments the user wants a server, not the demo."""
    if serve.serving_unavailable() is None:
        pytest.skip("this machine can serve")
    assert serve.main(["--model-path", "/m", "--draft-model-path", "/d", "--port", "9"]) == 2
    err = capsys.readouterr().err
    assert "Not serving --model-path /m --port 9" in err


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
