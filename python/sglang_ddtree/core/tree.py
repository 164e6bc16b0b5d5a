"""Build the DDTree draft tree: the `budget` most probable draft prefixes, batched, on device.

Terms (used across `sglang_ddtree.core`; the list in `sglang_ddtree.core` is the index):

- **block / depth.** A DFlash drafter reads ``[root, MASK x (block_size - 1)]`` and emits one
  distribution per masked slot, ``block_size - 1`` per-depth distributions; the tree reads the
  first ``D`` (its max depth, ``min(block_size - 1, budget)``), ``q_1 .. q_D``. They are marginals: ``q_d`` does not depend on the tokens chosen at other depths.
- **node.** A draft prefix ``(v_1, .., v_d)`` with ``1 <= d <= D``; ``v_d`` is its token.
  It is named by its rank tuple ``(r_1, .., r_d)``: ``v_i`` is the ``r_i``-th most likely token of
  ``q_i``. Its **score** is ``sum_i log q_i(v_i)`` (float32, summed root to leaf).
- **root.** Node 0 of every tree: the token the target emitted last step (the bonus token),
  not yet in the target's KV cache. Depth 0, score 0.
- **budget.** Draft nodes per request, root excluded. Trees are padded to ``W = budget + 1``
  slots (the verify width): slot 0 is the root, slots ``1..n`` the nodes in pop order, the rest
  are padding (``valid = False``). ``n < budget`` only when fewer prefixes exist (tiny
  vocabularies) or have non-zero draft probability.
- **top-K.** Candidates per depth: the ``K`` most likely tokens of each ``q_d``;
  ``K <= budget``.

Algorithm. The published DDTree builder is a best-first heap: pop the best prefix, push its
first child (next depth, rank 0) and its next sibling (same depth, next rank), stop after
``budget`` pops. It returns the ``budget`` most probable prefixes. We compute the same set and
order without a heap, in ``D`` fixed-shape steps that a CUDA graph can capture:

    beam_d = top-budget prefixes of depth d, from (beam_{d-1} x K ranks)   for d = 1..D
    tree   = top-budget of (beam_1 ++ .. ++ beam_D)

This is exact: a depth-``d`` member of the global top-budget has fewer than ``budget`` better
depth-``d`` prefixes, and its parent has fewer than ``budget`` better depth-``(d-1)`` prefixes
(each better parent has a child better than it), so neither is cut from its beam.

Order and tie-breaking (deterministic, identical on CPU and GPU for the same candidates). Nodes
are ordered by the key ``(-score, depth, parent's node index, rank)``, ascending. This key grows
from a node to its first child and to its next sibling, so the heap that pops by this key pops in
exactly this global order. Consequences: parents precede children; equal scores go shallow
first; siblings appear in decreasing draft log-prob (ties: lower rank first). Within one depth
the key reduces to ``(-score, slot in the beam)``, which is what the packed sort key below
encodes. The candidate ranks themselves come from ``select_candidates`` (``torch.topk``): exact
ties between draft log-probs of different tokens may be ranked differently on CPU and GPU.
Candidates with zero draft probability (log-prob ``-inf``) are never added.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

_INDEX_BITS = 32
MAX_BUDGET, MAX_DEPTH = 8191, 31  # what `tree_triton`'s packed key holds; larger is refused


class DraftTree(NamedTuple):
    """A batch of draft trees, root at slot 0, nodes in pop order, padded to ``W = budget + 1``.

    parents: [bs, W] int64. Parent slot; -1 for the root and for padding.
    depths:  [bs, W] int64. 0 for the root and for padding.
    tokens:  [bs, W] int64. Token ids; slot 0 holds the root token; 0 in padding.
    logw:    [bs, W] float32. Path score (sum of draft log-probs); 0 at the root, -inf in padding.
    valid:   [bs, W] bool. True for the root and real nodes.
    """

    parents: torch.Tensor
    depths: torch.Tensor
    tokens: torch.Tensor
    logw: torch.Tensor
    valid: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.parents.shape[1]


def select_candidates(
    draft_logprobs: torch.Tensor,  # [bs, D, V] float, log-probs (or logits, see below)
    topk: int,
    normalize: bool = False,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``topk`` candidates per depth, sorted by decreasing log-prob.

    With ``normalize=True`` the input may be raw logits: the top values are turned into
    log-probs by subtracting the full-vocabulary logsumexp (cheaper than a full log_softmax).

    ``backend``: "torch" (``torch.topk`` + ``torch.logsumexp``, any device) or "triton" (CUDA,
    ``normalize=True`` only: `sglang_ddtree.core.topk_triton`, one pass over the vocabulary;
    same candidates, log-probs equal up to float rounding of the logsumexp, ties in any order).

    Returns ``(cand_logprobs [bs, D, K] float32, cand_tokens [bs, D, K] int64)``, with
    ``K = min(topk, V)``.
    """
    assert draft_logprobs.dim() == 3, "draft_logprobs must be [bs, depth, vocab]"
    assert topk >= 1
    assert backend in ("torch", "triton"), backend
    if backend == "triton":
        assert normalize, "the triton top-K takes raw logits (normalize=True)"
        from sglang_ddtree.core.topk_triton import select_candidates_triton

        return select_candidates_triton(draft_logprobs, topk)
    k = min(topk, draft_logprobs.shape[-1])
    # A two-stage (per-chunk, then global) top-k measured slower on the H200 at bs 1-8
    # (156 vs 110 us for [15, 151936], k 64), so this stays one torch.topk.
    values, tokens = torch.topk(draft_logprobs, k, dim=-1)
    values = values.float()
    if normalize:
        values = values - torch.logsumexp(draft_logprobs.float(), dim=-1, keepdim=True)
    # Rounding can leave a log-prob a hair above 0; scores must never grow with depth.
    return values.clamp(max=0.0), tokens


