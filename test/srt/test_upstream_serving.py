"""The generated in-tree form of each base against that base's own serving code (read in its
pristine sources; CPU only): the scheduler's call of the draft worker's constructor binds to
``DDTreeWorkerV2.__init__``; every attribute the DDTREE modules read off the worker as DFLASH's
is DFLASH's own (its ``__getattr__`` would hand a missing one to the target worker); the split
verify writes KV as the base's backends do; and, where an interpreter imports the base's
SGLang (``$SGLANG_DDTREE_SMOKE_PYTHON``), the base's argument resolution with DDTREE resolves
W and B, the budget schedule survives the pickling to the schedulers, and the spec bag's
scoped override gives the drafter's block B while DFLASH builds.

Sources come as in ``test_upstream_patch.py`` (the generator's cache or a download); without
them the tests of that base skip.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASES = ("0.5.17", "0.5.23")
SPEC = "python/sglang/srt/speculative"
WORKER = f"{SPEC}/ddtree_worker_v2.py"
# The modules that read the worker as DFLASH's: {file: names the worker is read through}.
DFLASH_READERS = {
    WORKER: ("self",),
    f"{SPEC}/ddtree_step.py": ("dflash",),
    f"{SPEC}/ddtree_kv_commit.py": ("dflash",),
    f"{SPEC}/ddtree_glue_warmup.py": ("worker",),
}
VERIFY_MODULES = (
    f"{SPEC}/ddtree_attention/triton_backend.py",
    f"{SPEC}/ddtree_attention/flashmla_backend.py",
)


@pytest.fixture(scope="module", params=BASES)
def src(gen, request):
    try:
        return gen.find_source(version=request.param)
    except (Exception, SystemExit) as e:  # no network, no cache, no installed copy
        pytest.skip(f"pristine SGLang {request.param} sources unavailable: {e}")


@pytest.fixture(scope="module")
def added(gen, src):
    """The files the base's patch adds, as generated (before formatting)."""
    return gen.new_files(src.base, formatted=False)


def _tree(src, path: str) -> ast.Module:
    return ast.parse(src.read(path).decode())


def _function(tree: ast.AST, cls: str, name: str) -> ast.FunctionDef:
    klass = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _signature(fn: ast.FunctionDef) -> inspect.Signature:
    """``fn``'s signature, from a stub with its arguments (defaults None, no annotations)."""
    args = copy.deepcopy(fn.args)
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [d and ast.Constant(None) for d in args.kw_defaults]
    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
        if a is not None:
            a.annotation = None
    scope: dict = {}
    exec(f"def stub({ast.unparse(args)}): pass", scope)
    return inspect.signature(scope["stub"])


def _draft_worker_call(src) -> tuple[list, dict]:
    """The positional and keyword names of the base's scheduler's draft worker construction:
    ``DraftWorkerClass(**draft_worker_kwargs)`` with ``draft_worker_kwargs = dict(...)``."""
    fn = _function(_tree(src, "python/sglang/srt/managers/scheduler.py"), "Scheduler",
                   "maybe_init_draft_worker")  # fmt: skip
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "DraftWorkerClass"]  # fmt: skip
    assert len(calls) == 1 and [k.arg for k in calls[0].keywords] == [None]
    kwargs_name = calls[0].keywords[0].value.id
    built = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
             and [getattr(t, "id", None) for t in n.targets] == [kwargs_name]]  # fmt: skip
    assert len(built) == 1 and built[0].func.id == "dict" and not built[0].args
    return [], {k.arg: object() for k in built[0].keywords}


def test_the_schedulers_draft_worker_call_binds_to_the_worker(src, added):
    args, kwargs = _draft_worker_call(src)
    assert {"server_args", "gpu_id", "target_worker"} <= set(kwargs)
    init = _function(ast.parse(added[WORKER]), "DDTreeWorkerV2", "__init__")
    _signature(init).bind(object(), *args, **kwargs)  # raises TypeError where it would
    # The worker hands DFLASH's constructor what the scheduler handed it: DFLASH's own binds.
    parent = _function(_tree(src, f"{SPEC}/dflash_worker_v2.py"), "DFlashWorkerV2", "__init__")
    _signature(parent).bind(object(), *args, **kwargs)


def _is_super_init(node) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "super().__init__"


