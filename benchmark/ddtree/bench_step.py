"""Decode-step cost and accept length in SGLang: no speculation vs DFLASH chain vs DDTREE.

Step cost and accept lengths (of the trained pair). For each
configuration one ``sgl.Engine`` (triton attention, CUDA graphs on, overlap scheduling on) runs:

- phase ``accept``: all held-out prompts of the trained pair at once, ``--accept-tokens`` new
  tokens (``ignore_eos``), at T=0 and at T=1 / top_p 0.95; accept length = committed tokens per
  verify step = sum(completion_tokens) / sum(spec_verify_ct) over the prompts (SGLang's own
  per-request counters, ``meta_info``).
- phase ``step``: for every batch size ``bs`` and both temperatures, ``bs`` requests at once
  (``--step-tokens`` new tokens, ``ignore_eos``; their prompts prefilled into the radix cache
  by a one-token request first) so the decode batch holds exactly ``bs`` requests. The step
  cost is timed inside the scheduler by ``instruments.py`` (CUDA events on the forward stream
  around ``Scheduler.run_batch``, read back without syncs): the median GPU time from one decode
  step's start to the next one's, over the steps whose batch had all ``bs`` requests (the
  first 2 dropped). Also reported: the median GPU span of the step's own
  work, the accept length, and tokens/s = bs x accept / step.

Models (``--model``):
- ``pair``: the shipped trained pair (``python/sglang_ddtree/pair/assets``; Qwen3 4.0M target,
  DFlash block-16 drafter 1.4M, vocab 4096), held-out prompts as text.
- ``8b``: Qwen3-8B's shape (36 layers, hidden 4096, vocab 151936, bf16) with a drafter of the
  shape of z-lab's Qwen3-8B DFlash-b16 drafter (5 layers, block 16, target layers
  1/9/17/25/33), random weights (``load_format=dummy``: step cost does not depend on weight
  values); random token-id prompts. Phase ``accept`` is meaningless there and skipped.

- ``kimi``: Kimi K2.6's layer shapes (DeepSeek-V3: MLA with kv_lora_rank 512 / qk 128+64 / v 128,
  64 heads, hidden 7168, 384 routed experts top-8 of size 2048 + 1 shared, vocab 163,840, YaRN),
  ``--kimi-layers`` layers (the first dense), routed experts in bf16 (INT4 with ``--tp-rank-of``), with a
  drafter of the K2.6 DFlash drafter's shape (6 Qwen3 layers, 64 / 8 heads, block 8); random
  weights; ``--tp`` GPUs. Configurations ``dflash`` (the block-8 chain) and ``ddtree-N``.

Configurations (``--configs``): ``none``; ``dflash`` (chain, ``--speculative-num-draft-tokens``
= block 16); ``dflash-b8`` (8B shape only: the chain with a block-8 drafter of the same shape);
``ddtree-N`` (fixed budget N: N + 1 tree nodes); ``ddtree`` (the plugin's default adaptive
budget, i.e. no ``--speculative-num-draft-tokens``). A suffix runs a variant: ``+extendattn``
runs the target's tree-verify attention through triton's custom-mask extend kernel instead
of ``core.tree_attention`` (``--speculative-ddtree-verify-attention triton_extend``, a DDTREE
configuration's engine keyword); ``+baseline`` runs the
engine on the plugin under ``--baseline-python`` (an earlier commit's ``python/``, put
first on the engine processes' ``PYTHONPATH``; the main process, which checks requests,
keeps the installed one): two versions side by side in one run
(``ddtree+baseline@flashmla``).

Writes ``<out>/bench_step_<model>.json`` after every configuration, a markdown table
``bench_step_<model>.md`` and ``bench_step_<model>.png`` (matplotlib, when importable). A
configuration that fails is recorded with its error and the run goes on; none is started after
``--deadline-s``.

Phase ``experts`` (``--phases experts``, alone: CUDA graphs off): per batch size, the distinct
routed experts each MoE layer's top-k selects in one forward of the target, from the verify
forwards (``bs x W`` tokens; W = 1 without speculation), next to uniform routing's expectation.
Random weights do not route like a trained router: with SGLang's dummy loader every token of
the one-rank engine took the same 8-9 experts a layer, at any batch size, so its step times
price the routed experts at that count, not at the 60-384 a spread router would touch.
``--routing uniform`` spreads them by SGLang's benchmark-only simulation instead (each token's
experts from a random offset), for every phase.

Phase ``startup`` (``--phases startup``, alone): each configuration's engine started at a
decode-graph batch size of ``max(--batch-sizes)`` (``--cuda-graph-max-bs-decode``, formerly
``--cuda-graph-max-bs``), then
``max(--batch-sizes)`` requests of 8 tokens at T 1 / top_p 0.95: the seconds to a serving
engine, the KV pool it was left (tokens), and for DDTREE the glue graphs its startup captured
(`ddtree_glue_warmup.capture_glue_at_startup`: batch sizes, graphs, seconds, memory, what was
held for them before the pool was sized) and any glue graph captured later, while serving
(none should be), with the allocator's view of that capture (``instruments.StartupMemory``).
The worker's graph counts come out through the test hook ``testing.inject.GRAPH_STATS_ENV``,
which rewrites a file after every step, so this phase runs no timed steps.
``--memory-history``: the startup capture records allocation stacks
(``SGLANG_DDTREE_MEMORY_HISTORY``), so its summary names the code behind the largest live
blocks in the new segments outside the glue graphs' pool (what pins them).

The instruments (``instruments.py``: step timing, profilers, sync stacks, expert counts) run in
the engines' scheduler processes: those import this module again, which installs the ones the
environment names (set per configuration by ``run_config``).

Diagnostics (``instruments.py``; files copied to ``<out>/profile_<model>_<config>/``,
one per step run in run order): ``--torch-profile-skip N`` (torch profiler tables of 20 decode
steps after N; compare two with ``profile_diff.py``), ``--cprofile-skip N`` (host time),
``--sync-trace`` (the stack of every host-device sync inside decode steps), ``--prompt-len``
(8B shape: longer prompts, for the attention's share of the step). ``--temps`` picks
the step phase's sampling settings: ``T0``, ``T1_p0.95`` (the default pair), ``T1`` (no
top-p, which isolates the top-p renorm's cost), and ``T1_p0.95_minp0.05`` /
``T1_p0.95_penalties`` (min_p 0.05; frequency 0.3, presence 0.2 and repetition 1.05 penalties),
``T0_regex`` / ``T1_p0.95_regex`` (every request constrained by a regex: the grammar mask's
host cost; a random-weight shape gets a word-level tokenizer of its vocabulary size for them),
``T0_logprobs`` / ``T1_p0.95_logprobs`` (every request with ``return_logprob`` and the top 5):
each parameter's step cost beside plain sampling; a setting the server refuses is recorded as
that cell's error.

One-rank K2.6 (``--tp-rank-of 8``): a tp-1 engine of exactly one TP-8 rank's shapes (8 MLA query
heads, all 384 routed experts at a 2048 / 8 = 256 intermediate in INT4, dense and shared MLPs / 8,
vocabulary 163,840 / 8, the drafter's 64 / 8 heads / 8), 61 layers, which does one rank's work
per decode step less the all-reduces. A configuration may name the target's attention backend
(``dflash@flashmla``, ``ddtree-16@triton``; else ``--attention-backend``); flashmla runs at page
size 64. ``--prompt-lens`` runs the step phase at each prompt length; a cell whose requests do
not fit the engine's KV pool together (or ``--max-kv-tokens``) is skipped.

On an H200 with SGLang 0.5.17 and the plugin installed, writing into ``bench_out/``::

    python3 benchmark/ddtree/bench_step.py --model pair --phases accept,step --out bench_out
    python3 benchmark/ddtree/bench_step.py --model 8b --configs none,dflash,ddtree-32,ddtree-64 \\
        --out bench_out
    python3 benchmark/ddtree/bench_step.py --model kimi --tp-rank-of 8 --prompt-lens 256 16384 \\
        --batch-sizes 1 4 16 --configs none@flashmla,dflash@flashmla,ddtree@flashmla \\
        --out bench_out
    python3 benchmark/ddtree/bench_step.py --model kimi --tp 2 --phases experts --out bench_out
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from sglang_ddtree.srt.ddtree_attention.verify_backend import VERIFY_FLAG
from sglang_ddtree.testing import tiny_models
from sglang_ddtree.testing.e2e import TP_CHECK_ENGINE  # also installs testing.inject's hooks
from sglang_ddtree.testing.inject import GRAPH_STATS_ENV

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import instruments  # noqa: E402
from instruments import read_expert_counts, read_steps  # noqa: E402

# The engines' scheduler processes import this module again: the instruments this run names in
# the environment are installed there.
instruments.install_from_env()

DEFAULT_CONFIGS = {
    "pair": "none,dflash,ddtree,ddtree-16,ddtree-32,ddtree-64,ddtree-128",
    "8b": "none,dflash,dflash-b8,ddtree,ddtree-32,ddtree-64",
    "kimi": "none,dflash,ddtree-8,ddtree-16,ddtree-32,ddtree-64",
}
TEMPS = (("T0", {"temperature": 0.0}), ("T1_p0.95", {"temperature": 1.0, "top_p": 0.95}))
LOGPROBS_KEY = "_generate"  # in a --temps setting: arguments of the generate call itself
# --temps may also name T1 without top-p (no top-p renorm pass: isolates its cost), and the
# request parameters whose step cost is compared with plain sampling (T1_p0.95).
ALL_TEMPS = {
    **dict(TEMPS),
    "T1": {"temperature": 1.0},
    "T1_p0.95_minp0.05": {"temperature": 1.0, "top_p": 0.95, "min_p": 0.05},
    "T1_p0.95_penalties": {
        "temperature": 1.0,
        "top_p": 0.95,
        "frequency_penalty": 0.3,
        "presence_penalty": 0.2,
        "repetition_penalty": 1.05,
    },
    # Constrained decoding: the trained pair's tokenizer, or on the random-weight shapes a
    # word-level one of the target's vocabulary size (`write_word_tokenizer`).
    "T0_regex": {"temperature": 0.0, "regex": "[a-z ]+"},
    "T1_p0.95_regex": {"temperature": 1.0, "top_p": 0.95, "regex": "[a-z ]+"},
    # Logprobs are generate arguments, not sampling parameters (`generate` moves them).
    "T0_logprobs": {"temperature": 0.0, LOGPROBS_KEY: {"return_logprob": True,
                                                       "top_logprobs_num": 5}},
    "T1_p0.95_logprobs": {"temperature": 1.0, "top_p": 0.95,
                          LOGPROBS_KEY: {"return_logprob": True, "top_logprobs_num": 5}},
}  # fmt: skip
DROP_FIRST_STEPS = 2

# Qwen3-8B (config of Qwen/Qwen3-8B) and a drafter of the z-lab Qwen3-8B-DFlash-b16 shape.
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
DFLASH_8B = {
    **QWEN3_8B,
    "architectures": ["DFlashDraftModel"],
    "num_hidden_layers": 5,
    "max_window_layers": 5,
    "block_size": 16,
    "num_target_layers": 36,
    "dflash_config": {
        "block_size": 16,
        "target_layer_ids": [1, 9, 17, 25, 33],
        "mask_token_id": 151669,
    },
}


DFLASH_8B_B8 = {
    **DFLASH_8B,
    "block_size": 8,
    "dflash_config": {**DFLASH_8B["dflash_config"], "block_size": 8},
}


# Kimi K2.6's target (``testing.tiny_models.KIMI_K26``, its config.json) and its DFlash
# drafter's shape.
KIMI_DFLASH = {
    **{
        k: QWEN3_8B[k]
        for k in ("attention_bias", "attention_dropout", "hidden_act", "rms_norm_eps")
    },
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_hidden_layers": 6,
    "max_window_layers": 6,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": tiny_models.mla_target_config(tiny_models.KIMI_K26)["rope_scaling"],
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "block_size": 8,
    "dflash_config": {"block_size": 8, "mask_token_id": 163838},
}
KIMI_CONTEXT_LAYERS = 6  # K2.6's drafter reads 6 target layers


# bf16 at tp 2, per GPU: 17.1 GB a MoE layer (384 experts x 3 x 7168 x 2048, halved), about
# 8.7 GB for the dense layer, the vocab-parallel embedding and LM head, and the drafter. Seven
# layers (six MoE) take ~111 GB, under the 0.85 x 141 GB static share; eight do not fit.
KIMI_TP2_LAYERS = 7


def kimi_configs(layers: int) -> tuple[dict, dict]:
    """The target cut to ``layers`` layers (the first dense) and the drafter, its six context
    layers spread over the target's layers before the last (SGLang captures a layer's output at
    the next layer's input)."""
    n = KIMI_CONTEXT_LAYERS
    if layers < n + 1:
        raise SystemExit(f"--kimi-layers must be >= {n + 1} (six distinct context layers)")
    # K2.6's own spacing: 1 + round(i * (L - 4) / 5) gives [1, 12, 24, 35, 47, 58] at L = 61;
    # where it repeats a layer (few layers), an even spread over layers 0 .. L - 2.
    ids = [1 + round(i * (layers - 4) / (n - 1)) for i in range(n)]
    if len(set(ids)) < n:
        ids = [round(i * (layers - 2) / (n - 1)) for i in range(n)]
    target = tiny_models.mla_target_config(
        dataclasses.replace(tiny_models.KIMI_K26, target_layers=layers)
    )
    drafter = {
        **KIMI_DFLASH,
        "num_target_layers": layers,
        "dflash_config": {**KIMI_DFLASH["dflash_config"], "target_layer_ids": ids},
    }
    return target, drafter


