"""Benchmarks on a machine that cannot run them: a message and a non-zero exit, not a
traceback or a row of failures with exit code 0."""

import sys

import pytest
import torch


def test_bench_core_needs_cuda(load_benchmark, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("CUDA is visible")
    mod = load_benchmark("bench_core")
    monkeypatch.setattr(sys, "argv", ["bench_core.py"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        mod.main()


def test_bench_step_needs_sglang_and_cuda(load_benchmark, monkeypatch, tmp_path):
    from sglang_ddtree.serve import serving_unavailable

    mod = load_benchmark("bench_step")
    if serving_unavailable() is None:
        pytest.skip("this machine runs SGLang engines")
    monkeypatch.setattr(sys, "argv", ["bench_step.py", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="runs SGLang engines on a GPU"):
        mod.main()


def test_kimi_shape_configs(load_benchmark, tmp_path):
    """bench_step's Kimi K2.6 shape: the target is K2.6's config cut to N layers, the drafter
    reads six distinct layers before the last, and each config's verify width is known."""
    mod = load_benchmark("bench_step")
    for layers in (9, 12, 61):
        target, drafter = mod.kimi_configs(layers)
        ids = drafter["dflash_config"]["target_layer_ids"]
        assert target["num_hidden_layers"] == layers and drafter["num_target_layers"] == layers
        assert len(set(ids)) == 6 and min(ids) >= 1 and max(ids) <= layers - 2
        assert (target["kv_lora_rank"], target["n_routed_experts"], target["vocab_size"]) == (
            512, 384, 163840
        )  # fmt: skip
    assert mod.kimi_configs(61)[1]["dflash_config"]["target_layer_ids"] == [1, 12, 24, 35, 47, 58]
    with pytest.raises(SystemExit):
        mod.kimi_configs(8)
    spec = mod.model_spec("kimi", str(tmp_path), kimi_layers=9)
    assert spec["block"] == 8 and min(len(p) for p in spec["prompts"]) == 256
    w = {c: mod.verify_tokens_per_request(spec, c) for c in ("none", "dflash", "ddtree-32")}
    assert w == {"none": 1, "dflash": 8, "ddtree-32": 33}
    with pytest.raises(SystemExit):
        mod.verify_tokens_per_request(spec, "ddtree")  # adaptive: no single W


def test_expert_counter(tmp_path):
    """The MoE top-k counter counts distinct routed experts (a fused shared expert's id and
    padding excluded) and its files read back; the summary keeps the calls of one width."""
    from sglang_ddtree import step_timing as st

    ids = torch.tensor([[0, 5, 384], [5, 7, -1]])  # 384: the fused shared expert
    assert st.distinct_routed_experts(ids, 384) == 3
    (tmp_path / "experts.1.txt").write_text("2 3\n66 40\n")
    (tmp_path / "experts.2.txt").write_text("66 44\n")
    rows = st.read_expert_counts(str(tmp_path))
    assert sorted(rows) == [(2, 3), (66, 40), (66, 44)]


def test_expert_stats(load_benchmark):
    mod = load_benchmark("bench_step")
    got = mod.expert_stats([(66, 40), (66, 44), (256, 200), (66, 42)], 66)
    assert got == {"tokens": 66, "calls": 3, "median": 42, "max": 44}
    assert mod.expert_stats([], 9)["calls"] == 0
