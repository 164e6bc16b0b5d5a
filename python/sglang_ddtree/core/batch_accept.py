"""Mixing greedy and sampled requests in one verify step (pure torch, no SGLang import)."""

from __future__ import annotations

import torch

from sglang_ddtree.core.accept import AcceptResult


def greedy_rows(top_ks: torch.Tensor) -> torch.Tensor:
    """[bs] bool: rows SGLang samples greedily (it rewrites temperature 0 as top_k 1)."""
    return top_ks.view(-1) <= 1


def merge_accept(
    greedy: AcceptResult, sampled: AcceptResult, rows: torch.Tensor, num_nodes: int
) -> AcceptResult:
    """Row-wise choice between two accept results: ``greedy`` where ``rows`` [bs] bool is True,
    ``sampled`` elsewhere. Shapes as in `AcceptResult`; no host sync."""
    per_node = rows[:, None].expand(rows.shape[0], num_nodes).reshape(-1)
    return AcceptResult(
        predict=torch.where(per_node, greedy.predict, sampled.predict),
        accept_index=torch.where(rows[:, None], greedy.accept_index, sampled.accept_index),
        accept_length=torch.where(rows, greedy.accept_length, sampled.accept_length),
    )
