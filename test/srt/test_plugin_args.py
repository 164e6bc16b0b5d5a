"""CPU tests of the DDTREE plugin glue: option parsing, startup refusals, request refusals, the
tiny model factory, and (when SGLang imports) the spec class and ServerArgs resolution."""

from __future__ import annotations

import json
import logging
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from sglang_ddtree.srt import ddtree_args as dargs
from sglang_ddtree.srt import ddtree_budget as budget
from sglang_ddtree.srt import ddtree_requests as dreq


def good_cfg(**kw):
    base = dict(
        device="cuda",
        attention_backend="triton",
        prefill_attention_backend=None,
        decode_attention_backend=None,
        speculative_attention_mode="prefill",
        page_size=1,
        pp_size=1,
        enable_dp_attention=False,
        tokenizer_worker_num=1,
        speculative_accept_threshold_single=1.0,
        speculative_accept_threshold_acc=1.0,
        speculative_use_rejection_sampling=False,
        enable_two_batch_overlap=False,
        disaggregation_mode="null",
        speculative_draft_window_size=None,
        speculative_adaptive=False,
        speculative_eagle_topk=1,
        speculative_draft_model_path="/models/drafter",
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_good_config_passes():
    assert dargs.check_server_args(good_cfg()) == []
    assert dargs.check_server_args(good_cfg(attention_backend="flashinfer")) == []


@pytest.mark.parametrize(
    "kw, hint",
    [
        (dict(attention_backend="fa3"), "--attention-backend triton"),
        (dict(attention_backend=None), "--attention-backend triton"),
        (dict(prefill_attention_backend="fa3"), "--attention-backend triton"),
        (dict(attention_backend="flashinfer", page_size=16), "--page-size 1"),
        (dict(attention_backend="flashmla", page_size=32), "--page-size 64"),
        (dict(kv_cache_dtype="fp8_e4m3"), "--kv-cache-dtype auto"),
        (dict(pp_size=2), "--pp-size 1"),
        (dict(enable_dp_attention=True), "--enable-dp-attention"),
        (dict(tokenizer_worker_num=4), "--tokenizer-worker-num 1"),
        (dict(speculative_accept_threshold_single=0.5), "threshold-single 1.0"),
        (dict(speculative_accept_threshold_acc=0.9), "threshold-acc 1.0"),
        (dict(speculative_use_rejection_sampling=True), "--speculative-use-rejection-sampling"),
        (dict(device="cpu"), "--device cuda"),
        (dict(speculative_eagle_topk=4), "SGLANG_DDTREE_TOPK"),
        (dict(enable_deterministic_inference=True), "--enable-deterministic-inference"),
        (dict(sampling_backend="pytorch"), "--sampling-backend flashinfer"),
    ],
)
def test_refusals_name_the_fix(kw, hint):
    errors = dargs.check_server_args(good_cfg(**kw))
    assert len(errors) == 1 and hint in errors[0], errors


def test_a_missing_drafter_is_refused_in_ddtree_words():
    """Without a drafter SGLang's DFLASH handling would say "DFLASH speculative decoding
    requires ..."; DDTREE refuses first, naming the flag to pass."""
    (error,) = dargs.check_server_args(good_cfg(speculative_draft_model_path=None))
    assert error == (
        "DDTREE drafts with a DFlash drafter, and none was given; pass "
        "--speculative-draft-model-path <the target's DFlash drafter> (a local folder or hub "
        "id, e.g. z-lab/Kimi-K2.6-DFlash for moonshotai/Kimi-K2.6)."
    )
    assert "DFLASH" not in error


def test_decode_mode_checks_decode_backend():
    cfg = good_cfg(speculative_attention_mode="decode", decode_attention_backend="fa3")
    assert dargs.check_server_args(cfg)
    cfg = good_cfg(
        attention_backend="fa3",
        decode_attention_backend="triton",
        speculative_attention_mode="decode",
    )
    assert dargs.check_server_args(cfg) == []


def test_shapes_the_tree_kernel_cannot_take_are_refused_at_startup():
    """A drafter block above 32 or more than 8,192 nodes a request: refused with what to pass,
    not an assert at capture; the largest shapes the kernel holds are accepted."""
    from sglang_ddtree.core.tree import MAX_BUDGET, MAX_DEPTH

    edge = dargs.DDTreeShape(num_nodes=MAX_BUDGET + 1, block_size=MAX_DEPTH + 1, topk=8)
    assert dargs.check_shape(edge) == []
    (block,) = dargs.check_shape(dargs.DDTreeShape(num_nodes=80, block_size=33, topk=8))
    assert "at most 32" in block and "got 33" in block
    (nodes,) = dargs.check_shape(dargs.DDTreeShape(num_nodes=8193, block_size=8, topk=8))
    assert "--speculative-num-draft-tokens 8192" in nodes and "got 8193" in nodes


def test_shape_and_topk(monkeypatch):
    s = dargs.DDTreeShape(num_nodes=17, block_size=8, topk=8)
    assert (s.budget, s.max_depth, s.accept_width) == (16, 7, 8)
    assert s.candidates_per_depth(vocab_size=4) == 4
    assert dargs.check_shape(s) == []
    bad = dargs.check_shape(dargs.DDTreeShape(num_nodes=4, block_size=8, topk=8))
    assert bad and "--speculative-num-draft-tokens 16" in bad[0]
    assert dargs.default_num_nodes(16) == 32 == budget.default_schedule(16).max_num_nodes
    monkeypatch.delenv(dargs.TOPK_ENV, raising=False)
    assert dargs.read_topk() == dargs.DEFAULT_TOPK
    monkeypatch.setenv(dargs.TOPK_ENV, "3")
    assert dargs.read_topk() == 3
    for bad_val in ("0", "x", "-2"):
        monkeypatch.setenv(dargs.TOPK_ENV, bad_val)
        with pytest.raises(ValueError, match=dargs.TOPK_ENV):
            dargs.read_topk()
    monkeypatch.setenv(dargs.TOPK_ENV, "zero")
    assert any(dargs.TOPK_ENV in e for e in dargs.check_server_args(good_cfg()))


def test_request_refusals():
    def sp(**kw):
        base = dict(
            min_p=0.0,
            frequency_penalty=0.0,
            presence_penalty=0.0,
            repetition_penalty=1.0,
            json_schema=None,
            regex=None,
            ebnf=None,
            structural_tag=None,
        )
        base.update(kw)
        return SimpleNamespace(**base)

    def req(**kw):
        return SimpleNamespace(custom_logit_processor=None, return_logprob=False,
                               sampling_params=sp(**kw))  # fmt: skip

    assert dreq.refuse_request(req()) is None
    assert dreq.refuse_request(req(min_p=0.1)) is None  # SGLang's min-p path
    # Penalties and min_new_tokens are served (each node's path counts; their law test).
    assert dreq.refuse_request(req(frequency_penalty=0.5, presence_penalty=0.5)) is None
    assert dreq.refuse_request(req(repetition_penalty=1.1, min_new_tokens=4)) is None
    # Constrained decoding is served (each tree node's grammar mask).
    for name, value in (("regex", "a+"), ("json_schema", "{}"), ("ebnf", 'root ::= "a"'),
                        ("structural_tag", "{}")):  # fmt: skip
        assert dreq.refuse_request(req(**{name: value})) is None
    assert dreq.refuse_request(req(min_new_tokens=0, sampling_seed=7)) is None
    processor = SimpleNamespace(custom_logit_processor="x", sampling_params=sp())
    assert "custom logit" in dreq.refuse_request(processor)
    # Logprobs are served (their check against the non-speculative server's).
    logprobs = SimpleNamespace(custom_logit_processor=None, return_logprob=True,
                               sampling_params=sp())  # fmt: skip
    assert dreq.refuse_request(logprobs) is None


def test_a_request_that_holds_back_every_token_is_refused(monkeypatch):
    """min_new_tokens with stop ids covering the whole vocabulary (EOS included) leaves no token
    to emit: refused with a message naming the fields; one id short of it, without
    min_new_tokens, or with ids outside the vocabulary only, it is served."""
    vocab = 8
    monkeypatch.setattr(dreq, "_vocab", vocab)

    def req(min_new_tokens, stop_token_ids, eos=0):
        return SimpleNamespace(
            custom_logit_processor=None,
            return_logprob=False,
            sampling_params=SimpleNamespace(
                min_new_tokens=min_new_tokens, stop_token_ids=set(stop_token_ids)
            ),
            tokenizer=SimpleNamespace(additional_stop_token_ids=None, eos_token_id=eos),
        )

    refused = req(4, range(1, vocab))  # with EOS 0: all eight
    msg = dreq.refuse_request(refused)
    assert msg and "min_tokens / min_new_tokens 4" in msg and "vocabulary of 8" in msg
    # SGLang runs a refused request's one-token prefill under its sampling parameters: with
    # every token held back there, its sampler would draw from NaN and end the scheduler.
    assert refused.sampling_params.min_new_tokens == 0
    served = req(4, range(2, vocab))
    assert dreq.refuse_request(served) is None and served.sampling_params.min_new_tokens == 4
    both = req(4, range(1, vocab))  # refused for its processor: defused all the same
    both.custom_logit_processor = "a processor"
    assert "custom logit" in dreq.refuse_request(both)
    assert both.sampling_params.min_new_tokens == 0
    assert dreq.refuse_request(req(0, range(vocab))) is None  # nothing held back
    assert dreq.refuse_request(req(4, [-1, vocab, 2**63] + list(range(2, vocab)))) is None
    monkeypatch.setattr(dreq, "_vocab", None)  # no DDTREE worker in this process
    assert dreq.refuse_request(req(4, range(vocab))) is None


def test_request_hook_names_ddtree_first():
    """While DDTREE serves, its refusal answers before SGLang's own DFlash-family check (whose
    messages name DFLASH); otherwise SGLang's check runs unchanged."""
    from sglang_ddtree.plugin import _validate_request_hook

    def original(req, *a, **k):
        return "DFLASH speculative decoding does not support this yet."

    sp = SimpleNamespace(min_p=0.0, repetition_penalty=1.0)
    req = SimpleNamespace(custom_logit_processor="x", return_logprob=False, sampling_params=sp)
    was = dreq.ddtree_active()
    try:
        dreq.set_active(True)
        assert "DDTREE" in _validate_request_hook(original, req)
        dreq.set_active(False)
        assert "DFLASH" in _validate_request_hook(original, req)
    finally:
        dreq.set_active(was)


def test_request_hook_passes_dflash_s_logprob_refusal():
    """DDTREE serves logprobs: SGLang's DFlash-family check still runs for the rest (its
    other refusal, hidden states under overlap, answers) but not for logprobs, and the request
    keeps its flag; a request without logprobs reaches the check untouched."""
    from sglang_ddtree.plugin import _validate_request_hook

    def original(req, *a, **k):
        if req.return_logprob:
            return "DFLASH speculative decoding does not support return_logprob yet."
        if req.return_hidden_states:
            return "DFLASH speculative decoding does not support return_hidden_states yet."
        return None

    sp = SimpleNamespace(min_p=0.0, repetition_penalty=1.0)
    req = SimpleNamespace(custom_logit_processor=None, return_logprob=True,
                          return_hidden_states=False, sampling_params=sp)  # fmt: skip
    was = dreq.ddtree_active()
    try:
        dreq.set_active(True)
        assert _validate_request_hook(original, req) is None and req.return_logprob
        req.return_hidden_states = True
        assert "hidden_states" in _validate_request_hook(original, req) and req.return_logprob
        dreq.set_active(False)  # not a DDTREE server: SGLang's check as it is
        assert "return_logprob" in _validate_request_hook(original, req)
    finally:
        dreq.set_active(was)


# What a request asks for logprobs, as SGLang's Req carries it.
LOGPROB_ASKS = {
    "return_logprob": {"return_logprob": True},
    "top_logprobs_num": {"return_logprob": True, "top_logprobs_num": 5},
    "token_ids_logprob": {"return_logprob": True, "token_ids_logprob": [3, 7]},
}


@pytest.mark.parametrize("asks", list(LOGPROB_ASKS.values()), ids=list(LOGPROB_ASKS))
def test_ddtree_admits_logprob_requests_and_still_refuses_processors(asks):
    """DDTREE's request check, alone and as the plugin's hook around SGLang's DFlash-family
    check (which refuses logprobs naming DFLASH), admits each way of asking for logprobs, and
    the request reaches the scheduler as asked; a custom logit processor is still refused,
    naming DDTREE, with logprobs asked or not."""
    from sglang_ddtree.plugin import _validate_request_hook

    def dflash_check(req, enable_overlap):
        if req.return_logprob:
            return "DFLASH speculative decoding does not support return_logprob yet."
        return None

    def req(**kw):
        sp = SimpleNamespace(min_p=0.0, repetition_penalty=1.0)
        base = dict(custom_logit_processor=None, return_logprob=False, top_logprobs_num=0,
                    token_ids_logprob=None, return_hidden_states=False, sampling_params=sp)  # fmt: skip
        return SimpleNamespace(**{**base, **kw})

    was = dreq.ddtree_active()
    try:
        dreq.set_active(True)
        asking = req(**asks)
        assert dreq.refuse_request(asking) is None
        assert _validate_request_hook(dflash_check, asking, False) is None
        assert {k: getattr(asking, k) for k in asks} == asks
        for extra in ({}, asks):
            processor = req(custom_logit_processor="x", **extra)
            msg = _validate_request_hook(dflash_check, processor, False)
            assert "DDTREE" in msg and "custom logit processors" in msg
    finally:
        dreq.set_active(was)


def _max_row_column(ctx: int, w: int, block: int) -> int:
    """The largest req_to_token column (exclusive) a DDTREE request touches near the context
    limit: DFLASH v2 reserves ``committed + 2 W`` for every running request (committed below
    ``ctx``), and the verify writes W nodes after a device prefix that leads the host's committed
    length by up to one accepted path (depth + 1 <= block tokens)."""
    worst = 0
    for committed in range(max(0, ctx - 2 * w - block), ctx):
        for lead in range(0, min(block, w) + 1):
            worst = max(worst, committed + 2 * w, committed + lead + w)
    return worst


@pytest.mark.parametrize("w,block", [(9, 8), (17, 16), (33, 16), (65, 16), (33, 8)])
def test_req_to_token_rows_hold_every_reservation(w, block):
    """SGLang's default row headroom (4 + W) lets the reservation run into the next row (the
    check can fail: it does for the default); DDTREE's headroom holds it."""
    ctx = 512
    need = _max_row_column(ctx, w, block)
    assert ctx + 4 + w < need  # the known error is caught
    assert ctx + dargs.req_to_token_headroom(w, block) >= need


def test_row_headroom_hook_only_widens_ddtree():
    from sglang_ddtree.plugin import _row_headroom_hook

    def original(server_args):
        return 4 + server_args.speculative_num_draft_tokens

    ddtree = SimpleNamespace(
        speculative_algorithm="DDTREE", speculative_num_draft_tokens=33,
        speculative_dflash_block_size=16,
    )  # fmt: skip
    dflash = SimpleNamespace(
        speculative_algorithm="DFLASH", speculative_num_draft_tokens=16,
        speculative_dflash_block_size=16,
    )  # fmt: skip
    assert _row_headroom_hook(original, ddtree) == dargs.req_to_token_headroom(33, 16)
    assert _row_headroom_hook(original, dflash) == 20


def test_tiny_pair_files(tmp_path):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from sglang_ddtree.testing.tiny_models import MASK_TOKEN, TinyPairConfig, make_tiny_pair

    target, draft = make_tiny_pair(str(tmp_path))
    cfg = TinyPairConfig()
    tcfg = json.load(open(os.path.join(target, "config.json")))
    dcfg = json.load(open(os.path.join(draft, "config.json")))
    assert tcfg["architectures"] == ["Qwen3ForCausalLM"] and tcfg["vocab_size"] == cfg.vocab_size
    assert dcfg["architectures"] == ["DFlashDraftModel"]
    dfl = dcfg["dflash_config"]
    assert dfl["block_size"] == cfg.block_size and dfl["mask_token"] == MASK_TOKEN
    assert max(dfl["target_layer_ids"]) < tcfg["num_hidden_layers"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(target, "tokenizer.json"))
    assert tok.token_to_id(MASK_TOKEN) == dfl["mask_token_id"]
    ids = tok.encode("hello world").ids
    assert len(ids) == len("hello world") and max(ids) < cfg.vocab_size
    assert tok.decode(ids) == "hello world"
    from safetensors import safe_open

    with safe_open(os.path.join(draft, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "fc.weight" in keys and "layers.0.self_attn.qkv_proj.weight" not in keys
    assert f"layers.{cfg.draft_layers - 1}.mlp.down_proj.weight" in keys


def test_page_sizes_and_kv_dtypes_served():
    """triton at any page size, flashmla at its 64, flashinfer at 1; bfloat16 KV only."""
    for cfg in (
        good_cfg(page_size=16),
        good_cfg(page_size=64),
        good_cfg(attention_backend="flashmla", page_size=64),
        good_cfg(attention_backend="flashinfer", page_size=1),
        good_cfg(kv_cache_dtype="auto"),
        good_cfg(kv_cache_dtype="bfloat16"),
    ):
        assert dargs.check_server_args(cfg) == [], vars(cfg)


def test_mla_targets_verify_on_flashmla_or_triton():
    assert dargs.check_target(good_cfg(), is_mla=True) == []
    assert dargs.check_target(good_cfg(attention_backend="flashmla"), is_mla=True) == []
    assert dargs.check_target(good_cfg(attention_backend="flashinfer"), is_mla=False) == []
    for backend in ("flashinfer", "trtllm_mla", "cutlass_mla"):
        errors = dargs.check_target(good_cfg(attention_backend=backend), is_mla=True)
        assert len(errors) == 1, errors
        assert "--attention-backend flashmla" in errors[0]
        assert "--attention-backend triton" in errors[0]
    errors = dargs.check_target(good_cfg(attention_backend="flashmla"), is_mla=False)
    assert len(errors) == 1 and "MLA targets only" in errors[0]
    # The resolved KV dtype: a checkpoint's FP8 cache is refused at startup, not mid-serving.
    assert dargs.check_target(good_cfg(), is_mla=True, kv_dtype=torch.bfloat16) == []
    errors = dargs.check_target(good_cfg(), is_mla=True, kv_dtype=torch.float8_e4m3fn)
    assert len(errors) == 1 and "--kv-cache-dtype bfloat16" in errors[0]


def test_tiny_mla_pair_files(tmp_path):
    """The Kimi-shaped pair: K2.6's MLA head dims, the first layer dense, MoE after it, weight
    shapes agreeing with the config, and the drafter in the Qwen3 pair's format."""
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from safetensors import safe_open

    from sglang_ddtree.testing.tiny_models import TinyMLAPairConfig, make_tiny_mla_pair

    m = TinyMLAPairConfig()
    target, draft = make_tiny_mla_pair(str(tmp_path), m)
    tcfg = json.load(open(os.path.join(target, "config.json")))
    assert tcfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (tcfg["kv_lora_rank"], tcfg["qk_nope_head_dim"], tcfg["qk_rope_head_dim"]) == (
        512, 128, 64
    )  # fmt: skip
    assert tcfg["v_head_dim"] == 128 and tcfg["rope_scaling"]["type"] == "yarn"
    with safe_open(os.path.join(target, "model.safetensors"), "pt") as f:
        shape = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    n, h = tcfg["num_attention_heads"], tcfg["hidden_size"]
    qk = tcfg["qk_nope_head_dim"] + tcfg["qk_rope_head_dim"]
    for i in range(tcfg["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn"
        assert shape[f"{a}.q_b_proj.weight"] == (n * qk, tcfg["q_lora_rank"])
        assert shape[f"{a}.kv_a_proj_with_mqa.weight"] == (512 + 64, h)
        assert shape[f"{a}.kv_b_proj.weight"] == (n * (128 + 128), 512)
        moe = i >= tcfg["first_k_dense_replace"]
        assert (f"model.layers.{i}.mlp.gate.weight" in shape) == moe
        if moe:
            last = tcfg["n_routed_experts"] - 1
            assert shape[f"model.layers.{i}.mlp.experts.{last}.down_proj.weight"] == (
                h, tcfg["moe_intermediate_size"]
            )  # fmt: skip
            assert f"model.layers.{i}.mlp.gate.e_score_correction_bias" in shape
            assert f"model.layers.{i}.mlp.shared_experts.up_proj.weight" in shape
    dcfg = json.load(open(os.path.join(draft, "config.json")))
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["hidden_size"] == h
    assert (dcfg["num_attention_heads"], dcfg["num_key_value_heads"], dcfg["head_dim"]) == (
        m.draft_heads, m.draft_kv_heads, 128
    )  # fmt: skip
    assert max(dcfg["dflash_config"]["target_layer_ids"]) < tcfg["num_hidden_layers"]


def test_server_flags_parse_and_reach_the_server_args(capsys):
    """The plugin's hooks put DDTREE's flags on SGLang's parser and hand their values to the
    ServerArgs, during ``__post_init__`` (where the speculative arguments are resolved) and
    after it; a flag without DDTREE is refused."""
    import argparse

    from sglang_ddtree.plugin import _add_cli_args_hook, _from_cli_args_hook

    seen = {}

    class FakeServerArgs:  # SGLang's dataclass keeps only its own fields
        speculative_ddtree_budget_schedule = None
        speculative_ddtree_topk = None

        def __init__(self, speculative_algorithm):
            self.speculative_algorithm = speculative_algorithm
            seen["during_post_init"] = (
                self.speculative_ddtree_budget_schedule, self.speculative_ddtree_topk
            )  # fmt: skip
            self._resolved = True

        def __setattr__(self, name, value):  # as SGLang 0.5.17: read-only once resolved
            if not name.startswith("_") and getattr(self, "_resolved", False):
                raise AttributeError(f"server_args.{name} assigned after resolution")
            object.__setattr__(self, name, value)

    def add_cli_args(parser):
        parser.add_argument("--speculative-algorithm")

    def from_cli_args(cls, ns):
        return cls(speculative_algorithm=ns.speculative_algorithm)

    parser = argparse.ArgumentParser()
    _add_cli_args_hook(add_cli_args, parser)
    argv = ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget-schedule",
            "1:33,4:17", "--speculative-ddtree-topk", "6"]  # fmt: skip
    sa = _from_cli_args_hook(from_cli_args, FakeServerArgs, parser.parse_args(argv))
    assert seen["during_post_init"] == ("1:33,4:17", 6)
    assert (sa.speculative_ddtree_budget_schedule, sa.speculative_ddtree_topk) == ("1:33,4:17", 6)
    assert FakeServerArgs.speculative_ddtree_topk is None  # no leak into later ServerArgs
    assert sa.speculative_ddtree_verify_attention is None  # unset: the backend's own verify
    argv += ["--speculative-ddtree-verify-attention", "triton_extend"]
    sa = _from_cli_args_hook(from_cli_args, FakeServerArgs, parser.parse_args(argv))
    assert sa.speculative_ddtree_verify_attention == "triton_extend"
    with pytest.raises(SystemExit):
        parser.parse_args(argv[:-1] + ["on"])
    error = capsys.readouterr().err  # argparse's refusal names the choices
    assert "--speculative-ddtree-verify-attention: invalid choice: 'on'" in error
    assert "triton_extend" in error
    ns = parser.parse_args(["--speculative-algorithm", "DFLASH", "--speculative-ddtree-topk", "6"])
    with pytest.raises(ValueError, match="need --speculative-algorithm DDTREE"):
        _from_cli_args_hook(from_cli_args, FakeServerArgs, ns)


def test_server_flags_as_engine_keywords_reach_the_server_args():
    """``sgl.Engine(**kwargs)`` builds ``ServerArgs(**kwargs)``, whose dataclass init takes no
    other keyword: the plugin's hook takes DDTREE's flags off and hands them on as
    ``from_cli_args``'s hook does (visible during ``__post_init__``, kept after, no leak); a
    flag without DDTREE is refused, and a ServerArgs without them is built as it was."""
    from sglang_ddtree.plugin import _init_hook

    seen = {}

    class FakeServerArgs:
        speculative_ddtree_topk = None

        def __init__(self, speculative_algorithm=None):  # a dataclass init: fields only
            self.speculative_algorithm = speculative_algorithm
            seen["during_post_init"] = self.speculative_ddtree_topk

    sa = FakeServerArgs.__new__(FakeServerArgs)
    _init_hook(
        FakeServerArgs.__init__, sa, speculative_algorithm="DDTREE", speculative_ddtree_topk=6
    )
    assert seen["during_post_init"] == 6 and sa.speculative_ddtree_topk == 6
    assert FakeServerArgs.speculative_ddtree_topk is None  # no leak into later ServerArgs
    plain = FakeServerArgs.__new__(FakeServerArgs)
    _init_hook(FakeServerArgs.__init__, plain, speculative_algorithm="EAGLE")
    assert plain.speculative_algorithm == "EAGLE" and "speculative_ddtree_topk" not in vars(plain)
    other = FakeServerArgs.__new__(FakeServerArgs)
    with pytest.raises(ValueError, match="need --speculative-algorithm DDTREE"):
        _init_hook(FakeServerArgs.__init__, other, speculative_algorithm="DFLASH",
                   speculative_ddtree_topk=6)  # fmt: skip


def test_flags_win_over_nothing_and_refuse_a_disagreeing_env(monkeypatch):
    monkeypatch.delenv(dargs.TOPK_ENV, raising=False)
    monkeypatch.delenv(budget.SCHEDULE_ENV, raising=False)
    assert dargs.read_topk(flag=5) == 5
    with pytest.raises(ValueError, match=">= 1"):
        dargs.read_topk(flag=0)
    got = budget.resolve_schedule(None, 8, flag="1:33,4:17")
    assert str(got) == str(budget.BudgetSchedule.parse("1:33,4:17"))
    with pytest.raises(ValueError, match="ambiguous"):
        budget.resolve_schedule(17, 8, flag="1:33")
    with pytest.raises(ValueError):
        budget.resolve_schedule(None, 8, flag="1:4")  # W < B
    monkeypatch.setenv(dargs.TOPK_ENV, "5")
    assert dargs.read_topk(flag=5) == 5
    monkeypatch.setenv(dargs.TOPK_ENV, "4")
    with pytest.raises(ValueError, match="disagree"):
        dargs.read_topk(flag=5)
    monkeypatch.setenv(budget.SCHEDULE_ENV, "1:17")
    with pytest.raises(ValueError, match="disagree"):
        budget.resolve_schedule(None, 8, flag="1:33")


def _sglang_or_skip():
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: F401
    except Exception as e:  # not installed (CPU CI), or not importable here
        pytest.skip(f"sglang not importable: {type(e).__name__}")


def test_spec_class_answers():
    _sglang_or_skip()
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_ddtree import plugin

    plugin.register()
    algo = SpeculativeAlgorithm.from_string("ddtree")
    assert algo.is_dflash_family() and algo.supports_target_verify_for_draft()
    assert algo.carries_draft_hidden_states() is False and algo.need_topk() is False
    assert algo.supports_overlap is True
    assert algo.get_num_tokens_per_req_for_target_verify(17, is_draft_worker=False) == 17
    # Conformance with every is_*/supports_* of the builtin enum.
    names = [n for n in vars(SpeculativeAlgorithm) if n.startswith(("is_", "supports_"))]
    assert all(callable(getattr(algo, n)) for n in names)
    plugin.register()  # idempotent


def test_server_args_resolution(tmp_path, monkeypatch):
    _sglang_or_skip()
    from sglang.srt.server_args import ServerArgs

    from sglang_ddtree import plugin
    from sglang_ddtree.testing.tiny_models import make_tiny_pair

    plugin.register()
    target, draft = make_tiny_pair(str(tmp_path))
    # The sampling backend named: without CUDA, SGLang would resolve it to pytorch, which
    # DDTREE refuses (its law is the flashinfer sampler's).
    kw = dict(
        model_path=target,
        speculative_algorithm="DDTREE",
        speculative_draft_model_path=draft,
        device="cuda",
        sampling_backend="flashinfer",
    )
    try:
        sa = ServerArgs(attention_backend="triton", **kw)
    except RuntimeError as e:  # machines without an accelerator stop before our hook
        pytest.skip(str(e))
    # Neither flag nor env: the default adaptive schedule; SGLang sizes for its largest W.
    default = budget.default_schedule(8)  # "1:16,4:8" for the tiny block-8 drafter
    assert (sa.speculative_num_draft_tokens, sa.speculative_dflash_block_size) == (16, 8)
    assert sa._ddtree_budget_schedule == str(default) == "1:16,4:8"
    fixed = ServerArgs(attention_backend="triton", speculative_num_draft_tokens=17, **kw)
    assert fixed.speculative_num_draft_tokens == 17 and fixed._ddtree_budget_schedule == "1:17"
    monkeypatch.setenv("SGLANG_DDTREE_BUDGET_SCHEDULE", "1:33,4:17")
    env = ServerArgs(attention_backend="triton", **kw)
    assert env.speculative_num_draft_tokens == 33
    assert env._ddtree_budget_schedule == "1:33,4:17"
    with pytest.raises(ValueError, match="ambiguous"):
        ServerArgs(attention_backend="triton", speculative_num_draft_tokens=17, **kw)
    monkeypatch.delenv("SGLANG_DDTREE_BUDGET_SCHEDULE")
    with pytest.raises(ValueError, match="--attention-backend triton"):
        ServerArgs(attention_backend="fa3", **kw)
    with pytest.raises(ValueError, match="--speculative-num-draft-tokens 16"):
        ServerArgs(attention_backend="triton", speculative_num_draft_tokens=4, **kw)
    from sglang.srt.plugins import load_plugins

    load_plugins()  # applies the plugin's hooks: DDTREE's flags are ServerArgs keywords
    with pytest.raises(ValueError, match="verify-attention 'on' is none of DDTREE's"):
        ServerArgs(attention_backend="triton", speculative_ddtree_verify_attention="on", **kw)
    reference = ServerArgs(
        attention_backend="triton", speculative_ddtree_verify_attention="triton_extend", **kw
    )
    assert reference.speculative_ddtree_verify_attention == "triton_extend"  # sgl.Engine's way
    assert ServerArgs.speculative_ddtree_verify_attention is None  # no leak into later ones
    # A mixture-of-experts target (the Kimi-shaped pair, block 8): W = B at every batch size.
    from sglang_ddtree.testing.tiny_models import make_pair

    moe_target, moe_draft, _ = make_pair("mla", str(tmp_path / "moe"))
    moe = ServerArgs(
        attention_backend="triton",
        **{**kw, "model_path": moe_target, "speculative_draft_model_path": moe_draft},
    )
    assert moe._ddtree_budget_schedule == str(budget.default_schedule(8, moe=True)) == "1:8"
    assert moe.speculative_num_draft_tokens == 8


def test_dense_mla_control_pair(tmp_path):
    """``mla-dense``: the Kimi-shaped pair with every target layer dense (no expert weights),
    everything else as the MoE pair; ``make_pair`` knows the three tiny pairs and no other."""
    from sglang_ddtree.testing import tiny_models as tm

    _, _, moe = tm.make_pair("mla", str(tmp_path / "moe"))
    target, _, dense = tm.make_pair("mla-dense", str(tmp_path / "dense"))
    assert dense.first_k_dense == dense.target_layers and moe.first_k_dense == 1
    with open(os.path.join(target, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["first_k_dense_replace"] == cfg["num_hidden_layers"] == dense.target_layers
    from safetensors import safe_open

    with safe_open(os.path.join(target, "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if ".experts." in k]
    _, _, qwen = tm.make_pair("qwen3", str(tmp_path / "qwen3"))
    assert isinstance(qwen, tm.TinyPairConfig)
    with pytest.raises(ValueError):
        tm.make_pair("mla-moe", str(tmp_path / "bad"))


def test_eight_head_mla_pair_takes_the_gluon_prefix(tmp_path):
    """``mla8``: the Kimi-shaped MoE pair with a K2.6 TP-8 rank's 8 heads, so its W 8 verify
    (the MoE schedule's W = block) has 64 query rows a request: the flashmla verify's launch
    takes the Gluon prefix where it runs, as on the real rank; the 4-head pair's does not."""
    from sglang_ddtree.core.tree_attention import launch_settings
    from sglang_ddtree.testing import tiny_models as tm

    target, _, m = tm.make_pair("mla8", str(tmp_path / "mla8"))
    with open(os.path.join(target, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["num_attention_heads"] == m.num_heads == 8 and m.first_k_dense == 1
    d = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    w = str(budget.default_schedule(m.block_size, moe=True)).split(":")[1]
    for heads, picks in ((8, True), (tm.TinyMLAPairConfig().num_heads, False)):
        got = launch_settings(4, int(w), heads, 1, cfg["kv_lora_rank"], 132, d, 64, gluon=True)
        assert got.get("prefix_gluon", False) == picks, heads


def test_verify_backend_named_by_the_backend_object():
    """The step and the graph runner name the verify backend by SGLang's backend class; a
    prefill / decode split falls back to the server args' verify side; a named verify
    attention wins."""
    from sglang_ddtree.srt.ddtree_attention.attention_registry import (
        VERIFY_BACKENDS,
        verify_attention_backend,
        verify_backend,
    )

    assert verify_attention_backend("FlashMLABackend", good_cfg()) == "flashmla"
    assert verify_attention_backend("TritonAttnBackend", good_cfg(attention_backend="fa3")) == (
        "triton"
    )
    split = good_cfg(prefill_attention_backend="flashinfer", decode_attention_backend="flashmla")
    assert verify_attention_backend("HybridAttnBackend", split) == "flashinfer"
    assert verify_backend(split, "HybridAttnBackend") is VERIFY_BACKENDS["flashinfer"]
    assert not verify_backend(good_cfg(), "FlashMLABackend").reads_full_mask
    reference = good_cfg(speculative_ddtree_verify_attention="triton_extend")
    assert verify_backend(reference, "TritonAttnBackend") is VERIFY_BACKENDS["triton_extend"]
    errors = dargs.check_target(good_cfg(), is_mla=True, backend="trtllm_mla")
    assert len(errors) == 1 and "'trtllm_mla'" in errors[0]


def test_plugin_refuses_other_sglang_releases(monkeypatch):
    """The plugin registers on the SGLang release it pins and refuses any other, naming both;
    the pin is pyproject's `serve` extra (the Dockerfile's base is held to it elsewhere)."""
    import importlib.metadata
    import re
    from pathlib import Path

    from sglang_ddtree import plugin

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert re.search(r'"sglang==([0-9.]+)"', pyproject).group(1) == plugin.SGLANG_VERSION
    assert plugin.sglang_version_error(plugin.SGLANG_VERSION) is None
    for found in ("0.5.23", "0.5.17.post1", None):
        msg = plugin.sglang_version_error(found)
        assert plugin.SGLANG_VERSION in msg and str(found or "unknown") in msg

    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "_register_error", None)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.23")
    with pytest.raises(RuntimeError, match=r"SGLang 0\.5\.17 only.*SGLang 0\.5\.23"):
        plugin.register()
    assert not plugin._registered and "0.5.23" in str(plugin._register_error)


@pytest.fixture
def hook_registry(monkeypatch):
    """A stand-in for SGLang's hook registry: the targets registered, in order."""
    import enum

    registered = []

    class HookType(enum.Enum):
        AROUND = "around"

    class HookRegistry:
        @staticmethod
        def register(target, hook, hook_type):
            registered.append(target)

    registry = types.ModuleType("sglang.srt.plugins.hook_registry")
    registry.HookRegistry, registry.HookType = HookRegistry, HookType
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, registry.__name__, registry)
    return registered


def test_flashmla_hooks_only_where_its_backend_imports(hook_registry, monkeypatch, caplog):
    """SGLang's registry logs a traceback for every hooked class that does not import, on every
    launch: where the flashmla backend does not import, its hooks are not registered and one
    debug line says why; where it imports, all four are. Only backends that take the verify
    are hooked (the custom-mask ones keep SGLang's kernel untouched)."""
    from sglang_ddtree.srt import ddtree_attention_hook as hooks
    from sglang_ddtree.srt.ddtree_attention import flashmla_backend
    from sglang_ddtree.srt.ddtree_attention.flashmla_backend import FlashMLASplitVerify
    from sglang_ddtree.srt.ddtree_attention.triton_backend import TritonSplitVerify

    triton, flashmla = TritonSplitVerify.backend_class, FlashMLASplitVerify.backend_class
    monkeypatch.setattr(flashmla_backend, "BACKEND_MODULE", "ddtree_test_absent.flashmla_backend")
    flashmla_backend.import_error.cache_clear()
    caplog.set_level(logging.DEBUG)
    try:
        assert hooks.register_verify_hooks() == ["triton"]
        assert hook_registry == [f"{triton}.__init__", f"{triton}.forward_extend"]
        (record,) = [r for r in caplog.records if r.name == hooks.__name__]
        assert record.levelno == logging.DEBUG
        assert "No module named 'ddtree_test_absent'" in record.getMessage()
        assert "\n" not in record.getMessage() and record.exc_info is None

        present = types.ModuleType("ddtree_test_flashmla_backend")
        monkeypatch.setitem(sys.modules, present.__name__, present)
        monkeypatch.setattr(flashmla_backend, "BACKEND_MODULE", present.__name__)
        flashmla_backend.import_error.cache_clear()
        hook_registry.clear()
        assert hooks.register_verify_hooks() == ["triton", "flashmla"]
        registered = [t for t in hook_registry if t.startswith(flashmla + ".")]
        assert sorted(t.rsplit(".", 1)[1] for t in registered) == [
            "__init__", "forward_extend", "init_forward_metadata",
            "init_forward_metadata_out_graph",
        ]  # fmt: skip
    finally:
        flashmla_backend.import_error.cache_clear()


def test_token_ids_logprob_beside_another_logprob_request_keeps_the_scheduler(source):
    """SGLang 0.5.17's own decode logprobs (its functions, compiled from its sources) leave
    ``[]`` for a request without ``token_ids_logprob`` beside the others' tensors, and the
    scheduler's CPU copy (quoted from its sources) calls ``.tolist()`` on each: AttributeError,
    the scheduler's death. Through the plugin's hook every entry is a tensor, the copy gives
    what SGLang gives without ``no_copy_to_cpu``, and the hook changes nothing else."""
    from conftest import pristine_functions

    from sglang_ddtree import plugin

    path = "python/sglang/srt/layers/logprob_processor.py"
    fns = pristine_functions(source, path, ["get_token_ids_logprobs_raw", "get_token_ids_logprobs"])
    get = fns["get_token_ids_logprobs"]
    get.__globals__["LogprobStage"] = types.SimpleNamespace(DECODE="decode", PREFILL="prefill")
    copy_line = "v.tolist() for v in logits_output.next_token_token_ids_logprobs_val"
    processor = "python/sglang/srt/managers/scheduler_components/batch_result_processor.py"
    assert copy_line in source.read(processor).decode()

    logprobs = torch.log_softmax(torch.randn(3, 16), dim=-1)  # [bs, V]
    asks = [[1, 2], None, [15]]  # the middle request asks top logprobs only
    vals, _ = get(logprobs, asks, no_copy_to_cpu=True)
    with pytest.raises(AttributeError, match="'list' object has no attribute 'tolist'"):
        [v.tolist() for v in vals]  # the scheduler's copy

    expected, expected_idx = get(logprobs, asks)  # already on the host: lists
    for call in (lambda: plugin.token_ids_logprobs_with_tensor_placeholders(
                     get, logprobs, asks, no_copy_to_cpu=True),
                 lambda: plugin.token_ids_logprobs_with_tensor_placeholders(
                     get, logprobs, asks, True)):  # fmt: skip
        vals, idx = call()
        assert all(isinstance(v, torch.Tensor) for v in vals)
        assert [v.tolist() for v in vals] == expected and idx == expected_idx
    unchanged = plugin.token_ids_logprobs_with_tensor_placeholders(get, logprobs, asks)
    assert unchanged == (expected, expected_idx)


def test_the_logprob_placeholder_hook_is_registered(hook_registry):
    from sglang_ddtree import plugin

    plugin._register_logprob_placeholders()
    assert hook_registry == ["sglang.srt.layers.logprob_processor.get_token_ids_logprobs"]
