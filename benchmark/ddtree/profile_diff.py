"""Per-step kernel-time difference between two torch-profiler tables of ``bench_step.py``.

``bench_step.py --torch-profile-skip N --out OUT`` writes ``OUT/profile_<model>_<config>/
torchprof.<pid>.<k>.txt``, one ``key_averages`` table over 20 decode steps per run. This
prints, per step, where B spends more device time than A (kernel by kernel, and grouped into
GEMM / attention / tree build / other)::

    python3 benchmark/ddtree/profile_diff.py OUT/profile_8b_dflash/torchprof.<pid>.1.txt \\
        OUT/profile_8b_ddtree-64/torchprof.<pid>.1.txt
"""

from __future__ import annotations

import argparse
import re

STEPS = 20  # instruments.TORCH_PROFILE_STEPS
# record_function ranges and aten ops: not kernels (an op's self device time is its kernels',
# which have rows of their own)
SKIP = ("scheduler.", "step[", "aten::")
GROUPS = (
    ("gemm", ("nvjet", "void cublasLt")),
    ("attention", ("_fwd_kernel", "_prefix_attention_kernel", "_tree_attention_kernel")),
    ("tree build", ("_ddtree_heap_kernel", "_layout_kernel", "_chunk_topk_kernel")),
)


def _us(cell: str) -> float:
    for unit, scale in (("ms", 1e3), ("us", 1.0), ("s", 1e6)):
        if cell.endswith(unit):
            return float(cell[: -len(unit)]) * scale
    return float(cell)


def parse(path: str) -> dict[str, tuple[float, int]]:
    """{kernel name: (self device us, calls)} from the first (by device time) table."""
    lines = open(path).read().split("\n")
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Name"))
    out: dict[str, tuple[float, int]] = {}
    for line in lines[start + 2 :]:
        if line.startswith("---"):
            break
        cols = re.split(r"\s{2,}", line.strip())
        if cols[0].startswith(SKIP):
            continue
        t, n = out.get(cols[0], (0.0, 0))
        out[cols[0]] = (t + _us(cols[6]), n + int(cols[10]))
    return out


def group(name: str) -> str:
    return next((g for g, prefixes in GROUPS if name.startswith(prefixes)), "other")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    a, b = parse(args.a), parse(args.b)
    rows = sorted(
        ((b.get(n, (0, 0))[0] - a.get(n, (0, 0))[0], n) for n in set(a) | set(b)), reverse=True
    )
    print(f"{'B - A us/step':>13} {'A us':>8} {'B us':>8} {'A n':>5} {'B n':>5}  kernel")
    for d, n in rows[: args.top]:
        (ta, ca), (tb, cb) = a.get(n, (0, 0)), b.get(n, (0, 0))
        print(f"{d / STEPS:13.1f} {ta / STEPS:8.1f} {tb / STEPS:8.1f} "
              f"{ca / STEPS:5.1f} {cb / STEPS:5.1f}  {n[:70]}")  # fmt: skip
    for name, d in (("A", a), ("B", b)):
        sums: dict[str, float] = {}
        for n, (t, _) in d.items():
            sums[group(n)] = sums.get(group(n), 0.0) + t / STEPS
        groups = ", ".join(f"{g} {v:.0f}" for g, v in sorted(sums.items()))
        print(f"{name} us/step: {groups}; all {sum(sums.values()):.0f}")


if __name__ == "__main__":
    main()
