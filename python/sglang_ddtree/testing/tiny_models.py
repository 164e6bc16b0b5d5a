"""Tiny random-weight model pairs for end-to-end tests: a target and a DFlash drafter.

``make_tiny_pair(out_dir)`` writes two HF-style folders (``config.json``, ``model.safetensors``,
a locally built character-level tokenizer) that SGLang loads like any checkpoint:

- ``out_dir/target``: ``Qwen3ForCausalLM``, vocabulary ``V`` (default 128), 4 layers.
- ``out_dir/draft``: ``DFlashDraftModel`` (no embedding / LM head: it borrows the target's),
  with ``dflash_config = {block_size, target_layer_ids, mask_token, mask_token_id}``.

``make_tiny_mla_pair(out_dir)`` writes the same tokenizer with a Kimi-K2.6-shaped pair scaled
down (``TinyMLAPairConfig``): a ``DeepseekV3ForCausalLM`` target with Kimi K2.6's MLA head dims
(kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, YaRN), the first layer dense and the
rest MoE (a few routed experts, sigmoid scores with a correction bias, top-k, one shared
expert), and a DFlash drafter of Qwen3 layers with K2.6's drafter head shape (grouped-query
attention, head dim 128, block 8).

Why acceptance is deep with random weights: both models see a shared "bias channel" ``c`` (a
constant added to every token embedding), and the target LM head gives a small set of
``num_preferred`` tokens a large weight on that channel. Both the target and the drafter (which
uses the target LM head) therefore put most of their mass on the same few tokens, while the
random part of the weights still makes the target's choice among them depend on the context
(so a wrong tree mask, position or KV commit changes the output). A draft top-K with
``K >= num_preferred`` then covers the target's next token at most depths.

Weights are saved in float32 by default, which SGLang's ``dtype="auto"`` runs in float16 (pass
``dtype`` to run float32): with random weights near-ties between logits are common, and bf16
rounding differences between the verify kernels and plain decode would flip greedy argmaxes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import torch

MASK_TOKEN = "<|MASK|>"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", MASK_TOKEN, "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyPairConfig:
    """Sizes of the tiny pair. ``vocab_size`` includes the special tokens."""

    vocab_size: int = 128
    hidden_size: int = 128
    intermediate_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    target_layers: int = 4
    draft_layers: int = 2
    target_layer_ids: tuple[int, ...] = (1, 2)
    block_size: int = 8
    max_position_embeddings: int = 4096
    num_preferred: int = 4
    bias_channel_value: float = 3.0
    preferred_weight: float = 2.0
    head_std: float = 0.15
    seed: int = 0
    dtype: str = "float32"


def vocabulary(cfg: TinyPairConfig, filler: list[str] | None = None) -> list[str]:
    """`build_tokenizer`'s tokens in id order: the special and printable ones, then ``filler``
    (default ``<x0>``, ...) up to the vocabulary size."""
    chars = [chr(c) for c in range(32, 127)]
    vocab = SPECIALS + chars
    if cfg.vocab_size < len(vocab):
        vocab = vocab[: cfg.vocab_size]
    rest = cfg.vocab_size - len(vocab)
    vocab += filler[:rest] if filler is not None else [f"<x{i}>" for i in range(rest)]
    assert len(vocab) == cfg.vocab_size, "filler shorter than the vocabulary"
    return vocab


def build_tokenizer(out_dir: str, cfg: TinyPairConfig, filler: list[str] | None = None) -> dict:
    """Write a character-level fast tokenizer (tokenizer.json + configs); returns its vocab.
    ``filler``: the tokens after the special and printable ones (default ``<x0>``, ...)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(vocabulary(cfg, filler))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": "<unk>",
        "bos_token": None,
        "model_max_length": cfg.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, f)
    return vocab


def _common_config(cfg: TinyPairConfig, num_layers: int) -> dict:
    return {
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": cfg.dtype,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "initializer_range": 0.02,
    }


def _layer_weights(prefix: str, cfg: TinyPairConfig, g: torch.Generator) -> dict:
    h, hd = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.intermediate_size

    def rnd(*shape, std):
        return torch.randn(*shape, generator=g) * std

    return {
        f"{prefix}.input_layernorm.weight": torch.ones(h),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(h),
        f"{prefix}.self_attn.q_proj.weight": rnd(q, h, std=h**-0.5),
        f"{prefix}.self_attn.k_proj.weight": rnd(kv, h, std=h**-0.5),
        f"{prefix}.self_attn.v_proj.weight": rnd(kv, h, std=h**-0.5),
        f"{prefix}.self_attn.o_proj.weight": rnd(h, q, std=0.5 * q**-0.5),
        f"{prefix}.self_attn.q_norm.weight": torch.ones(hd),
        f"{prefix}.self_attn.k_norm.weight": torch.ones(hd),
        f"{prefix}.mlp.gate_proj.weight": rnd(inter, h, std=h**-0.5),
        f"{prefix}.mlp.up_proj.weight": rnd(inter, h, std=h**-0.5),
        f"{prefix}.mlp.down_proj.weight": rnd(h, inter, std=0.5 * inter**-0.5),
    }


