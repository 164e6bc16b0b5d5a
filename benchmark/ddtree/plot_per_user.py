"""The Kimi K2.6 grid of RESULTS.md as one table and one plot: DDTREE against SGLang's DFLASH
chain, one-rank decode step and projected TP-8 tokens/s per user, per (context, batch size).

Reads the ``project_tp8_kimi.json`` files that ``project_tp8.py`` wrote next to each cited
``bench_step_kimi.json`` (``RUNS``), prints the markdown table RESULTS.md carries (a CPU test
keeps the two equal) and, with matplotlib, writes the plot RESULTS.md embeds::

    python3 benchmark/ddtree/plot_per_user.py --png benchmark/ddtree/per_user.png

Tokens/s per user are projections (``project_tp8.py``: one-rank step plus published collective
costs; accept lengths assumed, the chain's tau 3.7), not measurements.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (raw folder under results/, commit of the code measured)
RUNS = [
    ("run228", "53c4a0a"),
    ("run178", "13ddf0d"),
    ("run184", "b089ef5"),
    ("run176", "13ddf0d"),
]
TAU = "3.7"


def cells(results: Path = HERE / "results") -> list[dict]:
    """One dict per (prompt, bs): both methods' one-rank step, projected TP-8 tokens/s per user
    (the chain at tau 3.7, DDTREE at tau x r(8)) and the folder and commit it comes from."""
    out = []
    for run, commit in RUNS:
        rows = json.loads((results / run / "project_tp8_kimi.json").read_text())["rows"]
        by = {(r["config"].split("@")[0], r["prompt_len"], r["bs"]): r for r in rows}
        for (config, prompt, bs), r in sorted(by.items(), key=lambda kv: kv[0][1:]):
            if config != "ddtree":
                continue
            chain = by[("dflash", prompt, bs)]
            out.append(
                dict(
                    prompt=prompt,
                    bs=bs,
                    chain_ms=chain["one_rank_step_ms"],
                    ddtree_ms=r["one_rank_step_ms"],
                    chain_tps=chain["tok_s_per_user"][TAU],
                    ddtree_tps=r["tok_s_per_user"][TAU],
                    run=run,
                    commit=commit,
                )
            )
    return sorted(out, key=lambda c: (c["prompt"], c["bs"]))


def _tokens(n: int) -> str:
    return f"{n:,}"


def table(rows: list[dict] | None = None) -> list[str]:
    """The markdown table of RESULTS.md's Kimi K2.6 grid."""
    rows = cells() if rows is None else rows
    lines = [
        "| context | bs | chain ms | DDTREE ms | step ratio | chain tok/s/user | "
        "DDTREE tok/s/user | per-user ratio | commit, raw |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in rows:
        lines.append(
            f"| {_tokens(c['prompt'])} | {c['bs']} | {c['chain_ms']:.2f} | {c['ddtree_ms']:.2f} "
            f"| {c['ddtree_ms'] / c['chain_ms']:.3f} | {c['chain_tps']:.0f} | "
            f"{c['ddtree_tps']:.0f} | {c['ddtree_tps'] / c['chain_tps']:.2f} | "
            f"`{c['commit']}`, `results/{c['run']}/` |"
        )
    return lines


def plot(path: Path, rows: list[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = cells() if rows is None else rows
    short = [f"{c['prompt'] // 1024}K" if c["prompt"] >= 1024 else str(c["prompt"]) for c in rows]
    labels = [f"{s}\nbs {c['bs']}" for s, c in zip(short, rows)]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=110)
    w = 0.38
    ax.bar([i - w / 2 for i in x], [c["chain_tps"] for c in rows], w, label="DFLASH chain")
    ax.bar([i + w / 2 for i in x], [c["ddtree_tps"] for c in rows], w, label="DDTREE (W 8)")
    for i, c in enumerate(rows):
        ratio = c["ddtree_tps"] / c["chain_tps"]
        ax.text(i + w / 2, c["ddtree_tps"] + 4, f"{ratio:.2f}x", ha="center", fontsize=7)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_xlabel("context tokens (K = 1,024), concurrent requests")
    ax.set_ylabel("tokens/s per user (projected)")
    ax.set_ylim(0, 1.15 * max(c["ddtree_tps"] for c in rows))
    ax.set_title(
        "Kimi K2.6 at TP 8, projected from one H200 rank (random weights, flashmla, "
        "T 1 / top_p 0.95)\naccept lengths assumed: the chain's 3.7, DDTREE's 1.226 times that",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--png", type=Path, help="write the plot here (needs matplotlib)")
    args = ap.parse_args(argv)
    print("\n".join(table()))
    if args.png:
        plot(args.png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
