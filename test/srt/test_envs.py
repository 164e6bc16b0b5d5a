"""CPU tests of ``srt/ddtree_envs.py``: SGLang's parsing rules per type, blank values, refusals
and their messages, the launch check (``ddtree_args.invalid_env_settings``), and the docs' table
of variables against the module."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_ddtree.srt.ddtree_envs import KNOBS, DDTreeEnvs, Knob, envs

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
    """Whether ``line`` reads an ``SGLANG_DDTREE_*`` variable (its name, an ``*_ENV`` constant or
    a field's ``.name``) from the environment itself; setting one (``os.environ[X] = ...``) is
    not a read."""
    variable = re.compile(r"SGLANG_DDTREE_|\b[A-Z_]*ENV\b|\.name\b")
    call = re.search(r"(\benv\.get|environ\.get|getenv|\)\.get)\(([^)]*)\)", line)
    if call and variable.search(call.group(2)):
        return True
    item = re.search(r"(\benv|environ)\[([^\]]+)\](\s*=(?!=))?", line)
    return bool(item and not item.group(3) and variable.search(item.group(2)))


def test_every_name_in_the_package_is_a_knob():
    """Source and docstrings of the package name no variable the table lacks, and no module but
    ddtree_envs reads one from the environment itself (testing.inject reads the tests' own
    variables, which no server reads), but for the start check's one read of a set variable's
    text, which it parses by the field's rules (``ddtree_args.invalid_env_settings``)."""
    known = {k.name for k in KNOBS}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        assert set(NAME.findall(text)) <= known, path
        if path.name not in ("ddtree_envs.py", "inject.py"):
            reads = [line.strip() for line in text.splitlines() if _reads_a_variable(line)]
            start_check = ["value = os.environ.get(field.name)"]
            assert reads == (start_check if path.name == "ddtree_args.py" else []), (path, reads)
    assert _reads_a_variable('x = os.environ.get("SGLANG_DDTREE_TOPK", "")')
    assert _reads_a_variable("if os.environ.get(CPROFILE_ENV) == WINDOW:")
    assert _reads_a_variable("out_dir = os.environ[ENV]")
    assert _reads_a_variable('raw = env.get(TOPK_ENV, "").strip()')
    assert _reads_a_variable('(os.environ if environ is None else environ).get(ENV, "1")')
    assert not _reads_a_variable("os.environ[RANK_SKEW_ENV] = '1'")
    assert _reads_a_variable("value = os.environ.get(knob.name)")
    assert not _reads_a_variable('os.environ.get("OUT", ".")')


@pytest.fixture
def unset(monkeypatch):
    """Every knob unset; ``monkeypatch`` to set some."""
    for knob in KNOBS:
        monkeypatch.delenv(knob.name, raising=False)
    return monkeypatch


def test_start_check_refuses_each_bad_value_once_in_the_knob_s_words(unset):
    """``invalid_env_settings`` (the start check, the same text in SGLang's tree) refuses every
    knob that can fail to parse, each once, in the words its own ``get()`` refuses it with."""
    from sglang_ddtree.srt.ddtree_args import invalid_env_settings

    assert invalid_env_settings() == []
    unset.setenv("SGLANG_DDTREE_TOPK", "4")
    unset.setenv("SGLANG_DDTREE_BUDGET_SCHEDULE", "1:33,4:17")
    assert invalid_env_settings() == []
    unset.setenv("SGLANG_DDTREE_TOPK", " ")  # blank: unset here (SGLang's EnvInt: refused)
    assert invalid_env_settings() == []
    # A str knob's text is its reader's to check (the schedule's: below); one with a stricter
    # form (``parse``) would need its own check there.
    assert all(knob._parse is None for knob in KNOBS if knob.type is str)
    refusable = [knob for knob in KNOBS if knob.type is int]
    for knob in refusable:
        unset.setenv(knob.name, "x")
    want = []
    for knob in refusable:
        with pytest.raises(ValueError) as e:
            knob.get()
        want.append(str(e.value))
    assert invalid_env_settings() == want


def test_schedule_text_is_parsed_by_its_reader(unset):
    from sglang_ddtree.srt.ddtree_budget import read_schedule_env

    assert read_schedule_env() is None
    unset.setenv("SGLANG_DDTREE_BUDGET_SCHEDULE", " 1:33,4:17 ")
    assert read_schedule_env().num_nodes == (33, 17)
    unset.setenv("SGLANG_DDTREE_BUDGET_SCHEDULE", "33")
    with pytest.raises(ValueError, match="SGLANG_DDTREE_BUDGET_SCHEDULE"):
        read_schedule_env()


def test_topk_flag_and_env_compared_as_integers(unset):
    from sglang_ddtree.srt.ddtree_args import read_topk

    for value, flag in (("08", 8), (" ", 5)):  # blank: unset
        unset.setenv("SGLANG_DDTREE_TOPK", value)
        assert read_topk(flag=flag) == flag
    unset.setenv("SGLANG_DDTREE_TOPK", "4")
    with pytest.raises(ValueError, match="disagree"):
        read_topk(flag=5)
    unset.setenv("SGLANG_DDTREE_TOPK", "x")
    with pytest.raises(ValueError, match="is not an integer"):
        read_topk(flag=5)


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
