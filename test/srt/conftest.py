"""Shared pytest setup: the `gpu` marker skips cleanly on machines without CUDA; benchmark
scripts (``benchmark/ddtree/*.py``, not a package) load as modules for their CPU tests; Triton
kernels' logic runs on the CPU under Triton's interpreter (`run_interpreted`)."""

import ast
import functools
import importlib.util
import json
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


@pytest.fixture(scope="session")
def gen():
    """``upstream/generate.py`` (the in-tree patch and series generator) as a module."""
    path = Path(__file__).resolve().parents[2] / "upstream" / "generate.py"
    spec = importlib.util.spec_from_file_location("ddtree_upstream_generate", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def pristine(gen):
    """``pristine(version)``: that SGLang release's sources as the generator finds them (never
    ``$SGLANG_DDTREE_SGLANG_SRC`` of another version), its wheel downloaded into
    ``.upstream-cache/`` where none is cached; a skip where there is none and no network."""

    def find(version: str):
        try:
            src = gen.find_source(version=version, download=False)
            if src.version() != version:
                raise RuntimeError(f"{src.label} is SGLang {src.version()}")
        except (RuntimeError, SystemExit):
            try:
                wheel = gen._cached_wheel(version) or gen.download_wheel(version)
            except (RuntimeError, OSError) as e:
                pytest.skip(f"pristine SGLang {version} sources unavailable: {e}"[:500])
            src = gen.Source(wheel, f"wheel {wheel.name}", version)
        src.base = version
        return src

    return find


@pytest.fixture(scope="session")
def source(gen):
    """Pristine SGLang 0.5.17's sources as ``upstream/generate.py`` finds them (an installed
    copy, the ``.upstream-cache/`` wheel, else ``pip download``), or a skip without them or
    without the formatters the generator writes SGLang's code with (``gen.formatter_python``:
    ``$SGLANG_DDTREE_FORMAT_PYTHON``, this interpreter, or an environment it makes with pip)."""
    try:
        src = gen.find_source()
    except Exception as e:  # no network, no cache, no installed sglang 0.5.17
        pytest.skip(f"pristine SGLang {gen.SGLANG_VERSION} sources unavailable: {e}")
    try:
        gen.formatter_python(src.base)
    except Exception as e:  # no network, nothing cached
        pytest.skip(f"SGLang {src.base}'s formatters unavailable ({gen.FORMATTERS[src.base]}): {e}")
    return src


def pristine_functions(source, path: str, names: list[str]) -> dict:
    """Functions of pristine SGLang's ``path`` (``source``: the `source` fixture's), taken by
    AST and compiled into one scope with ``torch``, so they call each other as in SGLang:
    ``{name: function}``. A name is ``"f"`` at module level or ``"Class.f"`` in a class (found
    as ``f``); annotations and decorators are dropped (their names are not in the scope)."""
    import ast

    found = {}
    for top in ast.parse(source.read(path).decode()).body:
        if isinstance(top, ast.FunctionDef):
            found[top.name] = top
        elif isinstance(top, ast.ClassDef):
            found.update({f"{top.name}.{n.name}": n for n in top.body
                          if isinstance(n, ast.FunctionDef)})  # fmt: skip
    scope = {"torch": torch}
    for name in names:
        node = found[name]
        node.decorator_list, node.returns = [], None
        for a in node.args.args + node.args.kwonlyargs:
            a.annotation = None
        exec(compile(ast.Module([node], []), path, "exec"), scope)
    return {name: scope[name.rsplit(".", 1)[-1]] for name in names}


def _interpret(code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` (with ``args`` in sys.argv) in a fresh interpreter with TRITON_INTERPRET=1, from
    this folder. A subprocess because the interpreter flag is read when triton is imported."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed")
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=Path(__file__).parent,
        env=dict(os.environ, TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _run_interpreted(code: str, ok_line: str, *args: str) -> None:
    """Run ``code`` under Triton's interpreter (`_interpret`); assert it exits 0 and prints
    ``ok_line``."""
    out = _interpret(code, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ok_line in out.stdout


# Some Triton interpreters (3.6 with NumPy 2) hand program ids over as one-element arrays, and a
# `range` bounded by a value loaded at such an offset fails with "only 0-dimensional arrays can
# be converted to Python scalars". Compiled kernels are unaffected.
_LOADED_LOOP_BOUND = """
import torch
import triton
import triton.language as tl

@triton.jit
def count(N, Out):
    b = tl.program_id(0)
    acc = tl.zeros([1], tl.int32)
    for i in range(0, tl.load(N + b), 2):
        acc += 1
    tl.store(Out + b + tl.arange(0, 1), acc)

out = torch.zeros(2, dtype=torch.int32)
count[(2,)](torch.tensor([3, 4], dtype=torch.int32), out)
assert out.tolist() == [2, 2], out
print("loaded loop bound OK")
"""


@functools.cache
def interpreter_bounds_loops_by_loads() -> bool:
    """Whether this Triton's interpreter runs a loop bounded by a loaded value
    (`_LOADED_LOOP_BOUND`): True, or False on exactly that limitation; any other failure of the
    probe is an error, not a skip."""
    out = _interpret(_LOADED_LOOP_BOUND)
    if out.returncode == 0 and "loaded loop bound OK" in out.stdout:
        return True
    assert "only 0-dimensional arrays" in out.stderr, out.stderr[-3000:]
    return False


@pytest.fixture(scope="session")
def run_interpreted():
    return _run_interpreted


def graph_replayed(fn):
    """``(result, graph)``: ``fn()`` captured in a CUDA graph (``fn`` already run once: compiled,
    warmed up) and replayed once; the graph is returned to keep the result's memory alive."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    graph.replay()
    torch.cuda.synchronize()
    return result, graph


def _cuda_and_sglang_missing() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed"
    return None


def _run_gpu_check(
    out_dir: str, module: str, args: list[str], summary: str, timeout: int, env=None
):
    """Run ``python -m module --out out_dir *args`` (an end-to-end check that starts SGLang
    servers; ``env``: variables added to this process's) and return its JSON summary
    ``out_dir/summary``; skip without CUDA or SGLang. The module's output is kept in
    ``out_dir/<name>_stdout.log``."""
    why = _cuda_and_sglang_missing()
    if why:
        pytest.skip(why)
    cmd = [sys.executable, "-m", module, "--out", out_dir, *args]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {}))
    )
    with open(os.path.join(out_dir, f"{module.rsplit('.', 1)[-1]}_stdout.log"), "w") as f:
        f.write(proc.stdout + proc.stderr)
    path = os.path.join(out_dir, summary)
    assert os.path.exists(path), (proc.stdout + proc.stderr)[-4000:]
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def run_gpu_check():
    return _run_gpu_check


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def top_level_names(source: str | bytes) -> set[str]:
    """Names a module defines at its top level (functions, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names
