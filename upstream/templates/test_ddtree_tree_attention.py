"""@@ALGORITHM@@'s tree-verify attention: the prefix part and the ancestor block merged by
log-sum-exp equal attention over the union of their keys, and the Triton kernels (CUDA) equal
the masked reference on random trees, ragged prefixes, grouped heads and MLA's latent layout
(also the prefix kernel's latent variant).
"""

import unittest

import torch

from sglang.srt.speculative.ddtree.layout import ancestor_mask
from sglang.srt.speculative.ddtree.tree_attention import (
    launch_settings,
    merge_attention_states,
    tree_attention,
    tree_attention_reference,
)
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=30, stage="base-b", runner_config="1-gpu-small")


def random_verify(bs, w, prefix, hq, hkv, d, dv, mla, device, seed):
    """One verify layer's inputs: KV slots shuffled over a pool, a random tree per request."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(prefix)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    total = int(lens.sum())
    perm = torch.randperm(total + bs * w + 5, generator=g)
    parents = torch.full((bs, w), -1, dtype=torch.int64)
    for i in range(1, w):
        parents[:, i] = torch.randint(0, i, (bs,), generator=g)
    k = torch.randn(len(perm), hkv, d, generator=g)
    v = k[..., :dv] if mla else torch.randn(len(perm), hkv, dv, generator=g)
    return dict(
        q=torch.randn(bs * w, hq, d, generator=g).to(device),
        k_buffer=k.to(device),
        v_buffer=(k.to(device)[..., :dv] if mla else v.to(device)),
        kv_indptr=indptr.to(device),
        kv_indices=perm[:total].to(device),
        node_loc=perm[total : total + bs * w].to(device),
        tree_mask=ancestor_mask(parents, w - 1).to(device),
    )


class TestDDTreeTreeAttention(CustomTestCase):
    def test_merge_is_attention_over_both_parts(self):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(6, 2, 8, generator=g)
        k1, v1 = torch.randn(10, 2, 8, generator=g), torch.randn(10, 2, 4, generator=g)
        k2, v2 = torch.randn(3, 2, 8, generator=g), torch.randn(3, 2, 4, generator=g)

        def part(k, v):
            s = torch.einsum("nhd,khd->nhk", q, k)
            return torch.einsum("nhk,khd->nhd", s.softmax(-1), v), torch.logsumexp(s, -1)

        (o1, l1), (o2, l2) = part(k1, v1), part(k2, v2)
        whole, _ = part(torch.cat([k1, k2]), torch.cat([v1, v2]))
        torch.testing.assert_close(merge_attention_states(o1, l1, o2, l2), whole)
        # A part that saw no key (log-sum-exp -inf) leaves the other's output.
        empty = torch.full_like(l1, float("-inf"))
        torch.testing.assert_close(merge_attention_states(o1, empty, o2, l2), o2)

    @unittest.skipUnless(torch.cuda.is_available(), "the kernels are Triton on CUDA")
    def test_kernels_equal_the_masked_reference(self):
        cases = [
            dict(bs=3, w=7, prefix=[5, 1, 37], hq=4, hkv=1, d=40, dv=32, mla=True),
            dict(bs=2, w=17, prefix=[9, 700], hq=8, hkv=1, d=576, dv=512, mla=True),
            dict(bs=2, w=5, prefix=[3, 11], hq=8, hkv=2, d=64, dv=64, mla=False),
            dict(bs=4, w=16, prefix=[1, 64, 65, 2000], hq=32, hkv=8, d=128, dv=128, mla=False),
        ]
        for seed, case in enumerate(cases):
            t = random_verify(**case, device="cuda", seed=seed)
            t["q"], t["k_buffer"] = t["q"].bfloat16(), t["k_buffer"].bfloat16()
            t["v_buffer"] = (
                t["k_buffer"][..., : case["dv"]] if case["mla"] else t["v_buffer"].bfloat16()
            )
            scale = case["d"] ** -0.5
            want = tree_attention_reference(**t, sm_scale=scale)
            got = tree_attention(
                t["q"], t["k_buffer"], t["v_buffer"], t["kv_indptr"], t["kv_indices"],
                t["node_loc"], t["tree_mask"], scale,
            )  # fmt: skip
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
            # As the backends launch it: the latent variant on a latent view; MHA heads of
            # more than 16 rows a KV head in the wide row tile (the queries loaded once).
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            settings = launch_settings(
                case["bs"], case["w"], case["hq"], case["hkv"], case["dv"], sms,
                latent_d=case["d"] if case["mla"] else 0,
            )  # fmt: skip
            self.assertTrue(settings["prefix_latent" if case["mla"] else "prefix_q_once"])
            got = tree_attention(
                t["q"], t["k_buffer"], t["v_buffer"], t["kv_indptr"], t["kv_indices"],
                t["node_loc"], t["tree_mask"], scale, **settings,
            )  # fmt: skip
            torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


if __name__ == "__main__":
    unittest.main()
