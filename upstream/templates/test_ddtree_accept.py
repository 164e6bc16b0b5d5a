"""@@ALGORITHM@@'s accept: the greedy walk follows the target's argmax down the tree (and the
commit plan keeps that path's tokens and KV rows in order), and the sampled accept (target-only tree sampling, zero draft probabilities, thresholds 1.0) emits each
token with exactly the target's probability, whatever the tree.

The sampled law is checked without randomness: the coins run over a regular grid, so the
frequency of each first emitted token is the target probability to within the grid's spacing
(every accept bucket and every inverse-CDF interval is an interval of coins). The same grid
with the coins halved (a wrong accept rule) is far off.
"""

import unittest

import torch

from sglang.srt.speculative.ddtree.accept import accept_greedy, accept_sampled
from sglang.srt.speculative.ddtree.commit import commit_accepted
from sglang.srt.speculative.ddtree.layout import tree_to_retrieve_arrays
from sglang.srt.speculative.ddtree.tree import DraftTree
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=30, stage="base-b", runner_config="1-gpu-small")

# Root 0; children 1 (token 3), 2 (token 5), 3 (token 1) of the root; 4 (token 2) under 1;
# 5 (token 3) under 4; 6 (token 0) under 2.
PARENTS = [-1, 0, 0, 0, 1, 4, 2]
TOKENS = [7, 3, 5, 1, 2, 3, 0]
VOCAB = 8
GRID = 400  # coins per axis


def make_tree(bs, device):
    parents = torch.tensor([PARENTS] * bs, device=device)
    depths = torch.tensor([[0, 1, 1, 1, 2, 3, 2]] * bs, device=device)
    tokens = torch.tensor([TOKENS] * bs, device=device)
    tree = DraftTree(
        parents=parents,
        depths=depths,
        tokens=tokens,
        logw=torch.zeros(bs, len(PARENTS), device=device),
        valid=torch.ones(bs, len(PARENTS), dtype=torch.bool, device=device),
    )
    return tree, tree_to_retrieve_arrays(tree, torch.zeros(bs, dtype=torch.int64, device=device))


class TestDDTreeAccept(CustomTestCase):
    def devices(self):
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    def test_greedy_walk_follows_the_target_argmax(self):
        for device in self.devices():
            tree, layout = make_tree(3, device)
            predict = torch.zeros(3, len(PARENTS), dtype=torch.int64, device=device)
            predict[0, 0], predict[0, 1], predict[0, 4], predict[0, 5] = 3, 2, 3, 6  # 1-4-5
            predict[1, 0], predict[1, 2], predict[1, 6] = 5, 0, 4  # 2-6, then bonus 4
            predict[2, 0] = 6  # no child carries 6: nothing accepted, bonus 6
            res = accept_greedy(layout, tree.tokens, predict, max_accept=4)
            self.assertEqual(res.accept_length.tolist(), [3, 2, 0], device)
            n = len(PARENTS)
            self.assertEqual(res.accept_index[0].tolist(), [0, 1, 4, 5])
            self.assertEqual(res.accept_index[1].tolist(), [n, n + 2, n + 6, -1])
            self.assertEqual(res.accept_index[2].tolist(), [2 * n, -1, -1, -1])
            self.assertEqual(res.predict[[0, 1, 4, 5]].tolist(), [3, 2, 3, 6])
            self.assertEqual(res.predict[[n, n + 2, n + 6]].tolist(), [5, 0, 4])
            self.assertEqual(res.predict[2 * n].item(), 6)
            # The commit: the accepted tokens then the bonus, the kept nodes in path order
            # (row j's KV belongs at prefix + j), the next root and lengths.
            plan = commit_accepted(res, torch.tensor([10, 20, 30], device=device), n)
            self.assertEqual(
                plan.out_tokens.tolist(), [[3, 2, 3, 6], [5, 0, 4, -1], [6, -1, -1, -1]]
            )
            self.assertEqual(
                plan.keep_nodes.tolist(), [[0, 1, 4, 5], [0, 2, 6, -1], [0, -1, -1, -1]]
            )
            self.assertEqual(plan.bonus.tolist(), [6, 4, 6])
            self.assertEqual(plan.new_seq_lens.tolist(), [14, 23, 31])

    def first_token_frequencies(self, device, probs, coin_scale=1.0):
        """Frequency of the first emitted token over a GRID x GRID grid of (root coin, bonus
        coin), every other coin fixed."""
        grid = (torch.arange(GRID, dtype=torch.float32, device=device) + 0.5) / GRID
        root_coin, final_coin = torch.meshgrid(grid, grid, indexing="ij")
        bs = GRID * GRID
        tree, layout = make_tree(bs, device)
        coins = torch.full((bs, len(PARENTS)), 0.5, device=device)
        coins[:, 0] = root_coin.reshape(-1) * coin_scale
        res = accept_sampled(
            layout,
            tree.tokens,
            probs.to(device).expand(bs, -1, -1).contiguous(),
            coins,
            final_coin.reshape(-1).contiguous(),
            max_accept=4,
        )
        # The root's emitted token: the first accepted child's, or the bonus at the root.
        first = res.predict.view(bs, len(PARENTS))[:, 0].long()
        return torch.bincount(first, minlength=VOCAB).double().cpu() / bs

    def test_sampled_first_token_has_the_target_law(self):
        gen = torch.Generator().manual_seed(0)
        probs = torch.softmax(torch.randn(len(PARENTS), VOCAB, generator=gen) * 2, dim=-1)
        probs[0, 6] = 0.0  # a token the target never emits stays out
        probs[0] /= probs[0].sum()
        for device in self.devices():
            freq = self.first_token_frequencies(device, probs)
            # Each token's coins form at most two intervals on each axis: 2 / GRID per axis.
            self.assertLess((freq - probs[0].double()).abs().max().item(), 4.0 / GRID, device)
            self.assertEqual(freq[6].item(), 0.0)
            wrong = self.first_token_frequencies(device, probs, coin_scale=0.5)
            self.assertGreater((wrong - probs[0].double()).abs().max().item(), 0.05, device)


if __name__ == "__main__":
    unittest.main()
