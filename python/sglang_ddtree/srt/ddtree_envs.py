"""Every ``SGLANG_DDTREE_*`` environment variable, declared once: name, type, default and a
one-line meaning (``DDTreeEnvs``; ``KNOBS`` lists them). Every reader in the plugin goes
through ``envs.<NAME>.get(environ=None)`` (``environ``: a mapping read instead of
``os.environ``, for tests), spelled as SGLang's own ``envs.<NAME>.get()``. The table for users,
``docs/configuration.md``, is kept equal to this one by a CPU test.

SGLang reads its own variables through ``sglang.srt.environ.envs``, whose fields are
``EnvBool``, ``EnvInt``, ``EnvFloat`` and ``EnvStr``. The plugin cannot add fields to that
class, and SGLang does not import on the CPU machines the tests run on, so this module mirrors
its parsing rules (the type of a knob is the field it would be in SGLang's ``Envs``):

- ``bool`` (``EnvBool``): ``true`` / ``1`` / ``yes`` / ``y`` or ``false`` / ``0`` / ``no`` /
  ``n``, in any case; nothing else, and no surrounding whitespace.
- ``int`` (``EnvInt``): what Python's ``int()`` reads (surrounding whitespace included).
- ``float`` (``EnvFloat``): what ``float()`` reads.
- ``str`` (``EnvStr``): the value as it is; a knob with ``parse`` (a stricter form) is read by
  that function.

Two rules differ from SGLang's ``EnvField.get``, both because every knob is checked when a
DDTREE server starts (``invalid_settings``, raised by ``ddtree_spec.validate_server_args``; the
benchmark instruments also when the plugin loads, in any server):

- A blank value (empty or whitespace only) reads as unset: the default. SGLang ends with the
  default too (``EnvStr`` keeps ``""``, the other types warn and fall back).
- A value that does not parse is refused, with a ``ValueError`` naming the variable, the value
  and what to set, where SGLang would warn and serve with the default: a typo stops the start
  instead of changing what is served.

Values read differently from the plugin's readers before this module (every other value reads
as it did):

- ``SGLANG_DDTREE_GLUE_GRAPHS``, ``SGLANG_DDTREE_GLUE_AT_STARTUP``: ``off`` (any case) turned
  them off and any value but ``0`` / ``false`` / ``off`` / ``no`` turned them on (``on``, ``2``,
  a typo); now only SGLang's booleans are accepted, so ``off``, ``on`` and the like are refused
  at start (set ``0`` or ``1``). Whitespace around a value was trimmed; now it is refused.
- ``SGLANG_DDTREE_TREE_ATTENTION``: only ``0`` and ``1`` were accepted; now every SGLang
  boolean (``true`` / ``yes`` / ``y``, ``false`` / ``no`` / ``n``, any case). A blank value
  was refused; now it is the default. Whitespace around ``0`` / ``1`` was trimmed; now refused.
- ``SGLANG_DDTREE_SYNC_TRACE``: any value but ``""`` and ``0`` turned tracing on (``false`` and
  ``no`` did); now ``false`` / ``no`` / ``n`` turn it off and a non-boolean is refused.
- ``SGLANG_DDTREE_TOPK`` set together with ``--speculative-ddtree-topk``: compared as integers
  (``08`` and 8 agree), no longer as text.
- ``SGLANG_DDTREE_STEP_TIMING``: a whitespace-only value was a directory name; now it is
  unset.
- ``SGLANG_DDTREE_CPROFILE`` / ``SGLANG_DDTREE_TORCH_PROFILE`` (at a scheduler's first batch),
  ``SGLANG_DDTREE_EXPERT_COUNT`` (at the first MoE call): a value that does not parse failed
  there, in a scheduler process; now it is refused when the server starts.
- The three test switches (the verify coins' scale, the ranks' coin-seed skew, the file of the
  CUDA-graph counts) are gone from the server: the tests inject them into the scheduler
  processes themselves.

Pure Python (no torch, no SGLang).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

BOOL_TRUE = ("true", "1", "yes", "y")
BOOL_FALSE = ("false", "0", "no", "n")
BOOL_RULE = "true, 1, yes, y or false, 0, no, n; any case"
TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


class Knob:
    """One environment variable: its type (``bool``, ``int``, ``float`` or ``str``), default
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
        """The default as the docs' table writes it: ``1`` / ``0`` for booleans, ``unset``
        for no default."""
        if self.default is None:
            return "unset"
        if self.type is bool:
            return "1" if self.default else "0"
        if self.type is float:
            return format(self.default, "g")
        return str(self.default)

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
        if self.type is bool:
            lowered = value.lower()
            if lowered in BOOL_TRUE:
                return True
            if lowered in BOOL_FALSE:
                return False
            raise self._refusal(value, f"is not a boolean ({BOOL_RULE})")
        if self.type is int or self.type is float:
            try:
                return self.type(value)
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
        if self._fix is not None:
            return self._fix
        if self.type is bool:
            return f"set it to 1 or 0, or unset it (default {self.default_text})"
        return f"set it to {TYPE_NAMES[self.type]} or unset it"


