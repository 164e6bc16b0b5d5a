"""Faults and load on a launched DDTREE server, on a CUDA machine with sglang 0.5.17
(``make test-gpu``): runs ``python -m sglang_ddtree.testing.faults`` (see that module for the
cases and sizes) and asserts on each case of its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    try:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        import sglang  # noqa: F401
    except ImportError as e:
        pytest.skip(f"{type(e).__name__}: {e}")
    out = os.environ.get("DDTREE_FAULTS_OUT") or str(tmp_path_factory.mktemp("faults"))
    cmd = [sys.executable, "-m", "sglang_ddtree.testing.faults", "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    path = os.path.join(out, "faults_summary.json")
    assert os.path.exists(path), (proc.stdout + proc.stderr)[-4000:]
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize(
    "case", ["context_limit", "aborts", "retraction", "chunked_prefill", "radix", "load"]
)
def test_fault_case(summary, case):
    assert summary[case]["passed"], json.dumps(summary[case])


def test_server_idles_without_leak(summary):
    assert summary["serving_after_idle"] and not summary["log_leak"], json.dumps(summary)
    assert not summary["log_traceback"]