def test_dflash_builds_with_the_drafters_block(src, added):
    """DFLASH sizes its block buffers and the drafter's block from the drafter tokens it reads
    while it builds; the worker makes that B where the base's DFLASH reads it: a scoped
    override of the spec bag's leaf (a sealed ``ServerArgs`` has no ``override``), or the
    arguments handed to it (a copy overridden, where ``ServerArgs.override`` exists)."""
    dflash = _function(_tree(src, f"{SPEC}/dflash_worker_v2.py"), "DFlashWorkerV2", "__init__")
    reads_bag = "get_spec().speculative_num_draft_tokens" in ast.unparse(dflash)
    init = _function(ast.parse(added[WORKER]), "DDTreeWorkerV2", "__init__")
    server_args = _tree(src, "python/sglang/srt/server_args.py")
    has_override = any(isinstance(n, ast.FunctionDef) and n.name == "override"
                       for n in ast.walk(server_args))  # fmt: skip
    overrides = [n for n in ast.walk(init) if isinstance(n, ast.Call)
                 and getattr(n.func, "attr", None) == "override"]  # fmt: skip
    assert len(overrides) == 1 and [k.arg for k in overrides[0].keywords] == [
        "speculative_num_draft_tokens"]  # fmt: skip
    assert ast.unparse(overrides[0].keywords[0].value) == "shape.block_size"
    receiver = ast.unparse(overrides[0].func.value)
    if reads_bag:
        assert receiver == "get_spec()", (src.base, receiver)
        scoped = [w for w in ast.walk(init) if isinstance(w, ast.With)
                  and w.items[0].context_expr is overrides[0]]  # fmt: skip
        assert scoped and any(_is_super_init(n) for s in scoped[0].body for n in ast.walk(s))
    else:
        assert has_override, f"SGLang {src.base}'s ServerArgs has no override"
        parent = [n for n in ast.walk(init) if _is_super_init(n)]
        assert len(parent) == 1 and ast.unparse(parent[0].args[0]) == receiver


def _dflash_names(src, edited: dict) -> set[str]:
    """What DFlashWorkerV2 (and its base class) defines, as the series leaves them (``edited``:
    `gen.edited_files`; the series' first part adds public methods to DFLASH's worker):
    methods, properties, class attributes and every ``self.NAME`` it assigns."""
    names = set()
    for path, cls in ((f"{SPEC}/dflash_worker_v2.py", "DFlashWorkerV2"),
                      (f"{SPEC}/base_spec_worker.py", "BaseSpecWorker")):  # fmt: skip
        tree = ast.parse(edited[path][1]) if path in edited else _tree(src, path)
        klass = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
        for node in ast.walk(klass):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for sub in ast.walk(t):
                        if (
                            isinstance(sub, ast.Attribute)
                            and getattr(sub.value, "id", "") == "self"
                        ):
                            names.add(sub.attr)
                        elif isinstance(sub, ast.Name):
                            names.add(sub.id)
    return names


def _worker_reads(text: str, through: tuple[str, ...]) -> set[str]:
    """The attributes read off the worker (``NAME.attr`` or ``self.NAME.attr`` for a name of
    ``through``)."""
    reads = set()
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        base = node.value
        if isinstance(base, ast.Attribute) and getattr(base.value, "id", None) == "self":
            base = ast.Name(base.attr)  # self.dflash.attr
        if isinstance(base, ast.Name) and base.id in through:
            reads.add(node.attr)
    return reads


def test_every_dflash_internal_ddtree_reads_is_dflashs(gen, src, added):
    """What the DDTREE modules read off the worker and DDTREE does not define itself is
    defined by the base's DFLASH worker: a name it lacks would be handed, by DFLASH's
    ``__getattr__``, to the target worker, which has no drafter block buffers."""
    worker = ast.parse(added[WORKER])
    klass = next(n for n in ast.walk(worker)
                 if isinstance(n, ast.ClassDef) and n.name == "DDTreeWorkerV2")  # fmt: skip
    own = {n.name for n in klass.body if isinstance(n, ast.FunctionDef)}
    own |= {t.attr for n in ast.walk(klass) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) == "self"}  # fmt: skip
    own |= {e.attr for n in ast.walk(klass) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Attribute)}  # fmt: skip
    # DDTREE's step and KV commit, which read the worker too, live beside it (not DFLASH's).
    own |= {"ddtree_step", "_penalty_rows"}
    dflash = _dflash_names(src, gen.edited_files(src))
    # The worker module's other classes (its graph counts) read their own ``self``.
    texts = {path: added[path] for path in DFLASH_READERS} | {WORKER: ast.unparse(klass)}
    reads = {path: _worker_reads(texts[path], through) - own
             for path, through in DFLASH_READERS.items()}  # fmt: skip
    missing = {path: sorted(r - dflash) for path, r in reads.items() if r - dflash}
    assert missing == {}, f"SGLang {src.base}'s DFlashWorkerV2 lacks them"
    used = set().union(*reads.values())
    # DFLASH's draft-block and drafter-KV methods the step drives are among what was checked.
    assert {"prepare_draft_block", "forward_draft_block", "append_target_hidden_to_draft_kv_by_loc",
            "target_worker"} <= used  # fmt: skip