# K2.6's routed experts as it ships them: compressed-tensors W4A16 (INT4, group 32, symmetric),
# attention, the dense and shared MLPs and the LM head in bf16. SGLang's dummy loader fills the
# packed weights and runs its Marlin MoE kernel on them.
KIMI_INT4_EXPERTS = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "output_activations": None,
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "strategy": "group",
                "group_size": 32,
                "dynamic": False,
                "actorder": None,
                "block_structure": None,
                "observer": "minmax",
                "observer_kwargs": {},
            },
        }
    },
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
}


def kimi_rank_configs(layers: int, tp: int) -> tuple[dict, dict]:
    """One TP-``tp`` rank of K2.6 and its drafter as a tp-1 model: the rank's query heads,
    expert, dense and shared MLP intermediates, vocabulary and drafter heads (each / ``tp``),
    all 384 routed experts in INT4 (`KIMI_INT4_EXPERTS`), ``layers`` layers. Such an engine
    does one rank's work per decode step, less the all-reduces."""
    target, drafter = kimi_configs(layers)
    vocab = target["vocab_size"] // tp
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        target[key] //= tp
    target.update(
        moe_intermediate_size=target["moe_intermediate_size"] // tp,
        vocab_size=vocab,
        bos_token_id=vocab - 4,
        eos_token_id=vocab - 3,
        quantization_config=KIMI_INT4_EXPERTS,
    )
    drafter.update(
        vocab_size=vocab,
        num_attention_heads=drafter["num_attention_heads"] // tp,
        num_key_value_heads=max(1, drafter["num_key_value_heads"] // tp),
        intermediate_size=drafter["intermediate_size"] // tp,
        dflash_config={**drafter["dflash_config"], "mask_token_id": vocab - 2},
    )
    return target, drafter


def _write_configs(pairs) -> None:
    for path, cfg in pairs:
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)


