"""GPU smoke of the series, part by part: ``python upstream/smoke_series.py --site DIR``.

``DIR`` holds an installed, pristine SGLang 0.5.17 (``DIR/sglang``, with sgl_kernel and the
rest of its stack beside it; ``--base 0.5.23``: SGLang 0.5.23 and ``upstream/0.5.23/series/``).
Its ``sglang`` package is copied to a scratch tree laid out as SGLang's repository
(``python/sglang``), and the committed parts (``upstream/series/*.patch``) are applied there in
order with ``git apply``. After each part:

- the in-tree tests the part adds (``test/registered/.../test_*.py``) run with
  SGLang's own test harness, the patched tree first on the path; the two that launch servers
  (``SERVER_TESTS``) name SGLang's DFLASH test models (``DEFAULT_TARGET_MODEL_DFLASH`` and its
  drafter, from the model hub), which this smoke stands in for with the trained pair shipped in
  ``sglang_ddtree.pair``: links at those names in the directory the tests run from, which the
  servers resolve as local model directories before the hub (``--hub-models``: no stand-in);
- the kernel benchmarks the part adds (``benchmark/kernels/ddtree/bench_ddtree_*.py``) run
  one small cell each (``--quick``);
- after the part that edits SGLang's attention backends, and after the last part, an engine
  without speculation serves the tiny random pair (the edits are inert for other algorithms);
- after the part that registers DDTREE, ``upstream/smoke_in_tree.py`` runs (greedy, the
  sampled law and its power, a refusal, the split attention) on the patched tree.

Prints one JSON line per part and a summary line (each check's whole output, a launched
server's included, is kept in ``--logs DIR``); exit status 0 when every step passed.
``--parts N``: stop after part N. ``--from N``: apply the parts before N without running their
checks (a smoke split over several calls). ``--only A.py,B.py``: of the checked parts' tests and
benchmarks, run only those. ``--apply-only``: apply and list, run nothing (any machine).
``--cpu``: after each part, import every module the series has added or edited so far (new
modules, edited SGLang files, tests and benchmarks, in a fresh interpreter) and run the unit
tests the part adds (not the server tests), their CUDA cases skipping; no benchmark, engine or
in-tree smoke, so it runs on a CPU machine where that SGLang imports, beside the plugin too.
``--stand-in NAME`` (with ``--cpu``): module ``NAME`` (a CUDA extension that cannot load here)
imports as a stand-in whose attributes are placeholders, in the import check only; the summary
names it.
Servers are launched as ``sglang serve`` (SGLang's test utilities), so a ``sglang`` command for
this interpreter is put first on PATH (an unpacked site has no console scripts).
Run it where the plugin is not installed: its entry point would register DDTREE as well.
SGLang's test utilities import its benchmark datasets, hence Hugging Face ``datasets``, at
module level; where that package is missing (an offline bundle) a stand-in module whose
``load_dataset`` raises is put last on the path, and the summary line names it (no check here
loads a dataset).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fork import generator  # noqa: E402  (upstream/generate.py as a module)

REPO = Path(__file__).resolve().parents[1]
SERIES = REPO / "upstream" / "series"  # the first base's; series_dir(base) for any
TESTS = "test/registered/"  # the in-tree tests a part adds: DDTREE's, and part 00's unit test
BENCHMARKS = "benchmark/kernels/ddtree"
SERVER_TESTS = {"test_ddtree.py", "test_ddtree_refusals.py"}  # name SGLang's hub models
PAIR = REPO / "python" / "sglang_ddtree" / "pair" / "assets"
# SGLang's test constants the server tests launch, and the shipped pair's model standing in.
MODEL_STAND_INS = {"DEFAULT_TARGET_MODEL_DFLASH": "target", "DEFAULT_DRAFT_MODEL_DFLASH": "drafter"}
BACKEND_EDITS = "layers/attention/triton_backend.py"
# An interpreter where a base's SGLang imports (its torch and Python dependencies), for the CPU
# checks that run this smoke with --cpu (test_upstream_patch.py); unset: the test's own.
SMOKE_PYTHON_ENV = "SGLANG_DDTREE_SMOKE_PYTHON"

_SERVE_WITHOUT_SPECULATION = """
import sglang as sgl
from sglang_ddtree.testing.e2e import engine_kwargs
from sglang_ddtree.testing.tiny_models import make_tiny_pair
import tempfile
target, _ = make_tiny_pair(tempfile.mkdtemp())
eng = sgl.Engine(**engine_kwargs(target, None, None))
out = eng.generate(input_ids=[[11, 12, 13, 14]], sampling_params={"max_new_tokens": 8})
eng.shutdown()
assert len(out[0]["output_ids"] if isinstance(out, list) else out["output_ids"]) == 8
print("served without speculation")
"""


def parts(series: Path = SERIES) -> list[Path]:
    return sorted(series.glob("[0-9][0-9]-*.patch"))


def touched_files(patch: Path) -> list[str]:
    """Paths the part creates or edits (its ``+++ b/PATH`` lines)."""
    return [line[len("+++ b/") :] for line in patch.read_text().splitlines()
            if line.startswith("+++ b/")]  # fmt: skip


# One fresh interpreter per part: import each (module name or file path), a stand-in for every
# module named in argv[2]; print {name: "ExcType: message"} of the failures as JSON.
_IMPORT_CHECK = """
import importlib, importlib.abc, importlib.machinery, importlib.util, json, sys, traceback, types

