"""project_tp8.py on small synthetic ``bench_step_kimi.json`` files (CPU): the collectives'
arithmetic against hand computations, W per configuration and batch size, the published
latency lines, tokens/s per user and the DDTREE / DFLASH ratio, and cells that cannot be
projected reported instead of crashing."""

import json
import math

import pytest

NO_LINK = (0.0, math.inf)  # LinkModel arguments of a free collective


def step(bs, step_ms, prompt_len=256, temp="T0"):
    """One measured step cell as bench_step.py writes it (random-weight accept length ~1)."""
    return {"bs": bs, "prompt_len": prompt_len, "temp": temp, "accept_length": 1.02,
            "tok_per_s": 50.0, "wall_s": 3.0, "steps": 40, "step_ms": step_ms, "span_ms": 1.0}  # fmt: skip


def bench_file(tmp_path, rows, name="bench_step_kimi.json", not_run=(), **top):
    result = {"model": "kimi", "tp_rank_of": 8, "rows": rows, "not_run": list(not_run), **top}
    path = tmp_path / name
    path.write_text(json.dumps(result))
    return str(path)


@pytest.fixture(scope="module")
def mod(load_benchmark):
    return load_benchmark("project_tp8")


def test_collectives_by_hand(mod):
    """bs 2 with a 10 us + 50 GB/s all-reduce and a 20 us + 400 GB/s all-gather (50,000 and
    400,000 bytes per us)."""
    ar, ag = mod.LinkModel(10.0, 50.0), mod.LinkModel(20.0, 400.0)
    schedule = mod.default_schedule(8)
    # DFLASH: W 8, 16 rows of 7168 x 2 = 229,376 bytes: 10 + 229,376 / 50,000 = 14.58752 us.
    dflash = mod.parse_config("dflash@flashmla")
    got = mod.collectives_us(dflash, 2, mod.verify_width(dflash, 2, schedule), ar, ag)
    assert got["target_all_reduce"] == pytest.approx(123 * 14.58752)  # 1 + 2 x 61 calls
    # Logits: 16 rows x 163,840 x 2 = 5,242,880 bytes: 20 + 5,242,880 / 400,000 = 33.1072 us.
    assert got["logits_all_gather"] == pytest.approx(33.1072)
    # Drafter: one block, 2 x 8 rows, the same 229,376 bytes, 1 + 2 x 6 calls.
    assert got["drafter_all_reduce"] == pytest.approx(13 * 14.58752)
    assert got["draft_select"] == pytest.approx(2 * 20.0)  # two small collectives, latency only
    assert sum(got.values()) == pytest.approx(1794.26496 + 33.1072 + 189.63776 + 40.0)
    # DDTREE's default at bs 2: W 16, 32 rows = 458,752 bytes: 10 + 9.17504 = 19.17504 us;
    # logits 10,485,760 bytes: 20 + 26.2144 us; the drafter's block is the chain's.
    ddtree = mod.parse_config("ddtree@flashmla")
    got = mod.collectives_us(ddtree, 2, mod.verify_width(ddtree, 2, schedule), ar, ag)
    assert got["target_all_reduce"] == pytest.approx(123 * 19.17504)
    assert got["logits_all_gather"] == pytest.approx(46.2144)
    assert got["drafter_all_reduce"] == pytest.approx(13 * 14.58752)
    # No speculation: W 1, 2 rows = 28,672 bytes: 10 + 0.57344 us; no drafter.
    none = mod.parse_config("none")
    got = mod.collectives_us(none, 2, 1, ar, ag)
    assert got["target_all_reduce"] == pytest.approx(123 * 10.57344)
    assert got["logits_all_gather"] == pytest.approx(20.0 + 655_360 / 400_000)
    assert got["drafter_all_reduce"] == 0.0 and got["draft_select"] == 0.0


def test_published_lines(mod):
    """The default lines pass through their two anchor points and lie on or above every
    published measurement."""
    ar, ag = mod.ALL_REDUCE, mod.ALL_GATHER
    # 1 MiB -> 4 MiB costs 33.8 - 16.7 = 17.1 us: 3,145,728 / 17.1 = 183,961 bytes per us;
    # a = 16.7 - 1,048,576 / 183,961 = 16.7 - 5.7 = 11.0 us.
    assert ar.bandwidth_gbps == pytest.approx(183.961, rel=1e-5)
    assert ar.latency_us == pytest.approx(11.0)
    # 32 MiB -> 128 MiB costs 385.3 - 118.9 = 266.4 us: 100,663,296 / 266.4 = 377,865 bytes
    # per us; a = 118.9 - 33,554,432 / 377,865 = 118.9 - 88.8 = 30.1 us.
    assert ag.bandwidth_gbps == pytest.approx(377.865, rel=1e-5)
    assert ag.latency_us == pytest.approx(30.1)
    for line, points in ((ar, mod.SGLANG_CUSTOM_ALL_REDUCE_H100_TP8),
                         (ag, mod.NCCL_RING_ALL_GATHER_H100_8GPU)):  # fmt: skip
        assert all(line.time_us(nbytes) >= us - 1e-9 for nbytes, us in points)
    # The smallest all-reduce of the grid, one row of 14,336 bytes: 11.0 + 0.078 us.
    assert ar.time_us(14_336) == pytest.approx(11.0 + 14_336 / 183_960.7, rel=1e-6)


