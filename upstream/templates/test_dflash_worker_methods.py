"""DFlashWorkerV2's fused drafter-KV helper methods: ``new_fused_kv_helper`` makes a helper on
the same stacked weights with a workspace of its own, which keeps its tensors when the shared
helper's workspace grows (as a long prefill grows it); ``use_fused_kv_helper`` runs appends on
it and puts the shared helper back, and leaves the fused path off if it failed inside."""

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()

import unittest
from types import SimpleNamespace

import torch

from sglang.kernels.ops.speculative.fused_kv_materialize import FusedKVMaterializeHelper
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=2, suite="base-a-test-cpu")

HEADS, HEAD_DIM, HIDDEN, LAYERS = 2, 16, 32, 3


def _layer():
    rope = SimpleNamespace(rotary_dim=HEAD_DIM, is_neox_style=True)
    q_size = kv_size = HEADS * HEAD_DIM
    attn = SimpleNamespace(
        num_kv_heads=HEADS,
        head_dim=HEAD_DIM,
        rotary_emb=rope,
        q_size=q_size,
        kv_size=kv_size,
        qkv_proj=SimpleNamespace(weight=torch.randn(q_size + 2 * kv_size, HIDDEN)),
        k_norm=SimpleNamespace(weight=torch.ones(HEAD_DIM), variance_epsilon=1e-6),
    )
    return SimpleNamespace(self_attn=attn)


def _worker():
    layers = [_layer() for _ in range(LAYERS)]
    rope = layers[0].self_attn.rotary_emb
    helper = FusedKVMaterializeHelper(layers, rope, HEADS, HEAD_DIM, torch.device("cpu"))
    worker = object.__new__(DFlashWorkerV2)  # the two methods read the helper only
    worker._fused_kv_helper = helper
    return worker


def _workspace(helper):
    return [
        t.data_ptr() for t in (helper._proj_workspace, helper._k_workspace, helper._v_workspace)
    ]


class TestDFlashFusedKVHelperMethods(CustomTestCase):
    def test_own_workspace_stays_where_the_shared_one_grows(self):
        worker = _worker()
        shared = worker._fused_kv_helper
        own = worker.new_fused_kv_helper(64)
        self.assertIs(own.flat_kv_weight_t, shared.flat_kv_weight_t)  # the weights, shared
        self.assertGreaterEqual(own._workspace_capacity, 64)
        before = _workspace(own)
        shared._ensure_workspace(4096, shared.flat_kv_weight_t.dtype)
        self.assertEqual(_workspace(own), before)
        self.assertTrue(set(_workspace(shared)).isdisjoint(before))
        self.assertIsNone(worker.new_fused_kv_helper(0))

    def test_appends_run_on_the_given_helper_and_the_shared_one_comes_back(self):
        worker = _worker()
        shared = worker._fused_kv_helper
        own = worker.new_fused_kv_helper(8)
        with worker.use_fused_kv_helper(own):
            self.assertIs(worker._fused_kv_helper, own)
        self.assertIs(worker._fused_kv_helper, shared)
        with worker.use_fused_kv_helper(None):
            self.assertIs(worker._fused_kv_helper, shared)
        with worker.use_fused_kv_helper(own):
            worker._fused_kv_helper = None  # the fused path failed inside
        self.assertIsNone(worker._fused_kv_helper)  # and stays off

    def test_without_the_fused_path(self):
        worker = _worker()
        worker._fused_kv_helper = None
        self.assertIsNone(worker.new_fused_kv_helper(8))
        with worker.use_fused_kv_helper(object()):
            self.assertIsNone(worker._fused_kv_helper)


if __name__ == "__main__":
    unittest.main()
