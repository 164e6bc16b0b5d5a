"""CPU test of the per-bucket target-verify graph runner (`sglang_ddtree.srt.ddtree_cuda_graph_runner`) against a
stand-in for SGLang 0.5.17's ``DecodeCudaGraphRunner``.

The stand-in keeps only the control flow the DDTREE runner relies on, as read from
``sglang/srt/model_executor/runner/decode_cuda_graph_runner.py``: ``__init__`` sets
``captured_req_width`` (W), ``capture_bs``, ``max_bs`` and sizes buffers, then calls
``capture()``; ``capture()`` -> ``_capture_one_stream()`` -> ``capture_one_shape(bs)`` for
``reversed(capture_bs)`` with ``num_tokens = bs * captured_req_width``, a ``get_spec_info``
dummy whose ``draft_token_num`` is the width, and a ``_make_graph_key`` key; ``can_run_graph``
refuses a width mismatch; replay pads bs to the smallest captured size >= bs. The real runner is
exercised on a GPU by ``python -m sglang_ddtree.testing.e2e --checks adaptive``.
"""

from __future__ import annotations

import bisect
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from sglang_ddtree.srt.ddtree_budget import BudgetSchedule

SGLANG_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]


@dataclass(frozen=True)
class ShapeKey:
    size: int
    stream_idx: int | None = None
    variant_label: str | None = None


class FakeDecodeCudaGraphRunner:
    def __init__(self, model_runner, **kwargs):
        self.model_runner = model_runner
        self.speculative_num_draft_tokens = model_runner.num_draft_tokens
        self.captured_req_width = model_runner.decode_num_tokens_per_req(
            num_draft_tokens=self.speculative_num_draft_tokens
        )
        self.capture_bs = list(SGLANG_BS)
        self.max_bs = max(self.capture_bs)
        self.max_num_token = self.max_bs * self.captured_req_width
        model_runner.init_cuda_graph_state_calls.append((self.max_bs, self.max_num_token))
        self.disable_padding = False
        self.buffers = SimpleNamespace(custom_mask="ALL_TRUE_MASK")
        self.graphs: dict = {}
        self.capture_order: list = []
        self.capture()

    def capture(self):
        self._capture_one_stream()

    def _capture_one_stream(self, stream_idx=None):
        for bs in reversed(self.capture_bs):
            self.capture_one_shape(bs)

    def capture_one_shape(self, bs):
        num_tokens = bs * self.captured_req_width
        spec = self.get_spec_info(num_tokens)
        key = self._make_graph_key(bs, None, None)
        assert key not in self.graphs, f"captured twice: {key}"
        self.graphs[key] = dict(width=self.captured_req_width, spec=spec, num_tokens=num_tokens)
        self.capture_order.append((bs, self.captured_req_width))

    def get_spec_info(self, num_tokens):
        return SimpleNamespace(draft_token_num=self.captured_req_width, custom_mask=None)

    def _make_graph_key(self, size, stream_idx=None, variant_label=None):
        return ShapeKey(size=size, stream_idx=stream_idx, variant_label=variant_label)

    def can_run_graph(self, forward_batch):
        spec_info = forward_batch.spec_info
        if spec_info.num_tokens_per_req != self.captured_req_width:
            return False
        return forward_batch.batch_size <= self.max_bs

    def replay_key(self, raw_bs):
        """What load_batch computes: the padded bs's key at the current width."""
        padded = self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]
        return self._make_graph_key(padded, None, None)