def test_the_split_verify_writes_kv_as_the_bases_backends_do(src, added):
    """Where the base's backends write KV through ``KVWriteLoc.for_batch`` (its physical mark,
    which a unified pool demands), the split verify writes through it too, and it reads only untranslated ids
    (the translator the base's backends keep); elsewhere the batch's bare ``out_cache_loc``."""
    own = src.read("python/sglang/srt/layers/attention/triton_backend.py").decode()
    takes_write_loc = re.search(r"KVWriteLoc\.for_batch\(\s*forward_batch\b", own) is not None
    for path in VERIFY_MODULES:
        tree = ast.parse(added[path])
        writes = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and getattr(n.func, "attr", None) == "set_kv_buffer"]  # fmt: skip
        assert writes, path
        for call in writes:
            loc = ast.unparse(call.args[1])
            want = "KVWriteLoc.for_batch(forward_batch)" if takes_write_loc else (
                "forward_batch.out_cache_loc")  # fmt: skip
            assert loc == want, (src.base, path, loc)
        text = added[path]
        backend = src.read("python/sglang/srt/layers/attention/"
                           + Path(path).name).decode()  # fmt: skip
        if "self.kv_index_translator =" in backend:
            assert "backend.kv_index_translator.reads_are_translated" in text, (src.base, path)
            assert "_translate_kv_loc" not in text, (src.base, path)  # gone from the base


# --- the base's argument resolution and spec bag, run (an interpreter with its SGLang) ------
_RESOLVE = r"""
import json, pickle, sys
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.runtime_context import get_context, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.ddtree_worker_v2 import schedule_from_args

pair, schedule = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
flags = {"speculative_ddtree_budget_schedule": schedule} if schedule else {}
args = ServerArgs(model_path=pair + "/target", speculative_algorithm="DDTREE",
                  speculative_draft_model_path=pair + "/drafter", device="cuda",
                  attention_backend="triton", sampling_backend="flashinfer", **flags)
args.resolve_once()
child = pickle.loads(pickle.dumps(args))  # as the launcher hands it to the schedulers
view = resolved_view(child)
out = {"W": view.speculative_num_draft_tokens, "B": view.speculative_dflash_block_size,
       "travelled": getattr(child, "_ddtree_budget_schedule", None),
       "schedule": str(schedule_from_args(view))}
get_context().set_server_args(child)
with get_spec().override(speculative_num_draft_tokens=out["B"]):
    out["inside"] = get_spec().speculative_num_draft_tokens
out["after"] = get_spec().speculative_num_draft_tokens
print(json.dumps(out))
"""


def _patched_site(gen, src, tmp_path) -> Path:
    """A copy of pristine SGLang's package with the base's generated files over it."""
    site = tmp_path / "site"
    if src.where.is_dir():
        shutil.copytree(src.where / "sglang", site / "sglang")
    else:
        import zipfile

        with zipfile.ZipFile(src.where) as whl:
            whl.extractall(site, [n for n in whl.namelist() if n.startswith("sglang/")])
    files = dict(gen.new_files(src.base, formatted=False))
    files.update({p: edited for p, (_, edited) in gen.edited_files(src).items()})
    for path, text in files.items():
        if path.startswith("python/"):
            (site / path[len("python/") :]).parent.mkdir(parents=True, exist_ok=True)
            (site / path[len("python/") :]).write_text(text)
    return site


def test_the_bases_resolution_carries_the_schedule_to_the_schedulers(gen, src, tmp_path):
    """On a base whose arguments are a sealed record resolved once (``resolve_once``):
    resolution declares W and B, the schedule survives the pickling, the worker reads it back,
    and the spec bag's scoped override gives B inside, W after."""
    if b"def resolve_once(" not in src.read("python/sglang/srt/server_args.py"):
        pytest.skip(f"SGLang {src.base} resolves its arguments as it builds them (no record)")
    python = os.environ.get("SGLANG_DDTREE_SMOKE_PYTHON") or sys.executable
    site = _patched_site(gen, src, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run([python, "-c", "import sglang.srt.server_args"], env=env,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"SGLang {src.base} does not import under {python}: "
                    f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")  # fmt: skip
    pair = REPO / "python" / "sglang_ddtree" / "pair" / "assets"
    block = json.loads((pair / "drafter" / "config.json").read_text())["block_size"]
    for schedule, want in ((None, f"1:{2 * block},4:{block}"), ("1:33,4:17", "1:33,4:17")):
        r = subprocess.run([python, "-c", _RESOLVE, str(pair), *([schedule] if schedule else [])],
                           env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        widest = max(int(step.split(":")[1]) for step in want.split(","))
        assert out == {"W": widest, "B": block, "travelled": want, "schedule": want,
                       "inside": block, "after": widest}, (src.base, schedule)  # fmt: skip
