"""Draft top-K over a vocabulary-sharded LM head (tensor parallel): every rank's shard top-K,
all-gathered and merged, equals the top-K of the full vocabulary."""

import pytest
import torch

from sglang_ddtree.core.tree import select_candidates
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


@pytest.mark.parametrize("tp,vocab,topk", [(2, 203, 4), (4, 203, 4), (8, 20, 4)])
def test_tensor_parallel_step_halves_build_the_single_rank_tree(tp, vocab, topk):
    """`draft_shard_candidates` on every rank's LM-head rows, stacked as the all-gather would,
    then `gathered_to_tree`, builds the tree (tokens, layout, verify slots) of `draft_to_tree`
    on the whole LM head."""
    from sglang_ddtree.core.step import draft_shard_candidates, draft_to_tree, gathered_to_tree

    gen = torch.Generator().manual_seed(tp)
    bs, block, hidden_size, budget = 3, 6, 16, 12
    hidden = torch.randn(bs * block, hidden_size, generator=gen)
    lm_head = torch.randn(vocab, hidden_size, generator=gen)
    bonus = torch.randint(0, vocab, (bs,), generator=gen)
    seq_lens = torch.tensor([5, 9, 2])
    pool_rows = torch.tensor([2, 0, 1])
    req_to_token = torch.arange(3 * 64, dtype=torch.int32).view(3, 64)
    depth = min(block - 1, budget)
    want = draft_to_tree(
        hidden, lm_head, bonus, seq_lens, pool_rows, req_to_token,
        block_size=block, max_depth=depth, budget=budget, topk=topk,
    )  # fmt: skip
    width = -(-vocab // tp)
    parts = [
        draft_shard_candidates(
            hidden,
            lm_head[r * width : (r + 1) * width],
            vocab_start=r * width,
            vocab_size=vocab,
            block_size=block,
            max_depth=depth,
            topk=topk,
        )  # fmt: skip
        for r in range(tp)
    ]
    # Every rank packs K candidates, also where its shard is narrower (tp 8 over 20 tokens:
    # shards of 3 tokens, then 2, then none).
    assert len({p.shape for p in parts}) == 1 and parts[0].shape[-1] == 2 * topk + 1
    got = gathered_to_tree(
        torch.stack(parts), bonus, seq_lens, pool_rows, req_to_token, budget=budget, topk=topk
    )
    assert torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.verify_loc, want.verify_loc)
    assert torch.equal(got.mask_cells, want.mask_cells)
    for name, a, b in zip(want.layout._fields, got.layout, want.layout):
        assert torch.equal(a, b), name
