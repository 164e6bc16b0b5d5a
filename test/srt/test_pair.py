"""The shipped target + DFlash drafter pair (python/sglang_ddtree/pair/assets), on the CPU.

Checks sizes, tokenizer and chat template, SGLang-facing configs and weight names, model shapes
and caches, the recorded held-out loss, and a quick chain accept length.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sglang_ddtree.pair import evaluate as E
from sglang_ddtree.pair import modeling as M
from sglang_ddtree.pair.tokenizer import (
    CHAT_TEMPLATE,
    EOS_ID,
    IM_END_ID,
    IM_START_ID,
    MASK_ID,
    MASK_TOKEN,
    apply_chat_template,
)

ASSETS = M.ASSETS_DIR
SIZE_LIMIT = 16_000_000  # bytes, all shipped files together
# The recorded loss was computed on the GPU in float32 from the same bf16 weights; a CPU float32
# recomputation differs only by summation order (measured about 1e-6).
LOSS_TOL = 1e-3


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    return M.load_pair()


@pytest.fixture(scope="module")
def metrics():
    return json.loads((ASSETS / "metrics.json").read_text())


def _cfg(name):
    return json.loads((ASSETS / name / "config.json").read_text())


def test_files_and_size():
    expected = [
        "target/config.json",
        "target/generation_config.json",
        "target/model.safetensors",
        "target/tokenizer.json",
        "target/tokenizer_config.json",
        "target/special_tokens_map.json",
        "drafter/config.json",
        "drafter/model.safetensors",
        "metrics.json",
        "heldout_sample.npy",
        "heldout_prompts.json",
        "MODEL_CARD.md",
    ]
    for name in expected:
        assert (ASSETS / name).is_file(), name
    total = sum(p.stat().st_size for p in Path(ASSETS).rglob("*") if p.is_file())
    assert total <= SIZE_LIMIT, total


def test_tokenizer_roundtrip(pair):
    _, _, tok = pair
    texts = [
        "def f(x):\n    return x ** 2  # square\n",
        "\tmixed\r\n  whitespace   \n\n",
        "unicode: é ü ß 漢字 🐍 \x00 end",
        "",
    ]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == _cfg("target")["vocab_size"] == 4096
    for tid, t in [
        (EOS_ID, "<|endoftext|>"),
        (IM_START_ID, "<|im_start|>"),
        (IM_END_ID, "<|im_end|>"),
    ]:
        assert tok.encode(t) == [tid]
    assert tok.encode(MASK_TOKEN) == [MASK_ID] == [tok.mask_token_id]


def test_chat_template(pair):
    _, _, tok = pair
    cfg = json.loads((ASSETS / "target/tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHAT_TEMPLATE
    assert cfg["eos_token"] == "<|endoftext|>" and cfg["mask_token"] == MASK_TOKEN
    msgs = [{"role": "user", "content": "import os"}]
    text = apply_chat_template(msgs)
    assert text == "<|im_start|>user\nimport os<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text)
    assert ids[0] == IM_START_ID and ids.count(IM_END_ID) == 1 and ids.count(IM_START_ID) == 2
    jinja2 = pytest.importorskip("jinja2")
    rendered = jinja2.Template(CHAT_TEMPLATE).render(messages=msgs, add_generation_prompt=True)
    assert rendered == text
    gen = json.loads((ASSETS / "target/generation_config.json").read_text())
    assert gen["eos_token_id"] == [EOS_ID, IM_END_ID]


def test_configs_match_sglang_dflash():
    t, d = _cfg("target"), _cfg("drafter")
    assert t["architectures"] == ["Qwen3ForCausalLM"] and t["model_type"] == "qwen3"
    assert d["architectures"] == ["DFlashDraftModel"] and d["model_type"] == "qwen3"
    dc = d["dflash_config"]
    assert dc["block_size"] == d["block_size"] == 16
    assert dc["mask_token"] == MASK_TOKEN and dc["mask_token_id"] == MASK_ID < t["vocab_size"]
    assert dc["num_target_layers"] == d["num_target_layers"] == t["num_hidden_layers"]
    # SGLang captures target layer i's output "before layer i + 1": the last layer is not allowed.
    ids = dc["target_layer_ids"]
    assert ids and all(0 <= i <= t["num_hidden_layers"] - 2 for i in ids)
    for key in ["hidden_size", "head_dim", "vocab_size", "rms_norm_eps"]:
        assert d[key] == t[key], key
    assert "is_causal" not in d  # SGLang then builds non-causal (ENCODER_ONLY) draft attention
    assert t["tie_word_embeddings"] is True


def test_weight_names_and_shapes():
    from safetensors import safe_open

    t, d = _cfg("target"), _cfg("drafter")
    h = t["hidden_size"]
    with safe_open(str(ASSETS / "drafter/model.safetensors"), "pt") as f:
        dkeys = set(f.keys())
        fc = f.get_slice("fc.weight").get_shape()
        dtypes = {f.get_slice(k).get_dtype() for k in dkeys}
    # SGLang's DFlashDraftModel: layers.*, norm, fc, hidden_norm; no embedding / LM head.
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= dkeys
    assert not any("embed" in k or "lm_head" in k for k in dkeys)
    assert {k.split(".")[1] for k in dkeys if k.startswith("layers.")} == {
        str(i) for i in range(d["num_hidden_layers"])
    }
    assert fc == [h, len(d["dflash_config"]["target_layer_ids"]) * h]
    with safe_open(str(ASSETS / "target/model.safetensors"), "pt") as f:
        tkeys = set(f.keys())
        dtypes |= {f.get_slice(k).get_dtype() for k in tkeys}
    assert "model.embed_tokens.weight" in tkeys and "lm_head.weight" not in tkeys
    assert dtypes == {"BF16"}
    target = M.Qwen3ForCausalLM(M.ModelArgs.load(ASSETS / "target"))
    assert tkeys | {"lm_head.weight"} == set(target.state_dict())


def test_heldout_loss_reproduces(pair, metrics):
    target = pair[0]
    sample = torch.from_numpy(np.load(ASSETS / "heldout_sample.npy").astype(np.int64))
    assert tuple(sample.shape) == (16, 512)
    loss = E.lm_loss(target, sample)
    assert abs(loss - metrics["target"]["heldout_sample_loss"]) < LOSS_TOL, loss


def test_model_shapes_and_caches(pair):
    target, drafter, tok = pair
    a, bs = target.args, drafter.block_size
    k = len(drafter.args.target_layer_ids)
    text = "import os\nimport sys\n\n\ndef main(argv):\n    for arg in argv:\n        print(arg)\n"
    ids = torch.tensor([tok.encode(text)] * 2)
    t = ids.shape[1]
    with torch.no_grad():
        logits, feats = target(ids)
        assert logits.shape == (2, t, a.vocab_size) and feats.shape == (2, t, k * a.hidden_size)
        cache = M.KVCache(a, 2, t + 8)
        l1, f1 = target(ids[:, :10], cache=cache)
        l2, f2 = target(ids[:, 10:], cache=cache)
        assert cache.length == t
        torch.testing.assert_close(torch.cat([l1, l2], 1), logits, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(torch.cat([f1, f2], 1), feats, atol=2e-4, rtol=1e-4)

        block = torch.full((2, bs), drafter.mask_token_id)
        block[:, 0] = ids[:, -1]
        out = drafter(feats[:, :-1], block)
        assert out.shape == (2, bs - 1, a.vocab_size)
        dcache = M.DraftKVCache(drafter.args, 2, t + bs)
        drafter(feats[:, :5], block, cache=dcache)
        out_cached = drafter(feats[:, 5:-1], block, cache=dcache)
        torch.testing.assert_close(out_cached, out, atol=2e-4, rtol=1e-4)
        anchors = torch.tensor([[t - 1 - bs], [t - 1 - bs]])
        block[:, 0] = ids[:, t - 1 - bs]
        via_anchor, labels = M.draft_at_anchors(drafter, feats, ids, anchors)
        direct = drafter(feats[:, : t - 1 - bs], block)
        assert labels.shape == (2, 1, bs - 1)
        torch.testing.assert_close(via_anchor[:, 0], direct, atol=2e-4, rtol=1e-4)


def test_chain_accept_length_cpu(pair, metrics):
    """Re-measure the first two held-out prompts (256 tokens each, as recorded)."""
    target, drafter, tok = pair
    rec = metrics["chain_T0_heldout_prompts_cpu"]
    assert rec["accept_length"] >= 3.0 and rec["num_prompts"] == 64
    prompts = json.loads((ASSETS / "heldout_prompts.json").read_text())[:2]
    ids = [tok.encode(p["prompt"]) for p in prompts]
    res = E.chain_accept_on_prompts(target, drafter, ids, rec["num_tokens"])
    assert res["tokens"] == 2 * rec["num_tokens"]
    # float32 on another CPU may flip a near-tie argmax now and then: allow 10%
    for got, want in zip(res["per_prompt"], rec["per_prompt"][:2]):
        assert abs(got - want) <= 0.1 * want, (res["per_prompt"], rec["per_prompt"][:2])


@pytest.mark.gpu
def test_heldout_loss_bf16_cuda(metrics):
    target = M.load_target(device="cuda", dtype=torch.bfloat16)
    sample = torch.from_numpy(np.load(ASSETS / "heldout_sample.npy").astype(np.int64))
    loss = E.lm_loss(target, sample)
    assert abs(loss - metrics["target"]["heldout_sample_loss"]) < 0.02, loss


def test_transformers_loads_pair():
    pytest.importorskip("transformers")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ASSETS / "target"))
    assert tok.mask_token_id == MASK_ID and tok.eos_token_id == EOS_ID
    assert AutoConfig.from_pretrained(str(ASSETS / "drafter")).dflash_config["mask_token_id"] == 3
    hf = AutoModelForCausalLM.from_pretrained(str(ASSETS / "target"), dtype=torch.float32)
    ours = M.load_target()
    ids = torch.tensor([[5, 6, 7, 300, 1000, 2000]])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids)[0], atol=1e-4, rtol=1e-4)
