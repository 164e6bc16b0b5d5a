"""@@ALGORITHM@@'s draft tree: the batched best-first builder equals the paper's heap algorithm,
the verify layout (first child, next sibling, positions, ancestor mask) matches the tree, and
the draft top-K over a vocabulary-sharded LM head (tensor parallelism) equals the full one.
"""

import heapq
import unittest

import numpy as np
import torch

from sglang.srt.speculative.ddtree.layout import tree_to_retrieve_arrays
from sglang.srt.speculative.ddtree.tree import build_tree_from_candidates, select_candidates
from sglang.srt.speculative.ddtree.vocab_shard import merge_shard_candidates, shard_candidates
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=30, stage="base-b", runner_config="1-gpu-small")

# Quantized log-probs make many path scores exactly equal: tie-breaking is exercised too.
LEVELS = [0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -np.inf]


def heap_build(lp, tok, root, budget):
    """One request: pop the best path, push its next sibling and first child (paper's Alg. 1);
    heap keys ``(-score, depth, parent slot, rank)``. Returns parents, depths, tokens."""
    depth_max, k = lp.shape
    parents, depths, tokens, logw = [-1], [0], [root], [np.float32(0.0)]
    heap = []

    def push(parent, depth, rank):
        if depth <= depth_max and rank < k:
            score = np.float32(logw[parent] + lp[depth - 1, rank])
            if score != -np.inf:
                heapq.heappush(heap, (-float(score), depth, parent, rank, score))

    push(0, 1, 0)
    while heap and len(parents) <= budget:
        _, depth, parent, rank, score = heapq.heappop(heap)
        slot = len(parents)
        parents.append(parent)
        depths.append(depth)
        tokens.append(int(tok[depth - 1, rank]))
        logw.append(score)
        push(parent, depth, rank + 1)
        push(slot, depth + 1, 0)
    return parents, depths, tokens


def random_candidates(rng, bs, depth, k, vocab, quantized):
    if quantized:
        lp = rng.choice(LEVELS, size=(bs, depth, k), p=[0.2, 0.2, 0.2, 0.15, 0.1, 0.1, 0.05])
    else:
        lp = np.log(rng.dirichlet(np.ones(vocab), size=(bs, depth)))[..., :k]
    lp = -np.sort(-lp, axis=-1)
    tok = np.stack([[rng.permutation(vocab)[:k] for _ in range(depth)] for _ in range(bs)])
    return lp.astype(np.float32), tok, rng.integers(0, vocab, size=bs)


class TestDDTreeDraftTree(CustomTestCase):
    def devices(self):
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    def test_builder_equals_heap_algorithm(self):
        rng = np.random.default_rng(0)
        for device in self.devices():
            for case in range(60):
                bs, depth, vocab = 3, int(rng.integers(1, 6)), int(rng.integers(2, 9))
                k = int(rng.integers(1, vocab + 1))
                budget = int(rng.integers(k, 25))
                lp, tok, roots = random_candidates(rng, bs, depth, k, vocab, case % 2 == 0)
                tree = build_tree_from_candidates(
                    torch.tensor(lp, device=device),
                    torch.tensor(tok, device=device),
                    torch.tensor(roots, device=device),
                    budget,
                )
                for b in range(bs):
                    parents, depths, tokens = heap_build(lp[b], tok[b], int(roots[b]), budget)
                    n = len(parents)
                    self.assertEqual(tree.parents[b, :n].tolist(), parents, (device, case))
                    self.assertEqual(tree.depths[b, :n].tolist(), depths, (device, case))
                    self.assertEqual(tree.tokens[b, :n].tolist(), tokens, (device, case))
                    self.assertFalse(bool(tree.valid[b, n:].any()))

    def test_layout_matches_the_tree(self):
        rng = np.random.default_rng(1)
        for device in self.devices():
            lp, tok, roots = random_candidates(rng, 4, 5, 4, 6, quantized=False)
            tree = build_tree_from_candidates(
                torch.tensor(lp, device=device),
                torch.tensor(tok, device=device),
                torch.tensor(roots, device=device),
                16,
            )
            prefix = torch.tensor([3, 0, 17, 100], device=device)
            layout = tree_to_retrieve_arrays(tree, prefix, max_depth=5)
            parents = tree.parents.cpu().tolist()
            for b in range(4):
                n = int(tree.valid[b].sum())
                for i in range(n):
                    children = [j for j in range(n) if parents[b][j] == i]
                    first = layout.retrieve_next_token[b, i].item()
                    self.assertEqual(first, children[0] if children else -1)
                    walk = []
                    while first >= 0:  # the sibling chain visits every child, in slot order
                        walk.append(first)
                        first = layout.retrieve_next_sibling[b, first].item()
                    self.assertEqual(walk, children)
                    ancestors, a = {i}, parents[b][i]
                    while a >= 0:
                        ancestors.add(a)
                        a = parents[b][a]
                    row = layout.tree_mask[b, i, :n].tolist()
                    self.assertEqual({j for j in range(n) if row[j]}, ancestors)
                    self.assertEqual(
                        layout.positions[b, i].item(), prefix[b].item() + tree.depths[b, i].item()
                    )

    def test_sharded_top_k_equals_the_full_vocabulary(self):
        g = torch.Generator().manual_seed(2)
        vocab, topk = 1001, 8
        logits = torch.randn(3, 5, vocab, generator=g) * 3
        want_lp, want_tok = select_candidates(logits, topk, normalize=True)
        for tp in (1, 2, 8):
            width = -(-vocab // tp)  # the last shard padded, as a vocab-parallel LM head is
            pad = torch.full((3, 5, width * tp - vocab), 50.0)
            padded = torch.cat([logits, pad], -1)
            parts = [
                shard_candidates(padded[..., r * width : (r + 1) * width], r * width, vocab, topk)
                for r in range(tp)
            ]
            values, tokens, lse = (torch.stack(x) for x in zip(*parts))  # the all-gather
            got_lp, got_tok = merge_shard_candidates(values, tokens, lse, topk)
            self.assertTrue(torch.equal(got_tok, want_tok), tp)
            torch.testing.assert_close(got_lp, want_lp, atol=2e-6, rtol=0)


if __name__ == "__main__":
    unittest.main()
