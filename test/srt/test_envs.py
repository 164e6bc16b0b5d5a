"""CPU tests of ``srt/ddtree_envs.py``: SGLang's parsing rules per type, blank values, refusals
and their messages, the launch check, and the docs' table of variables against the module."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_ddtree.srt.ddtree_envs import KNOBS, DDTreeEnvs, Knob, envs, invalid_settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "sglang_ddtree"
NAME = re.compile(r"SGLANG_DDTREE_[A-Z0-9_]+")


def _knob(type_, default, **kw) -> Knob:
    class Table:
        SGLANG_DDTREE_X = Knob(type_, default, "a test knob", **kw)

    return Table.SGLANG_DDTREE_X


def _get(knob: Knob, value: str | None):
    return knob.get({} if value is None else {knob.name: value})


# --- int: int() -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, parsed", [("8", 8), (" 8 ", 8), ("+3", 3), ("-2", -2), ("0", 0), ("1_0", 10)]
)
def test_int_is_python_int(value, parsed):
    assert _get(_knob(int, 8), value) == parsed == int(value)


@pytest.mark.parametrize("value", ["x", "8.0", "0x10", "1e3", "8 8"])
def test_int_refusals(value):
    with pytest.raises(ValueError) as e:
        _get(_knob(int, None), value)
    assert (
        str(e.value)
        == f"SGLANG_DDTREE_X={value!r} is not an integer; set it to an integer or unset it."
    )


# --- str: as is; a stricter form ----------------------------------------------------------------


def test_str_is_kept_as_is():
    assert _get(_knob(str, None), " /tmp/a b ") == " /tmp/a b "
    assert _get(_knob(str, None), "Window") == "Window"


def test_a_knob_s_own_fix_is_named():
    with pytest.raises(ValueError) as e:
        _get(_knob(int, 1, fix="set it to 0 (off) or 1 (the default)"), "on")
    assert str(e.value).endswith("set it to 0 (off) or 1 (the default).")
    with pytest.raises(ValueError) as e:
        _get(envs.SGLANG_DDTREE_TOPK, "eight")
    assert str(e.value) == "SGLANG_DDTREE_TOPK='eight' is not an integer; set it to e.g. 8."


# --- unset and blank: the default ---------------------------------------------------------------


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.name)
@pytest.mark.parametrize("value", [None, "", "  ", "\t"])
def test_unset_or_blank_is_the_default(knob, value):
    assert _get(knob, value) == knob.default
    assert not knob.is_set({} if value is None else {knob.name: value})


def test_reads_os_environ_by_default(monkeypatch):
    knob = envs.SGLANG_DDTREE_TOPK
    monkeypatch.delenv(knob.name, raising=False)
    assert knob.get() == 8 and not knob.is_set()
    monkeypatch.setenv(knob.name, "5")
    assert knob.get() == 5 and knob.is_set() and knob.raw() == "5"
    assert knob.get({}) == 8  # a mapping given: os.environ is not read


# --- the table ----------------------------------------------------------------------------------


def test_table_is_well_formed():
    names = [k.name for k in KNOBS]
    assert len(names) == len(set(names)) == 2
    assert KNOBS == tuple(v for v in vars(DDTreeEnvs).values() if isinstance(v, Knob))
    for knob in KNOBS:
        assert knob.name.startswith("SGLANG_DDTREE_") and getattr(envs, knob.name) is knob
        assert knob.meaning and "\n" not in knob.meaning
        assert knob.default is None or isinstance(knob.default, knob.type)
        assert knob.get({}) == knob.default


def _reads_a_variable(line: str) -> bool:
    """Whether ``line`` reads an ``SGLANG_DDTREE_*`` variable (its name or an ``*_ENV`` constant)
    from the environment itself; setting one (``os.environ[X] = ...``) is not a read."""
    variable = re.compile(r"SGLANG_DDTREE_|\b[A-Z_]*ENV\b")
    call = re.search(r"(\benv\.get|environ\.get|getenv|\)\.get)\(([^)]*)\)", line)
    if call and variable.search(call.group(2)):
        return True
    item = re.search(r"(\benv|environ)\[([^\]]+)\](\s*=(?!=))?", line)
    return bool(item and not item.group(3) and variable.search(item.group(2)))


def test_every_name_in_the_package_is_a_knob():
    """Source and docstrings of the package name no variable the table lacks, and no module but
    ddtree_envs reads one from the environment itself (testing.inject reads the tests' own
    variables, which no server reads)."""
    known = {k.name for k in KNOBS}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert set(NAME.findall(text)) <= known, path
        if path.name not in ("ddtree_envs.py", "inject.py"):
            reads = [line for line in text.splitlines() if _reads_a_variable(line)]
            assert not reads, (path, reads)
    assert _reads_a_variable('x = os.environ.get("SGLANG_DDTREE_TOPK", "")')
    assert _reads_a_variable("if os.environ.get(CPROFILE_ENV) == WINDOW:")
    assert _reads_a_variable("out_dir = os.environ[ENV]")
    assert _reads_a_variable('raw = env.get(TOPK_ENV, "").strip()')
    assert _reads_a_variable('(os.environ if environ is None else environ).get(ENV, "1")')
    assert not _reads_a_variable("os.environ[RANK_SKEW_ENV] = '1'")
    assert not _reads_a_variable('os.environ.get("OUT", ".")')


def test_invalid_settings_lists_each_bad_value_once():
    assert invalid_settings({}) == []
    good = {
        "SGLANG_DDTREE_TOPK": "4",
        "SGLANG_DDTREE_BUDGET_SCHEDULE": "1:33,4:17",
    }
    assert invalid_settings(good) == []
    bad = {"SGLANG_DDTREE_TOPK": "x"}  # the schedule's text is its reader's (below)
    errors = invalid_settings({**good, **bad})
    assert len(errors) == len(bad)
    for name, value in bad.items():
        assert any(e.startswith(f"{name}={value!r}") for e in errors), name


def test_schedule_text_is_parsed_by_its_reader():
    from sglang_ddtree.srt.ddtree_budget import read_schedule_env

    assert read_schedule_env({}) is None
    assert read_schedule_env({"SGLANG_DDTREE_BUDGET_SCHEDULE": " 1:33,4:17 "}).num_nodes == (33, 17)
    with pytest.raises(ValueError, match="SGLANG_DDTREE_BUDGET_SCHEDULE"):
        read_schedule_env({"SGLANG_DDTREE_BUDGET_SCHEDULE": "33"})


def test_topk_flag_and_env_compared_as_integers():
    from sglang_ddtree.srt.ddtree_args import read_topk

    assert read_topk({"SGLANG_DDTREE_TOPK": "08"}, flag=8) == 8
    assert read_topk({"SGLANG_DDTREE_TOPK": " "}, flag=5) == 5  # blank: unset
    with pytest.raises(ValueError, match="disagree"):
        read_topk({"SGLANG_DDTREE_TOPK": "4"}, flag=5)
    with pytest.raises(ValueError, match="is not an integer"):
        read_topk({"SGLANG_DDTREE_TOPK": "x"}, flag=5)


# --- refused at launch --------------------------------------------------------------------------


@pytest.fixture
def spec_module(monkeypatch):
    """``srt/ddtree_spec.py`` against stand-ins for the two SGLang names it imports."""
    registry = types.ModuleType("sglang.srt.speculative.spec_registry")
    registry.CustomSpecAlgo = object
    overrides = types.ModuleType("sglang.srt.arg_groups.overrides")
    overrides.resolved_view = lambda server_args: server_args
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.srt.arg_groups"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, registry.__name__, registry)
    monkeypatch.setitem(sys.modules, overrides.__name__, overrides)
    path = PACKAGE / "srt" / "ddtree_spec.py"
    spec = importlib.util.spec_from_file_location("ddtree_spec_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _server_args(**kw):
    base = dict(
        device="cuda",
        attention_backend="triton",
        speculative_attention_mode="prefill",
        page_size=1,
        speculative_eagle_topk=None,
        speculative_draft_model_path="/models/drafter",
    )
    return SimpleNamespace(**{**base, **kw})


def test_validate_server_args_refuses_every_bad_value_once(spec_module, monkeypatch):
    for knob in KNOBS:
        monkeypatch.delenv(knob.name, raising=False)
    spec_module.validate_server_args(_server_args())
    monkeypatch.setenv("SGLANG_DDTREE_TOPK", "x")  # also read by check_server_args
    with pytest.raises(ValueError) as e:  # a bad verify attention: no verify backend to ask
        spec_module.validate_server_args(_server_args(speculative_ddtree_verify_attention="on"))
    lines = str(e.value).splitlines()
    assert lines[0] == "Invalid DDTREE configuration:"
    assert len(lines) == 3, lines
    for name in ("SGLANG_DDTREE_TOPK='x'", "verify-attention 'on' is none"):
        assert sum(name in line for line in lines) == 1, name


def test_validate_server_args_refuses_a_missing_drafter_naming_the_flag(spec_module, monkeypatch):
    """SGLang calls this before its DFLASH handling, which would refuse in DFLASH's name."""
    for knob in KNOBS:
        monkeypatch.delenv(knob.name, raising=False)
    with pytest.raises(ValueError) as e:
        spec_module.validate_server_args(_server_args(speculative_draft_model_path=None))
    lines = str(e.value).splitlines()
    assert lines[0] == "Invalid DDTREE configuration:" and len(lines) == 2, lines
    assert "pass --speculative-draft-model-path <" in lines[1] and "DFLASH" not in lines[1]