def write_word_tokenizer(path: str, vocab_size: int, seed: int = 0) -> None:
    """A tokenizer of ``vocab_size`` tokens into ``path`` for a random-weight shape's
    constrained cells (the shapes start without one, so a grammar has no vocabulary): the tiny
    pairs' (`tiny_models.build_tokenizer`) with distinct words of 2-8 lowercase letters after
    its special and printable tokens, half with a leading space and one in eight capitalized,
    so that the grammar's mask walks a vocabulary of the target's size and of a real one's
    kind."""
    cfg = tiny_models.TinyPairConfig(vocab_size=vocab_size)
    tiny_models.build_tokenizer(path, cfg, filler=tokenizer_words(vocab_size, seed))


def tokenizer_words(vocab_size: int, seed: int = 0) -> list[str]:
    """`write_word_tokenizer`'s words (its tokens after the special and printable ones)."""
    rng = random.Random(seed)
    words: list[str] = []
    seen = set(tiny_models.SPECIALS) | {chr(c) for c in range(32, 127)}
    while len(words) < vocab_size:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
        word = (" " if rng.random() < 0.5 else "") + (
            word.capitalize() if rng.random() < 0.125 else word
        )
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def give_word_tokenizer(spec: dict) -> None:
    """A random-weight shape's engine with a tokenizer (`write_word_tokenizer`, into the
    target's directory) instead of none, its drafters' mask token id moved to the tokenizer's
    (SGLang's DFLASH worker refuses a drafter whose ``mask_token_id`` differs from it)."""
    with open(os.path.join(spec["target"], "config.json")) as f:
        write_word_tokenizer(spec["target"], json.load(f)["vocab_size"])
    spec["engine"]["skip_tokenizer_init"] = False
    mask_id = tiny_models.SPECIALS.index(tiny_models.MASK_TOKEN)
    for key in ("drafter", "drafter_b8"):
        if key in spec:
            path = os.path.join(spec[key], "config.json")
            with open(path) as f:
                cfg = json.load(f)
            cfg["dflash_config"]["mask_token_id"] = mask_id
            with open(path, "w") as f:
                json.dump(cfg, f, indent=1)


def model_spec(
    name: str,
    workdir: str,
    prompt_len: int | None = None,
    kimi_layers: int = KIMI_TP2_LAYERS,
    rank_of: int | None = None,
    prompt_lens: tuple[int, ...] = (256,),
) -> dict:
    """Paths and engine settings of one model family. ``prompt_len`` (8B shape only): every
    prompt has that many tokens instead of 64-128. ``rank_of`` (kimi only): one TP-N rank's
    shapes (`kimi_rank_configs`); ``prompt_lens`` (kimi): the prompt lengths of the step
    phase (``spec["prompts_by_len"]``)."""
    if name == "pair":
        from sglang_ddtree.pair import ASSETS_DIR, heldout_prompts

        return {
            "target": str(ASSETS_DIR / "target"),
            "drafter": str(ASSETS_DIR / "drafter"),
            "block": 16,
            "prompts": heldout_prompts(),
            "engine": {"mem_fraction_static": 0.35, "context_length": 2048},
        }
    if name == "8b":
        target, drafter = os.path.join(workdir, "qwen3-8b"), os.path.join(workdir, "dflash-8b")
        drafter_b8 = os.path.join(workdir, "dflash-8b-b8")
        _write_configs(((target, QWEN3_8B), (drafter, DFLASH_8B), (drafter_b8, DFLASH_8B_B8)))
        rng = random.Random(0)
        lengths = [prompt_len or rng.randint(64, 128) for _ in range(64)]
        prompts = [[rng.randrange(1000, 150000) for _ in range(n)] for n in lengths]
        context = max(4096, 2 * (prompt_len or 0))
        return {
            "target": target,
            "drafter": drafter,
            "drafter_b8": drafter_b8,
            "block": 16,
            "prompts": prompts,
            "engine": {
                "mem_fraction_static": 0.80,
                "context_length": context,
                "load_format": "dummy",
                "skip_tokenizer_init": True,
            },
        }
    if name == "kimi":
        target, drafter = os.path.join(workdir, "kimi-k2.6"), os.path.join(workdir, "dflash-kimi")
        configs = kimi_rank_configs(kimi_layers, rank_of) if rank_of else kimi_configs(kimi_layers)
        _write_configs(zip((target, drafter), configs))
        vocab = configs[0]["vocab_size"]
        rng = random.Random(0)
        # >= 256 tokens: no prefill forward has as few tokens as a verify (bs x W <= 64 x 65).
        by_len = {
            n: [[rng.randrange(1000, vocab - 8) for _ in range(n)] for _ in range(64)]
            for n in prompt_lens
        }
        return {
            "target": target,
            "drafter": drafter,
            "block": 8,
            "prompts": by_len[prompt_lens[0]],
            "prompts_by_len": by_len,
            "engine": {
                "mem_fraction_static": 0.85,
                "context_length": max(4096, max(prompt_lens) + 1024),
                "load_format": "dummy",
                "skip_tokenizer_init": True,
            },
        }
    raise SystemExit(f"unknown --model {name!r}: pair, 8b or kimi")


