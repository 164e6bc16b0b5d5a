"""Benchmarks on a machine that cannot run them: a message and a non-zero exit, not a
traceback or a row of failures with exit code 0."""

import sys

import pytest
import torch


def test_bench_core_needs_cuda(load_benchmark, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible")
    mod = load_benchmark("bench_core")
    monkeypatch.setattr(sys, "argv", ["bench_core.py"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        mod.main()


def test_bench_step_needs_sglang_and_cuda(load_benchmark, monkeypatch, tmp_path):
    from sglang_ddtree.serve import serving_unavailable

    mod = load_benchmark("bench_step")
    if serving_unavailable() is None:
        pytest.skip("this machine runs SGLang engines")
    monkeypatch.setattr(sys, "argv", ["bench_step.py", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="runs SGLang engines on a GPU"):
        mod.main()