def _save(out_dir: str, config: dict, weights: dict, dtype: str) -> None:
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    tdtype = getattr(torch, dtype)
    save_file(
        {k: v.to(tdtype).contiguous() for k, v in weights.items()},
        os.path.join(out_dir, "model.safetensors"),
        metadata={"format": "pt"},
    )
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 0, "eos_token_id": 0}, f)


def preferred_token_ids(cfg: TinyPairConfig) -> list[int]:
    """Ids the LM head favours (letters 'a', 'b', ...: printable, never special)."""
    first = len(SPECIALS) + (ord("a") - 32)
    return list(range(first, first + cfg.num_preferred))


def _biased_head(cfg: TinyPairConfig, g: torch.Generator) -> dict:
    """Target embeddings carrying a constant on the bias channel, and an LM head that rewards
    it for a few preferred tokens (see the module docstring)."""
    h, bias_ch = cfg.hidden_size, 0
    embed = torch.randn(cfg.vocab_size, h, generator=g)
    embed[:, bias_ch] = cfg.bias_channel_value
    lm_head = torch.randn(cfg.vocab_size, h, generator=g) * cfg.head_std
    lm_head[:, bias_ch] = 0.0
    lm_head[preferred_token_ids(cfg), bias_ch] = cfg.preferred_weight
    return {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": lm_head,
    }


def _write_drafter(draft_dir: str, cfg: TinyPairConfig, mask_id: int, g: torch.Generator) -> None:
    """The DFlash drafter: Qwen3 layers + context projection; its final norm keeps the bias
    channel."""
    h, n_ctx = cfg.hidden_size, len(cfg.target_layer_ids)
    dweights = {
        "fc.weight": torch.randn(h, n_ctx * h, generator=g) * (n_ctx * h) ** -0.5,
        "hidden_norm.weight": torch.ones(h),
        "norm.weight": torch.ones(h),
    }
    for i in range(cfg.draft_layers):
        dweights.update(_layer_weights(f"layers.{i}", cfg, g))
    draft_cfg = {
        "architectures": ["DFlashDraftModel"],
        **_common_config(cfg, cfg.draft_layers),
        "block_size": cfg.block_size,
        "num_target_layers": cfg.target_layers,
        "dflash_config": {
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.target_layer_ids),
            "mask_token": MASK_TOKEN,
            "mask_token_id": mask_id,
        },
    }
    _save(draft_dir, draft_cfg, dweights, cfg.dtype)


def make_tiny_pair(out_dir: str, cfg: TinyPairConfig | None = None) -> tuple[str, str]:
    """Write the target and draft folders under ``out_dir``; return ``(target, draft)`` paths.

    Deterministic for a given ``cfg`` (seeded CPU generator). Takes well under a second.
    """
    cfg = cfg or TinyPairConfig()
    if max(cfg.target_layer_ids) >= cfg.target_layers:
        raise ValueError("target_layer_ids must index target layers")
    g = torch.Generator().manual_seed(cfg.seed)
    target_dir, draft_dir = os.path.join(out_dir, "target"), os.path.join(out_dir, "draft")
    vocab = build_tokenizer(target_dir, cfg)
    build_tokenizer(draft_dir, cfg)
    weights = _biased_head(cfg, g)
    for i in range(cfg.target_layers):
        weights.update(_layer_weights(f"model.layers.{i}", cfg, g))
    target_cfg = {"architectures": ["Qwen3ForCausalLM"], **_common_config(cfg, cfg.target_layers)}
    _save(target_dir, target_cfg, weights, cfg.dtype)
    _write_drafter(draft_dir, cfg, vocab[MASK_TOKEN], g)
    return target_dir, draft_dir


