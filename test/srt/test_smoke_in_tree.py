"""``upstream/smoke_in_tree.py`` counts the split-attention log line that the patched SGLang's
engines write to the stderr they inherit, and fails without it. CPU only: child processes stand
in for the engines' schedulers."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location(
        "ddtree_smoke_in_tree", REPO / "upstream" / "smoke_in_tree.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _child_writes(line: str) -> None:
    code = f"import sys; sys.stderr.write({line!r} + '\\n')"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lines_of_children_and_self_are_counted_and_copied_back(smoke, capfd):
    def run():
        _child_writes(f"[sched] DDTREE: {smoke.SPLIT_LOG_LINE} (...)")
        os.write(2, f"{smoke.SPLIT_LOG_LINE}\n".encode())  # this process, at the descriptor
        os.write(2, b"an unrelated line\n")
        return 7

    result, lines = smoke.split_attention_lines(run)
    assert (result, lines) == (7, 2)
    err = capfd.readouterr().err
    assert err.count(smoke.SPLIT_LOG_LINE) == 2 and "an unrelated line" in err


def test_descriptor_restored_after_a_failing_run(smoke, capfd):
    def run():
        _child_writes("before the failure")
        raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        smoke.split_attention_lines(run)
    os.write(2, b"after\n")
    err = capfd.readouterr().err
    assert "before the failure" in err and "after" in err


def test_main_fails_without_the_line(smoke, monkeypatch):
    monkeypatch.setattr(smoke, "smoke", lambda: 0)
    assert smoke.main() == 1  # every other check passed, but no verify took the split


def test_main_passes_with_the_line_and_keeps_a_failure(smoke, monkeypatch):
    def passing():
        _child_writes(f"DDTREE: {smoke.SPLIT_LOG_LINE}")
        return 0

    monkeypatch.setattr(smoke, "smoke", passing)
    assert smoke.main() == 0

    def failing():
        _child_writes(f"DDTREE: {smoke.SPLIT_LOG_LINE}")
        return 1

    monkeypatch.setattr(smoke, "smoke", failing)
    assert smoke.main() == 1


def test_the_line_looked_for_is_the_one_the_attention_logs(smoke):
    """The in-tree smoke runs without the plugin, so it names the line itself: the same text
    ``ddtree_attention`` logs when a verify takes the split (that it is logged:
    ``test_tree_attention.test_attention_hook_interpreted``)."""
    from sglang_ddtree.srt.ddtree_attention import verify_backend

    assert smoke.SPLIT_LOG_LINE == verify_backend.SPLIT_LOG_LINE
