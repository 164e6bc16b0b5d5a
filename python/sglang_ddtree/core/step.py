"""The two pure-tensor halves of a DDTREE decode step, around the target's tree verify.

``draft_to_tree``: drafter hidden states -> draft tree -> everything the verify forward needs.
``accept_and_commit``: target logits over the tree -> accepted path -> what the step commits.

Under tensor parallelism (the LM head split by vocabulary) ``draft_to_tree`` is two halves
around one all-gather: ``draft_shard_candidates`` on each rank, ``gathered_to_tree`` on the
gathered candidates.

Both take and return device tensors only, with shapes fixed by (bs, W, B) and host flags, and
never read the device from the host, so the step captures each in a CUDA graph per key
(`sglang_ddtree.srt.ddtree_glue_graph`) through its segment functions, `make_tree_fns` and
`make_accept_fn`. Terms as in `sglang_ddtree.core`: W = budget + 1 nodes
per request, B = drafter block, D = min(B - 1, budget) max depth, S = D + 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from sglang_ddtree.core.accept import accept_greedy, accept_sampled
from sglang_ddtree.core.batch_accept import greedy_rows, merge_accept
from sglang_ddtree.core.commit import CommitPlan, commit_accepted
from sglang_ddtree.core.layout import TreeLayout, tree_to_retrieve_arrays, verify_mask_cells
from sglang_ddtree.core.sampling import draw_coins, target_probs
from sglang_ddtree.core.tree import build_tree_from_candidates, select_candidates
from sglang_ddtree.core.vocab_shard import merge_shard_candidates, shard_candidates


class TreeStep(NamedTuple):
    """Verify inputs for bs requests of W nodes.

    tokens:           [bs, W] int64. Node tokens; slot 0 is the root (last step's bonus).
    layout:           `TreeLayout` (retrieve arrays, positions [bs, W], tree_mask [bs, W, W]).
    verify_loc:       [bs * W] int64. KV slots ``req_to_token[req, prefix : prefix + W]``.
    mask_cells:       [bs * W * W] int64. Tree cells in SGLang's flattened FULL_MASK.
    seq_lens:         [bs] the batch's committed lengths (its dtype), as read by this step.
    req_pool_indices: [bs] the batch's request-pool rows (its dtype), as read by this step.
    """

    tokens: torch.Tensor
    layout: TreeLayout
    verify_loc: torch.Tensor
    mask_cells: torch.Tensor
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor


def _draft_logits(
    hidden: torch.Tensor,  # [bs * B, H]
    lm_head: torch.Tensor,  # [V', H] the LM head, or this rank's vocabulary shard of it
    bs: int,
    block_size: int,
    depth: int,
) -> torch.Tensor:
    """Draft logits at the D masked slots: [bs, D, V'] in the LM head's dtype."""
    assert hidden.shape[0] == bs * block_size, (hidden.shape, bs, block_size)
    # One [bs * D, H] x [H, V] GEMM. The strided [bs, D, H] view would make torch.matmul run a
    # batched GEMM that reads the whole LM head once per request (bs x 1.2 GB at Qwen3-8B's
    # shape: 2.3 ms at bs 8 on the H200); the reshape copies only bs * D * H elements.
    hs = hidden.view(bs, block_size, -1)[:, 1 : 1 + depth, :].reshape(bs * depth, -1)
    return torch.mm(hs.to(lm_head.dtype), lm_head.T).view(bs, depth, -1)


def draft_to_tree(
    hidden: torch.Tensor,  # [bs * B, H] drafter hidden states of the block [root, MASK x D]
    lm_head: torch.Tensor,  # [V, H] the target's LM head (DFlash drafters share it)
    bonus: torch.Tensor,  # [bs] int, the root token of each tree
    seq_lens: torch.Tensor,  # [bs] int, committed tokens per request
    req_pool_indices: torch.Tensor,  # [bs] int, rows of req_to_token
    req_to_token: torch.Tensor,  # [pool, max_len] int32, KV slot of each position
    *,
    block_size: int,  # B
    max_depth: int,  # D = min(B - 1, budget)
    budget: int,  # W - 1
    topk: int,  # candidates per depth
    draft_topk: str = "torch",  # select_candidates backend: "torch" or "triton"
) -> TreeStep:
    """Per-depth top-K of the draft, best-first tree of ``budget`` nodes, verify layout."""
    bs = seq_lens.shape[0]
    logits = _draft_logits(hidden, lm_head, bs, block_size, max_depth)
    if draft_topk == "torch":
        logits = logits.float()
    cand_lp, cand_tok = select_candidates(logits, topk, normalize=True, backend=draft_topk)
    return candidates_to_tree(
        cand_lp, cand_tok, bonus, seq_lens, req_pool_indices, req_to_token, budget=budget
    )


def draft_shard_candidates(
    hidden: torch.Tensor,  # [bs * B, H]
    lm_head_shard: torch.Tensor,  # [V_shard, H] this rank's rows of the LM head (no padding)
    *,
    vocab_start: int,  # global token id of the shard's first row
    vocab_size: int,  # V
    block_size: int,  # B
    max_depth: int,  # D
    topk: int,  # candidates per depth
) -> torch.Tensor:
    """Tensor parallelism, first half: this rank's draft candidates packed for one all-gather,
    ``[bs, D, 2K + 1]`` float32 = (log-its [K], token ids [K], logsumexp [1]); token ids are
    below 2^24, so float32 holds them exactly."""
    bs = hidden.shape[0] // block_size
    logits = _draft_logits(hidden, lm_head_shard, bs, block_size, max_depth)
    values, tokens, lse = shard_candidates(logits, vocab_start, vocab_size, topk)
    assert vocab_size < 2**24, "token ids must be exact in float32"
    short = topk - values.shape[-1]
    if short > 0:  # a shard narrower than K: pad to K, so every rank gathers the same width
        values = torch.nn.functional.pad(values, (0, short), value=float("-inf"))
        tokens = torch.nn.functional.pad(tokens, (0, short), value=0)
    return torch.cat([values, tokens.float(), lse[..., None]], dim=-1)


def gathered_to_tree(
    gathered: torch.Tensor,  # [tp, bs, D, 2K + 1] float32, every rank's draft_shard_candidates
    bonus: torch.Tensor,  # [bs] int
    seq_lens: torch.Tensor,  # [bs] int
    req_pool_indices: torch.Tensor,  # [bs] int
    req_to_token: torch.Tensor,  # [pool, max_len] int32
    *,
    budget: int,  # W - 1
    topk: int,  # candidates per depth
) -> TreeStep:
    """Tensor parallelism, second half: merge the gathered candidates into the full-vocabulary
    top-K and build the tree. Every rank merges the same gathered tensor, so every rank builds
    the same tree bit for bit."""
    k = (gathered.shape[-1] - 1) // 2
    values, tokens, lse = gathered[..., :k], gathered[..., k : 2 * k], gathered[..., 2 * k]
    cand_lp, cand_tok = merge_shard_candidates(values, tokens.to(torch.int64), lse, topk)
    return candidates_to_tree(
        cand_lp, cand_tok, bonus, seq_lens, req_pool_indices, req_to_token, budget=budget
    )


def candidates_to_tree(
    cand_lp: torch.Tensor,  # [bs, D, K] float32 log-probs, sorted per depth
    cand_tok: torch.Tensor,  # [bs, D, K] int64
    bonus: torch.Tensor,  # [bs] int, the root token of each tree
    seq_lens: torch.Tensor,  # [bs] int, committed tokens per request
    req_pool_indices: torch.Tensor,  # [bs] int, rows of req_to_token
    req_to_token: torch.Tensor,  # [pool, max_len] int32, KV slot of each position
    *,
    budget: int,  # W - 1
) -> TreeStep:
    """Best-first tree of ``budget`` nodes from per-depth candidates, and the verify layout."""
    depth = cand_lp.shape[1]
    prefix = seq_lens.to(torch.int64)
    tree = build_tree_from_candidates(cand_lp, cand_tok, bonus.view(-1).to(torch.int64), budget)
    layout = tree_to_retrieve_arrays(tree, prefix, max_depth=depth)
    n = budget + 1
    cols = prefix[:, None] + torch.arange(n, device=prefix.device)
    verify_loc = req_to_token[req_pool_indices.to(torch.int64)[:, None], cols]
    return TreeStep(
        tokens=tree.tokens,
        layout=layout,
        verify_loc=verify_loc.to(torch.int64).reshape(-1),
        mask_cells=verify_mask_cells(prefix, n),
        seq_lens=seq_lens,
        req_pool_indices=req_pool_indices,
    )


# Up to this many rows (bs x W) the target argmax takes the split-row kernel: with few rows
# torch.argmax leaves most SMs idle; with hundreds it streams the logits at full bandwidth
# itself and the split kernel measured slower (H200, benchmark/ddtree/RESULTS.md).
SPLIT_ARGMAX_MAX_ROWS = 128


def target_argmax(logits: torch.Tensor) -> torch.Tensor:  # [rows, V] float -> [rows] int64
    """``torch.argmax(logits, dim=-1)``; on CUDA (float32 / bf16 / fp16, last dim contiguous,
    at most `SPLIT_ARGMAX_MAX_ROWS` rows) the bit-identical split-row Triton kernel,
    `sglang_ddtree.core.argmax_triton`. Which one runs follows from the shape alone."""
    small = logits.dim() == 2 and logits.shape[0] <= SPLIT_ARGMAX_MAX_ROWS
    if logits.is_cuda and small and logits.stride(-1) == 1:
        if logits.dtype in (torch.float32, torch.bfloat16, torch.float16):
            try:
                from sglang_ddtree.core.argmax_triton import argmax_rows
            except ImportError:  # no triton: torch's argmax
                pass
            else:
                return argmax_rows(logits)
    return torch.argmax(logits, dim=-1)


def accept_and_commit(
    logits: torch.Tensor,  # [bs * W, V] float, target logits at every node (penalties applied)
    tokens: torch.Tensor,  # [bs, W] int64
    layout: TreeLayout,
    seq_lens: torch.Tensor,  # [bs] int
    *,
    accept_width: int,  # S
    temperatures: torch.Tensor | None = None,  # [bs] float32; None: every row greedy
    top_ks: torch.Tensor | None = None,  # [bs] int; <= 1 marks a greedy row
    top_ps: torch.Tensor | None = None,  # [bs] float32
    need_top_k: bool = True,
    need_top_p: bool = True,
    coins: torch.Tensor | None = None,  # [bs, W] float32 uniforms; None: drawn here
    final_coins: torch.Tensor | None = None,  # [bs] float32 uniforms for the bonus
    min_ps: torch.Tensor | None = None,  # [bs] float32; read when need_min_p
    need_min_p: bool = False,  # SGLang's need_min_p_sampling: the min-p path for every row
) -> CommitPlan:
    """Greedy rows by tree walk, sampled rows by target-only tree sampling; one commit."""
    bs, w = tokens.shape
    assert logits.shape[0] == bs * w, (logits.shape, bs, w)
    target_predict = target_argmax(logits).view(bs, w)
    result = accept_greedy(layout, tokens, target_predict, accept_width)
    if temperatures is not None:
        assert top_ks is not None and top_ps is not None
        probs = target_probs(
            logits.view(bs, w, -1),
            temperatures.view(-1).float(),
            top_ks.view(-1).to(torch.int64),
            top_ps.view(-1).float(),
            need_top_k=need_top_k,
            need_top_p=need_top_p,
            min_p=None if min_ps is None else min_ps.view(-1).float(),
            need_min_p=need_min_p,
        )
        if coins is None:
            coins, final_coins = draw_coins(bs, w, logits.device)
        assert coins.shape == (bs, w) and final_coins.shape == (bs,)
        sampled = accept_sampled(layout, tokens, probs, coins, final_coins, accept_width)
        result = merge_accept(result, sampled, greedy_rows(top_ks), w)
    return commit_accepted(result, seq_lens.to(torch.int64), w)


def make_tree_fns(
    shape,  # the step's B (block_size), D (max_depth) and W - 1 (budget) at one W
    vocab: int,  # V, the real tokens of the target's vocabulary
    topk: int,  # K, candidates per depth
    draft_topk: str,  # select_candidates backend
    lm_head: Callable[[], torch.Tensor],  # -> [V, H] the target's LM head rows of real tokens
    req_to_token: Callable[[], torch.Tensor],  # -> [pool, max_len] int32
    lm_head_shard: Callable[[], tuple[torch.Tensor, int]] | None = None,
) -> dict[str, Callable[..., object]]:
    """The draft-tree segment's functions for one W, by segment name: ``{"tree":
    draft_to_tree}`` on one rank; under tensor parallelism (``lm_head_shard`` given: this rank's
    real LM-head rows and the global id of the first) ``{"shard": the rank's candidates,
    "tree": the tree from every rank's all-gathered candidates}``. Weights and pools are looked
    up at each call: a worker's pools are attached after its segments are built."""
    assert topk >= 1 and draft_topk in ("torch", "triton"), (topk, draft_topk)
    if lm_head_shard is None:

        def tree_fn(hidden, bonus, seq_lens, req_pool_indices) -> TreeStep:
            return draft_to_tree(
                hidden, lm_head(), bonus, seq_lens, req_pool_indices, req_to_token(),
                block_size=shape.block_size, max_depth=shape.max_depth, budget=shape.budget,
                topk=topk, draft_topk=draft_topk,
            )  # fmt: skip

        return {"tree": tree_fn}

    def shard_fn(hidden) -> torch.Tensor:
        rows, start = lm_head_shard()
        return draft_shard_candidates(
            hidden, rows, vocab_start=start, vocab_size=vocab, block_size=shape.block_size,
            max_depth=shape.max_depth, topk=topk,
        )  # fmt: skip

    def gathered_tree_fn(gathered, bonus, seq_lens, req_pool_indices) -> TreeStep:
        return gathered_to_tree(
            gathered, bonus, seq_lens, req_pool_indices, req_to_token(),
            budget=shape.budget, topk=topk,
        )  # fmt: skip

    return {"shard": shard_fn, "tree": gathered_tree_fn}


def make_accept_fn(accept_width: int) -> Callable[..., CommitPlan]:  # S
    """The accept segment's function: `accept_and_commit` over the layout's fields by name (a
    glue graph binds tensors by name)."""
    assert accept_width >= 1, accept_width

    def accept_fn(logits, tokens, seq_lens, **rest) -> CommitPlan:
        layout = TreeLayout(*(rest.pop(f) for f in TreeLayout._fields))
        return accept_and_commit(
            logits, tokens, layout, seq_lens, accept_width=accept_width, **rest
        )

    return accept_fn
