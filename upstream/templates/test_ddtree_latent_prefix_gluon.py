"""@@ALGORITHM@@'s latent prefix as a Gluon kernel (Hopper): its two TMA descriptors of the
latent cache (CPU), and (on Hopper) every share of each request's prefix, read from 64-slot
pages through a block table, equal to attention written out in float32 over that share's keys
(output and log-sum-exp), with one share and several, ragged prefixes over page boundaries.
"""

import itertools
import unittest

import torch

from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=20, stage="base-b", runner_config="1-gpu-small")

PAGE, ROWS, KEYS, MIN_SHARE, DV = 64, 64, 64, 256, 512


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def paged_case(prefix, w, hq, seed):
    """Queries, a latent cache of scattered 64-slot pages, the int64 prefix offsets and the
    int32 block table."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // PAGE) for n in prefix]
    order = torch.randperm(sum(pages) + 3, generator=g)
    table = torch.zeros(len(prefix), max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[at : at + n]
        at += n
    cache = torch.randn(len(order) * PAGE, 1, DV + 64, generator=g).bfloat16()
    q = torch.randn(len(prefix) * w, hq, DV + 64, generator=g).bfloat16()
    indptr = torch.tensor([0, *prefix]).cumsum(0)
    return q, cache, indptr, table


def share_range(length, split, splits):
    """The kernel's share of a prefix: at least MIN_SHARE keys, whole key tiles."""
    share = max(-(-length // splits), MIN_SHARE)
    share = -(-share // KEYS) * KEYS
    lo = split * share
    return lo, min(lo + share, length)


def reference(q, cache, table, b, lo, hi, w, scale):
    """Output [W, Hq, DV] and log-sum-exp [W, Hq] of request b's rows over keys [lo, hi)."""
    pos = torch.arange(lo, hi)
    slots = table[b, pos // PAGE].long() * PAGE + pos % PAGE
    k = cache[slots, 0].float()
    s = torch.einsum("nhd,kd->nhk", q[b * w : (b + 1) * w].float(), k) * scale
    return torch.einsum("nhk,kd->nhd", s.softmax(-1), k[:, :DV]), torch.logsumexp(s, -1)


class TestDDTreeLatentPrefixGluon(CustomTestCase):
    def test_cache_descriptors_cover_the_latent_and_rope_columns(self):
        """The launch's two TMA descriptors (host-side, no GPU): the pool's [slots, D] rows at
        its own address and row stride, 64-slot blocks of half the 512 latent columns (a key
        tile arrives in two copies) and of the 64 rope columns, each with a 128-byte swizzle."""
        from sglang.srt.speculative.ddtree.tree_attention_gluon import cache_descriptors

        pool = torch.zeros(300, 1, DV + 64, dtype=torch.bfloat16)
        latent, rope = cache_descriptors(pool, DV, KEYS)
        for desc, cols in ((latent, DV // 2), (rope, 64)):
            self.assertEqual(desc.base.data_ptr(), pool.data_ptr())
            self.assertEqual(list(desc.shape), [300, DV + 64])
            self.assertEqual(list(desc.strides), [pool.stride(0), 1])
            self.assertEqual(list(desc.block_shape), [KEYS, cols])
            self.assertEqual(desc.layout.swizzle_byte_width, 128)

    @unittest.skipUnless(hopper(), "the Gluon kernel runs on Hopper")
    def test_shares_equal_attention_over_their_keys(self):
        from sglang.srt.speculative.ddtree.tree_attention_gluon import latent_prefix_gluon

        prefix = [5, 64, 65, 700, 3000]
        scale = (DV + 64) ** -0.5
        # 64 query rows (one program a share), and 128 (two row tiles a request).
        for (w, hq), splits in itertools.product(((8, 8), (16, 8)), (1, 4)):
            q, cache, indptr, table = (t.cuda() for t in paged_case(prefix, w, hq, seed=w))
            o1 = torch.zeros(splits, q.shape[0], hq, DV, device="cuda")
            lse1 = torch.zeros(splits, q.shape[0], hq, device="cuda")
            grid = (len(prefix), 1, -(-w * hq // ROWS) * splits)
            latent_prefix_gluon(
                grid, q, cache, indptr, table, o1, lse1, scale, w, hq, ROWS, KEYS, splits,
                PAGE, MIN_SHARE,
            )  # fmt: skip
            for b, length in enumerate(prefix):
                for split in range(splits):
                    lo, hi = share_range(length, split, splits)
                    if lo >= hi:
                        continue  # an empty share is left unwritten
                    host = (q.cpu(), cache.cpu(), table.cpu())
                    out, lse = reference(*host, b, lo, hi, w, scale)
                    rows = slice(b * w, (b + 1) * w)
                    got_out, got_lse = o1[split, rows].cpu(), lse1[split, rows].cpu()
                    torch.testing.assert_close(got_out, out, atol=2e-2, rtol=2e-2)
                    torch.testing.assert_close(got_lse, lse, atol=1e-2, rtol=1e-3)

if __name__ == "__main__":
    unittest.main()