class _Placeholder:
    def __init__(self, *args, **kwargs):
        pass
    def __call__(self, *args, **kwargs):
        raise RuntimeError("a stand-in of smoke_series --stand-in")
    def __getattr__(self, name):
        return _Placeholder()

class _StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = names
    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda attr: _Placeholder
        return module
    def exec_module(self, module):
        pass

items, stand_ins = json.loads(sys.argv[1]), json.loads(sys.argv[2])
if stand_ins:
    sys.meta_path.insert(0, _StandIns(stand_ins))
failed = {}
for name in items:
    try:
        if name.endswith(".py"):
            spec = importlib.util.spec_from_file_location("smoke_" + name.replace("/", "_")[:-3], name)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        else:
            importlib.import_module(name)
    except BaseException as e:
        failed[name] = (type(e).__name__ + ": " + str(e)).strip()[-500:]
print(json.dumps(failed))
"""


# From the part that registers DDTREE on (``--cpu``): DDTREE is a member of the enum, with its
# predicate and the DFLASH family's, and SGLang's parser has the two flags (derived from the fields the edit adds).
_REGISTERED_CHECK = """
import argparse
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
algo = SpeculativeAlgorithm.from_string("DDTREE")
assert algo is SpeculativeAlgorithm.DDTREE and algo.is_ddtree(), algo
assert algo.is_dflash_family() and not algo.is_dflash()
assert SpeculativeAlgorithm.from_string("DFLASH").is_ddtree() is False
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
ns = parser.parse_args(["--model-path", "m", "--speculative-algorithm", "DDTREE",
                        "--speculative-ddtree-topk", "4",
                        "--speculative-ddtree-budget-schedule", "1:32,4:16"])
assert (ns.speculative_ddtree_topk, ns.speculative_ddtree_budget_schedule) == (4, "1:32,4:16")
print("DDTREE registered in-tree; its server flags parse")
"""


def import_targets(files: list[str]) -> list[str]:
    """What the import check imports of ``files`` (repository paths): the Python modules
    under ``python/`` by module name, the tests and benchmarks by path, sorted."""
    out = []
    for path in sorted(set(files)):
        if not path.endswith(".py"):
            continue
        if path.startswith("python/"):
            name = path[len("python/") : -len(".py")].replace("/", ".")
            out.append(name[: -len(".__init__")] if name.endswith(".__init__") else name)
        else:
            out.append(path)
    return out


def import_check(targets: list[str], env: dict, root: Path, stand_in: list[str]) -> dict:
    """``{"imported": n, "failed": {name: error}}`` of importing ``targets`` in one fresh
    interpreter run from ``root`` (the scratch tree)."""
    r = subprocess.run(
        [sys.executable, "-c", _IMPORT_CHECK, json.dumps(targets), json.dumps(stand_in)],
        cwd=root, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return {"imported": 0, "failed": {"<import check>": (r.stderr or r.stdout)[-1500:]}}
    failed = json.loads(lines[-1])
    return {"imported": len(targets) - len(failed), "failed": failed}


def added_files(patch: Path) -> list[str]:
    """Paths the part creates (``--- /dev/null`` then ``+++ b/PATH``)."""
    lines = patch.read_text().splitlines()
    return [
        b[len("+++ b/") :]
        for a, b in zip(lines, lines[1:])
        if a == "--- /dev/null" and b.startswith("+++ b/")
    ]


_DATASETS_STAND_IN = """
def load_dataset(*args, **kwargs):
    raise RuntimeError("Hugging Face datasets is not installed; smoke_series stands in for it")
