"""Faults and load on a launched DDTREE server, on a CUDA machine with sglang 0.5.17
(``make test-gpu``): runs ``python -m sglang_ddtree.testing.faults`` (see that module for the
cases and sizes) and asserts on each case of its summary."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def summary(tmp_path_factory, run_gpu_check):
    out = os.environ.get("DDTREE_FAULTS_OUT") or str(tmp_path_factory.mktemp("faults"))
    return run_gpu_check(out, "sglang_ddtree.testing.faults", [], "faults_summary.json", 1500)


@pytest.mark.parametrize(
    "case",
    [
        "context_limit",
        "aborts",
        "retraction",
        "chunked_prefill",
        "radix",
        "load",
        "logprob_mix",
        "every_token_held_back",
    ],
)
def test_fault_case(summary, case):
    assert summary[case]["passed"], json.dumps(summary[case])


def test_server_idles_without_leak(summary):
    assert summary["serving_after_idle"] and not summary["log_leak"], json.dumps(summary)
    assert not summary["log_traceback"]
