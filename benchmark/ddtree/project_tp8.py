"""Projected TP-8 decode step and tokens/s per user of Kimi K2.6, from one-rank step times.

``bench_step.py --model kimi --tp-rank-of 8`` times, on one GPU, a tp-1 engine with exactly one
TP-8 rank's shapes of Kimi K2.6 (``bench_step_kimi.json``): one rank's work per decode step,
without the collectives. This tool adds the collectives back from published latencies and turns
the projected step into tokens/s per user (concurrency c = bs) with accept lengths taken from
outside those random-weight engines (their own accept lengths, about 1, are never used)::

    TP-8 step = one-rank step_ms + collectives(config, bs)
    tokens/s per user = accept length / TP-8 step

per (sampling setting T, prompt length, bs) cell of every configuration (``none``, ``dflash``,
``ddtree``, ``ddtree-N``, with any ``+variant`` and ``@backend``), and for each DDTREE cell the
ratio of its tokens/s per user to the DFLASH chain's of the same backend and variant.

Verify width W, the tokens each request puts through the target in one step: 1 without
speculation; the block, 8, for the DFLASH chain; ``ddtree`` the budget schedule's W
(``--ddtree-schedule``: the one the run used; the plugin's default for K2.6, a mixture-of-experts
target, is ``1:8``, W 8 at every bs; before it, ``1:16,4:8``); ``ddtree-N`` N + 1.

Collectives per decode step at TP 8, as SGLang 0.5.17 runs K2.6 (a DeepseekV3 model) with
tensor parallelism alone:

- target, T = bs x W rows: an all-reduce of [T, 7168] bf16 after the vocab-parallel input
  embedding and after each of the 61 layers' attention and MoE / MLP,
  ``(1 + 2 x 61) x t_ar(T x 7168 x 2)``; the vocab-parallel LM head's logits all-gathered
  (``LogitsProcessor``: [T, 163840 / 8] bf16 per rank into [T, 163840]),
  ``t_ag(T x 163840 x 2)``.
- drafter (DFLASH and DDTREE), D = bs x 8 rows (one block): the same embedding all-reduce and
  two per layer of its 6, ``(1 + 2 x 6) x t_ar(D x 7168 x 2)``; its context projection is
  replicated and its K / V projections column-parallel (no collective). Draft tokens from the
  vocab-parallel head: DFLASH all-gathers every rank's maxima and their ids (two all-gathers),
  DDTREE every rank's top-K candidates (one all-gather) and all-reduces a rank fingerprint:
  two NCCL collectives of a few kilobytes each, ``2 x t_ag(0)``.

The all-reduce figure, ``t_ar(bytes) = a + bytes / b``. SGLang's custom all-reduce on 8 x H100
(NVLink 4 through NVSwitch, 900 GB/s per GPU as on the H200), tp 8, timed without CUDA graphs
over 5,000 back-to-back calls, https://github.com/sgl-project/sglang/pull/2904 ("unit test
performance in H100"; its sizes count float32 elements, ``sgl-kernel/tests/test_trt_reduce.py``
of that change): 2 KiB 5.9 us, 16 KiB 5.7, 128 KiB 7.8, 1 MiB 16.7, 2 MiB 22.1, 4 MiB 33.8 us
(vLLM's kernel, same run: 10.1, 9.3, 11.8, 24.1, 30.4, 45.0 us). ``a`` and ``b`` are the line
through the 1 MiB and 4 MiB points, a = 11.0 us, b = 184 GB/s, which lies on or above all six.
Conservative: it overstates the small messages by 3.9-5.4 us a call (11.0-11.7 us against
5.7-7.8 us up to 128 KiB; a row of the grid is 14,336 bytes, so 8 to 64 rows, bs 1-8 at W 8,
are 112 KiB to 896 KiB), and it comes from eager calls on H100, where SGLang 0.5.17's decode
replays CUDA graphs on H200 with its newer kernels (at tp 8: one-shot push up to 128 KiB,
two-shot above, NCCL only past its 16 MiB workspace; the grid's largest message, 1,024 rows, is
14 MiB). Not an upper bound on every implementation: vLLM's H100 table at tp 6
(https://github.com/vllm-project/vllm/pull/24111) has NCCL at 43 / 53 us for 2 / 4 MB against
this line's 22.4 / 33.8 us (its own two-stage custom all-reduce: 26 / 37 us). A larger cost
per all-reduce raises every projected step, so it lowers the projected tokens/s; for the
DDTREE / DFLASH ratio it cuts both ways (the fixed part dilutes whichever one-rank step is
slower, the bytes part weighs on the wider verify, W 16 at bs 1-3). ``--ar-latency-us`` /
``--ar-bandwidth-gbps`` replace it (``--ar-latency-us 0 --ar-bandwidth-gbps inf --ag-latency-us
0 --ag-bandwidth-gbps inf``: no communication at all).

The all-gather figure, ``t_ag(bytes of the gathered output) = a + bytes / b``: NCCL's ring
all-gather on 8 x H100, the NCCL kernel's device time (cross-rank minimum) per size of the
gathered buffer, https://github.com/NVIDIA/Megatron-LM/pull/5596: 2 MiB 20.2 us, 8 MiB 43.4,
32 MiB 118.9, 128 MiB 385.3 us. The line through the 32 MiB and 128 MiB points, a = 30.1 us,
b = 378 GB/s, lies on or above all four (by 15.4 and 8.9 us at 2 and 8 MiB, which offsets
the fastest-rank timing). Conservative: SGLang gathers the verify logits with a multicast
(NVLS) all-gather where the GPUs offer it, NCCL otherwise; the small collectives cost its
30.1 us intercept each.

Accept lengths (committed tokens per verify step):

- DFLASH chain: tau_chain of z-lab's block-8 Kimi-K2.5-DFlash drafter, from its model card
  (https://huggingface.co/z-lab/Kimi-K2.5-DFlash): 3.7 on MT-Bench, 5.3 on GSM8K
  (``--tau-chain``).
- DDTREE: tau_tree = tau_chain x r(W), at most the block (7 drafted tokens and the bonus).
  r(W), the tree / chain accept-length ratio, is an assumption transferred from the project's
  tiny trained pair (a 4.0M Qwen3 target and its block-16 DFlash drafter; RESULTS.md, the
  trained pair's accept lengths at T=1, top_p 0.95: chain 1.55, DDTREE at W 16 1.90, at W 32
  2.06), taken at the same W relative to the drafter's block (the pair's 16, K2.6's 8):
  r(8) = 1.90 / 1.55 = 1.226, r(16) = 2.06 / 1.55 = 1.329. By absolute W, r(16) would be 1.226
  instead. Other W have no default (``--tree-ratio W=R``): their cells get no tokens/s.
- none: 1.

Not modelled: the sampling over the full vocabulary after the logits gather (the one-rank
engine samples over 163840 / 8 columns), host-side differences between one engine and eight
ranks, and any overlap of the collectives with compute (SGLang's decode runs them in line).

Reads one or more ``bench_step_kimi.json`` files: cells skipped for their KV or without a
measured step, and configurations that failed or did not run, are listed, not projected; a cell
measured in several files is taken from the last. Writes ``<out>/project_tp8_kimi.md`` and
``<out>/project_tp8_kimi.json`` and prints the markdown; CPU only::

    python3 benchmark/ddtree/project_tp8.py bench_out/bench_step_kimi.json --out bench_out
    python3 benchmark/ddtree/project_tp8.py a/bench_step_kimi.json b/bench_step_kimi.json \\
        --tree-ratio 8=1.2 16=1.3 --tau-chain 3.7 5.3 --out bench_out
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from sglang_ddtree.srt.ddtree_budget import BudgetSchedule, default_schedule

# Kimi K2.6 at TP 8 and its DFlash drafter.
KIMI_LAYERS = 61
HIDDEN_SIZE = 7168
VOCAB_SIZE = 163840
TP_SIZE = 8
DRAFTER_LAYERS = 6
BLOCK_SIZE = 8
BF16_BYTES = 2
# All-reduces per forward: the vocab-parallel embedding's, then two per layer.
TARGET_ALL_REDUCES = 1 + 2 * KIMI_LAYERS
DRAFTER_ALL_REDUCES = 1 + 2 * DRAFTER_LAYERS
# Small NCCL collectives choosing the draft tokens from the vocab-parallel head.
DRAFT_SELECT_COLLECTIVES = 2

KiB = 1024
MiB = 1024 * KiB

# (message bytes, microseconds) as published; see the module docstring.
SGLANG_CUSTOM_ALL_REDUCE_H100_TP8 = (
    (2 * KiB, 5.9),
    (16 * KiB, 5.7),
    (128 * KiB, 7.8),
    (1 * MiB, 16.7),
    (2 * MiB, 22.1),
    (4 * MiB, 33.8),
)
ALL_REDUCE_SOURCE = "https://github.com/sgl-project/sglang/pull/2904"
NCCL_RING_ALL_GATHER_H100_8GPU = (
    (2 * MiB, 20.2),
    (8 * MiB, 43.4),
    (32 * MiB, 118.9),
    (128 * MiB, 385.3),
)
ALL_GATHER_SOURCE = "https://github.com/NVIDIA/Megatron-LM/pull/5596"

# Accept lengths per verify step of z-lab's Kimi-K2.5-DFlash (block 8), MT-Bench and GSM8K.
TAU_CHAIN = (3.7, 5.3)
TAU_CHAIN_SOURCE = "https://huggingface.co/z-lab/Kimi-K2.5-DFlash"
# The trained pair's accept lengths at T=1, top_p 0.95 (RESULTS.md): the block-16 chain, and
# DDTREE at W nodes.
PAIR_BLOCK_SIZE = 16
PAIR_CHAIN_ACCEPT = 1.55
PAIR_TREE_ACCEPT = {16: 1.90, 32: 2.06}


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """``time_us(bytes) = latency_us + bytes / bandwidth`` (bandwidth in GB/s, 1e9 bytes)."""

    latency_us: float
    bandwidth_gbps: float

    def time_us(self, nbytes: float) -> float:
        return self.latency_us + nbytes / (self.bandwidth_gbps * 1e3)

    @classmethod
    def through(cls, p: tuple[int, float], q: tuple[int, float]) -> LinkModel:
        """The line through two published (bytes, us) points."""
        (x0, t0), (x1, t1) = p, q
        bytes_per_us = (x1 - x0) / (t1 - t0)
        return cls(latency_us=t0 - x0 / bytes_per_us, bandwidth_gbps=bytes_per_us / 1e3)


ALL_REDUCE = LinkModel.through(
    SGLANG_CUSTOM_ALL_REDUCE_H100_TP8[3], SGLANG_CUSTOM_ALL_REDUCE_H100_TP8[5]
)
ALL_GATHER = LinkModel.through(NCCL_RING_ALL_GATHER_H100_8GPU[2], NCCL_RING_ALL_GATHER_H100_8GPU[3])


def default_tree_ratios() -> dict[int, float]:
    """r(W) for K2.6's block 8: the pair's DDTREE / chain accept at the same W / block."""
    return {
        w * BLOCK_SIZE // PAIR_BLOCK_SIZE: accept / PAIR_CHAIN_ACCEPT
        for w, accept in PAIR_TREE_ACCEPT.items()
    }


@dataclasses.dataclass(frozen=True)
class Config:
    """A bench_step configuration name, ``kind[-N][+variant...][@backend]``."""

    name: str
    kind: str  # "none", "dflash" or "ddtree"
    fixed_width: int | None  # ddtree-N: N + 1; None: from the schedule (ddtree) or the kind
    variant: str  # "+a+b" or ""
    backend: str  # "" when the name has none

    @property
    def speculative(self) -> bool:
        return self.kind != "none"


def parse_config(name: str) -> Config:
    """``"ddtree-15+baseline@flashmla"`` -> kind ddtree, W 16, variant ``+baseline``, backend
    flashmla. ValueError for configurations this projection does not know (``dflash-b8``)."""
    rest, _, backend = name.partition("@")
    base, *variants = rest.split("+")
    variant = "".join(f"+{v}" for v in variants)
    if base in ("none", "dflash", "ddtree"):
        return Config(name, base, None, variant, backend)
    if base.startswith("ddtree-") and base[len("ddtree-") :].isdigit():
        budget = int(base[len("ddtree-") :])
        return Config(name, "ddtree", budget + 1, variant, backend)
    raise ValueError(f"{name!r}: not none, dflash, ddtree or ddtree-N")


def verify_width(config: Config, bs: int, schedule: BudgetSchedule) -> int:
    """W: tokens per request through the target in one decode step of ``bs`` requests."""
    if config.kind == "none":
        return 1
    if config.kind == "dflash":
        return BLOCK_SIZE
    if config.fixed_width is not None:
        return config.fixed_width
    return schedule.num_nodes_for(bs)


def collectives_us(
    config: Config, bs: int, width: int, all_reduce: LinkModel, all_gather: LinkModel
) -> dict[str, float]:
    """The TP-8 collectives of one decode step, us, by part (module docstring)."""
    rows = bs * width
    parts = {
        "target_all_reduce": TARGET_ALL_REDUCES
        * all_reduce.time_us(rows * HIDDEN_SIZE * BF16_BYTES),
        "logits_all_gather": all_gather.time_us(rows * VOCAB_SIZE * BF16_BYTES),
        "drafter_all_reduce": 0.0,
        "draft_select": 0.0,
    }
    if config.speculative:
        block_rows = bs * BLOCK_SIZE
        parts["drafter_all_reduce"] = DRAFTER_ALL_REDUCES * all_reduce.time_us(
            block_rows * HIDDEN_SIZE * BF16_BYTES
        )
        parts["draft_select"] = DRAFT_SELECT_COLLECTIVES * all_gather.time_us(0)
    return parts


def accept_length(
    config: Config, width: int, tau_chain: float, tree_ratios: dict[int, float]
) -> float | None:
    """Committed tokens per verify step; None for a DDTREE width without a tree / chain ratio."""
    if config.kind == "none":
        return 1.0
    if config.kind == "dflash":
        return tau_chain
    ratio = tree_ratios.get(width)
    return None if ratio is None else min(tau_chain * ratio, float(BLOCK_SIZE))


def load_cells(paths: list[str]) -> tuple[dict, list[str], list[dict]]:
    """Measured step cells of the files, keyed ``(config, temp, prompt_len, bs)``, the
    configurations in first-seen order, and what cannot be projected (with the reason)."""
    cells: dict[tuple, dict] = {}
    configs: list[str] = []
    missing: list[dict] = []
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        if result.get("model") != "kimi" or result.get("tp_rank_of") != TP_SIZE:
            raise SystemExit(
                f"{path}: model {result.get('model')!r}, tp_rank_of {result.get('tp_rank_of')!r};"
                f" this projection needs bench_step.py --model kimi --tp-rank-of {TP_SIZE}"
            )
        for name in result.get("not_run", []):
            missing.append({"file": path, "config": name, "reason": "not run (deadline)"})
        for row in result.get("rows", []):
            name = row["config"]
            if "error" in row:
                missing.append({"file": path, "config": name, "reason": f"error: {row['error']}"})
                continue
            try:
                parse_config(name)
            except ValueError as e:
                missing.append({"file": path, "config": name, "reason": str(e)})
                continue
            if name not in configs:
                configs.append(name)
            for step in row.get("step", []):
                where = {"config": name, "prompt_len": step.get("prompt_len"), "bs": step["bs"]}
                if "skipped" in step:
                    missing.append(
                        {"file": path, **where, "reason": f"skipped ({step['skipped']})"}
                    )
                    continue
                if step.get("step_ms") is None:
                    missing.append(
                        {"file": path, **where, "temp": step["temp"], "reason": "no step measured"}
                    )
                    continue
                key = (name, step["temp"], step.get("prompt_len"), step["bs"])
                cells[key] = {**step, "file": path}
    # A cell skipped or unmeasured in one file but measured in another is projected.
    measured = {(c, t, p, b) for c, t, p, b in cells} | {(c, None, p, b) for c, _, p, b in cells}
    missing = [
        m
        for m in missing
        if "bs" not in m or (m["config"], m.get("temp"), m["prompt_len"], m["bs"]) not in measured
    ]
    return cells, configs, missing


def chain_reference(config: Config, configs: list[str]) -> str | None:
    """The DFLASH configuration a DDTREE one is compared with: same variant and backend, else
    the plain chain of that backend."""
    at = f"@{config.backend}" if config.backend else ""
    for name in (f"dflash{config.variant}{at}", f"dflash{at}"):
        if name in configs:
            return name
    return None


def project(
    cells: dict,
    configs: list[str],
    taus: list[float],
    tree_ratios: dict[int, float],
    schedule: BudgetSchedule,
    all_reduce: LinkModel = ALL_REDUCE,
    all_gather: LinkModel = ALL_GATHER,
) -> tuple[list[dict], list[dict]]:
    """Projected rows, one per measured cell, and notes on what was left out of them."""
    rows, notes = [], []
    for (name, temp, plen, bs), cell in cells.items():
        config = parse_config(name)
        width = verify_width(config, bs, schedule)
        parts = collectives_us(config, bs, width, all_reduce, all_gather)
        comm_ms = sum(parts.values()) / 1e3
        step_ms = cell["step_ms"] + comm_ms
        row = {
            "config": name,
            "temp": temp,
            "prompt_len": plen,
            "bs": bs,
            "w": width,
            "one_rank_step_ms": cell["step_ms"],
            "collectives_ms": comm_ms,
            "collectives_us": parts,
            "tp8_step_ms": step_ms,
            "file": cell["file"],
            "accept": {},
            "tok_s_per_user": {},
            "ratio_to_chain": {},
            "chain": None,
        }
        for tau in taus:
            acc = accept_length(config, width, tau, tree_ratios)
            row["accept"][tau] = acc
            row["tok_s_per_user"][tau] = None if acc is None else acc / step_ms * 1e3
        if config.kind == "ddtree" and None in row["accept"].values():
            notes.append(
                {**_where(row), "reason": f"no tree / chain ratio for W={width} (--tree-ratio)"}
            )
        rows.append(row)
    by_key = {(r["config"], r["temp"], r["prompt_len"], r["bs"]): r for r in rows}
    for row in rows:
        config = parse_config(row["config"])
        if config.kind != "ddtree":
            continue
        chain = chain_reference(config, configs)
        ref = by_key.get((chain, row["temp"], row["prompt_len"], row["bs"])) if chain else None
        if ref is None:
            notes.append({**_where(row), "reason": "no DFLASH cell to compare with"})
            continue
        row["chain"] = chain
        for tau in taus:
            mine, theirs = row["tok_s_per_user"][tau], ref["tok_s_per_user"][tau]
            row["ratio_to_chain"][tau] = None if mine is None else mine / theirs
    order = {name: i for i, name in enumerate(configs)}
    rows.sort(key=lambda r: (r["temp"], r["prompt_len"] or 0, r["bs"], order[r["config"]]))
    return rows, notes


def _where(row: dict) -> dict:
    return {k: row[k] for k in ("config", "temp", "prompt_len", "bs")}


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(
    rows: list[dict],
    missing: list[dict],
    notes: list[dict],
    taus: list[float],
    tree_ratios: dict[int, float],
    all_reduce: LinkModel,
    all_gather: LinkModel,
    paths: list[str],
) -> str:
    ratios = ", ".join(f"r({w}) = {r:.3f}" for w, r in sorted(tree_ratios.items())) or "none"
    lines = [
        "# Kimi K2.6 at TP 8: decode step and tokens/s per user projected from one rank",
        "",
        f"One-rank steps from {', '.join(f'`{p}`' for p in paths)}. TP-8 step = one-rank step"
        f" + {TARGET_ALL_REDUCES} t_ar(bs W x {HIDDEN_SIZE} x 2 B) + t_ag(bs W x {VOCAB_SIZE} x 2"
        f" B) + (speculative) {DRAFTER_ALL_REDUCES} t_ar(bs {BLOCK_SIZE} x {HIDDEN_SIZE} x 2 B)"
        f" + {DRAFT_SELECT_COLLECTIVES} t_ag(0); t_ar(x) = {all_reduce.latency_us:.1f} us + x /"
        f" {all_reduce.bandwidth_gbps:.0f} GB/s ({ALL_REDUCE_SOURCE}), t_ag(x) ="
        f" {all_gather.latency_us:.1f} us + x / {all_gather.bandwidth_gbps:.0f} GB/s"
        f" ({ALL_GATHER_SOURCE}). tokens/s per user = accept / step: DFLASH tau_chain"
        f" ({TAU_CHAIN_SOURCE}), DDTREE tau_chain x r(W), r assumed from the trained pair"
        f" ({ratios}), none 1. DDTREE / DFLASH: tokens/s per user against the chain of the same"
        " backend at the same cell. The engines' own accept lengths (random weights) are unused.",
        "",
        "| T | prompt | bs (c) | config | W | one-rank ms | collectives ms | TP-8 ms | "
        + " | ".join(f"tok/s/user tau {t}" for t in taus)
        + " | "
        + " | ".join(f"DDTREE/DFLASH tau {t}" for t in taus)
        + " |",
        "|---|---:|---:|---|---:|---:|---:|---:|" + "---:|" * (2 * len(taus)),
    ]
    for r in rows:
        toks = [_num(r["tok_s_per_user"][t], ".1f") for t in taus]
        rat = [_num(r["ratio_to_chain"].get(t), ".3f") for t in taus]
        lines.append(
            f"| {r['temp']} | {r['prompt_len'] or '-'} | {r['bs']} | {r['config']} | {r['w']} | "
            f"{r['one_rank_step_ms']:.2f} | {r['collectives_ms']:.2f} | {r['tp8_step_ms']:.2f} | "
            + " | ".join(toks + rat)
            + " |"
        )
    tree_rows = [r for r in rows if any(v is not None for v in r["ratio_to_chain"].values())]
    if tree_rows:
        sizes = sorted({r["bs"] for r in rows})
        lines += [
            "",
            "DDTREE / DFLASH tokens/s per user by concurrency",
            "",
            "| T | prompt | config | tau | " + " | ".join(f"c = {c}" for c in sizes) + " |",
            "|---|---:|---|---:|" + "---:|" * len(sizes),
        ]
        groups: dict[tuple, dict[int, dict]] = {}
        for r in tree_rows:
            groups.setdefault((r["temp"], r["prompt_len"], r["config"]), {})[r["bs"]] = r
        for (temp, plen, name), by_bs in groups.items():
            for tau in taus:
                cells = [
                    _num(by_bs[c]["ratio_to_chain"].get(tau), ".3f") if c in by_bs else "-"
                    for c in sizes
                ]
                lines.append(
                    f"| {temp} | {plen or '-'} | {name} | {tau} | " + " | ".join(cells) + " |"
                )
    if missing or notes:
        lines += ["", "Not projected or not compared:", ""]
        lines += [f"- {line}" for line in grouped_reasons(missing + notes)]
    return "\n".join(lines)


def grouped_reasons(entries: list[dict]) -> list[str]:
    """One line per (configuration, reason, file), with the cells it covers."""
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        groups.setdefault((e["config"], e["reason"], e.get("file")), []).append(e)
    out = []
    for (name, reason, path), members in groups.items():
        cells = []
        for key, label in (("temp", ""), ("prompt_len", "prompt "), ("bs", "bs ")):
            values = sorted({m[key] for m in members if m.get(key) is not None})
            if values:
                cells.append(label + ", ".join(str(v) for v in values))
        where = f" ({'; '.join(cells)})" if cells else ""
        source = f" in `{path}`" if path else ""
        out.append(f"{name}{where}{source}: {reason}")
    return out


def parse_tree_ratios(items: list[str]) -> dict[int, float]:
    """``["8=1.2", "16=1.3"]`` -> ``{8: 1.2, 16: 1.3}``."""
    out = {}
    for item in items:
        w, sep, r = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[int(w)] = float(r)
        except ValueError:
            raise SystemExit(f"--tree-ratio {item!r}: expected W=R, e.g. 16=1.33") from None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="bench_step_kimi.json files (--tp-rank-of 8)")
    ap.add_argument("--out", default=None, help="write project_tp8_kimi.md / .json here")
    ap.add_argument("--tau-chain", type=float, nargs="+", default=list(TAU_CHAIN))
    ap.add_argument(
        "--tree-ratio",
        nargs="+",
        default=[],
        help="W=R: DDTREE / chain accept-length ratio at W nodes (adds to or replaces the "
        "defaults " + ", ".join(f"{w}={r:.3f}" for w, r in default_tree_ratios().items()) + ")",
    )
    ap.add_argument(
        "--ddtree-schedule",
        default=str(default_schedule(BLOCK_SIZE, moe=True)),
        help="the budget schedule the ddtree configuration ran (min_bs:W,...; default: the "
        "plugin's default for a mixture-of-experts target, 1:8)",
    )
    ap.add_argument("--ar-latency-us", type=float, default=ALL_REDUCE.latency_us)
    ap.add_argument("--ar-bandwidth-gbps", type=float, default=ALL_REDUCE.bandwidth_gbps)
    ap.add_argument("--ag-latency-us", type=float, default=ALL_GATHER.latency_us)
    ap.add_argument("--ag-bandwidth-gbps", type=float, default=ALL_GATHER.bandwidth_gbps)
    args = ap.parse_args(argv)
    tree_ratios = {**default_tree_ratios(), **parse_tree_ratios(args.tree_ratio)}
    try:
        schedule = BudgetSchedule.parse(args.ddtree_schedule)
    except ValueError as e:
        raise SystemExit(f"--ddtree-schedule: {e}") from None
    all_reduce = LinkModel(args.ar_latency_us, args.ar_bandwidth_gbps)
    all_gather = LinkModel(args.ag_latency_us, args.ag_bandwidth_gbps)
    cells, configs, missing = load_cells(args.files)
    rows, notes = project(
        cells, configs, args.tau_chain, tree_ratios, schedule, all_reduce, all_gather
    )
    md = markdown(
        rows, missing, notes, args.tau_chain, tree_ratios, all_reduce, all_gather, args.files
    )
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "project_tp8_kimi.md"), "w") as f:
            f.write(md + "\n")
        model = {
            "all_reduce": {**dataclasses.asdict(all_reduce), "source": ALL_REDUCE_SOURCE},
            "all_gather": {**dataclasses.asdict(all_gather), "source": ALL_GATHER_SOURCE},
            "tau_chain": args.tau_chain,
            "tau_chain_source": TAU_CHAIN_SOURCE,
            "tree_ratios": tree_ratios,
            "ddtree_schedule": str(schedule),
        }
        with open(os.path.join(args.out, "project_tp8_kimi.json"), "w") as f:
            json.dump(
                {
                    "files": args.files,
                    "model": model,
                    "rows": rows,
                    "not_projected": missing,
                    "notes": notes,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