"""


def stand_ins(site: Path, root: Path) -> list[Path]:
    """Directories of stand-in modules for SGLang test imports missing beside ``site``."""
    if (site / "datasets").is_dir() or importlib.util.find_spec("datasets") is not None:
        return []
    shim = root / "stand_ins"
    (shim / "datasets").mkdir(parents=True, exist_ok=True)
    (shim / "datasets" / "__init__.py").write_text(_DATASETS_STAND_IN.lstrip())
    return [shim]


def model_stand_ins(tree: Path, workdir: Path) -> dict[str, str]:
    """Links in ``workdir`` at the hub names SGLang's test utilities (in ``tree``, the patched
    package) give the server tests' models, each to the shipped pair's model standing in for
    it; returns {hub name: pair directory}. A relative model path that exists is a local
    directory to SGLang and Hugging Face, so servers launched from ``workdir`` load the pair."""
    source = (tree / "sglang" / "test" / "test_utils.py").read_text()
    names = {}
    for model in MODEL_STAND_INS.values():  # else each server dies at start, naming the hub model
        if not (PAIR / model / "model.safetensors").is_file():
            raise SystemExit(
                f"smoke_series: the shipped pair's {model} weights are missing "
                f"({PAIR / model / 'model.safetensors'}); the server tests load them "
                "(or pass --hub-models)"
            )
    for constant, model in MODEL_STAND_INS.items():
        found = re.search(rf'^{constant}\s*=\s*"([^"]+)"', source, re.MULTILINE)
        if found is None:
            raise SystemExit(f"smoke_series: {constant} not in SGLang's test_utils.py")
        link = workdir / found.group(1)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(PAIR / model, target_is_directory=True)
        names[found.group(1)] = str(PAIR / model)
    return names


def sglang_command(root: Path) -> Path:
    """A directory holding a ``sglang`` command for this interpreter (SGLang's console script):
    its test utilities launch servers as ``sglang serve``, and an unpacked site has no console
    scripts. The patched tree is first on PYTHONPATH, so it is the one served. The call sits
    under a main guard, as in pip's console scripts: the server spawns its schedulers, and a
    spawned child re-runs this file as its main module."""
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "sglang"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom sglang.cli.main import main\n\n"
        'if __name__ == "__main__":\n    sys.exit(main())\n'
    )
    script.chmod(0o755)
    return bindir


def helpers_path(root: Path) -> Path:
    """A directory holding only this repository's ``sglang_ddtree`` package (the tiny pair and
    the test helpers), not ``python/`` itself: an ``sglang_ddtree.egg-info`` left there by an
    editable install would publish the plugin's entry point to every process on the path."""
    helpers = root / "helpers"
    helpers.mkdir(exist_ok=True)
    link = helpers / "sglang_ddtree"
    if not link.is_symlink():
        link.symlink_to(REPO / "python" / "sglang_ddtree", target_is_directory=True)
    return helpers


_PLUGINS = (
    "import importlib.metadata as m; "
    "print(','.join(e.name for e in m.entry_points(group='sglang.srt.plugins')))"
)


def visible_plugins(env: dict) -> list[str]:
    """SGLang plugins (entry points) a process started with ``env`` would load."""
    r = subprocess.run([sys.executable, "-c", _PLUGINS], env=env, capture_output=True, text=True)
    return [name for name in r.stdout.strip().split(",") if name]


