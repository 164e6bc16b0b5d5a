"""Benchmarks on a machine that cannot run them: a message and a non-zero exit, not a
traceback or a row of failures with exit code 0."""

import json
import os
import sys
from types import SimpleNamespace

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


def test_bench_step_memory_history_is_for_the_startup_phase(load_benchmark, monkeypatch, tmp_path):
    """``--memory-history`` (allocation stacks in the startup glue capture) is refused with any
    phase but ``startup``, before an engine starts."""
    import sglang_ddtree.serve

    mod = load_benchmark("bench_step")
    monkeypatch.setattr(sglang_ddtree.serve, "serving_unavailable", lambda: None)
    argv = ["bench_step.py", "--out", str(tmp_path), "--memory-history"]
    monkeypatch.setattr(sys, "argv", [*argv, "--phases", "step"])
    with pytest.raises(SystemExit, match="--memory-history is for --phases startup"):
        mod.main()


def test_kimi_shape_configs(load_benchmark, tmp_path):
    """bench_step's Kimi K2.6 shape: the target is K2.6's config cut to N layers, the drafter
    reads six distinct layers before the last, and each config's verify width is known."""
    mod = load_benchmark("bench_step")
    for layers in (mod.KIMI_TP2_LAYERS, 9, 12, 61):
        target, drafter = mod.kimi_configs(layers)
        ids = drafter["dflash_config"]["target_layer_ids"]
        assert target["num_hidden_layers"] == layers and drafter["num_target_layers"] == layers
        assert len(set(ids)) == 6 and min(ids) >= 0 and max(ids) <= layers - 2
        assert (target["kv_lora_rank"], target["n_routed_experts"], target["vocab_size"]) == (
            512, 384, 163840
        )  # fmt: skip
    assert mod.kimi_configs(61)[1]["dflash_config"]["target_layer_ids"] == [1, 12, 24, 35, 47, 58]
    assert mod.kimi_configs(7)[1]["dflash_config"]["target_layer_ids"] == [0, 1, 2, 3, 4, 5]
    with pytest.raises(SystemExit):
        mod.kimi_configs(6)
    spec = mod.model_spec("kimi", str(tmp_path), kimi_layers=9)
    assert spec["block"] == 8 and min(len(p) for p in spec["prompts"]) == 256
    w = {c: mod.verify_tokens_per_request(spec, c) for c in ("none", "dflash", "ddtree-32")}
    assert w == {"none": 1, "dflash": 8, "ddtree-32": 33}
    with pytest.raises(SystemExit):
        mod.verify_tokens_per_request(spec, "ddtree")  # adaptive: no single W


def test_word_tokenizer_for_constrained_cells(load_benchmark, tmp_path):
    """bench_step's tokenizer for a random-weight shape's regex cells: exactly the target's
    vocabulary size, distinct tokens, specials first, mostly lowercase words (so a regex of
    lowercase letters and spaces admits a real share of the vocabulary)."""
    from tokenizers import Tokenizer

    from sglang_ddtree.testing.tiny_models import SPECIALS

    mod = load_benchmark("bench_step")
    mod.write_word_tokenizer(str(tmp_path), 5000)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    vocab = tok.get_vocab()
    assert len(vocab) == 5000 and sorted(vocab.values()) == list(range(5000))
    assert [tok.id_to_token(i) for i in range(len(SPECIALS))] == SPECIALS
    lower = [t for t in vocab if t.strip().isalpha() and t.strip().islower()]
    assert 0.8 * 5000 < len(lower) < 5000
    spaced = next(t for t in lower if t.startswith(" "))
    bare = next(t for t in lower if not t.startswith(" "))
    assert tok.decode([vocab[bare], vocab[spaced]]) == bare + spaced  # detokenized as written
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == SPECIALS[0]


def test_expert_counter(load_benchmark, tmp_path):
    """The MoE top-k counter counts distinct routed experts (a fused shared expert's id and
    padding excluded) and its files read back; the summary keeps the calls of one width."""
    st = load_benchmark("instruments")

    ids = torch.tensor([[0, 5, 384], [5, 7, -1]])  # 384: the fused shared expert
    assert st.distinct_routed_experts(ids, 384) == 3
    (tmp_path / "experts.1.txt").write_text("2 3\n66 40\n")
    (tmp_path / "experts.2.txt").write_text("66 44\n")
    rows = st.read_expert_counts(str(tmp_path))
    assert sorted(rows) == [(2, 3), (66, 40), (66, 44)]