def verify_tokens_per_request(spec: dict, config: str) -> int:
    """W: tokens each request puts through the target's forward in one decode step."""
    base = config.split("+")[0]
    if base == "none":
        return 1
    if base.startswith("ddtree-"):
        return int(base.split("-", 1)[1]) + 1
    if base == "dflash":
        return spec["block"]
    if base == "dflash-b8":
        return 8
    raise SystemExit(f"--phases experts needs a fixed W: none, dflash or ddtree-N, not {config!r}")


def widest_verify_width(spec: dict, config: str) -> int:
    """The widest W a configuration verifies (the default DDTREE schedule's is 2B; 0 without
    speculation). SGLang's DFLASH-family scheduler reserves 2 W of KV slots a request."""
    if config == "none":
        return 0
    if config == "ddtree":
        return 2 * spec["block"]
    return verify_tokens_per_request(spec, config)


# SGLang's benchmark-only routing knob (``sglang.srt.layers.moe.topk.select_experts``): each
# token takes experts ``o, o + E/k, ...`` (mod E) from a random offset ``o``, router ignored.
SIMULATE_UNIFORM_EXPERTS_ENV = "SGLANG_SIMULATE_UNIFORM_EXPERTS"
ROUTINGS = ("weights", "uniform")


def routing_env(routing: str) -> dict:
    """The engine processes' environment for ``--routing``: ``weights`` routes by the loaded
    router (with dummy weights every token of the K2.6 rank took the same 8-9 experts a
    layer), ``uniform`` by SGLang's uniform simulation (each token's experts from a random
    offset: E / k residue classes, so ``tokens`` tokens touch about ``k *
    uniform_distinct_experts(tokens, E // k, 1)`` experts, within 1 % of uniformly random
    routing's count for K2.6 at 9 tokens)."""
    assert routing in ROUTINGS, routing
    return {SIMULATE_UNIFORM_EXPERTS_ENV: "1" if routing == "uniform" else "0"}


def uniform_distinct_experts(tokens: int, experts: int, top_k: int) -> float:
    """Expected distinct experts when each of ``tokens`` tokens picks ``top_k`` of ``experts``
    uniformly at random: the spread of an untrained router, an upper reference for a trained
    one, whose tokens share experts more (same-sequence tokens most of all)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def expert_stats(counts: list[tuple[int, int]], tokens: int) -> dict:
    """Distinct routed experts per MoE layer call over the calls with ``tokens`` tokens, next to
    the uniform-routing expectation for K2.6's 384 experts, top-8."""
    got = [d for t, d in counts if t == tokens]
    m = tiny_models.KIMI_K26
    return {
        "tokens": tokens,
        "calls": len(got),
        "median": statistics.median(got) if got else None,
        "max": max(got) if got else None,
        "uniform": round(
            uniform_distinct_experts(tokens, m.n_routed_experts, m.num_experts_per_tok), 1
        ),
    }


def engine_kwargs(
    spec: dict,
    config: str,
    max_bs: int,
    tp: int = 1,
    graphs: bool = True,
    plain_all_reduce: bool = False,
) -> dict:
    kw = dict(
        model_path=spec["target"],
        attention_backend="triton",
        cuda_graph_max_bs_decode=max_bs,
        max_running_requests=max_bs,
        log_level="warning",
        random_seed=0,
        **spec["engine"],
    )
    if tp > 1:
        kw["tp_size"] = tp
        if plain_all_reduce:
            kw.update(TP_CHECK_ENGINE)
    if not graphs:
        kw["disable_cuda_graph"] = True
    if config == "none":
        return kw
    kw.update(speculative_draft_model_path=spec["drafter"])
    if config == "dflash":
        kw.update(speculative_algorithm="DFLASH", speculative_num_draft_tokens=spec["block"])
    elif config == "dflash-b8":  # the chain with a block-8 drafter (8B shape only)
        if "drafter_b8" not in spec:
            raise SystemExit("dflash-b8 needs --model 8b (the trained pair's drafter is block 16)")
        kw.update(
            speculative_algorithm="DFLASH",
            speculative_num_draft_tokens=8,
            speculative_draft_model_path=spec["drafter_b8"],
        )
    elif config == "ddtree":
        kw.update(speculative_algorithm="DDTREE")
    elif config.startswith("ddtree-"):
        kw.update(
            speculative_algorithm="DDTREE",
            speculative_num_draft_tokens=int(config.split("-", 1)[1]) + 1,
        )
    else:
        raise SystemExit(f"unknown config {config!r}")
    return kw


def generate(eng, prompts, params) -> tuple[list[dict], float]:
    key = "prompt" if isinstance(prompts[0], str) else "input_ids"
    params = dict(params)
    extra = params.pop(LOGPROBS_KEY, {})
    t0 = time.monotonic()
    out = eng.generate(**{key: prompts}, sampling_params=params, **extra)
    out = out if isinstance(out, list) else [out]
    return out, t0


def accept_length(outs: list[dict]) -> float | None:
    """Committed tokens per verify step over ``outs`` (None without speculation)."""
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    steps = sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs)
    return tokens / steps if steps else None


