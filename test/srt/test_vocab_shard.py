"""Draft top-K over a vocabulary-sharded LM head (tensor parallel): every rank's shard top-K,
all-gathered and merged, equals the top-K of the full vocabulary."""

import pytest
import torch

from sglang_ddtree.core import select_candidates
from sglang_ddtree.core.vocab_shard import merge_shard_candidates, shard_candidates


def sharded(logits: torch.Tensor, tp: int, topk: int):
    """Split ``logits`` [bs, D, V] as a vocab-parallel LM head would (the last shard padded
    with garbage columns), run every rank, stack what an all-gather would, merge."""
    bs, depth, vocab = logits.shape
    width = -(-vocab // tp)
    padded = torch.cat([logits, torch.full((bs, depth, width * tp - vocab), 50.0)], -1)
    parts = [
        shard_candidates(padded[..., r * width : (r + 1) * width], r * width, vocab, topk)
        for r in range(tp)
    ]
    values, tokens, lse = (torch.stack(x) for x in zip(*parts))
    return merge_shard_candidates(values, tokens, lse, topk)


@pytest.mark.parametrize("tp", [1, 2, 3, 8])
@pytest.mark.parametrize("topk", [1, 8, 40])
def test_sharded_top_k_equals_full_vocabulary(tp, topk):
    gen = torch.Generator().manual_seed(tp * 100 + topk)
    logits = torch.randn(3, 5, 1001, generator=gen) * 3  # no ties (continuous values)
    want_lp, want_tok = select_candidates(logits, topk, normalize=True)
    got_lp, got_tok = sharded(logits, tp, topk)
    assert torch.equal(got_tok, want_tok)
    torch.testing.assert_close(got_lp, want_lp, atol=2e-6, rtol=0)
    assert (got_tok < 1001).all()  # padding never wins, though its value is the largest


def test_ties_break_by_token_id_whatever_the_layout():
    logits = torch.zeros(1, 1, 12)
    logits[..., [2, 5, 9, 11]] = 1.0  # four tied tokens, spread over shards
    outs = [sharded(logits, tp, 3)[1] for tp in (1, 2, 4)]
    assert all(torch.equal(o, torch.tensor([[[2, 5, 9]]])) for o in outs)
