"""Every ``is_dflash()`` / ``is_dflash_family()`` call in pristine SGLang 0.5.17's ``sglang/srt``
is audited in ``docs/integration.md`` (which of them DDTREE wants): the calls counted per file
equal that table's. An SGLang upgrade that adds or moves one fails here until the table says
what DDTREE does with it. CPU only; the sources from the ``source`` fixture (``conftest.py``)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "docs" / "integration.md"
CALL = re.compile(r"(?<!def )\b(is_dflash|is_dflash_family)\(\)")
ROW = re.compile(r"^\| `([^`]+\.py)` \| (\d+) \| `(is_dflash|is_dflash_family)` \|")


def audited() -> Counter:
    """``(sglang/srt-relative path, predicate) -> calls`` from the table's rows."""
    rows = Counter()
    for line in TABLE.read_text().splitlines():
        m = ROW.match(line)
        if m:
            rows[(m.group(1), m.group(3))] += int(m.group(2))
    return rows


def counted(text: str) -> Counter:
    return Counter(m.group(1) for m in CALL.finditer(text))


def test_call_pattern_counts_calls_not_definitions():
    text = "def is_dflash(self):\n    return self.is_dflash() or x.is_dflash_family()\n"
    assert counted(text) == Counter({"is_dflash": 1, "is_dflash_family": 1})
    assert audited()[("managers/scheduler.py", "is_dflash_family")] == 2


def test_every_dflash_branch_of_sglang_is_audited(source):
    found = Counter()
    prefix = "python/sglang/srt/"
    for path in source.python_files(prefix):
        for name, n in counted(source.read(path).decode("utf-8", "replace")).items():
            found[(path[len(prefix) :], name)] += n
    assert found, "no calls found: the scan reads nothing"
    assert found == audited(), {
        "in SGLang, not in docs/integration.md": dict(found - audited()),
        "in docs/integration.md, not in SGLang": dict(audited() - found),
    }