def test_validate_server_args_refuses_flashmla_where_it_does_not_import(spec_module, monkeypatch):
    """A machine whose SGLang cannot import its flashmla backend: selecting it is refused at
    start, naming the flag and what to pass; another backend never tries the import."""
    from sglang_ddtree.srt.ddtree_attention import flashmla_backend

    for knob in KNOBS:
        monkeypatch.delenv(knob.name, raising=False)
    monkeypatch.setattr(flashmla_backend, "BACKEND_MODULE", "ddtree_test_absent.flashmla_backend")
    flashmla_backend.import_error.cache_clear()
    try:
        spec_module.validate_server_args(_server_args())  # triton
        assert flashmla_backend.import_error.cache_info().currsize == 0
        with pytest.raises(ValueError) as e:
            spec_module.validate_server_args(
                _server_args(attention_backend="flashmla", page_size=64)
            )
    finally:
        flashmla_backend.import_error.cache_clear()
    lines = str(e.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[1] == (
        "  - --attention-backend flashmla cannot run on this machine: SGLang's flashmla backend "
        "does not import (ModuleNotFoundError: No module named 'ddtree_test_absent'); pass "
        "--attention-backend triton (DDTREE's split verify serves MLA targets there too)."
    )


# --- the docs' table ----------------------------------------------------------------------------


def _docs_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and NAME.fullmatch(cells[0].strip("`")):
            name = cells[0].strip("`")
            assert name not in rows, f"{name} has two rows"
            rows[name] = cells
    return rows


def test_docs_table_is_the_module_s_table():
    """docs/configuration.md has one row per knob (variable, default, meaning) with the
    module's default, and no other SGLANG_DDTREE_ name appears in the docs or the README."""
    rows = _docs_rows()
    assert set(rows) == {k.name for k in KNOBS}
    for knob in KNOBS:
        _, default, meaning = rows[knob.name]
        if knob.default is None:
            assert default.startswith("unset"), (knob.name, default)
        else:
            assert default.startswith(f"`{knob.default_text}`"), (knob.name, default)
        assert meaning, knob.name
    known = {k.name for k in KNOBS}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert set(NAME.findall(path.read_text())) <= known, path


def test_readme_stays_short_and_points_to_the_table():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 120
    assert "docs/configuration.md" in readme


# --- against SGLang itself, where it imports --------------------------------------------------


def test_parsers_match_sglang_environ():
    environ = pytest.importorskip("sglang.srt.environ")
    samples = ["1", "0", "true", "False", "YES", "n", "on", "off", " 1", "8", " 8 ", "1_0", "x",
               "0.5", "1e3", "nan"]  # fmt: skip
    for ours, theirs in ((int, environ.EnvInt),):
        field = theirs(None)
        for value in samples:
            try:
                expected = field.parse(value)
            except ValueError:
                expected = ValueError
            try:
                got = _get(_knob(ours, None), value)
            except ValueError:
                got = ValueError
            assert got == expected or (got != got and expected != expected), (ours, value)