@pytest.mark.parametrize(
    "name, widths",
    [
        ("none@flashmla", {1: 1, 3: 1, 4: 1, 64: 1}),
        ("dflash@flashmla", {1: 8, 3: 8, 4: 8, 64: 8}),
        ("ddtree@flashmla", {1: 16, 3: 16, 4: 8, 16: 8, 64: 8}),  # schedule 1:16,4:8
        ("ddtree-15@flashmla", {1: 16, 4: 16, 64: 16}),
        ("ddtree-7+baseline@triton", {1: 8, 64: 8}),
        ("ddtree-31", {1: 32, 16: 32}),
    ],
)
def test_verify_width(mod, name, widths):
    schedule = mod.default_schedule(8)
    config = mod.parse_config(name)
    assert {bs: mod.verify_width(config, bs, schedule) for bs in widths} == widths


def test_configuration_names(mod):
    config = mod.parse_config("ddtree-15+baseline+tritontopk@flashmla")
    assert (config.kind, config.fixed_width, config.variant, config.backend) == (
        "ddtree", 16, "+baseline+tritontopk", "flashmla"
    )  # fmt: skip
    for bad in ("dflash-b8", "ddtree-x", "eagle"):
        with pytest.raises(ValueError):
            mod.parse_config(bad)
    # Another schedule changes the adaptive W and nothing else.
    other = mod.BudgetSchedule.parse("1:32,8:16")
    assert mod.verify_width(mod.parse_config("ddtree"), 7, other) == 32
    assert mod.verify_width(mod.parse_config("ddtree-15"), 7, other) == 16


def test_tree_ratios_and_accept_lengths(mod):
    """r(W) from the trained pair at the same W / block, and the accept length per config."""
    ratios = mod.default_tree_ratios()
    assert ratios == {8: pytest.approx(1.90 / 1.55), 16: pytest.approx(2.06 / 1.55)}
    ddtree, dflash, none = (mod.parse_config(n) for n in ("ddtree", "dflash", "none"))
    assert mod.accept_length(dflash, 8, 3.7, ratios) == 3.7
    assert mod.accept_length(none, 1, 5.3, ratios) == 1.0
    assert mod.accept_length(ddtree, 8, 5.3, {8: 1.2}) == pytest.approx(6.36)  # 5.3 x 1.2
    assert mod.accept_length(ddtree, 32, 5.3, ratios) is None  # no ratio at W 32
    # At most the block: 7 drafted tokens and the bonus (7.0 x 1.25 = 8.75 -> 8).
    assert mod.accept_length(ddtree, 16, 7.0, {16: 1.25}) == 8.0
    assert mod.parse_tree_ratios(["32=1.4", "8=1.1"]) == {32: 1.4, 8: 1.1}
    with pytest.raises(SystemExit):
        mod.parse_tree_ratios(["16:1.3"])


def test_tokens_per_user_and_ratio(mod, tmp_path):
    """Without communication the ratio is r x chain step / tree step; with the default lines
    every ratio is the quotient of the two projected tokens/s per user."""
    path = bench_file(tmp_path, [
        {"config": "dflash@flashmla", "step": [step(1, 20.0), step(4, 24.0)]},
        {"config": "ddtree@flashmla", "step": [step(1, 21.0), step(4, 25.0)]},
        {"config": "none@flashmla", "step": [step(1, 16.0)]},
    ])  # fmt: skip
    cells, configs, missing = mod.load_cells([path])
    assert missing == []
    free = mod.LinkModel(*NO_LINK)
    rows, notes = mod.project(
        cells, configs, [3.7, 5.3], {16: 1.25, 8: 1.2}, mod.default_schedule(8), free, free
    )
    assert notes == []
    by = {(r["config"], r["bs"]): r for r in rows}
    chain, tree = by[("dflash@flashmla", 1)], by[("ddtree@flashmla", 1)]
    assert chain["tp8_step_ms"] == 20.0 and tree["w"] == 16
    # 3.7 tokens per 20 ms = 185 tokens/s; the tree 3.7 x 1.25 = 4.625 per 21 ms.
    assert chain["tok_s_per_user"][3.7] == pytest.approx(185.0)
    assert tree["tok_s_per_user"][3.7] == pytest.approx(4.625 / 21.0 * 1e3)
    assert tree["ratio_to_chain"][3.7] == pytest.approx(1.25 * 20.0 / 21.0)  # 1.190476
    # bs 4: W 8, r 1.2: 1.2 x 24 / 25 = 1.152 at either tau.
    assert by[("ddtree@flashmla", 4)]["ratio_to_chain"][5.3] == pytest.approx(1.152)
    assert by[("none@flashmla", 1)]["tok_s_per_user"][5.3] == pytest.approx(1e3 / 16.0)
    assert by[("dflash@flashmla", 1)]["ratio_to_chain"] == {}  # only DDTREE rows have one

    rows, _ = mod.project(cells, configs, [3.7, 5.3], {16: 1.25, 8: 1.2}, mod.default_schedule(8))
    by = {(r["config"], r["bs"]): r for r in rows}
    for bs in (1, 4):
        chain, tree = by[("dflash@flashmla", bs)], by[("ddtree@flashmla", bs)]
        assert tree["tp8_step_ms"] > tree["one_rank_step_ms"]
        for tau in (3.7, 5.3):
            assert tree["ratio_to_chain"][tau] == pytest.approx(
                tree["tok_s_per_user"][tau] / chain["tok_s_per_user"][tau]
            )