def test_routing_option_sets_sglangs_uniform_simulation(load_benchmark):
    """``--routing uniform`` turns on SGLang's own benchmark-only routing simulation for the
    engine processes (and ``weights`` turns it off, so a later configuration does not inherit
    it); its residue-class spread touches about as many experts as uniformly random routing."""
    mod = load_benchmark("bench_step")
    assert mod.routing_env("uniform") == {"SGLANG_SIMULATE_UNIFORM_EXPERTS": "1"}
    assert mod.routing_env("weights") == {"SGLANG_SIMULATE_UNIFORM_EXPERTS": "0"}
    with pytest.raises(AssertionError):
        mod.routing_env("random")
    classes = 8 * mod.uniform_distinct_experts(9, 384 // 8, 1)
    assert classes == pytest.approx(mod.uniform_distinct_experts(9, 384, 8), rel=0.01)


def test_routing_knob_is_sglangs(load_benchmark):
    """The knob ``--routing uniform`` sets is one SGLang 0.5.17's envs module defines."""
    mod = load_benchmark("bench_step")
    sglang_envs = pytest.importorskip("sglang.srt.environ").envs
    assert hasattr(sglang_envs, mod.SIMULATE_UNIFORM_EXPERTS_ENV)


def test_expert_stats(load_benchmark):
    mod = load_benchmark("bench_step")
    got = mod.expert_stats([(66, 40), (66, 44), (256, 200), (66, 42)], 66)
    assert {k: got[k] for k in ("tokens", "calls", "median", "max")} == {
        "tokens": 66, "calls": 3, "median": 42, "max": 44
    }  # fmt: skip
    assert mod.expert_stats([], 9)["calls"] == 0
    # The phase's markdown: one line per configuration and batch size, with the counts.
    text = mod.table({"rows": [{"config": "ddtree-8", "experts": [{"bs": 4, **got}]}]})
    line = next(x for x in text.splitlines() if x.startswith("| ddtree-8 |"))
    assert [c.strip() for c in line.strip("|").split("|")] == [
        "ddtree-8", "4", "66", "3", "42", "44", str(got["uniform"])
    ]  # fmt: skip
    # Uniform routing: one token touches exactly top_k experts; many tokens approach all.
    assert mod.uniform_distinct_experts(1, 384, 8) == pytest.approx(8.0)
    assert mod.uniform_distinct_experts(9, 384, 8) < 72 < mod.uniform_distinct_experts(65, 384, 8)
    assert mod.uniform_distinct_experts(10_000, 384, 8) == pytest.approx(384.0)
    # Against a simulation of uniform picks (2,000 draws of 33 tokens): within 1 %.
    gen = torch.Generator().manual_seed(0)
    sim = [
        len({e for _ in range(33) for e in torch.randperm(384, generator=gen)[:8].tolist()})
        for _ in range(2000)
    ]
    assert sum(sim) / len(sim) == pytest.approx(mod.uniform_distinct_experts(33, 384, 8), rel=0.01)


def test_bench_serving_pieces(load_benchmark, tmp_path):
    """The serving driver: SGLang's client command, its output, alternating server order, and
    medians / ranges / the DDTREE-over-DFLASH ratio per cell."""
    mod = load_benchmark("bench_serving")
    args = SimpleNamespace(prompts_per_level=4, input_len=128, output_len=128)
    cmd = mod.client_argv("http://h:1", "/m", "T1_p0.95", 8, args, "/o.jsonl")
    assert cmd[:2] == ["--backend", "sglang"]
    flags = dict(zip(cmd[::2], cmd[1::2]))
    assert flags["--dataset-name"] == "random-ids" and flags["--max-concurrency"] == "8"
    assert flags["--num-prompts"] == "32" and flags["--temperature"] == "1.0"
    assert flags["--top-p"] == "0.95" and flags["--random-output-len"] == "128"
    out = tmp_path / "o.jsonl"
    out.write_text(
        json.dumps({"output_throughput": 5.0})
        + "\n"
        + json.dumps({"output_throughput": 7.5})
        + "\n"
    )
    assert mod.read_throughput(str(out)) == 7.5
    assert mod.order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert mod.order(["a", "b", "c"], 1) == ["c", "b", "a"]
    runs = [
        {"repeat": r, "config": cfg, "cells": {"T0": {"1": tps}}}
        for r, (cfg, tps) in enumerate(
            [("dflash", 100.0), ("ddtree", 150.0), ("dflash", 110.0), ("ddtree", 130.0),
             ("dflash", 90.0), ("ddtree", 140.0)]
        )
    ]  # fmt: skip
    summary = mod.summarize({"runs": runs})
    cell = summary["T0"]["1"]
    assert cell["dflash"] == {"median": 100.0, "min": 90.0, "max": 110.0, "n": 3}
    assert cell["ddtree/dflash"] == pytest.approx(1.4)
    md = mod.markdown(summary, ["none", "dflash", "ddtree"])
    assert "| 1 | - | 100 (90-110, n=3) | 140 (130-150, n=3) | 1.40 |" in md
    # Warm-up cells take an explicit request count; the client loop gets the argv after -m.
    warm = mod.client_argv("http://h:1", "/m", "T0", 8, args, "/w", num=16)
    assert warm[warm.index("--num-prompts") + 1] == "16"
    # One client process runs every cell: a stand-in sglang.benchmark.serving records its argv.
    fake = tmp_path / "fake" / "sglang" / "benchmark"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    seen = tmp_path / "argv.jsonl"
    (fake / "serving.py").write_text(
        "import json, sys\n"
        "def cli_main():\n"
        f"    open({str(seen)!r}, 'a').write(json.dumps(sys.argv) + '\\n')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))
    mod.run_client_cells([cmd, warm], env)
    lines = [json.loads(x) for x in seen.read_text().splitlines()]
    assert lines == [
        ["sglang.benchmark.serving", *cmd],
        ["sglang.benchmark.serving", *warm],
    ]
    log = tmp_path / "server.log"
    log.write_text(
        "[INFO] DDTREE glue graph tree_w33: captured key (4,).\n"
        "[INFO] DDTREE glue graph accept_w33: captured key (4, 'greedy').\n"
        "[INFO] captured key of something else\n"
    )
    assert mod.count_captures(str(log)) == 2
    runs = [dict(run, captures_measured=i % 2) for i, run in enumerate(runs)]
    assert mod.captures_line(runs) == (
        "Glue-graph captures while measuring, per server: dflash [0, 0, 0]; ddtree [1, 1, 1].\n"
    )
    stub = mod.datasets_stub(str(tmp_path))
    if stub is not None:  # HF datasets missing here: the stub package is importable
        assert (tmp_path / "stub" / "datasets" / "__init__.py").exists()


def test_bench_serving_resumes_only_the_same_measurement(load_benchmark, tmp_path, capsys):
    """A rerun into an earlier --out continues it only with the same settings and the same
    plugin code; otherwise it stops, naming what differs, before any server starts."""
    mod = load_benchmark("bench_serving")
    args = SimpleNamespace(model_path="/t", draft_model_path="/d", concurrency=[1, 8],
                           temps=["T0"], prompts_per_level=4, input_len=128, output_len=128,
                           server_args="")  # fmt: skip
    settings = mod.measurement_settings(args, ["ddtree", "dflash"])
    assert settings["code"] == mod.code_fingerprint() and len(settings["code"]) == 12
    assert settings == mod.measurement_settings(args, ["dflash", "ddtree"])
    assert settings["models"] == ["/t", "/d"]  # given paths; the shipped pair by name
    assert (
        mod.measurement_settings(args, ["ddtree"], "the shipped pair")["models"]
        == "the shipped pair"
    )
    run = {"repeat": 0, "config": "dflash", "cells": {}}
    assert mod.resume_error({"runs": []}, settings) is None
    assert mod.resume_error({"runs": [run], "settings": settings}, settings) is None
    assert "no settings" in mod.resume_error({"runs": [run]}, settings)
    other = dict(settings, code="0" * 12, output_len=64)
    assert "code, output_len differ" in mod.resume_error(
        {"runs": [run], "settings": other}, settings
    )
    (tmp_path / "bench_serving.json").write_text(
        json.dumps({"runs": [run], "settings": dict(settings, code="0" * 12)})
    )
    argv = ["--out", str(tmp_path), "--model-path", "/t", "--speculative-draft-model-path", "/d"]
    assert mod.main(argv + ["--concurrency", "1", "8", "--temps", "T0"]) == 2
    assert "cannot resume" in capsys.readouterr().err


def test_bench_serving_refuses_without_a_gpu(load_benchmark, tmp_path, capsys):
    from sglang_ddtree.serve import serving_unavailable

    if serving_unavailable() is None:
        pytest.skip("this machine runs SGLang servers")
    mod = load_benchmark("bench_serving")
    assert mod.main(["--out", str(tmp_path)]) == 2
    assert "launches SGLang servers on a GPU" in capsys.readouterr().err
    # Server flags that start with dashes pass in the --server-args=... form.
    assert mod.main(["--out", str(tmp_path), "--server-args=--disable-prefill-cuda-graph"]) == 2
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path), "--configs", "eagle"])