def _window_steps(records: list[dict], t0: float, t1: float, bs: int) -> list[dict]:
    """The decode steps of ``bs`` requests in one timed run, its first ``DROP_FIRST_STEPS``
    dropped."""
    rows = [r for r in records if t0 <= r["t"] <= t1 and r["mode"] == "DECODE" and r["bs"] == bs]
    return rows[DROP_FIRST_STEPS:]


def step_stats(records: list[dict], t0: float, t1: float, bs: int) -> dict:
    return cell_stats(records, [(t0, t1)], bs)


def cell_stats(records: list[dict], windows: list[tuple[float, float]], bs: int) -> dict:
    """One cell's step over its timed runs (``windows``: host ``(t0, t1)`` each): the median
    period and span over all their steps; with several runs also each run's median period
    (``repeat_step_ms``: the spread between runs of one engine)."""
    per_run = [_window_steps(records, t0, t1, bs) for t0, t1 in windows]
    rows = [r for run in per_run for r in run]
    periods = [r["period_ms"] for r in rows if r["period_ms"] is not None]
    out = {
        "steps": len(rows),
        "step_ms": statistics.median(periods) if periods else None,
        "span_ms": statistics.median(r["span_ms"] for r in rows) if rows else None,
    }
    host = [r["host_ms"] for r in rows if r.get("host_ms") is not None]
    if host:  # host time in run_batch a step, beside the GPU's period
        out["host_ms"] = statistics.median(host)
    if len(windows) > 1:
        out["repeat_step_ms"] = [
            statistics.median(p) if p else None
            for p in (
                [r["period_ms"] for r in run if r["period_ms"] is not None] for run in per_run
            )
        ]
    return out


def flush_timing(eng, spec) -> None:
    """A 1-token request: its prefill makes the scheduler write out all finished step records."""
    generate(eng, spec["prompts"][:1], {"max_new_tokens": 1, "temperature": 0.0})
    time.sleep(0.6)
    generate(eng, spec["prompts"][:1], {"max_new_tokens": 1, "temperature": 0.0})


VARIANTS = {
    # The target's tree verify through triton's custom-mask extend kernel instead of the default
    # split attention (core/tree_attention.py).
    "extendattn": {VERIFY_FLAG: "triton_extend"},
    # The engine's processes import the plugin from --baseline-python (another checkout's
    # python/, e.g. an earlier commit): two versions side by side in one run.
    "baseline": {},
}
# The DDTREE engine keywords every variant starts from (none: the worker's defaults).
DEFAULT_VARIANT_KWARGS: dict[str, str] = {}


ATTENTION_BACKENDS = ("triton", "flashmla", "flashinfer")


def split_backend(config: str, default: str) -> tuple[str, str]:
    """``"dflash@flashmla"`` -> (``"dflash"``, ``"flashmla"``); no ``@``: ``default``."""
    config, _, backend = config.partition("@")
    backend = backend or default
    if backend not in ATTENTION_BACKENDS:
        raise SystemExit(f"unknown attention backend {backend!r} (known: {ATTENTION_BACKENDS})")
    return config, backend


def split_variant(config: str) -> tuple[str, dict[str, str]]:
    """``"ddtree-64+extendattn"`` -> (``"ddtree-64"``, the DDTREE engine keywords of those
    variants over the worker's defaults). Unknown suffixes exit with the known ones."""
    base, *variants = config.split("+")
    kwargs = dict(DEFAULT_VARIANT_KWARGS)
    for variant in variants:
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r} in {config!r} (known: {list(VARIANTS)})")
        kwargs.update(VARIANTS[variant])
    return base, kwargs


def engine_pythonpath(config: str, baseline_python: str | None, current: str | None):
    """The engine processes' ``PYTHONPATH`` for a configuration (``"ddtree+baseline"``: the
    ``--baseline-python`` folder ahead of ``current``, so they import that plugin before the
    installed one), or None to leave it as it is."""
    if "baseline" not in config.split("+")[1:]:
        return None
    if not baseline_python:
        raise SystemExit(f"{config!r} needs --baseline-python")
    if os.path.exists(os.path.join(baseline_python, "sglang_ddtree", "step_timing.py")):
        # That plugin hooks run_batch itself when the timing variable is set.
        raise SystemExit(
            f"--baseline-python {baseline_python}: its plugin times every step itself "
            "(sglang_ddtree/step_timing.py), so each step would be recorded twice"
        )
    return os.pathsep.join(filter(None, [baseline_python, current]))