CPROFILE_WINDOW = "window"  # SGLANG_DDTREE_CPROFILE: profile while <dir>/cprofile.window exists


def _cprofile_setting(value: str) -> str | int:
    """``window``, or the decode batches to skip (an integer)."""
    if value == CPROFILE_WINDOW:
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"is neither {CPROFILE_WINDOW!r} nor an integer") from None


class DDTreeEnvs:
    """The table of ``SGLANG_DDTREE_*`` knobs (in SGLang's tree: fields of its ``Envs``).

    Serving knobs first, then benchmark instruments (read only with ``SGLANG_DDTREE_STEP_TIMING``
    set).
    """

    # Serving.
    SGLANG_DDTREE_BUDGET_SCHEDULE = Knob(
        str,
        None,
        "adaptive tree budget, W per running batch size as min_bs:W pairs (e.g. 1:65,8:33,32:17);"
        " the env form of --speculative-ddtree-budget-schedule",
    )
    SGLANG_DDTREE_TOPK = Knob(
        int,
        8,
        "draft candidates per depth K (>= 1); the env form of --speculative-ddtree-topk",
        fix="set it to e.g. 8",
    )
    SGLANG_DDTREE_TREE_ATTENTION = Knob(
        bool,
        True,
        "the tree-verify attention split into the prefix part and the ancestor block; "
        "0 keeps the backend's custom-mask kernel (refused on flashmla)",
        fix="set it to 0 (the backend's custom-mask kernel) or 1 (the default)",
    )
    SGLANG_DDTREE_GLUE_GRAPHS = Knob(
        bool,
        True,
        "the step's tree / accept / KV glue from CUDA graphs; 0 runs it eagerly (same outputs)",
    )
    SGLANG_DDTREE_GLUE_AT_STARTUP = Knob(
        bool,
        True,
        "glue CUDA graphs captured at startup; 0 captures each the first time it is met, "
        "while serving",
    )
    SGLANG_DDTREE_GLUE_PADDED = Knob(
        bool,
        True,
        "the tree and accept glue graphs keyed by the batch size SGLang pads a step to (its "
        "captured sizes: 51 up to 256), the KV commit's by the real one; 0 keys all of them by "
        "the real batch size (3.5x the glue graphs at --cuda-graph-max-bs 256)",
    )
    # Benchmark instruments (the plugin's per-step timing hook).
    SGLANG_DDTREE_STEP_TIMING = Knob(
        str,
        None,
        "benchmarks: a directory; per-step GPU time of every scheduler batch is written there",
    )
    SGLANG_DDTREE_CPROFILE = Knob(
        str,
        None,
        "benchmarks: cProfile the scheduler's host time after this many decode batches of one "
        "size, or window (while <dir>/cprofile.window exists)",
        parse=_cprofile_setting,
        fix=f"set it to {CPROFILE_WINDOW} or to the decode batches to skip, e.g. 20",
    )
    SGLANG_DDTREE_TORCH_PROFILE = Knob(
        int,
        None,
        "benchmarks: torch-profile decode steps after this many decode batches of one size",
    )
    SGLANG_DDTREE_SYNC_TRACE = Knob(
        bool,
        False,
        "benchmarks: record the Python stack of every host-device sync in a decode batch",
    )
    SGLANG_DDTREE_MEMORY_HISTORY = Knob(
        bool,
        False,
        "benchmarks: record allocation stacks during the startup glue capture; its summary "
        "names the code that allocated the largest live blocks outside the graphs' pool",
    )
    SGLANG_DDTREE_EXPERT_COUNT = Knob(
        int,
        None,
        "benchmarks: count the distinct routed experts (ids below this) of every MoE top-k call",
    )


envs = DDTreeEnvs()
KNOBS: tuple[Knob, ...] = tuple(v for v in vars(DDTreeEnvs).values() if isinstance(v, Knob))


def invalid_settings(environ: Mapping[str, str] | None = None) -> list[str]:
    """One refusal per knob whose value does not parse (empty when every one does)."""
    errors = []
    for knob in KNOBS:
        try:
            knob.get(environ)
        except ValueError as e:
            errors.append(str(e))
    return errors
