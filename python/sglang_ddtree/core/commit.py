"""Turn an accepted path into what a worker commits: one function for greedy and sampled steps.

A step that accepted ``k`` draft nodes commits ``k + 1`` slots of target KV (the root and the
``k`` nodes, in path order, so they can be moved to contiguous positions ``prefix ..
prefix + k``) and emits ``k + 1`` tokens (the ``k`` accepted draft tokens, then the bonus).
The bonus is the next step's root; its KV is written by the next verify.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sglang_ddtree.core.accept import AcceptResult


class CommitPlan(NamedTuple):
    """What one decode step commits, per request (S = accept_index width, W nodes per request).

    out_tokens:     [bs, S] int64. Emitted tokens: accepted draft tokens, then the bonus; -1 pad.
    next_token_ids: [bs * S] int64. ``out_tokens`` flattened with pads 0 (SGLang's layout).
    keep_index:     [bs, S] int64. Global node ids (b * W + i) whose target KV is kept, root
                    first, in path order; -1 pad. Row j's KV belongs at position prefix_len + j.
    keep_nodes:     [bs, S] int64. The same nodes as slots within the request (i); -1 pad.
    accept_length:  [bs] int32. Accepted draft nodes (root and bonus excluded).
    commit_lens:    [bs] int32. accept_length + 1 (= emitted tokens = kept KV slots).
    bonus:          [bs] int64. The last emitted token: the next step's root.
    new_seq_lens:   [bs] int64. prefix_lens + commit_lens.
    """

    out_tokens: torch.Tensor
    next_token_ids: torch.Tensor
    keep_index: torch.Tensor
    keep_nodes: torch.Tensor
    accept_length: torch.Tensor
    commit_lens: torch.Tensor
    bonus: torch.Tensor
    new_seq_lens: torch.Tensor


def commit_accepted(
    result: AcceptResult,
    prefix_lens: torch.Tensor,  # [bs] int64, tokens in the target KV before this step
    num_nodes: int,  # W
) -> CommitPlan:
    """Gather emitted tokens and the KV rows to keep from an `AcceptResult`. No host sync."""
    bs, s = result.accept_index.shape
    assert result.predict.shape == (bs * num_nodes,)
    assert prefix_lens.shape == (bs,)
    keep_index = result.accept_index.to(torch.int64)
    present = keep_index >= 0
    out_tokens = torch.where(present, result.predict.to(torch.int64)[keep_index.clamp(min=0)], -1)
    rows = torch.arange(bs, device=keep_index.device)
    keep_nodes = torch.where(present, keep_index - rows[:, None] * num_nodes, -1)
    accept_length = result.accept_length.to(torch.int32)
    commit_lens = accept_length + 1
    bonus = out_tokens[rows, commit_lens.to(torch.int64) - 1]
    new_seq_lens = prefix_lens.to(torch.int64) + commit_lens
    return CommitPlan(
        out_tokens=out_tokens,
        next_token_ids=out_tokens.clamp(min=0).reshape(-1),
        keep_index=keep_index,
        keep_nodes=keep_nodes,
        accept_length=accept_length,
        commit_lens=commit_lens,
        bonus=bonus,
        new_seq_lens=new_seq_lens,
    )