def run(cmd: list[str], env: dict, cwd: Path, timeout: float, log: Path) -> dict:
    """Run one check; its whole output (a launched server's included) goes to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out = {"cmd": " ".join(cmd[-2:]), "log": str(log)}
    with open(log, "w") as f:
        try:
            r = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout)  # fmt: skip
            out["ok"] = r.returncode == 0
        except subprocess.TimeoutExpired:
            out.update(ok=False, why=f"timeout {timeout:.0f} s")
    out["tail"] = log.read_text(errors="replace")[-600:]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gen = generator()
    ap.add_argument("--site", required=True, help="directory holding pristine sglang of --base")
    ap.add_argument("--base", choices=gen.BASES, default=gen.BASES[0], help="the SGLang release")
    ap.add_argument("--parts", type=int, default=None, help="stop after this part")
    ap.add_argument(
        "--from",
        dest="first",
        type=int,
        default=0,
        help="check from this part on (earlier: applied)",
    )
    ap.add_argument("--apply-only", action="store_true")
    ap.add_argument(
        "--cpu",
        action="store_true",
        help="after each part: the import check and the unit tests the part adds (a CPU machine)",
    )
    ap.add_argument(
        "--stand-in",
        action="append",
        default=[],
        metavar="MODULE",
        help="with --cpu: a module that cannot load here imports as a stand-in (repeatable)",
    )
    ap.add_argument(
        "--only",
        default=None,
        help="comma list of test or benchmark file names: run only those in the checked parts "
        "(no engine or in-tree smoke then)",
    )
    ap.add_argument(
        "--hub-models",
        action="store_true",
        help="the server tests load SGLang's test models by their hub names (no stand-in)",
    )
    ap.add_argument("--keep", default=None, help="scratch directory (default: a new one)")
    ap.add_argument(
        "--logs", default=None, help="directory for each check's whole output (default: scratch)"
    )
    args = ap.parse_args()
    if args.stand_in and not args.cpu:
        ap.error("--stand-in goes with --cpu")
    series = parts(gen.series_dir(args.base))
    site = Path(args.site).resolve()
    if not (site / "sglang" / "srt").is_dir():
        raise SystemExit(f"smoke_series: no sglang package under {site}")
    root = Path(args.keep or tempfile.mkdtemp(prefix="ddtree_series_"))
    shutil.copytree(site / "sglang", root / "python" / "sglang", dirs_exist_ok=True)
    shims = stand_ins(site, root)
    logs = Path(args.logs) if args.logs else root / "logs"
    env = {
        **os.environ,
        # The patched tree first, the rest of SGLang's stack after it, then this repository's
        # package alone (the tiny pair and the test helpers the smoke uses; not the plugin's
        # entry point), then any stand-in module.
        "PYTHONPATH": os.pathsep.join(
            [str(root / "python"), str(site), str(helpers_path(root)), *map(str, shims)]
        ),
        "PYTHONUNBUFFERED": "1",
        "PATH": os.pathsep.join([str(sglang_command(root)), os.environ.get("PATH", "")]),
    }
    checks_any = not (args.apply_only or args.cpu) and (
        args.parts is None or args.parts >= args.first
    )
    if checks_any and "ddtree" in visible_plugins(env):
        raise SystemExit(
            "smoke_series: the sglang-ddtree plugin is installed here (its entry point would "
            "register DDTREE besides the patched tree): python3 -m pip uninstall sglang-ddtree"
        )
    only = set(args.only.split(",")) if args.only else None
    picked = lambda path: only is None or Path(path).name in only  # noqa: E731
    # The server tests run from here: their hub model names resolve to the stand-ins.
    models_dir = root / "models"
    models_dir.mkdir(exist_ok=True)
    server_env = env if args.hub_models else {**env, "HF_HUB_OFFLINE": "1"}
    stood_in_models: dict[str, str] = {}
    results, ok, touched, serving = [], True, [], False
    for patch in series:
        i = int(patch.name[:2])  # the part's number: 00, the refactor of SGLang's own code, first
        if args.parts is not None and i > args.parts:
            break
        applied = subprocess.run(
            ["git", "apply", "-p1", str(patch)], cwd=root, capture_output=True, text=True
        )
        checked = not args.apply_only and i >= args.first
        step = {"part": patch.name, "applied": applied.returncode == 0, "checked": checked,
                "checks": []}  # fmt: skip
        if applied.returncode != 0:
            step["why"] = applied.stderr[-600:]
        new = added_files(patch)
        touched += touched_files(patch)
        serving = serving or any(p.endswith("ddtree_worker_v2.py") for p in new)
        tests = [p for p in new if p.startswith(TESTS) and Path(p).name.startswith("test_")]
        benchmarks = [p for p in new if p.startswith(BENCHMARKS) and p.endswith(".py")]
        if applied.returncode == 0 and checked and args.cpu:
            step["imports"] = import_check(import_targets(touched), env, root, args.stand_in)
            for test in tests:
                if Path(test).name in SERVER_TESTS:
                    continue
                cmd = [sys.executable, "-m", "unittest", "-v", Path(test).stem]
                log = logs / f"{patch.stem}.{Path(test).stem}.log"
                step["checks"].append(run(cmd, env, root / Path(test).parent, 900, log))
            if serving:
                log = logs / f"{patch.stem}.registered.log"
                script = root / "registered_check.py"
                script.write_text(_REGISTERED_CHECK.lstrip())
                step["checks"].append(run([sys.executable, str(script)], env, root, 600, log))
        elif applied.returncode == 0 and checked:
            for test in filter(picked, tests):
                cmd = [sys.executable, "-m", "unittest", "-v", Path(test).stem]
                log = logs / f"{patch.stem}.{Path(test).stem}.log"
                if Path(test).name not in SERVER_TESTS:
                    step["checks"].append(run(cmd, env, root / Path(test).parent, 900, log))
                    continue
                if not args.hub_models and not stood_in_models:
                    stood_in_models = model_stand_ins(root / "python", models_dir)
                test_env = {**server_env, "PYTHONPATH": os.pathsep.join(
                    [str(root / Path(test).parent), server_env["PYTHONPATH"]])}  # fmt: skip
                step["checks"].append(run(cmd, test_env, models_dir, 1200, log))
            for bench in filter(picked, benchmarks):  # one small cell: it runs, not how fast
                log = logs / f"{patch.stem}.{Path(bench).stem}.log"
                step["checks"].append(run([sys.executable, bench, "--quick"], env, root, 600, log))
            edits_backends = any(BACKEND_EDITS in line for line in patch.read_text().splitlines()
                                 if line.startswith("+++ b/"))  # fmt: skip
            last = i == len(series) or i == args.parts
            if (edits_backends or last) and only is None:
                log = logs / f"{patch.stem}.serve_without_speculation.log"
                step["checks"].append(
                    run([sys.executable, "-c", _SERVE_WITHOUT_SPECULATION], env, root, 600, log)
                )
            if any(p.endswith("ddtree_worker_v2.py") for p in new) and only is None:
                log = logs / f"{patch.stem}.smoke_in_tree.log"
                smoke = [sys.executable, str(REPO / "upstream" / "smoke_in_tree.py")]
                step["checks"].append(run(smoke, env, root, 900, log))
        step["tests_added"] = tests
        step["benchmarks_added"] = benchmarks
        step["ok"] = (
            step["applied"]
            and all(c["ok"] for c in step["checks"])
            and not step.get("imports", {}).get("failed")
        )
        ok = ok and step["ok"]
        results.append(step)
        print(json.dumps(step), flush=True)
        if not step["applied"]:
            break
    stood_in = (
        (["datasets"] if shims else [])
        + [f"model {name}: {path}" for name, path in stood_in_models.items()]
        + [f"module {name} (import check)" for name in args.stand_in]
    )
    print(json.dumps({"series": [r["part"] for r in results], "ok": ok, "tree": str(root),
                      "stand_ins": stood_in}))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
