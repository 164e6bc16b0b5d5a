"""@@ALGORITHM@@'s glue graphs: a segment replays its key's CUDA graph with each call's copied
inputs and gives what the eager function gives; bound inputs that move force a recapture, up
to a limit, after which the key runs eagerly; a segment that cannot be captured (a host sync)
runs eagerly with the right result. Off CUDA every call is eager. Keyed by a padded batch
size, one graph serves every batch padded to it, over the padded rows of a static buffer.
"""

import unittest
from collections import namedtuple

import torch

from sglang.srt.speculative.ddtree_glue_graph import SegmentGraphs
from sglang.srt.speculative.ddtree.padding import leading_rows, padded_view
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=20, stage="base-b", runner_config="1-gpu-small")


def segment(weights, x, scale):
    """A pure glue segment: ``weights`` bound (a graph output upstream), ``x`` copied."""
    return {"y": (x @ weights) * scale, "top": torch.topk(x, 2, dim=-1).indices}


class TestDDTreeGlueGraph(CustomTestCase):
    def test_off_cuda_every_call_is_eager(self):
        seg = SegmentGraphs("cpu", segment)
        w, x = torch.randn(4, 3), torch.randn(5, 4)
        out = seg((1,), {"weights": w}, {"x": x}, {"scale": 2.0})
        torch.testing.assert_close(out["y"], (x @ w) * 2.0)
        self.assertEqual(seg.counts["eager"], 1)
        self.assertEqual(seg.counts["captures"], 0)

    @unittest.skipUnless(torch.cuda.is_available(), "CUDA graphs")
    def test_replay_recapture_and_limits(self):
        seg = SegmentGraphs("demo", segment, max_captures=2)
        w = torch.randn(4, 3, device="cuda")
        for step in range(4):  # capture on the first call, then replays with new copied inputs
            x = torch.randn(5, 4, device="cuda")
            out = seg((5,), {"weights": w}, {"x": x}, {"scale": 0.5})
            torch.testing.assert_close(out["y"], (x @ w) * 0.5)
            self.assertTrue(torch.equal(out["top"], torch.topk(x, 2, dim=-1).indices))
        self.assertEqual((seg.counts["captures"], seg.counts["graph"]), (1, 3))
        for moved in range(2):  # a bound input at a new address: recapture, then (limit 2) eager
            w = torch.randn(4, 3, device="cuda")
            x = torch.randn(5, 4, device="cuda")
            out = seg((5,), {"weights": w}, {"x": x}, {"scale": 0.5})
            torch.testing.assert_close(out["y"], (x @ w) * 0.5)
            self.assertEqual(seg.counts["captures"], 2)
        self.assertIn((5,), seg.eager_keys)

        def syncs(weights, x):  # .item() inside a capture: not capturable
            return x * float(weights.sum().item())

        bad = SegmentGraphs("sync", syncs)
        w, x = torch.ones(3, device="cuda"), torch.randn(3, device="cuda")
        torch.testing.assert_close(bad((1,), {"weights": w}, {"x": x}), x * 3.0)
        self.assertEqual(bad.counts["capture_failures"], 1)
        torch.testing.assert_close(bad((1,), {"weights": w}, {"x": x}), x * 3.0)
        torch.rand(1, device="cuda")  # the generator left capture mode

    def test_padded_view_and_leading_rows(self):
        buf = torch.arange(30).view(10, 3)
        self.assertTrue(torch.equal(padded_view(buf[:4], 6), buf[:6]))
        self.assertIsNone(padded_view(buf[:4].clone(), 6))  # no padded rows behind it
        self.assertIsNone(padded_view(buf[:4], 11))  # past the storage
        rows = namedtuple("rows", "per_request per_node")  # 6 requests, 1 and 3 rows each
        cut = leading_rows(rows(torch.arange(6), torch.arange(18)), bs=4, rows=6)
        self.assertEqual((cut.per_request.tolist(), cut.per_node.numel()), ([0, 1, 2, 3], 12))

    @unittest.skipUnless(torch.cuda.is_available(), "CUDA graphs")
    def test_one_graph_serves_every_batch_padded_to_its_size(self):
        seg = SegmentGraphs("padded", lambda weights, x: {"y": x @ weights})
        w = torch.randn(4, 3, device="cuda")
        static = torch.empty(8, 4, device="cuda")  # a padded replay's output buffer, 8 rows
        for bs in (5, 8, 6, 7):
            static.normal_()
            x = padded_view(static[:bs], 8)  # the real rows given, the padded rows read too
            out = seg((8,), {"weights": w, "x": x})
            torch.testing.assert_close(out["y"][:bs], static[:bs] @ w)
        self.assertEqual((seg.counts["captures"], seg.counts["graph"]), (1, 3))


if __name__ == "__main__":
    unittest.main()