def test_cells_that_cannot_be_projected(mod, tmp_path, capsys):
    """A failed and an unrun configuration, a cell skipped for its KV, a step never measured, a
    tree width without a ratio and a DDTREE cell without a chain cell are listed; the rest is
    projected and written."""
    path = bench_file(tmp_path, [
        {"config": "dflash@flashmla", "step": [step(1, 20.0)]},
        {"config": "ddtree@flashmla", "step": [
            step(1, 21.0), step(16, 30.0), {"bs": 64, "prompt_len": 256, "skipped": "KV"},
            step(4, None)]},
        {"config": "ddtree-31@flashmla", "step": [step(1, 23.0)]},
        {"config": "ddtree-15@triton", "error": "RuntimeError: out of memory"},
        {"config": "dflash-b8", "step": [step(1, 5.0)]},
    ], not_run=["none@flashmla"])  # fmt: skip
    out = tmp_path / "out"
    assert mod.main([path, "--out", str(out)]) == 0
    md = (out / "project_tp8_kimi.md").read_text()
    assert md == capsys.readouterr().out
    assert "ddtree-15@triton in" in md and "error: RuntimeError: out of memory" in md
    assert "none@flashmla in" in md and "not run (deadline)" in md
    assert "ddtree@flashmla (prompt 256; bs 64)" in md and "skipped (KV)" in md
    assert "ddtree@flashmla (T0; prompt 256; bs 4)" in md and "no step measured" in md
    assert "no tree / chain ratio for W=32" in md
    assert "ddtree@flashmla (T0; prompt 256; bs 16): no DFLASH cell to compare with" in md
    assert "dflash-b8 in" in md
    saved = json.loads((out / "project_tp8_kimi.json").read_text())
    projected = {(r["config"], r["bs"]) for r in saved["rows"]}
    assert projected == {("dflash@flashmla", 1), ("ddtree@flashmla", 1),
                         ("ddtree@flashmla", 16), ("ddtree-31@flashmla", 1)}  # fmt: skip
    tree32 = next(r for r in saved["rows"] if r["config"] == "ddtree-31@flashmla")
    assert tree32["tok_s_per_user"] == {"3.7": None, "5.3": None}
    assert tree32["tp8_step_ms"] > 23.0  # its step is still projected
    assert len(saved["not_projected"]) == 5 and len(saved["notes"]) == 2
    # The ratio table by concurrency leaves the uncompared cell empty.
    assert "| T0 | 256 | ddtree@flashmla | 3.7 | " in md


def test_several_files(mod, tmp_path):
    """A cell skipped in one file and measured in another is projected, not listed; a cell in
    both comes from the last file."""
    first = bench_file(tmp_path, [
        {"config": "dflash@flashmla", "step": [step(1, 20.0),
                                               {"bs": 16, "prompt_len": 256, "skipped": "KV"}]},
    ], name="a.json")  # fmt: skip
    second = bench_file(tmp_path, [
        {"config": "dflash@flashmla", "step": [step(1, 19.0), step(16, 40.0)]},
    ], name="b.json")  # fmt: skip
    cells, configs, missing = mod.load_cells([first, second])
    assert missing == [] and configs == ["dflash@flashmla"]
    assert cells[("dflash@flashmla", "T0", 256, 1)]["step_ms"] == 19.0
    assert cells[("dflash@flashmla", "T0", 256, 16)]["file"] == second


def test_refuses_other_measurements(mod, tmp_path):
    for top in ({"model": "8b", "tp_rank_of": None}, {"model": "kimi", "tp_rank_of": None}):
        path = bench_file(tmp_path, [], **top)
        with pytest.raises(SystemExit, match="--tp-rank-of 8"):
            mod.load_cells([path])
