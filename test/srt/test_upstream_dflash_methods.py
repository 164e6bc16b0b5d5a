"""Part 00 of the series (``upstream/generate.py``'s ``DFLASH_EDITS``): DFLASH's draft block, its
drafter forward and its drafter-KV append as public methods of ``DFlashWorkerV2``, which DFLASH's
decode and the in-tree DDTREE modules both call. On each base's edited ``dflash_worker_v2.py``:
it parses and compiles; each new method's moved statements equal, AST for AST, the statements of
pristine ``forward_batch_generation`` they replaced (moved, not rewritten); the decode calls the
methods there and is otherwise the pristine one; every local the decode reads after them is
bound again. On the generated DDTREE modules: none reads a DFLASH private, and each method they
call on DFLASH's worker exists on the edited class and takes the arguments they pass; DDTREE's
prefill is DFLASH's, logprobs included (the worker part's edit of DFLASH's refusal on 0.5.17).

Pristine sources as the generator finds them (``.upstream-cache/``, downloaded there where
missing and there is network); without them a base's tests skip.
"""

from __future__ import annotations

import ast
import inspect

import pytest

BASES = ("0.5.17", "0.5.23")
DFLASH = "python/sglang/srt/speculative/dflash_worker_v2.py"
# What the in-tree DDTREE modules must not read: DFLASH's privates the plugin reads on 0.5.17.
PRIVATES = {
    "_prepare_dflash_draft_block_unchecked", "_draft_block_ids_buf", "_draft_block_positions_buf",
    "_draft_verify_out_cache_loc_buf", "_ensure_draft_block_buffers", "_draft_block_spec_info",
    "_mask_token_id", "_append_target_hidden_to_draft_kv_by_loc", "_fused_kv_helper",
    "_ensure_workspace",
}  # fmt: skip
# The methods part 00 adds and DDTREE calls: {name: its one moved block or None}.
NEW_METHODS = {
    "prepare_draft_block": "moved",
    "forward_draft_block": "moved",
    "append_target_hidden_to_draft_kv_by_loc": None,
    "new_fused_kv_helper": None,
    "use_fused_kv_helper": None,
}


@pytest.fixture(scope="module", params=BASES)
def worker(gen, pristine, request):
    """``(pristine text, edited text)`` of ``dflash_worker_v2.py`` on the base, as part 00
    leaves it (a later part's edit, the worker part's logprobs one, is not a move)."""
    src = pristine(request.param)
    part00 = {e.name for e in gen.DFLASH_EDITS}
    pristine, edited = gen.edited_files(src, edit_names=part00)[DFLASH]
    return pristine.decode(), edited