def _pack_sort_key(score: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """Pack (score desc, slot asc) into one int64 so `topk` has no ties and is deterministic.

    score: [...] float32; slot: [...] int64 in [0, 2**31). Larger key = earlier in order.
    """
    bits = (score + 0.0).view(torch.int32).to(torch.int64)  # + 0.0 turns -0.0 into +0.0
    # IEEE-754 floats compare like sign-magnitude integers; flip negatives to two's complement.
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return (ordered << _INDEX_BITS) | ((1 << (_INDEX_BITS - 1)) - 1 - slot)


def _top_by_key(score: torch.Tensor, count: int) -> torch.Tensor:
    """Indices [bs, count] of the best `count` entries of score [bs, M] by (score desc, index)."""
    slot = torch.arange(score.shape[1], device=score.device, dtype=torch.int64)
    return torch.topk(_pack_sort_key(score, slot), count, dim=1).indices


def build_tree_from_candidates(
    cand_logprobs: torch.Tensor,  # [bs, D, K] float32, sorted descending along K
    cand_tokens: torch.Tensor,  # [bs, D, K] int64
    root_tokens: torch.Tensor,  # [bs] int64
    budget: int,
    backend: str = "auto",
) -> DraftTree:
    """The `budget` most probable prefixes of the factorized draft, as a padded tree.

    No host synchronization; every shape depends only on (bs, budget, D, K), so the function
    can be captured in a CUDA graph. ``backend``: "torch" (depth beam, any device), "triton"
    (one-kernel heap, CUDA), or "auto" (triton on CUDA when importable). Both give identical
    trees.
    """
    assert cand_logprobs.dim() == 3 and cand_logprobs.shape == cand_tokens.shape
    bs, depth, k = cand_logprobs.shape
    assert root_tokens.shape == (bs,)
    assert budget >= 1
    assert backend in ("auto", "torch", "triton"), backend
    if backend != "torch" and cand_logprobs.is_cuda:
        try:
            from sglang_ddtree.core.tree_triton import build_tree_triton
        except ImportError:
            if backend == "triton":
                raise
        else:
            return build_tree_triton(cand_logprobs, cand_tokens, root_tokens, budget)
    elif backend == "triton":
        raise RuntimeError("the triton tree builder needs CUDA tensors")
    device = cand_logprobs.device
    lp = cand_logprobs.float()
    neg_inf = float("-inf")

    # Beam over depth d: (score, parent = flat index into the previous beam, rank).
    beam_score = torch.zeros(bs, 1, device=device)  # the root
    beam_scores, beam_parents, beam_ranks = [], [], []
    for d in range(depth):
        # Candidates = every beam entry extended by each of the K ranks at depth d.
        cand = (beam_score[:, :, None] + lp[:, d, None, :]).reshape(bs, -1)
        take = min(budget, cand.shape[1])
        idx = _top_by_key(cand, take)
        beam_score = torch.gather(cand, 1, idx)
        beam_scores.append(beam_score)
        beam_parents.append(idx // k)
        beam_ranks.append(idx % k)

    # Merge all depths: flat id of depth-d slot j is offset[d] + j.
    sizes = [s.shape[1] for s in beam_scores]
    offsets = [0]
    for s in sizes[:-1]:
        offsets.append(offsets[-1] + s)
    all_score = torch.cat(beam_scores, dim=1)  # [bs, M]
    # Parent as a flat id (-1 for depth-1 nodes, whose parent is the root).
    all_parent = torch.cat(
        [beam_parents[0].new_full(beam_parents[0].shape, -1)]
        + [p + offsets[d - 1] for d, p in enumerate(beam_parents) if d > 0],
        dim=1,
    )
    all_depth = torch.cat([torch.full_like(p, d + 1) for d, p in enumerate(beam_parents)], dim=1)
    all_token = torch.cat(
        [torch.gather(cand_tokens[:, d], 1, r) for d, r in enumerate(beam_ranks)], dim=1
    )
    m = all_score.shape[1]
    n_take = min(budget, m)
    order = _top_by_key(all_score, n_take)  # [bs, n_take] flat ids in pop order

    # Node slot of each flat id (slot 0 is the root; unselected ids map to -1).
    slot_of = torch.full((bs, m), -1, device=device, dtype=torch.int64)
    slot_of.scatter_(1, order, torch.arange(1, n_take + 1, device=device).expand(bs, n_take))
    sel_parent_flat = torch.gather(all_parent, 1, order)
    sel_parent = torch.where(
        sel_parent_flat < 0,
        torch.zeros_like(sel_parent_flat),
        torch.gather(slot_of, 1, sel_parent_flat.clamp(min=0)),
    )
    sel_score = torch.gather(all_score, 1, order)
    sel_valid = sel_score > neg_inf

    n = budget + 1
    parents = torch.full((bs, n), -1, device=device, dtype=torch.int64)
    depths = torch.zeros(bs, n, device=device, dtype=torch.int64)
    tokens = torch.zeros(bs, n, device=device, dtype=torch.int64)
    logw = torch.full((bs, n), neg_inf, device=device, dtype=torch.float32)
    valid = torch.zeros(bs, n, device=device, dtype=torch.bool)
    body = slice(1, n_take + 1)
    parents[:, body] = torch.where(sel_valid, sel_parent, -1)
    depths[:, body] = torch.where(sel_valid, torch.gather(all_depth, 1, order), 0)
    tokens[:, body] = torch.where(sel_valid, torch.gather(all_token, 1, order), 0)
    logw[:, body] = sel_score
    valid[:, body] = sel_valid
    tokens[:, 0] = root_tokens
    logw[:, 0] = 0.0
    valid[:, 0] = True
    return DraftTree(parents, depths, tokens, logw, valid)


def build_tree(
    draft_logprobs: torch.Tensor,  # [bs, D, V] float log-probs
    budget: int,
    root_tokens: torch.Tensor | None = None,  # [bs] int64; zeros when None
    topk: int | None = None,
    backend: str = "auto",
) -> DraftTree:
    """DDTree's best-first tree of `budget` nodes from per-depth draft log-probs.

    ``topk`` bounds the candidates per depth (default and maximum: ``budget``; the paper's
    Lemma 1 shows ``min(budget, V)`` loses nothing).
    """
    assert draft_logprobs.dim() == 3, "draft_logprobs must be [bs, depth, vocab]"
    assert budget >= 1, "budget must be >= 1"
    k = budget if topk is None else topk
    assert 1 <= k <= budget, "topk must be in [1, budget]"
    bs = draft_logprobs.shape[0]
    if root_tokens is None:
        root_tokens = torch.zeros(bs, dtype=torch.int64, device=draft_logprobs.device)
    cand_lp, cand_tok = select_candidates(draft_logprobs, k)
    return build_tree_from_candidates(cand_lp, cand_tok, root_tokens, budget, backend)
