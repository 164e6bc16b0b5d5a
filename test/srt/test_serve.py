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