def _methods(text: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(text)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DFlashWorkerV2"]
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _dump(stmts) -> list[str]:
    return [ast.dump(s) for s in stmts]


def _body(fn: ast.FunctionDef) -> list[ast.stmt]:
    """The statements of ``fn`` after its docstring."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


def _names(stmts, ctx) -> set[str]:
    return {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ctx)}  # fmt: skip


def _calls_self(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == name and isinstance(n.func.value, ast.Name)
               and n.func.value.id == "self" for n in ast.walk(stmt))  # fmt: skip


def test_edited_worker_parses_and_compiles(worker):
    _, edited = worker
    compile(edited, DFLASH, "exec")
    methods = _methods(edited)
    assert set(NEW_METHODS) <= set(methods)
    assert "_append_target_hidden_to_draft_kv_by_loc" not in methods


def test_moved_methods_are_the_decodes_statements(worker):
    """Each moved method is ``preamble + moved + return``: the preamble's statements are the
    pristine decode's (its locals bound as the decode binds them), the moved ones a contiguous
    run of the pristine decode's statements, and the decode is the pristine one with the runs
    replaced by the calls (and statements rebinding what the moved ones bound), less preamble
    statements only the moved code read."""
    pristine_text, edited = worker
    # The append's rename is an edit of its own (its three occurrences): named back here.
    edited = edited.replace(
        ".append_target_hidden_to_draft_kv_by_loc(", "._append_target_hidden_to_draft_kv_by_loc("
    )
    old = _body(_methods(pristine_text)["forward_batch_generation"])
    new_methods = _methods(edited)
    new = _body(new_methods["forward_batch_generation"])
    old_dump, expected = _dump(old), _dump(old)
    preambles = set()
    for name in (n for n, kind in NEW_METHODS.items() if kind == "moved"):
        fn = new_methods[name]
        body = _body(fn)
        assert isinstance(body[-1], ast.Return), name
        # The preamble: the fewest leading statements, each the pristine decode's, after
        # which the rest (but the return) is a run of the pristine decode's statements whose
        # first the decode no longer holds (moved, not copied).
        runs = [
            (k, i)
            for k in range(len(body) - 4)
            if all(s in old_dump for s in _dump(body[:k])) and ast.dump(body[k]) not in _dump(new)
            for i in range(len(old_dump))
            if old_dump[i : i + len(body) - 1 - k] == _dump(body[k:-1])
        ]
        assert runs, f"{name}: its statements are no run of the pristine decode's"
        k, i = runs[0]
        moved = _dump(body[k:-1])
        assert len(moved) >= 3, name
        preambles |= set(_dump(body[:k]))
        # The moved code reads only its parameters, the preamble and what it binds itself.
        params = {a.arg for a in fn.args.args}
        bound_before = _names(body[:k], ast.Store) | params
        free = _names(body[k:-1], ast.Load) - _names(body[k:-1], ast.Store)
        outer = _names(old[:i], ast.Store)
        assert free & outer <= bound_before, (name, sorted(free & outer - bound_before))
        # Where it was, the decode calls the method.
        (at,) = [j for j, s in enumerate(new) if _calls_self(s, name)]
        expected[expected.index(moved[0]) : expected.index(moved[0]) + len(moved)] = [
            f"<call {name}>"
        ]
    # The decode: the pristine statements, the runs replaced by the calls and what follows them.
    got, j = [], 0
    rebinding = set()
    while j < len(new):
        call = next((n for n in NEW_METHODS if _calls_self(new[j], n)), None)
        if call is None:
            got.append(ast.dump(new[j]))
            j += 1
            continue
        got.append(f"<call {call}>")
        j += 1
        while (
            j < len(new)
            and ast.dump(new[j]) in old_dump
            and not any(_calls_self(new[j], n) for n in NEW_METHODS)
            and ast.dump(new[j]) not in expected
        ):
            rebinding.add(ast.dump(new[j]))  # rebinds a name the moved statements bound
            j += 1
    dropped = [s for s in expected if s not in got]
    assert set(dropped) <= preambles, "the decode lost statements no method took"
    assert [s for s in expected if s in got or s.startswith("<call")] == got
    # Every local the decode reads after the calls, and the moved statements bound, is bound
    # again by the call or the rebinding statements.
    moved_stores = set()
    for name in (n for n, kind in NEW_METHODS.items() if kind == "moved"):
        moved_stores |= _names(_body(new_methods[name])[:-1], ast.Store)
    calls = [s for s in new if any(_calls_self(s, n) for n in NEW_METHODS
                                   if NEW_METHODS[n] == "moved")]  # fmt: skip
    last = max(new.index(s) for s in calls)
    after = _names(new[last + 1 :], ast.Load)
    rebound = _names(calls, ast.Store) | _names(
        [s for s in new if ast.dump(s) in rebinding], ast.Store
    )
    live = (after & moved_stores) - _names(new[: new.index(calls[0])], ast.Store)
    assert live <= rebound, sorted(live - rebound)


def _ddtree_modules(gen, base: str) -> dict[str, ast.Module]:
    files = gen.new_files(base, formatted=False)
    return {
        path: ast.parse(text, filename=path)
        for path, text in files.items()
        if path.startswith("python/sglang/srt/speculative/ddtree") and path.endswith(".py")
    }


@pytest.mark.parametrize("base", BASES)
def test_ddtree_modules_read_no_dflash_private(gen, base):
    reads = sorted(
        (path, node.lineno, name)
        for path, tree in _ddtree_modules(gen, base).items()
        for node in ast.walk(tree)
        for name in (
            [node.attr]
            if isinstance(node, ast.Attribute)
            else [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom)
            else [node.value]
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            else []
        )  # fmt: skip
        if name in PRIVATES
    )
    assert reads == []


def _dflash_calls(trees) -> list[tuple[str, ast.Call]]:
    """Calls ``dflash.NAME(...)`` / ``self.dflash.NAME(...)`` of a new method."""
    out = []
    for tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if (isinstance(owner, ast.Name) and owner.id == "dflash") or (
                isinstance(owner, ast.Attribute) and owner.attr == "dflash"
            ):
                if node.func.attr in NEW_METHODS:
                    out.append((node.func.attr, node))
    return out


def test_ddtree_calls_the_methods_with_their_parameters(gen, worker):
    _, edited = worker
    methods = _methods(edited)
    base = next(b for b in BASES if gen.PRISTINE_SHA256[b][DFLASH] == _sha(gen, worker))
    calls = _dflash_calls(_ddtree_modules(gen, base).values())
    assert {name for name, _ in calls} == set(NEW_METHODS)
    for name, call in calls:
        fn = methods[name]
        scope: dict = {}
        exec(f"def f({ast.unparse(fn.args)}): pass", {"Optional": None, "torch": None,
             "ScheduleBatch": None, "DFlashDraftInputV2": None}, scope)  # fmt: skip
        assert not any(isinstance(a, ast.Starred) for a in call.args), name
        inspect.signature(scope["f"]).bind(
            "self", *call.args, **{k.arg: None for k in call.keywords}
        )  # raises TypeError where the parameters do not match


def _sha(gen, worker) -> str:
    import hashlib

    return hashlib.sha256(worker[0].encode()).hexdigest()


@pytest.mark.parametrize("base", BASES)
def test_ddtree_prefill_is_dflashs_logprobs_included(gen, pristine, base):
    """In-tree, DDTREE's prefill is DFLASH's as it is, logprobs included: on 0.5.17 the worker
    part's edit lets DDTREE's batches past the refusal in DFLASH's worker, which DFLASH keeps
    (its guard evaluated for both algorithms); 0.5.23's DFLASH has none to pass. No DDTREE
    module wraps the target worker's forward."""
    from types import SimpleNamespace

    _, edited = gen.edited_files(pristine(base))[DFLASH]
    decode = _methods(edited)["forward_batch_generation"]
    guards = [n for n in ast.walk(decode) if isinstance(n, ast.If)
              and "does not support return_logprob" in ast.unparse(n.body)]  # fmt: skip
    assert len(guards) == (1 if base == "0.5.17" else 0)
    batch = SimpleNamespace(return_logprob=True)
    for guard in guards:
        refuses = {
            algo: eval(
                compile(ast.Expression(guard.test), DFLASH, "eval"),
                {},
                {
                    "batch": batch,
                    "self": SimpleNamespace(
                        server_args=SimpleNamespace(speculative_algorithm=algo)
                    ),
                },
            )  # fmt: skip
            for algo in ("DFLASH", "DDTREE")
        }
        assert refuses == {"DFLASH": True, "DDTREE": False}
    texts = [ast.unparse(tree) for tree in _ddtree_modules(gen, base).values()]
    assert not any("prefill_with_logprobs" in t or "'forward_batch_generation'" in t for t in texts)
