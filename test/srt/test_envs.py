"""CPU tests of ``srt/ddtree_envs.py``: SGLang's parsing rules per type, blank values, refusals
and their messages."""

from __future__ import annotations

import pytest

from sglang_ddtree.srt.ddtree_envs import KNOBS, DDTreeEnvs, Knob, envs, invalid_settings


def _knob(type_, default, **kw) -> Knob:
    class Table:
        SGLANG_DDTREE_X = Knob(type_, default, "a test knob", **kw)

    return Table.SGLANG_DDTREE_X


def _get(knob: Knob, value: str | None):
    return knob.get({} if value is None else {knob.name: value})


# --- bool: SGLang's EnvBool ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["true", "1", "yes", "y", "TRUE", "True", "YES", "Y", "yEs"])
def test_bool_true(value):
    assert _get(_knob(bool, False), value) is True


@pytest.mark.parametrize("value", ["false", "0", "no", "n", "FALSE", "False", "NO", "N", "nO"])
def test_bool_false(value):
    assert _get(_knob(bool, True), value) is False


@pytest.mark.parametrize(
    "value", ["on", "off", "ON", "2", "-1", "t", "f", "enable", " 1", "0 ", "\t0"]
)
def test_bool_refusals(value):
    """No on / off and no trimming: SGLang's EnvBool accepts neither."""
    with pytest.raises(ValueError) as e:
        _get(_knob(bool, True), value)
    message = str(e.value)
    assert message.startswith(f"SGLANG_DDTREE_X={value!r} is not a boolean (")
    assert "true, 1, yes, y or false, 0, no, n; any case" in message
    assert message.endswith("; set it to 1 or 0, or unset it (default 1).")


# --- int and float: int() and float() ----------------------------------------------------------


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


@pytest.mark.parametrize("value, parsed", [("0.5", 0.5), (" 1 ", 1.0), ("1e-1", 0.1), ("-2", -2.0)])
def test_float_is_python_float(value, parsed):
    assert _get(_knob(float, 1.0), value) == parsed


def test_float_refusal():
    with pytest.raises(
        ValueError, match=r"SGLANG_DDTREE_X='half' is not a number; set it to a number"
    ):
        _get(_knob(float, 1.0), "half")


# --- str: as is; choices trimmed and lower-cased; a stricter form -----------------------------


def test_str_is_kept_as_is():
    assert _get(_knob(str, None), " /tmp/a b ") == " /tmp/a b "
    assert _get(_knob(str, None), "Window") == "Window"


def test_choices_trimmed_any_case_and_refusal_message():
    knob = _knob(str, "auto", choices=("auto", "torch", "triton"))
    assert _get(knob, " Triton ") == "triton" and _get(knob, "TORCH") == "torch"
    with pytest.raises(ValueError) as e:
        _get(knob, " CUDA ")
    assert str(e.value) == (
        "SGLANG_DDTREE_X='cuda' is not one of ('auto', 'torch', 'triton'); "
        "unset it or set it to auto."
    )


def test_cprofile_is_window_or_an_integer():
    knob = envs.SGLANG_DDTREE_CPROFILE
    assert _get(knob, "window") == "window"
    assert _get(knob, "0") == 0 and _get(knob, " 20 ") == 20
    for bad in ("Window", "w", "1.5"):
        with pytest.raises(ValueError) as e:
            _get(knob, bad)
        assert str(e.value).startswith(f"SGLANG_DDTREE_CPROFILE={bad!r} is neither 'window' nor ")
        assert "set it to window or to the decode batches to skip" in str(e.value)


def test_a_knob_s_own_fix_is_named():
    with pytest.raises(ValueError) as e:
        _get(envs.SGLANG_DDTREE_TREE_ATTENTION, "on")
    assert str(e.value).endswith(
        "set it to 0 (the backend's custom-mask kernel) or 1 (the default)."
    )
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
    assert len(names) == len(set(names)) == 16
    assert KNOBS == tuple(v for v in vars(DDTreeEnvs).values() if isinstance(v, Knob))
    for knob in KNOBS:
        assert knob.name.startswith("SGLANG_DDTREE_") and getattr(envs, knob.name) is knob
        assert knob.meaning and "\n" not in knob.meaning
        assert knob.default is None or isinstance(knob.default, knob.type)
        if knob.choices:
            assert knob.default == knob.choices[0]
        assert knob.get({}) == knob.default


def test_invalid_settings_lists_each_bad_value_once():
    assert invalid_settings({}) == []
    good = {
        "SGLANG_DDTREE_TOPK": "4",
        "SGLANG_DDTREE_DRAFT_TOPK": "Triton",
        "SGLANG_DDTREE_TREE_ATTENTION": "yes",
        "SGLANG_DDTREE_GLUE_GRAPHS": "false",
        "SGLANG_DDTREE_CPROFILE": "window",
        "SGLANG_DDTREE_TEST_COIN_SCALE": "0.5",
    }
    assert invalid_settings(good) == []
    bad = {
        "SGLANG_DDTREE_GLUE_GRAPHS": "off",
        "SGLANG_DDTREE_GLUE_AT_STARTUP": "on",
        "SGLANG_DDTREE_KV_MOVER": "torch",
        "SGLANG_DDTREE_EXPERT_COUNT": "all",
        "SGLANG_DDTREE_SYNC_TRACE": "2",
    }
    errors = invalid_settings({**good, **bad})
    assert len(errors) == len(bad)
    for name, value in bad.items():
        assert any(e.startswith(f"{name}={value!r}") for e in errors), name


# --- against SGLang itself, where it imports --------------------------------------------------


def test_parsers_match_sglang_environ():
    environ = pytest.importorskip("sglang.srt.environ")
    samples = ["1", "0", "true", "False", "YES", "n", "on", "off", " 1", "8", " 8 ", "1_0", "x",
               "0.5", "1e3", "nan"]  # fmt: skip
    for ours, theirs in ((bool, environ.EnvBool), (int, environ.EnvInt), (float, environ.EnvFloat)):
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
