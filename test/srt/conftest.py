"""Shared pytest setup: the `gpu` marker skips cleanly on machines without CUDA; benchmark
scripts (``benchmark/ddtree/*.py``, not a package) load as modules for their CPU tests."""

import importlib.util
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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
