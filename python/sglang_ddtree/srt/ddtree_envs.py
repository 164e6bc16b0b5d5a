"""Every ``SGLANG_DDTREE_*`` environment variable, declared once: name, type, default and a
one-line meaning (``DDTreeEnvs``; ``KNOBS`` lists them). Every reader goes through
``envs.<NAME>.get()`` (and ``.is_set()``, ``.parse(value)``, ``.name``, ``.default``), as SGLang
reads its own, so that the readers' text is the same in SGLang's tree, where this table is
fields of SGLang's ``Envs`` (``upstream/generate.py`` writes them from it) and this module does
not go. The table for users, ``docs/configuration.md``, is kept equal to this one by a CPU test.

SGLang reads its own variables through ``sglang.srt.environ.envs``, whose fields are
``EnvInt``, ``EnvStr`` and others. The plugin cannot add fields to that
class, and SGLang does not import on the CPU machines the tests run on, so this module mirrors
the parsing rules of the two types its knobs have (the field each is in SGLang's ``Envs``):

- ``int`` (``EnvInt``): what Python's ``int()`` reads (surrounding whitespace included).
- ``str`` (``EnvStr``): the value as it is; a knob with ``parse`` (a stricter form) is read by
  that function.

Two rules differ from SGLang's ``EnvField.get``:

- A blank value (empty or whitespace only) reads as unset: the default (``is_set()`` is False).
  SGLang ends with the default too (``EnvStr`` keeps ``""``, which the readers take as unset;
  the other types warn and fall back), but counts the variable as set.
- ``get()`` refuses a value that does not parse, with a ``ValueError`` naming the variable, the
  value and what to set, where SGLang would warn and serve with the default. A DDTREE server
  refuses such a value at start on either (``ddtree_args.invalid_env_settings``, by the
  field's ``parse``): a typo stops the start instead of changing what is served.

Pure Python (no torch, no SGLang)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

TYPE_NAMES = {int: "an integer", str: "a string"}


class Knob:
    """One environment variable: its type (``int`` or ``str``), default
    (unset or blank), one-line meaning, ``parse``: a stricter form of a ``str`` knob (raises
    ``ValueError`` saying what it expects), ``fix``: what a refusal tells the user to set (a
    default per type otherwise). The name is the attribute's in ``DDTreeEnvs``."""

    def __init__(
        self,
        type_: type,
        default: Any,
        meaning: str,
        parse: Callable[[str], Any] | None = None,
        fix: str | None = None,
    ):
        assert type_ in TYPE_NAMES, type_
        assert parse is None or type_ is str, "parse is for str knobs"
        self.type = type_
        self.default = default
        self.meaning = meaning
        self._parse = parse
        self._fix = fix
        self.name = ""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Knob({self.name}, {self.type.__name__}, default={self.default!r})"

    @property
    def default_text(self) -> str:
        """The default as the docs' table writes it, ``unset`` for no default."""
        return "unset" if self.default is None else str(self.default)

    def raw(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The value as set, or None when unset or blank."""
        value = (os.environ if environ is None else environ).get(self.name)
        return value if value is not None and value.strip() else None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.raw(environ) is not None

    def get(self, environ: Mapping[str, str] | None = None) -> Any:
        """The parsed value (the default when unset or blank); ValueError (naming the variable,
        the value and what to set) when it does not parse."""
        value = self.raw(environ)
        return self.default if value is None else self.parse(value)

    def parse(self, value: str) -> Any:
        if self.type is int:
            try:
                return int(value)
            except ValueError:
                raise self._refusal(value, f"is not {TYPE_NAMES[self.type]}") from None
        if self._parse is not None:
            try:
                return self._parse(value)
            except ValueError as e:
                raise self._refusal(value, str(e)) from None
        return value

    def _refusal(self, value: str, problem: str) -> ValueError:
        return ValueError(f"{self.name}={value!r} {problem}; {self.fix}.")

    @property
    def fix(self) -> str:
        return self._fix or f"set it to {TYPE_NAMES[self.type]} or unset it"


class DDTreeEnvs:
    """The table of ``SGLANG_DDTREE_*`` knobs (in SGLang's tree: fields of its ``Envs``)."""

    SGLANG_DDTREE_BUDGET_SCHEDULE = Knob(
        str,
        None,
        "budget schedule: W (budget + 1) per running batch size as min_bs:W pairs"
        " (e.g. 1:65,8:33,32:17);"
        " the env form of --speculative-ddtree-budget-schedule",
    )
    SGLANG_DDTREE_TOPK = Knob(
        int,
        8,
        "draft candidates per depth K (>= 1); the env form of --speculative-ddtree-topk",
        fix="set it to e.g. 8",
    )


envs = DDTreeEnvs()
KNOBS: tuple[Knob, ...] = tuple(v for v in vars(DDTreeEnvs).values() if isinstance(v, Knob))