@dataclass(frozen=True)
class TinyMLAPairConfig:
    """Sizes of the Kimi-shaped tiny pair (K2.6's own value in the comment where scaled)."""

    vocab_size: int = 128
    hidden_size: int = 256  # 7168
    target_layers: int = 4  # 61, the first dense
    first_k_dense: int = 1
    num_heads: int = 4  # 64
    q_lora_rank: int = 128  # 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    intermediate_size: int = 512  # dense layer; 18432
    moe_intermediate_size: int = 128  # 2048
    n_routed_experts: int = 8  # 384
    num_experts_per_tok: int = 2  # 8
    n_shared_experts: int = 1
    draft_layers: int = 2  # 6
    draft_heads: int = 8  # 64
    draft_kv_heads: int = 2  # 8
    draft_head_dim: int = 128
    target_layer_ids: tuple[int, ...] = (1, 2)  # (1, 12, 24, 35, 47, 58) of 61
    block_size: int = 8
    max_position_embeddings: int = 8192  # 262144 with YaRN factor 64 over 4096
    num_preferred: int = 4
    bias_channel_value: float = 3.0
    preferred_weight: float = 2.0
    head_std: float = 0.15
    seed: int = 0
    dtype: str = "float32"
    yarn_beta_fast: float = 1.0  # 32
    bos_token_id: int = 0  # 163584
    eos_token_id: int = 0  # 163586


# Kimi K2.6's own target shape (its config.json), for step-cost benchmarks with dummy weights.
KIMI_K26 = TinyMLAPairConfig(
    vocab_size=163840,
    hidden_size=7168,
    target_layers=61,
    num_heads=64,
    q_lora_rank=1536,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    n_routed_experts=384,
    num_experts_per_tok=8,
    max_position_embeddings=262144,
    yarn_beta_fast=32.0,
    bos_token_id=163584,
    eos_token_id=163586,
    dtype="bfloat16",
)


