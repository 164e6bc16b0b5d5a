"""Shared pytest setup: the `gpu` marker skips cleanly on machines without CUDA; benchmark
scripts (``benchmark/ddtree/*.py``, not a package) load as modules for their CPU tests; Triton
kernels' logic runs on the CPU under Triton's interpreter (`run_interpreted`)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARK_DIR = Path(__file__).resolve().parents[2] / "benchmark" / "ddtree"


def _load_benchmark(name: str):
    """Import ``benchmark/ddtree/<name>.py`` as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARK_DIR / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def load_benchmark():
    return _load_benchmark


def _run_interpreted(code: str, ok_line: str, *args: str) -> None:
    """Run ``code`` (with ``args`` in sys.argv) in a fresh interpreter with TRITON_INTERPRET=1,
    from this folder, and assert it exits 0 and prints ``ok_line``. A subprocess because the
    interpreter flag is read when triton is imported."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed")
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=Path(__file__).parent,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert ok_line in out.stdout


@pytest.fixture(scope="session")
def run_interpreted():
    return _run_interpreted


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
