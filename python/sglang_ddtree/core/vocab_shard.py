"""Draft top-K when the LM head is split over tensor-parallel ranks by vocabulary.

Under tensor parallelism each rank holds rows ``[start, start + V_shard)`` of the LM head (the
last shard padded past V). Each rank takes the top-K of its own logits and their logsumexp
(`shard_candidates`); the ranks all-gather those ``tp * K`` candidates and ``tp`` partial
logsumexps (a few kilobytes, not ``[bs, D, V]`` logits), and every rank merges them the same way
(`merge_shard_candidates`). The result equals `core.tree.select_candidates` on the full
vocabulary (``normalize=True``) up to float rounding of the logsumexp, and is bitwise identical
on every rank because every rank merges the same gathered tensors.
"""

from __future__ import annotations

import torch

from sglang_ddtree.core.tree import _pack_sort_key


def shard_candidates(
    logits: torch.Tensor,  # [bs, D, V_shard] float, this rank's slice of the draft logits
    vocab_start: int,  # global id of column 0
    vocab_size: int,  # V: columns at or past it (padding) are not tokens
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's top-K: ``(values [bs, D, K] float32, tokens [bs, D, K] int64 global ids,
    logsumexp [bs, D] float32)``, ``K = min(topk, V_shard)``; padded columns count as -inf."""
    assert logits.dim() == 3, "logits must be [bs, depth, vocab shard]"
    width = logits.shape[-1]
    ids = torch.arange(vocab_start, vocab_start + width, device=logits.device)
    x = logits.float().masked_fill(ids >= vocab_size, float("-inf"))
    k = min(topk, width)
    # Ties at the K-th place go to the lowest token id, as in the merge: then the merged
    # candidates do not depend on how the vocabulary is split.
    local = torch.topk(_pack_sort_key(x, ids.expand_as(x)), k, dim=-1).indices
    values = torch.gather(x, -1, local)
    return values, local + vocab_start, torch.logsumexp(x, dim=-1)


def merge_shard_candidates(
    values: torch.Tensor,  # [tp, bs, D, K] float32, every rank's `shard_candidates` values
    tokens: torch.Tensor,  # [tp, bs, D, K] int64 global ids
    logsumexp: torch.Tensor,  # [tp, bs, D] float32
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cand_logprobs [bs, D, K'] float32, cand_tokens [bs, D, K'] int64)`` over the whole
    vocabulary, ``K' = min(topk, tp * K)``, sorted by decreasing log-prob, ties by increasing
    token id (the same order whatever the shard layout)."""
    tp, bs, depth, k = values.shape
    assert tokens.shape == values.shape and logsumexp.shape == (tp, bs, depth)
    flat_v = values.permute(1, 2, 0, 3).reshape(bs, depth, tp * k)
    flat_t = tokens.permute(1, 2, 0, 3).reshape(bs, depth, tp * k)
    keep = min(topk, tp * k)
    order = torch.topk(_pack_sort_key(flat_v, flat_t), keep, dim=-1).indices
    lse = torch.logsumexp(logsumexp, dim=0)  # [bs, D]
    cand_lp = torch.gather(flat_v, -1, order) - lse[..., None]
    # Rounding can leave a log-prob a hair above 0; scores must never grow with depth.
    return cand_lp.clamp(max=0.0), torch.gather(flat_t, -1, order)