@pytest.fixture
def cuda_graph_mod(monkeypatch):
    """``sglang_ddtree/srt/ddtree_cuda_graph_runner.py`` loaded against the stand-in (SGLang not needed)."""
    for name in ("sglang", "sglang.srt", "sglang.srt.model_executor", "sglang.srt.speculative"):
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    base = types.ModuleType("decode_cuda_graph_runner")
    base.DecodeCudaGraphRunner = FakeDecodeCudaGraphRunner
    keys = types.ModuleType("shape_key")
    keys.ShapeKey = ShapeKey
    prefix = "sglang.srt.model_executor.runner"
    monkeypatch.setitem(sys.modules, prefix, types.ModuleType(prefix))
    monkeypatch.setitem(sys.modules, f"{prefix}.decode_cuda_graph_runner", base)
    monkeypatch.setitem(sys.modules, f"{prefix}.shape_key", keys)
    # SGLang's name of the target's backend, through its wrappers (the verify backend's key).
    dflash_utils = types.ModuleType("dflash_utils")
    dflash_utils.resolve_dflash_verify_mask_policy = lambda b: (type(b).__name__, True)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.dflash_utils", dflash_utils)
    import sglang_ddtree

    path = os.path.join(
        os.path.dirname(sglang_ddtree.__file__), "srt", "ddtree_cuda_graph_runner.py"
    )
    spec = importlib.util.spec_from_file_location("ddtree_cuda_graph_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class TritonAttnBackend:  # stand-ins for the target's attention backend objects, by class
    pass


class FlashMLABackend:
    pass


def fake_model_runner(w_max: int, attn_backend=None):
    mr = SimpleNamespace(
        num_draft_tokens=w_max, is_draft_worker=False, init_cuda_graph_state_calls=[],
        attn_backend=attn_backend or TritonAttnBackend(), server_args=SimpleNamespace(),
    )  # fmt: skip
    mr.decode_num_tokens_per_req = lambda num_draft_tokens=None: num_draft_tokens
    return mr


def with_schedule(mr, schedule: BudgetSchedule, num_nodes: int | None = None):
    """The server arguments as the launcher resolved them (W and the schedule's text)."""
    mr.server_args._ddtree_budget_schedule = str(schedule)
    mr.server_args.speculative_num_draft_tokens = num_nodes or schedule.max_num_nodes
    return mr


def build(mod, schedule: BudgetSchedule, attn_backend=None):
    mr = with_schedule(fake_model_runner(schedule.max_num_nodes, attn_backend), schedule)
    mod.install_target_graph_runner(mr)
    runner_cls = mr._decode_cuda_graph_runner_cls()  # what capture_decode_graph calls
    return mr, runner_cls(mr)


def test_each_bucket_captured_at_its_width(cuda_graph_mod):
    s = BudgetSchedule.parse("1:65,8:33,32:17")
    mr, r = build(cuda_graph_mod, s)
    assert mr.init_cuda_graph_state_calls == [(48, 48 * 65)]  # backend state allocated once
    assert r.capture_bs == [1, 2, 4, 7, 8, 12, 16, 24, 31, 32, 40, 48] and r.max_bs == 48
    assert r.captured_req_width == 65  # restored after capture
    for key, g in r.graphs.items():
        w = s.num_nodes_for(key.size)
        assert g["width"] == w and key.variant_label == f"w{w}"
        assert g["spec"].draft_token_num == w and g["spec"].custom_mask == "ALL_TRUE_MASK"
        assert g["num_tokens"] == key.size * w
    assert sorted(k.size for k in r.graphs) == r.capture_bs
    # Largest token count first (W=33 at bs 31: 1023 tokens), each bucket descending.
    assert r.capture_order[:5] == [(31, 33), (24, 33), (16, 33), (12, 33), (8, 33)]


def test_capture_mask_follows_the_verify_backend(cuda_graph_mod):
    """A verify backend that reads SGLang's FULL_MASK (triton's split, triton's extend kernel)
    captures with the all-True mask; one that reads the tree's own mask (flashmla's split)
    keeps SGLang's dummy as it is and fills buffers of its own in its metadata call."""
    s = BudgetSchedule.parse("1:17")
    _, flashmla = build(cuda_graph_mod, s, FlashMLABackend())
    assert {g["spec"].custom_mask for g in flashmla.graphs.values()} == {None}
    mr, reference = build(cuda_graph_mod, s)
    mr.server_args.speculative_ddtree_verify_attention = "triton_extend"
    assert reference.get_spec_info(17).custom_mask == "ALL_TRUE_MASK"


def test_replay_picks_the_bucket_width(cuda_graph_mod):
    s = BudgetSchedule.parse("1:65,8:33,32:17")
    _, r = build(cuda_graph_mod, s)
    for bs in range(1, 49):
        w = s.num_nodes_for(bs)
        fb = SimpleNamespace(batch_size=bs, spec_info=SimpleNamespace(num_tokens_per_req=w))
        assert r.can_run_graph(fb) and r.captured_req_width == w
        assert r.replay_key(bs) in r.graphs, bs
        assert r.has_graph_for(bs)
    assert r.width_mismatches == 0 and not r.has_graph_for(49)


def test_width_mismatch_is_counted(cuda_graph_mod):
    _, r = build(cuda_graph_mod, BudgetSchedule.parse("1:65,8:33"))
    fb = SimpleNamespace(batch_size=9, spec_info=SimpleNamespace(num_tokens_per_req=65))
    assert not r.can_run_graph(fb)
    assert r.width_mismatches == 1


def test_fixed_budget_is_todays_runner(cuda_graph_mod):
    _, r = build(cuda_graph_mod, BudgetSchedule.fixed(33))
    assert r.capture_bs == SGLANG_BS
    assert {k.variant_label for k in r.graphs} == {"w33"}


def test_schedule_must_match_sglang_width(cuda_graph_mod):
    mr = with_schedule(fake_model_runner(33), BudgetSchedule.parse("1:65,8:33"))
    cuda_graph_mod.install_target_graph_runner(mr)  # SGLang sized for W=33, schedule says 65
    with pytest.raises(RuntimeError, match="must agree"):
        mr._decode_cuda_graph_runner_cls()(mr)
