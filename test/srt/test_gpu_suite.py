"""The GPU suite's lanes (``test/gpu_suite.lanes``, run by ``test/gpu_suite.sh``) hold every GPU
test exactly once, and each set fits one 10-minute command: checked on the CPU by pytest's own
collection of each lane's arguments against ``pytest -m gpu test/srt``."""

from __future__ import annotations

import concurrent.futures as cf
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LANES = REPO / "test" / "gpu_suite.lanes"
COMMAND_SECONDS = 600  # the GPU machine's limit on one command


def lanes(text: str) -> list[tuple[str, str, int, list[str]]]:
    """``(set, name, seconds, pytest arguments)`` of every lane in ``text``."""
    out = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            set_, name, seconds, args = line.split("|", 3)
            out.append((set_, name, int(seconds), shlex.split(args)))
    return out


def collected(args: list[str]) -> list[str]:
    """The GPU test ids pytest collects for ``args`` (run from the repository root)."""
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *args],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode in (0, 5), r.stdout[-2000:] + r.stderr[-2000:]  # 5: none collected
    return [line for line in r.stdout.splitlines() if "::" in line]


def problems(text: str, everything: list[str], lane_ids: dict[str, list[str]]) -> list[str]:
    """What is wrong with lanes ``text`` whose collections are ``lane_ids`` ({name: ids}),
    against ``everything`` (the suite's ids)."""
    out, seen = [], {}
    for name, ids in lane_ids.items():
        if not ids:
            out.append(f"lane {name} collects no GPU test")
        for test in ids:
            if test in seen:
                out.append(f"{test} is in lanes {seen[test]} and {name}")
            seen.setdefault(test, name)
    out += [f"{test} is in no lane" for test in everything if test not in seen]
    out += [f"{test} is not a GPU test of test/srt" for test in seen if test not in everything]
    for set_ in sorted({lane[0] for lane in lanes(text)}):
        mine = [lane for lane in lanes(text) if lane[0] == set_]
        alone = sum(s for _, name, s, _ in mine if name.startswith("alone-"))
        side = max([s for _, name, s, _ in mine if not name.startswith("alone-")], default=0)
        if alone + side + 30 > COMMAND_SECONDS:  # 30 s for the set-up and the lane gaps
            out.append(f"set {set_} needs {alone + side} s of lanes")
    return out


def test_every_gpu_test_is_in_exactly_one_lane_and_each_set_fits_a_command():
    text = LANES.read_text()
    everything = collected(["test/srt"])
    assert len(everything) >= 100
    with cf.ThreadPoolExecutor(4) as pool:
        ids = dict(zip([lane[1] for lane in lanes(text)],
                       pool.map(collected, [lane[3] for lane in lanes(text)])))  # fmt: skip
    assert problems(text, everything, ids) == []
    # The checks see a lane left out, a test in two lanes and a set over the command's time.
    dropped = next(name for _, name, _, _ in lanes(text) if name.startswith("e2e"))
    partial = {name: tests for name, tests in ids.items() if name != dropped}
    assert any("is in no lane" in p for p in problems(text, everything, partial))
    doubled = dict(ids, extra=ids[dropped])
    assert any("is in lanes" in p for p in problems(text, everything, doubled))
    slow = text.replace("|560|", "|590|", 1)
    assert any("needs" in p for p in problems(slow, everything, ids))