def run_config(spec, config, args, timing_dir) -> dict:
    import sglang as sgl

    os.environ[instruments.ENV] = timing_dir
    if args.cprofile_skip is not None:
        os.environ[instruments.CPROFILE_ENV] = str(args.cprofile_skip)
    if args.torch_profile_skip is not None:
        os.environ[instruments.TORCH_PROFILE_ENV] = str(args.torch_profile_skip)
    os.environ[instruments.SYNC_TRACE_ENV] = "1" if args.sync_trace else "0"
    os.environ[instruments.MEMORY_HISTORY_ENV] = "1" if args.memory_history else "0"
    row = {"config": config, "accept": {}, "step": []}
    config_only, backend = split_backend(config, args.attention_backend)
    base, variant_kwargs = split_variant(config_only)
    pythonpath = os.environ.get("PYTHONPATH")
    engine_path = engine_pythonpath(config_only, args.baseline_python, pythonpath)
    if engine_path is not None:  # spawned engine processes read it at their start
        os.environ["PYTHONPATH"] = engine_path
    os.environ.update(routing_env(args.routing))
    counting = "experts" in args.phases
    if counting:  # graphs off: the counter runs at every MoE call
        os.environ[instruments.EXPERT_COUNT_ENV] = str(tiny_models.KIMI_K26.n_routed_experts)
    else:
        os.environ.pop(instruments.EXPERT_COUNT_ENV, None)
    stats_path = os.path.join(timing_dir, "graph_stats.json")
    if "startup" in args.phases:  # the worker writes its graph counts there (testing.inject)
        os.makedirs(timing_dir, exist_ok=True)
        os.environ[GRAPH_STATS_ENV] = stats_path
    else:
        os.environ.pop(GRAPH_STATS_ENV, None)
    t_start = time.monotonic()
    kw = engine_kwargs(
        spec,
        base,
        max(args.batch_sizes),
        tp=args.tp,
        graphs=not counting,
        plain_all_reduce=args.plain_all_reduce,
    )
    if variant_kwargs and kw.get("speculative_algorithm") != "DDTREE":
        raise SystemExit(f"{config!r}: its variant sets DDTREE's {sorted(variant_kwargs)}")
    kw.update(variant_kwargs)
    kw["attention_backend"] = backend
    if backend == "flashmla":
        kw["page_size"] = 64
    if args.draft_attention_backend and base != "none":
        kw["speculative_draft_attention_backend"] = args.draft_attention_backend
    eng = sgl.Engine(**kw)
    row["engine_up_s"] = round(time.monotonic() - t_start, 1)
    print(f"[bench_step] {config}: engine up in {row['engine_up_s']} s", flush=True)
    try:
        info = eng.get_server_info()
        row["server_args"] = {
            k: info.get(k)
            for k in (
                "speculative_algorithm",
                "speculative_num_draft_tokens",
                "attention_backend",
                "page_size",
                "speculative_draft_attention_backend",
                "disable_cuda_graph",
                "cuda_graph_max_bs_decode",
                "disable_overlap_schedule",
                "max_total_num_tokens",
            )
        }
        # The KV pool holds this many tokens: a cell whose requests do not fit together never
        # runs as one batch of bs, so it is skipped, not timed.
        pool_tokens = info.get("max_total_num_tokens")
        if "startup" in args.phases:
            row["startup"] = startup_stats(eng, spec, row["engine_up_s"], pool_tokens,
                                           max(args.batch_sizes), stats_path)  # fmt: skip
            print(f"[bench_step] {config} startup: {row['startup']}", flush=True)
        if "accept" in args.phases and config != "none" and args.model == "pair":
            for tname, tparams in TEMPS:
                params = {"max_new_tokens": args.accept_tokens, "ignore_eos": True, **tparams}
                outs, _ = generate(eng, spec["prompts"], params)
                row["accept"][tname] = {
                    "prompts": len(outs),
                    "accept_length": accept_length(outs),
                    "tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
                }
                print(f"[bench_step] {config} accept {tname}: {row['accept'][tname]}", flush=True)
        if counting:
            w = verify_tokens_per_request(spec, config_only)
            row["experts"] = []
            for bs in args.batch_sizes:
                prompts = [spec["prompts"][i % len(spec["prompts"])] for i in range(bs)]
                generate(eng, prompts, {"max_new_tokens": 16, "ignore_eos": True, "temperature": 0})
                counts = read_expert_counts(timing_dir)
                row["experts"].append({"bs": bs, "w": w, **expert_stats(counts, bs * w)})
                print(f"[bench_step] {config} experts: {row['experts'][-1]}", flush=True)
        if "step" in args.phases:
            windows = []
            by_len = spec.get("prompts_by_len") or {None: spec["prompts"]}
            for plen, pool in by_len.items():
                for bs in args.batch_sizes:
                    limits = [n for n in (args.max_kv_tokens, pool_tokens) if n]
                    kv_limit = min(limits) if limits else None
                    if (
                        kv_limit
                        and bs
                        * ((plen or 0) + args.step_tokens + 2 * widest_verify_width(spec, base))
                        > kv_limit
                    ):
                        row["step"].append(
                            {"bs": bs, "prompt_len": plen, "skipped": f"KV (pool {kv_limit})"}
                        )
                        continue
                    prompts = [pool[i % len(pool)] for i in range(bs)]
                    # Prefill every prompt first (into the radix cache), so that the timed
                    # requests start decoding together: long prompts otherwise finish their
                    # prefills while the first ones decode, and no step holds all bs requests.
                    generate(eng, prompts, {"max_new_tokens": 1, "temperature": 0.0})
                    for tname, tparams in args.temps:
                        params = {"max_new_tokens": args.step_tokens, "ignore_eos": True}
                        runs = []
                        try:
                            for _ in range(args.repeats):
                                outs, t0 = generate(eng, prompts, {**params, **tparams})
                                runs.append((t0, time.monotonic(), accept_length(outs)))
                        except Exception as e:  # a refused parameter: this cell's error
                            row["step"].append(
                                {"bs": bs, "prompt_len": plen, "temp": tname,
                                 "error": f"{type(e).__name__}: {e}"[:500]}
                            )  # fmt: skip
                            continue
                        windows.append((plen, bs, tname, runs))
            flush_timing(eng, spec)
            records = read_steps(timing_dir)
            for plen, bs, tname, runs in windows:
                st = cell_stats(records, [(t0, t1) for t0, t1, _ in runs], bs)
                accepts = [a for _, _, a in runs if a is not None]
                acc = statistics.mean(accepts) if accepts else None
                tok = (bs * (acc or 1.0) / st["step_ms"] * 1e3) if st["step_ms"] else None
                row["step"].append(
                    {
                        "bs": bs,
                        "prompt_len": plen,
                        "temp": tname,
                        "accept_length": acc,
                        "tok_per_s": tok,
                        "wall_s": sum(t1 - t0 for t0, t1, _ in runs),
                        **st,
                    }
                )
                print(f"[bench_step] {config} bs={bs} {tname}: {row['step'][-1]}", flush=True)
    finally:
        eng.shutdown()
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath
    if args.cprofile_skip is not None or args.torch_profile_skip is not None or args.sync_trace:
        # Segments in the order of the runs above (accept phase first, then the step runs).
        # Plain characters only: '@' and '+' in a configuration's name are not portable paths.
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", config)
        dest = os.path.join(args.out, f"profile_{args.model}_{safe}")
        os.makedirs(dest, exist_ok=True)
        for name in os.listdir(timing_dir):
            if name.startswith(("cprofile.", "torchprof.", "syncs.")):
                shutil.copy(os.path.join(timing_dir, name), dest)
    return row


