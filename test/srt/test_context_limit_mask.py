"""A full captured batch at the context limit with a wide fixed tree (``testing.context_limit``):
every request returns its full length and the engine keeps serving. The verify's FULL_MASK is
sized on the host from the reserved lengths (committed + 2 W), which near the limit pass the
context; the target graph's mask buffer holds max graph bs x W x (context + W) cells."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu


def test_full_graph_batch_at_the_context_limit(tmp_path, run_gpu_check):
    summary = run_gpu_check(
        str(tmp_path), "sglang_ddtree.testing.context_limit", [], "context_limit_summary.json", 600
    )
    assert summary["passed"], json.dumps(summary, indent=1)[:4000]
    assert len(summary["rounds"]) == 3