@pytest.mark.parametrize(
    "name, message, valid, invalid",
    [
        # K2.6's MLA shape is valid; MLA's values are a slice of one KV head's keys.
        ("bench_tree_attention", "no CUDA GPU here", ["--mla"],
         ["--mla", "--heads", "16", "2", "576"]),
        # FlashInfer's prefix part is timed on MHA heads, paged or not; pages only with it.
        ("bench_tree_attention", "no CUDA GPU here", ["--flashinfer", "--page-size", "16"],
         ["--flashinfer", "--mla"]),
        ("bench_tree_attention", "no CUDA GPU here",
         ["--flashinfer", "--flashinfer-backend", "fa3"], ["--page-size", "16"]),
        # The per-kernel times compare the own split with a library's (FlashMLA's, FlashInfer's).
        ("bench_tree_attention", "no CUDA GPU here", ["--mla", "--flashmla", "--kernel-times"],
         ["--mla", "--kernel-times"]),
        ("bench_tree_attention", "no CUDA GPU here", ["--flashinfer", "--kernel-times"],
         ["--kernel-times"]),
        # Row shapes are bench_core's.
        ("bench_top_p", "needs a CUDA GPU", [], ["--shapes", "uniform"]),
    ],
)  # fmt: skip
def test_kernel_bench_refuses_without_a_gpu(
    load_benchmark, tmp_path, capsys, name, message, valid, invalid
):
    """A kernel benchmark on a machine without CUDA: exit 2 with a message for valid flags,
    argparse's exit for invalid ones."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    mod = load_benchmark(name)
    assert mod.main(["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert mod.main(["--out", str(tmp_path), *valid]) == 2
    with pytest.raises(SystemExit):
        mod.main(["--out", str(tmp_path), *invalid])


def test_bench_tree_attention_flashinfer_cells(load_benchmark, tmp_path):
    """``--flashinfer``: Qwen3-8B's heads at bs 1 4 8 16 32, W 8 16 32 and prefix 8192 by
    default, each cell measured with FlashInfer's prefix part; the table has a column per field
    and marks a missing one."""
    mod = load_benchmark("bench_tree_attention")
    args = mod.parse_args(["--out", str(tmp_path), "--flashinfer"])
    cells = mod.cells(args)
    shapes = [(shape["bs"], shape["w"], shape["prefix"]) for shape, _ in cells]
    assert shapes == [(bs, w, 8192) for bs in (1, 4, 8, 16, 32) for w in (8, 16, 32)]
    shape, options = cells[0]
    assert (shape["hq"], shape["hkv"], shape["d"]) == (32, 8, 128)
    assert options == dict(dv=None, sweep=False, flashmla=False, flashinfer=True, page_size=1,
                           flashinfer_backend="fa2", sweep_only=None,
                           kernel_times=False)  # fmt: skip
    # The other modes keep their cells.
    plain = mod.parse_args(["--out", str(tmp_path)])
    assert len(mod.cells(plain)) == 3 * 3 * 2 and plain.mode == "triton"
    assert mod.parse_args(["--out", str(tmp_path), "--mla", "--flashmla"]).mode == "flashmla"
    row = {"bs": 1, "W": 8, "prefix": 8192, "extend_us": 1234.5, "split_auto_us": 40.0,
           "flashinfer_prefix_us": 20.0, "flashinfer_split_us": 25.0, "floor_us": 7.0,
           "split_over_flashinfer_prefix": 2.0, "split_over_flashinfer_split": 1.6}  # fmt: skip
    table = mod.markdown([row], args.mode, args.heads).splitlines()
    columns = len(mod.BASE_COLUMNS) + len(mod.MODE_COLUMNS["flashinfer"])
    assert table[2].count("|") == table[3].count("|") == table[4].count("|") == columns + 1
    assert table[4].startswith("| 1 | 8,192 | 8 | 1,234.5 | 40.0 | 20.0 | 25.0 | - | - | - | 7.0 |")
    assert table[4].endswith("| 2.00 | 1.60 | - | - | - |")


def test_bench_top_p_counts_decisions_against_the_float64_law(load_benchmark):
    """``off_float64`` is 0 for the law's own set (and for any choice at its edge) and counts
    every token a wrong cut moves."""
    mod = load_benchmark("bench_top_p")
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 400, generator=g), dim=-1)
    top_p = torch.tensor([0.9, 0.5, 1.0])
    from sglang_ddtree.core.sampling import joint_top_k_top_p_renorm

    law = joint_top_k_top_p_renorm(probs.double(), torch.zeros(3, dtype=torch.int64), top_p) > 0
    assert mod.off_float64(law, probs, top_p) == 0
    # Row 0 keeps its five most probable tokens fewer; row 2 (top_p 1) drops one.
    wrong = law.clone()
    order = torch.argsort(probs[0], descending=True)
    kept0 = int(law[0].sum())
    wrong[0, order[kept0 - 5 : kept0]] = False
    wrong[2, 0] = False
    assert mod.off_float64(wrong, probs, top_p) == 6


def test_bench_step_table_marks_a_refused_parameter(load_benchmark):
    """A request-parameter setting the server refuses (a grammar without a tokenizer, on the
    random-weight shapes) is that cell's error ("refused" in the table, no point in the plot),
    beside the timed cells of the same configuration."""
    mod = load_benchmark("bench_step")
    assert {"T1_p0.95_minp0.05", "T1_p0.95_penalties"} <= set(mod.ALL_TEMPS)
    timed = {"bs": 1, "prompt_len": None, "temp": "T1_p0.95", "step_ms": 10.0,
             "accept_length": 3.0, "tok_per_s": 300.0}  # fmt: skip
    refused = {"bs": 1, "prompt_len": None, "temp": "T1_p0.95_regex", "error": "ValueError"}
    text = mod.table({"rows": [{"config": "ddtree", "step": [timed, refused]}]})
    assert "| T1_p0.95 | 1 | 10.00 (3.00, 300) |" in text
    assert "| T1_p0.95_regex | 1 | refused |" in text


def test_bench_tree_attention_reads_what_triton_built(load_benchmark):
    """The sweep's build report: kernels found in a JIT function's per-device caches (Triton
    keeps ``(kernels, ...)`` tuples there), and from a kernel's TTGIR how many dots are warpgroup
    MMA, how many plain dots and how many loads asynchronous or TMA copies."""
    mod = load_benchmark("bench_tree_attention")
    ttgir = "\n".join([
        "%a = ttg.async_copy_global_to_local %p, %s : ...",
        "%b = ttg.async_copy_global_to_local %q, %t : ...",
        "%c = ttng.warp_group_dot %x, %y, %z {inputPrecision = 0 : i32} : ...",
        "%d = tt.dot %u, %v, %w : ...",
        "ttng.async_tma_copy_global_to_local %desc[%i, %j] %buf, %bar, %pred : ...",
    ])  # fmt: skip
    kernel = SimpleNamespace(
        n_regs=168, n_spills=0, asm={"ttgir": ttgir},
        metadata=SimpleNamespace(shared=147456, num_stages=2, num_warps=8),
    )  # fmt: skip
    fn = SimpleNamespace(device_caches={0: ({"key": kernel}, {}, None)})
    assert list(mod.compiled_kernels(fn).values()) == [kernel]
    assert mod.compiled_kernels(SimpleNamespace()) == {}
    assert mod.kernel_stats(kernel) == {
        "regs": 168, "spills": 0, "shared": 147456, "stages": 2, "warps": 8,
        "warpgroup_dots": 1, "other_dots": 1, "async_copies": 2, "tma_copies": 1,
    }  # fmt: skip
    # Every sweep setting names a distinct launch, and the new ones move only what they say.
    variants = mod.sweep_variants(8, mla=True)
    best = variants["lat64w8n64"]
    assert variants["lat64w16n64"] == dict(best, warps=(16, None))
    assert variants["lat64w8n128s1"] == dict(best, prefix_keys=128, prefix_stages=1)


def test_bench_tree_attention_kernel_times(load_benchmark):
    """``--kernel-times``: the device time of each CUDA kernel per call, summed over its
    launches by name (a template instance cut to 60 characters), host events left out."""
    mod = load_benchmark("bench_tree_attention")
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    long_name = "void sm90::flash_fwd_splitkv_mla_kernel<Traits<cutlass::bfloat16_t>, x>"
    events = [
        SimpleNamespace(name="_tree_attention_kernel", device_type=cuda, device_time_total=30.0),
        SimpleNamespace(name="_tree_attention_kernel", device_type=cuda, device_time_total=10.0),
        SimpleNamespace(name=long_name, device_type=cuda, device_time_total=50.0),
        SimpleNamespace(name="aten::empty", device_type=cpu, device_time_total=0.0),
    ]  # fmt: skip
    assert mod.kernel_us(events, calls=4) == {"_tree_attention_kernel": 10.0, long_name[:60]: 12.5}


def test_bench_tree_attention_sweep_table(load_benchmark):
    """The sweep's settings as a table, a column per setting, next to the hook's split; a
    setting Triton could not build shows what stopped it; no sweep, no table."""
    mod = load_benchmark("bench_tree_attention")
    rows = [
        {"bs": 1, "prefix": 16384, "W": 8, "split_paged_us": 39.4,
         "sweep_us": {"a": 40.04, "b": "OutOfResources: shared memory"}},
        {"bs": 4, "prefix": 65536, "W": 8, "split_paged_us": 191.0, "sweep_us": {"a": 237.2}},
    ]  # fmt: skip
    lines = mod.sweep_table(rows)
    assert lines[3] == "| bs | prefix | W | hook | a | b |"
    assert lines[5] == "| 1 | 16,384 | 8 | 39.4 | 40.0 | OutOfResources: shared m |"
    assert lines[6] == "| 4 | 65,536 | 8 | 191.0 | 237.2 | - |"
    assert mod.sweep_table([{"bs": 1, "prefix": 1, "W": 8, "split_auto_us": 1.0}]) == []


def test_word_tokenizer_agrees_with_the_drafters_mask_token(load_benchmark, tmp_path):
    """The 8B shape's regex cells: its drafters' mask token id is the word tokenizer's, the
    agreement SGLang's DFLASH worker checks at startup (where SGLang imports, its own
    `_resolve_mask_token_id`, which refuses the drafter's original id)."""
    from tokenizers import Tokenizer

    from sglang_ddtree.testing.tiny_models import MASK_TOKEN

    mod = load_benchmark("bench_step")
    spec = mod.model_spec("8b", str(tmp_path))
    try:
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    except ImportError:  # CPU machines without SGLang: the same comparison, by hand
        DFlashWorkerV2 = None

    def resolve(drafter_dir):
        with open(os.path.join(drafter_dir, "config.json")) as f:
            cfg = json.load(f)["dflash_config"]
        tokenizer = Tokenizer.from_file(os.path.join(spec["target"], "tokenizer.json"))
        if DFlashWorkerV2 is None:
            if tokenizer.get_vocab()[MASK_TOKEN] != cfg["mask_token_id"]:
                raise ValueError("mask_token_id conflicts with the tokenizer's")
            return cfg["mask_token_id"]
        worker = SimpleNamespace(
            target_worker=SimpleNamespace(
                model_runner=SimpleNamespace(
                    model_config=SimpleNamespace(vocab_size=mod.QWEN3_8B["vocab_size"])
                ),
                tokenizer=tokenizer,
            )
        )
        return DFlashWorkerV2._resolve_mask_token_id(
            worker, mask_token=cfg.get("mask_token", MASK_TOKEN), mask_token_id=cfg["mask_token_id"]
        )

    original = mod.DFLASH_8B["dflash_config"]["mask_token_id"]
    mod.write_word_tokenizer(spec["target"], mod.QWEN3_8B["vocab_size"])  # the tokenizer alone
    with pytest.raises(ValueError, match="mask_token_id conflicts"):
        resolve(spec["drafter"])
    mod.give_word_tokenizer(spec)
    assert spec["engine"]["skip_tokenizer_init"] is False
    for key in ("drafter", "drafter_b8"):
        got = resolve(spec[key])
        tokenizer = Tokenizer.from_file(os.path.join(spec["target"], "tokenizer.json"))
        assert got != original and got == tokenizer.token_to_id(MASK_TOKEN)