def read_graph_stats(path: str) -> dict | None:
    """The worker's last graph counts (``GraphStats.as_dict``), or None (no DDTREE worker)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def glue_captures(stats: dict | None) -> int | None:
    """Glue graphs captured so far, over every segment."""
    if not stats:
        return None
    return sum(seg.get("captures", 0) for seg in stats.get("glue", {}).values())


def startup_stats(eng, spec, up_s: float, pool_tokens, max_bs: int, stats_path: str) -> dict:
    """Phase ``startup``: what starting the engine cost (see the module's docstring)."""
    at_start = read_graph_stats(stats_path)
    prompts = [spec["prompts"][i % len(spec["prompts"])] for i in range(max_bs)]
    params = {"max_new_tokens": 8, "ignore_eos": True, "temperature": 1.0, "top_p": 0.95}
    outs, t0 = generate(eng, prompts, params)
    serve_s = time.monotonic() - t0
    after = read_graph_stats(stats_path)
    glue = (at_start or {}).get("startup")
    before, later = glue_captures(at_start), glue_captures(after)
    while_serving = None if before is None or later is None else later - before
    return {
        "max_bs": max_bs,
        "engine_up_s": up_s,
        "kv_pool_tokens": pool_tokens,
        "glue": glue,
        "glue_captures_while_serving": while_serving,
        "first_batch_s": round(serve_s, 2),
        "first_batch_tokens": sum(o["meta_info"]["completion_tokens"] for o in outs),
    }


def startup_table(rows: list[dict]) -> str:
    """Phase ``startup``'s rows as markdown."""
    lines = [
        "| config | max bs | engine up s | KV pool tokens | glue: batch sizes | graphs | s | "
        "GiB taken | GiB held | captured while serving |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        st = r["startup"]
        g = st.get("glue") or {}
        cells = [g.get(k, "-") for k in ("batch_sizes", "captures", "seconds", "memory_gib")]
        cells.append(g.get("reserved_gib", "-") if g else "-")
        later = st.get("glue_captures_while_serving")
        cells.append("-" if later is None else later)
        lines.append(
            f"| {r['config']} | {st['max_bs']} | {st['engine_up_s']} | {st['kv_pool_tokens']} | "
            + " | ".join(str(c) for c in cells)
            + " |"
        )
    return "\n".join(lines)


def experts_table(rows: list[dict]) -> str:
    """Phase ``experts``' rows as markdown: per configuration and batch size, the median and
    largest distinct routed experts a MoE layer call selected, next to uniform routing's."""
    lines = [
        "distinct routed experts per MoE layer call: median / max (uniform routing's)",
        "",
        "| config | bs | tokens | calls | median | max | uniform |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        for e in r["experts"]:
            cells = [e["bs"], e["tokens"], e["calls"], e["median"], e["max"], e["uniform"]]
            lines.append(f"| {r['config']} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def table(result: dict) -> str:
    started = [r for r in result["rows"] if "startup" in r]
    if started:
        return startup_table(started)
    counted = [r for r in result["rows"] if "experts" in r]
    if counted:
        return experts_table(counted)
    rows = [r for r in result["rows"] if "step" in r]
    lines = []
    acc_rows = [r for r in rows if r.get("accept")]
    if acc_rows:
        lines += [
            "| config | " + " | ".join(f"accept {t}" for t, _ in TEMPS) + " |",
            "|---|" + "---:|" * len(TEMPS),
        ]
        for r in acc_rows:
            cells = [
                f"{r['accept'][t]['accept_length']:.2f}" if t in r["accept"] else "-"
                for t, _ in TEMPS
            ]
            lines.append(f"| {r['config']} | " + " | ".join(cells) + " |")
        lines.append("")
    configs = [r["config"] for r in rows]
    steps = [(r["config"], s) for r in rows for s in r["step"] if "temp" in s]
    by = {(c, s.get("prompt_len"), s["bs"], s["temp"]): s for c, s in steps}
    keys = sorted({(s["temp"], s.get("prompt_len") or 0, s["bs"]) for _, s in steps})
    by_prompt = any(plen for _, plen, _ in keys)  # a prompt column where lengths were set
    lines += [
        "step ms (accept length, tokens/s) per configuration"
        + ("; [the range of the repeats' medians]" if _has_repeats(rows) else ""),
        "",
        "| T | " + ("prompt | " if by_prompt else "") + "bs | " + " | ".join(configs) + " |",
        "|---|" + ("---:|" if by_prompt else "") + "---:|" + "---|" * len(configs),
    ]
    for temp, plen, bs in keys:
        cells = []
        for c in configs:
            s = by.get((c, plen or None, bs, temp))
            if not s or s.get("step_ms") is None:
                cells.append("refused" if s and "error" in s else "-")
                continue
            acc = f"{s['accept_length']:.2f}" if s["accept_length"] else "1"
            spread = s.get("repeat_step_ms")
            spread = (
                f" [{min(spread):.2f}-{max(spread):.2f}]" if spread and None not in spread else ""
            )
            cells.append(f"{s['step_ms']:.2f}{spread} ({acc}, {s['tok_per_s']:.0f})")
        prompt = f"{plen or '-'} | " if by_prompt else ""
        lines.append(f"| {temp} | {prompt}{bs} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _has_repeats(rows) -> bool:
    return any("repeat_step_ms" in s for r in rows for s in r.get("step", []))


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in result["rows"]:
        for temp, style in (("T0", "-"), ("T1_p0.95", "--"), ("T1", ":")):
            pts = [s for s in r.get("step", []) if s.get("temp") == temp and s.get("step_ms")]
            if not pts:
                continue
            xs = [s["bs"] for s in pts]
            axes[0].plot(
                xs, [s["step_ms"] for s in pts], style, marker="o", label=f"{r['config']} {temp}"
            )
            axes[1].plot(
                xs, [s["tok_per_s"] for s in pts], style, marker="o", label=f"{r['config']} {temp}"
            )
    for ax, ylabel in zip(axes, ("decode step (ms, median)", "tokens/s = bs x accept / step")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"bench_step {result['model']} ({result.get('gpu', '')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def gpu_name() -> str:
    try:
        return subprocess.check_output(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], text=True
        ).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="pair", choices=("pair", "8b", "kimi"))
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every engine")
    ap.add_argument(
        "--plain-all-reduce",
        action="store_true",
        help="tp > 1: NCCL's all-reduce, without SGLang's custom all-reduce or FlashInfer's "
        "all-reduce fusion (testing.e2e.TP_CHECK_ENGINE)",
    )
    ap.add_argument(
        "--kimi-layers",
        type=int,
        default=None,
        help=f"kimi: target layers (K2.6 has 61; default {KIMI_TP2_LAYERS}, which fits two "
        "H200s in bf16, or 61 with --tp-rank-of)",
    )
    ap.add_argument(
        "--tp-rank-of",
        type=int,
        default=None,
        help="kimi: one TP-N rank's shapes on one GPU (heads, expert / MLP intermediates, "
        "vocabulary and drafter heads / N; INT4 routed experts; --kimi-layers 61 by default)",
    )
    ap.add_argument(
        "--prompt-lens",
        type=int,
        nargs="+",
        default=None,
        help="kimi: prompt lengths of the step phase (default 256); cells run per length and bs",
    )
    ap.add_argument(
        "--max-kv-tokens",
        type=int,
        default=None,
        help="skip (prompt length, bs) cells whose bs x (prompt + --step-tokens) exceeds this",
    )
    ap.add_argument(
        "--attention-backend",
        default="triton",
        choices=ATTENTION_BACKENDS,
        help="the target's backend where a configuration names none (config@backend does)",
    )
    ap.add_argument(
        "--draft-attention-backend",
        default=None,
        help="the drafter's backend (default: SGLang's choice for the target's backend)",
    )
    ap.add_argument(
        "--baseline-python",
        default=None,
        help="the python/ folder of another checkout (an earlier commit): a configuration "
        "with the +baseline suffix runs its engine on that plugin",
    )
    ap.add_argument("--configs", default=None, help="comma list (default: DEFAULT_CONFIGS[model])")
    ap.add_argument(
        "--phases", default="step", help="comma list of: accept, step; or experts; or startup"
    )
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--accept-tokens", type=int, default=256)
    ap.add_argument("--step-tokens", type=int, default=128)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="time each step cell this many times in the same engine (its prompts prefilled "
        "once); the cell's step is the median over all, each run's median in repeat_step_ms",
    )
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument(
        "--cprofile-skip",
        type=int,
        default=None,
        help="also cProfile the scheduler thread per step run (after N decode steps)",
    )
    ap.add_argument(
        "--torch-profile-skip",
        type=int,
        default=None,
        help="also torch-profile (CPU+CUDA) each run after N decode steps",
    )
    ap.add_argument(
        "--sync-trace",
        action="store_true",
        help="also record the stack of every host-device sync inside decode steps",
    )
    ap.add_argument(
        "--memory-history",
        action="store_true",
        help="phase startup: record allocation stacks during the glue capture (what pins the "
        "memory outside the glue graphs' pool)",
    )
    ap.add_argument(
        "--temps",
        default=",".join(t for t, _ in TEMPS),
        help=f"comma list of step-phase sampling settings: {', '.join(ALL_TEMPS)}",
    )
    ap.add_argument(
        "--prompt-len",
        type=int,
        default=None,
        help="8B shape: tokens per prompt (default: 64-128); the attention over the prefix "
        "grows with it. Long prompts are prefilled in chunks, so a large bs needs more "
        "--step-tokens for all its requests to share decode steps (bs 64 with 2048 "
        "and 48 measured no step)",
    )
    ap.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="weights",
        help="kimi: routed experts chosen by the loaded router (weights; with dummy weights "
        "every token takes the same experts) or spread by SGLang's benchmark-only uniform "
        f"simulation ({SIMULATE_UNIFORM_EXPERTS_ENV})",
    )
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from sglang_ddtree.serve import serving_unavailable

    missing = serving_unavailable()
    if missing:
        raise SystemExit(f"bench_step.py runs SGLang engines on a GPU: {missing}.")
    if args.prompt_len is not None and args.model != "8b":
        raise SystemExit("--prompt-len applies to --model 8b only")
    if (args.tp_rank_of or args.prompt_lens) and args.model != "kimi":
        raise SystemExit("--tp-rank-of and --prompt-lens apply to --model kimi only")
    if args.routing != "weights" and args.model != "kimi":
        raise SystemExit("--routing applies to --model kimi only (the other targets are dense)")
    if args.kimi_layers is None:
        args.kimi_layers = 61 if args.tp_rank_of else KIMI_TP2_LAYERS
    unknown = [t for t in args.temps.split(",") if t not in ALL_TEMPS]
    if unknown:
        raise SystemExit(f"unknown --temps {unknown}; known: {list(ALL_TEMPS)}")
    args.temps = [(t, ALL_TEMPS[t]) for t in args.temps.split(",")]
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    args.phases = set(args.phases.split(","))
    if not args.phases <= {"accept", "step", "experts", "startup"}:
        raise SystemExit(
            f"unknown --phases {sorted(args.phases)}; accept, step, experts or startup"
        )
    if "experts" in args.phases and len(args.phases) > 1:
        raise SystemExit("--phases experts runs alone (its engines run without CUDA graphs)")
    if "startup" in args.phases and len(args.phases) > 1:
        raise SystemExit("--phases startup runs alone (its graph counts are written every step)")
    if args.memory_history and "startup" not in args.phases:
        raise SystemExit("--memory-history is for --phases startup (the glue capture's memory)")
    os.makedirs(args.out, exist_ok=True)
    t_begin = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="bench_step_")
    spec = model_spec(
        args.model,
        workdir,
        args.prompt_len,
        args.kimi_layers,
        rank_of=args.tp_rank_of,
        prompt_lens=tuple(args.prompt_lens or (256,)),
    )
    if any("regex" in params for _, params in args.temps) and spec["engine"].get(
        "skip_tokenizer_init"
    ):  # a grammar needs a vocabulary: a word-level one of the target's size
        give_word_tokenizer(spec)
    result = {
        "model": args.model,
        "command": " ".join(sys.argv),
        "gpu": gpu_name(),
        "batch_sizes": args.batch_sizes,
        "tp_rank_of": args.tp_rank_of,
        "routing": args.routing,
        "rows": [],
        "not_run": [],
    }
    json_path = os.path.join(args.out, f"bench_step_{args.model}.json")
    for config in (args.configs or DEFAULT_CONFIGS[args.model]).split(","):
        if time.monotonic() - t_begin > args.deadline_s:
            result["not_run"].append(config)
            continue
        timing_dir = os.path.join(workdir, f"steps_{config.replace('@', '_')}")
        try:
            result["rows"].append(run_config(spec, config, args, timing_dir))
        except Exception as e:  # record and go on: one failed config must not lose the rest
            print(f"[bench_step] {config} FAILED: {type(e).__name__}: {e}", flush=True)
            result["rows"].append({"config": config, "error": f"{type(e).__name__}: {e}"})
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    with open(json_path, "w") as f:  # again: configurations skipped at the deadline
        json.dump(result, f, indent=1)
    md = table(result)
    print(md)
    with open(os.path.join(args.out, f"bench_step_{args.model}.md"), "w") as f:
        f.write(md + "\n")
    plot(result, os.path.join(args.out, f"bench_step_{args.model}.png"))
    failed = [r["config"] for r in result["rows"] if "error" in r]
    if failed:
        print(f"[bench_step] FAILED: {failed}")
    if result["not_run"]:
        print(f"[bench_step] NOT RUN (deadline): {result['not_run']}")
    if failed or result["not_run"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