def mla_target_config(m: TinyMLAPairConfig) -> dict:
    """The target's ``config.json`` (DeepSeek-V3 architecture, as SGLang reads it)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": m.vocab_size,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.intermediate_size,
        "moe_intermediate_size": m.moe_intermediate_size,
        "num_hidden_layers": m.target_layers,
        "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_heads,
        "q_lora_rank": m.q_lora_rank,
        "kv_lora_rank": m.kv_lora_rank,
        "qk_nope_head_dim": m.qk_nope_head_dim,
        "qk_rope_head_dim": m.qk_rope_head_dim,
        "v_head_dim": m.v_head_dim,
        "n_routed_experts": m.n_routed_experts,
        "num_experts_per_tok": m.num_experts_per_tok,
        "n_shared_experts": m.n_shared_experts,
        "first_k_dense_replace": m.first_k_dense,
        # SGLang reads these three; transformers' DeepseekV3Config does not write them.
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.827,
        "hidden_act": "silu",
        "max_position_embeddings": m.max_position_embeddings,
        "rope_theta": 50000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": m.max_position_embeddings / 4096,
            "original_max_position_embeddings": 4096,
            "beta_fast": m.yarn_beta_fast,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "torch_dtype": m.dtype,
        "bos_token_id": m.bos_token_id,
        "eos_token_id": m.eos_token_id,
        "initializer_range": 0.02,
    }


def _mla_layer_weights(prefix: str, m: TinyMLAPairConfig, moe: bool, g: torch.Generator) -> dict:
    h, n = m.hidden_size, m.num_heads
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim

    def rnd(*shape, std):
        return torch.randn(*shape, generator=g) * std

    def mlp(pre: str, inter: int) -> dict:
        return {
            f"{pre}.gate_proj.weight": rnd(inter, h, std=h**-0.5),
            f"{pre}.up_proj.weight": rnd(inter, h, std=h**-0.5),
            f"{pre}.down_proj.weight": rnd(h, inter, std=0.5 * inter**-0.5),
        }

    a = f"{prefix}.self_attn"
    w = {
        f"{prefix}.input_layernorm.weight": torch.ones(h),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(h),
        f"{a}.q_a_proj.weight": rnd(m.q_lora_rank, h, std=h**-0.5),
        f"{a}.q_a_layernorm.weight": torch.ones(m.q_lora_rank),
        f"{a}.q_b_proj.weight": rnd(n * qk, m.q_lora_rank, std=m.q_lora_rank**-0.5),
        f"{a}.kv_a_proj_with_mqa.weight": rnd(m.kv_lora_rank + m.qk_rope_head_dim, h, std=h**-0.5),
        f"{a}.kv_a_layernorm.weight": torch.ones(m.kv_lora_rank),
        f"{a}.kv_b_proj.weight": rnd(
            n * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, std=m.kv_lora_rank**-0.5
        ),
        f"{a}.o_proj.weight": rnd(h, n * m.v_head_dim, std=0.5 * (n * m.v_head_dim) ** -0.5),
    }
    if not moe:
        w.update(mlp(f"{prefix}.mlp", m.intermediate_size))
        return w
    w[f"{prefix}.mlp.gate.weight"] = rnd(m.n_routed_experts, h, std=h**-0.5)
    w[f"{prefix}.mlp.gate.e_score_correction_bias"] = torch.zeros(m.n_routed_experts)
    for e in range(m.n_routed_experts):
        w.update(mlp(f"{prefix}.mlp.experts.{e}", m.moe_intermediate_size))
    shared = m.moe_intermediate_size * m.n_shared_experts
    w.update(mlp(f"{prefix}.mlp.shared_experts", shared))
    return w


# The tiny pairs the checks can run on (``--arch``).
TINY_ARCHS = ("qwen3", "mla", "mla-dense", "mla8", "mla8-dense")


def make_pair(
    arch: str, out_dir: str, dtype: str = "float32"
) -> tuple[str, str, TinyPairConfig | TinyMLAPairConfig]:
    """(target dir, drafter dir, config) of one tiny pair: ``qwen3``; ``mla``, the Kimi-shaped
    MLA + MoE pair; ``mla-dense``, that pair with every target layer dense (no MoE), the
    control that separates MLA tree verify from expert routing; ``mla8``, that MoE pair with
    8 attention heads, a K2.6 TP-8 rank's, so that a W 8 verify has 64 query rows a request
    (the flashmla verify's Gluon prefix on Hopper in bfloat16); ``mla8-dense``, those heads
    with dense layers (that kernel without a router's near-ties)."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny pair {arch!r}: one of {', '.join(TINY_ARCHS)}")
    if arch == "qwen3":
        cfg = TinyPairConfig(dtype=dtype)
        return (*make_tiny_pair(out_dir, cfg), cfg)
    m = TinyMLAPairConfig(dtype=dtype)
    if arch.endswith("-dense"):
        m = replace(m, first_k_dense=m.target_layers)
    if arch.startswith("mla8"):
        m = replace(m, num_heads=8)
    return (*make_tiny_mla_pair(out_dir, m), m)


def make_tiny_mla_pair(out_dir: str, m: TinyMLAPairConfig | None = None) -> tuple[str, str]:
    """Write the Kimi-shaped target and its drafter under ``out_dir``; return their paths.

    Same tokenizer, bias-channel construction and drafter format as ``make_tiny_pair``.
    """
    m = m or TinyMLAPairConfig()
    if max(m.target_layer_ids) >= m.target_layers - 1:
        # SGLang's DeepSeek model captures a layer's output at the next layer's input.
        raise ValueError("target_layer_ids must index target layers before the last")
    # The drafter's Qwen3 layers and the shared tokenizer use the Qwen3 pair's fields.
    dcfg = TinyPairConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=2 * m.hidden_size,
        num_heads=m.draft_heads,
        num_kv_heads=m.draft_kv_heads,
        head_dim=m.draft_head_dim,
        target_layers=m.target_layers,
        draft_layers=m.draft_layers,
        target_layer_ids=m.target_layer_ids,
        block_size=m.block_size,
        max_position_embeddings=m.max_position_embeddings,
        num_preferred=m.num_preferred,
        bias_channel_value=m.bias_channel_value,
        preferred_weight=m.preferred_weight,
        head_std=m.head_std,
        dtype=m.dtype,
    )
    g = torch.Generator().manual_seed(m.seed)
    target_dir, draft_dir = os.path.join(out_dir, "target"), os.path.join(out_dir, "draft")
    vocab = build_tokenizer(target_dir, dcfg)
    build_tokenizer(draft_dir, dcfg)
    weights = _biased_head(dcfg, g)
    for i in range(m.target_layers):
        weights.update(_mla_layer_weights(f"model.layers.{i}", m, i >= m.first_k_dense, g))
    _save(target_dir, mla_target_config(m), weights, m.dtype)
    _write_drafter(draft_dir, dcfg, vocab[MASK_TOKEN], g)
    return target_dir, draft_dir


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--vocab-size", type=int, default=TinyPairConfig.vocab_size)
    p.add_argument("--block-size", type=int, default=TinyPairConfig.block_size)
    p.add_argument("--dtype", default=TinyPairConfig.dtype)
    p.add_argument("--arch", choices=("qwen3", "mla"), default="qwen3")
    a = p.parse_args()
    if a.arch == "mla":
        m = TinyMLAPairConfig(vocab_size=a.vocab_size, block_size=a.block_size, dtype=a.dtype)
        t, d = make_tiny_mla_pair(a.out_dir, m)
    else:
        cfg = TinyPairConfig(vocab_size=a.vocab_size, block_size=a.block_size, dtype=a.dtype)
        t, d = make_tiny_pair(a.out_dir, cfg)
    print(f"target={t}\ndraft={d}")


if __name__ == "__main__":
    main()