def test_bench_step_startup_phase_counts_graphs_captured_while_serving(load_benchmark, tmp_path):
    """Phase ``startup`` reads the worker's graph counts before and after its first batch: the
    glue capture at startup is reported as the worker wrote it, a glue graph captured while
    serving is counted (none should be), and an engine without a DDTREE worker (no counts
    file) reports none rather than zero."""
    mod = load_benchmark("bench_step")
    stats_path = tmp_path / "graph_stats.json"
    glue = {"batch_sizes": 3, "captures": 45, "seconds": 1.5, "memory_gib": 0.2,
            "reserved_gib": 0.25}  # fmt: skip
    at_start = {"glue": {"tree_w9": {"captures": 3}, "accept_w9": {"captures": 21}},
                "startup": glue}  # fmt: skip

    class Engine:
        def __init__(self, captured_later: int):
            self.captured_later = captured_later
            self.calls = []

        def generate(self, input_ids, sampling_params):
            self.calls.append((len(input_ids), sampling_params))
            if stats_path.exists():  # the worker rewrites its counts after the steps
                after = json.loads(stats_path.read_text())
                after["glue"]["tree_w9"]["captures"] += self.captured_later
                stats_path.write_text(json.dumps(after))
            return [{"meta_info": {"completion_tokens": 8}} for _ in input_ids]

    spec = {"prompts": [[1, 2, 3], [4, 5]]}
    rows = []
    for later in (0, 2):
        stats_path.write_text(json.dumps(at_start))
        eng = Engine(later)
        st = mod.startup_stats(eng, spec, 61.0, 5000, 4, str(stats_path))
        assert eng.calls[0][0] == 4 and eng.calls[0][1]["max_new_tokens"] == 8
        assert st["glue"] == glue and st["glue_captures_while_serving"] == later
        assert st["first_batch_tokens"] == 32 and st["kv_pool_tokens"] == 5000
        rows.append({"config": f"ddtree{later}", "startup": st})
    stats_path.unlink()
    none = mod.startup_stats(Engine(0), spec, 40.0, 6000, 4, str(stats_path))
    assert none["glue"] is None and none["glue_captures_while_serving"] is None
    rows.append({"config": "dflash", "startup": none, "step": []})
    text = mod.table({"rows": rows})
    assert "| ddtree0 | 4 | 61.0 | 5000 | 3 | 45 | 1.5 | 0.2 | 0.25 | 0 |" in text
    assert "| ddtree2 | 4 | 61.0 | 5000 | 3 | 45 | 1.5 | 0.2 | 0.25 | 2 |" in text
    assert "| dflash | 4 | 40.0 | 6000 | - | - | - | - | - | - |" in text


def test_bench_step_logprobs_cells(load_benchmark):
    """A logprobs cell asks the engine for each token's logprob and top 5 as arguments of the
    generate call (SGLang's sampling parameters have no such fields) and leaves the setting
    itself as it was for the next repeat."""
    mod = load_benchmark("bench_step")

    class Engine:
        def __init__(self):
            self.calls = []

        def generate(self, input_ids, sampling_params, **extra):
            self.calls.append((sampling_params, extra))
            return [{"meta_info": {"completion_tokens": 1}} for _ in input_ids]

    eng = Engine()
    setting = mod.ALL_TEMPS["T1_p0.95_logprobs"]
    for _ in range(2):
        mod.generate(eng, [[1, 2]], {"max_new_tokens": 4, **setting})
    for params, extra in eng.calls:
        assert params == {"max_new_tokens": 4, "temperature": 1.0, "top_p": 0.95}
        assert extra == {"return_logprob": True, "top_logprobs_num": 5}
    mod.generate(eng, [[1, 2]], mod.ALL_TEMPS["T1_p0.95"])
    assert eng.calls[-1][1] == {}
