"""@@ALGORITHM@@'s request laws at every tree node: frequency, presence and repetition penalties
and min_new_tokens count the request's emitted tokens plus the tokens on the node's path (the
non-speculative sampler's law after the same generated tokens), and committed-token logprobs
are the log-softmax of each predicting node's processed logits.
"""

import unittest

import torch

from sglang.srt.speculative.ddtree.layout import ancestor_mask
from sglang.srt.speculative.ddtree.logprobs import (
    committed_logprobs,
    logprobs_at,
    predicting_normalizers,
    top_logprobs,
)
from sglang.srt.speculative.ddtree.penalties import RequestPenalties, apply_tree_penalties
from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.test_utils import CustomTestCase

register_cuda_ci(est_time=20, stage="base-b", runner_config="1-gpu-small")

VOCAB = 12
PARENTS = [-1, 0, 1, 0, 3, 2]  # root; path 1-2-5 and path 3-4
TOKENS = [4, 4, 9, 2, 4, 9]


def node_law(logits, counts, generated, p):
    """The non-speculative sampler's penalties after ``generated`` tokens whose counts are
    ``counts`` (one row, float32): additive first, then the repetition scale, then the stop
    ids held back while fewer than min_new_tokens tokens were generated."""
    out = logits.clone()
    seen = counts > 0
    out = out + torch.where(seen, -p["frequency"] * counts.float() - p["presence"], torch.zeros(()))
    scale = torch.where(seen, torch.tensor(p["repetition"]), torch.tensor(1.0))
    out = torch.where(out < 0, out * scale, out / scale)
    if generated < p["min_new_tokens"]:
        out[p["stop_ids"]] = float("-inf")
    return out


class TestDDTreeRequestLaws(CustomTestCase):
    def test_penalties_count_the_path_of_each_node(self):
        gen = torch.Generator().manual_seed(0)
        w = len(PARENTS)
        logits = torch.randn(1, w, VOCAB, generator=gen) * 3
        emitted = [4, 7, 7, 4]  # the root (token 4) is the last emitted token
        counts = torch.bincount(torch.tensor(emitted), minlength=VOCAB)
        p = dict(frequency=0.4, presence=0.3, repetition=1.3, min_new_tokens=6, stop_ids=[9, 11])
        state = RequestPenalties(
            output_counts=counts[None].to(torch.int32),
            output_lens=torch.tensor([len(emitted)]),
            frequency_penalty=torch.tensor([p["frequency"]]),
            presence_penalty=torch.tensor([p["presence"]]),
            repetition_penalty=torch.tensor([p["repetition"]]),
            min_new_tokens=torch.tensor([p["min_new_tokens"]]),
            stop_token_ids=torch.tensor([p["stop_ids"]]),
        )
        mask = ancestor_mask(torch.tensor([PARENTS]), max_depth=w - 1)
        got = apply_tree_penalties(logits, torch.tensor([TOKENS]), mask, state)
        for v in range(w):
            path, u = [], v
            while u > 0:  # the draft nodes from the root down to v
                path.append(TOKENS[u])
                u = PARENTS[u]
            node_counts = counts + torch.bincount(torch.tensor(path, dtype=torch.long),
                                                  minlength=VOCAB)  # fmt: skip
            want = node_law(logits[0, v], node_counts, len(emitted) + len(path), p)
            torch.testing.assert_close(got[0, v], want, rtol=0, atol=1e-6, msg=f"node {v}")
        # The one-term approximation (emitted tokens only, at every node) is not this law.
        one_term = node_law(logits[0, 5], counts, len(emitted), p)
        self.assertGreater((got[0, 5] - one_term).abs().max().item(), 0.1)

    def test_committed_logprobs_are_the_predicting_nodes(self):
        gen = torch.Generator().manual_seed(1)
        bs, w = 2, len(PARENTS)
        logits = torch.randn(bs, w, VOCAB, generator=gen) * 2
        keep = torch.tensor([[0, 1, 2], [0, 3, -1]])  # predicting nodes, -1 padded
        out = torch.tensor([[4, 9, 1], [2, 6, -1]])  # committed tokens
        temperature = torch.tensor([0.7, 1.0])
        res = committed_logprobs(logits, keep, out, temperature, top_n=3)
        for b in range(bs):
            for j in range(3):
                if keep[b, j] < 0:
                    self.assertEqual(res.token_logprobs[b, j].item(), 0.0)
                    self.assertEqual(res.top_ids[b, j].tolist(), [-1, -1, -1])
                    continue
                row = torch.log_softmax(logits[b, keep[b, j]] / temperature[b], dim=-1)
                self.assertAlmostEqual(
                    res.token_logprobs[b, j].item(), row[out[b, j]].item(), places=5
                )
                top = torch.topk(row, 3)
                self.assertEqual(res.top_ids[b, j].tolist(), top.indices.tolist())
        greedy = committed_logprobs(logits, keep, out, temperature, top_n=1, all_greedy=True)
        row = torch.log_softmax(logits[0, 2], dim=-1)  # no temperature in an all-greedy batch
        self.assertAlmostEqual(greedy.token_logprobs[0, 2].item(), row[1].item(), places=5)

    def test_serving_normalizers_report_the_committed_logprobs(self):
        """One max and log-sum a predicting row (the Triton kernel on CUDA) gives the same
        logprobs as normalizing each row, to float32 rounding."""
        device = "cuda" if torch.cuda.is_available() else "cpu"
        gen = torch.Generator().manual_seed(2)
        bs, w, vocab = 3, len(PARENTS), 5000
        logits = torch.randn(bs, w, vocab, generator=gen) * 4
        keep = torch.tensor([[0, 1, 2, 5], [0, 3, 4, -1], [0, -1, -1, -1]])
        out = torch.randint(0, vocab, keep.shape, generator=gen).masked_fill(keep < 0, -1)
        temperature = torch.tensor([0.7, 1.0, 1.3])
        for greedy in (False, True):
            want = committed_logprobs(logits, keep, out, temperature, 4, all_greedy=greedy)
            flat = logits.view(bs * w, vocab).to(device)
            norm = predicting_normalizers(flat, keep.to(device), temperature.to(device), greedy)
            tokens = out.clamp(min=0).view(-1).to(device)
            got = logprobs_at(norm, flat[norm.rows, tokens][:, None]).view(bs, -1).cpu()
            top, ids = top_logprobs(flat, norm, 4, chunk_rows=bs)
            present = keep >= 0
            torch.testing.assert_close(got[present], want.token_logprobs[present],
                                       atol=1e-5, rtol=1e-6)  # fmt: skip
            torch.testing.assert_close(top.cpu().view(bs, -1, 4)[present],
                                       want.top_logprobs[present], atol=1e-5, rtol=1e-6)  # fmt: skip
            self.assertTrue(torch.equal(ids.cpu().view(bs, -1, 4)[present], want.top_ids[present]))


if __name__ == "__main__":
    unittest.main()
