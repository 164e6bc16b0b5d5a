"""@@ALGORITHM@@'s radix top-p: its CUDA source sits with SGLang's JIT kernels, and (on CUDA)
each row keeps exactly the tokens whose strictly-more-probable mass is below top_p, ties at the
edge included, renormalized; the fused softmax form equals the two steps apart.
"""

import unittest
from pathlib import Path

import torch

import sglang
from sglang.srt.speculative.ddtree.topp_radix import SOURCE
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=60, stage="base-b", runner_config="1-gpu-small")


def _jit_available() -> bool:
    try:
        import sglang.kernels.jit.utils  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def nucleus_reference(probs, top_p):
    """Keep x iff the mass of the tokens strictly more probable than x is below top_p (float64)."""
    out = torch.empty_like(probs, dtype=torch.float64)
    for m, row in enumerate(probs.double()):  # one row at a time: [V, V] comparisons
        mass = ((row[None, :] > row[:, None]) * row[None, :]).sum(-1)
        kept = torch.where(mass < float(top_p[m]), row, 0.0)
        out[m] = kept / kept.sum()
    return out


class TestDDTreeTopPRadix(CustomTestCase):
    def test_source_is_with_the_jit_kernels(self):
        path = Path(sglang.__file__).parent / "kernels" / "jit" / "csrc" / SOURCE
        self.assertTrue(path.is_file(), path)

    @unittest.skipUnless(_jit_available(), "needs CUDA and SGLang's JIT loader")
    def test_nucleus_equals_the_reference(self):
        from sglang.srt.speculative.ddtree.topp_radix import (
            top_p_renorm_radix,
            top_p_softmax_renorm_radix,
        )

        g = torch.Generator().manual_seed(0)
        for vocab in (1000, 1001):  # rows read four floats at a time, and one at a time
            logits = torch.randn(64, vocab, generator=g) * 3
            logits[:8] = torch.randint(0, 4, (8, vocab), generator=g).float()  # many ties
            top_p = torch.rand(64, generator=g).clamp(0.05, 1.0)
            top_p[:4] = 1.0
            probs = torch.softmax(logits, -1).cuda()
            got = top_p_renorm_radix(probs, top_p.cuda()).cpu().double()
            want = nucleus_reference(probs.cpu(), top_p)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
            fused = top_p_softmax_renorm_radix(
                logits.cuda(), torch.ones(64, device="cuda"), top_p.cuda()
            )
            torch.testing.assert_close(fused.cpu().double(), want, atol=1e-5, rtol=1e-4)


if __name__ == "__main__":
    unittest.main()
