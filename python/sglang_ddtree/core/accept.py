"""Accept a verified draft tree: greedy and sampled requests, one result type.

Terms (as in `sglang_ddtree.core`; the accept-side ones in more detail):

- **accepted path.** Root first, then the draft nodes the target agrees with, each a child of
  the previous one. Stored as global node ids ``b * W + i`` in ``accept_index`` [bs, S],
  padded with -1. ``S`` = longest path the walk may take, root included (max depth + 1).
- **accept length.** Accepted draft nodes, root excluded: 0..S-1. A step commits
  ``accept_length + 1`` tokens.
- **bonus token.** The target's own token after the last accepted node: at T = 0 its argmax;
  at T > 0 a draw from its distribution with the rejected children removed (which makes every
  emitted token an exact target sample). It becomes the next step's root.
- ``predict`` [bs * W] int32, the accept kernels' output: for each accepted node, the token
  emitted after it (the next accepted node's token, or the bonus at the last one). Entries of
  other nodes are 0.

Greedy: the target argmax at each node picks the child with that token; the walk follows it.
Sampled (target-only, lossless): at each accepted node, children are tried in sibling order,
accumulating the target mass of their tokens; with one uniform coin per node the child whose
cumulative bucket holds the coin is accepted. If none is, the bonus is drawn from the target
with the tried children zeroed. This is `sgl_kernel.tree_speculative_sampling_target_only` with
zero draft probabilities and thresholds 1.0; `accept_sampled_reference` is the same law in
plain torch (same coins, same arithmetic) for the CPU and for tests. The tree never depends on
the target's draws, so the output law is the target's, whatever the tree.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sglang_ddtree.core.layout import TreeLayout
from sglang_ddtree.core.sampling import clamp_coins


class AcceptResult(NamedTuple):
    """Accepted path per request, in the layout of SGLang's accept kernels.

    predict:       [bs * W] int32. Token emitted after each accepted node (0 elsewhere).
    accept_index:  [bs, S] int32. Global ids of root + accepted nodes; -1 padded.
    accept_length: [bs] int32. Accepted draft nodes (root excluded).
    """

    predict: torch.Tensor
    accept_index: torch.Tensor
    accept_length: torch.Tensor


def _empty_result(bs: int, n: int, max_accept: int, layout: TreeLayout) -> AcceptResult:
    device = layout.retrieve_index.device
    predict = torch.zeros(bs * n, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, max_accept), -1, dtype=torch.int32, device=device)
    accept_length = torch.zeros(bs, dtype=torch.int32, device=device)
    return AcceptResult(predict, accept_index, accept_length)


def _check(layout: TreeLayout, tokens: torch.Tensor, max_accept: int) -> tuple[int, int]:
    bs, n = layout.retrieve_index.shape
    assert tokens.shape == (bs, n), "tokens must be [bs, W]"
    assert layout.retrieve_next_token.shape == (bs, n)
    assert layout.retrieve_next_sibling.shape == (bs, n)
    assert 1 <= max_accept <= n, "max_accept (S) must be in [1, W]"
    return bs, n


def _use_kernel(device: torch.device, backend: str) -> bool:
    assert backend in ("auto", "kernel", "torch"), backend
    if backend == "torch":
        return False
    if device.type != "cuda":
        if backend == "kernel":
            raise RuntimeError("the sgl_kernel accept path needs CUDA tensors")
        return False
    try:
        import sgl_kernel  # noqa: F401
    except Exception as e:
        if backend == "kernel":
            raise RuntimeError("sgl_kernel is not importable") from e
        return False
    return True


def _tree_kernel_args(res: AcceptResult, tokens: torch.Tensor, layout: TreeLayout) -> dict:
    """The arguments sgl_kernel's two tree kernels share: the outputs, the candidates and the
    layout arrays (SGLang's ``retrive_*`` spelling)."""
    return dict(
        predicts=res.predict,
        accept_index=res.accept_index,
        accept_token_num=res.accept_length,
        candidates=tokens.to(torch.int64).contiguous(),
        retrive_index=layout.retrieve_index.contiguous(),
        retrive_next_token=layout.retrieve_next_token.contiguous(),
        retrive_next_sibling=layout.retrieve_next_sibling.contiguous(),
    )


def accept_greedy(
    layout: TreeLayout,
    tokens: torch.Tensor,  # [bs, W] int64, node tokens (slot 0 = root)
    target_predict: torch.Tensor,  # [bs, W] int64, target argmax at each node
    max_accept: int,  # S
    backend: str = "auto",
) -> AcceptResult:
    """Greedy tree walk: follow the child whose token equals the target argmax.

    ``backend``: "kernel" (``sgl_kernel.verify_tree_greedy``), "torch" (a vectorized walk that
    runs anywhere), or "auto" (the kernel on CUDA when available). Both give the same result.
    """
    bs, n = _check(layout, tokens, max_accept)
    assert target_predict.shape == (bs, n)
    res = _empty_result(bs, n, max_accept, layout)
    if _use_kernel(tokens.device, backend):
        from sgl_kernel import verify_tree_greedy

        verify_tree_greedy(
            **_tree_kernel_args(res, tokens, layout),
            target_predict=target_predict.to(torch.int64).contiguous(),
        )
        return res

    device = tokens.device
    rows = torch.arange(bs, device=device)
    cur = torch.zeros(bs, dtype=torch.int64, device=device)
    active = torch.ones(bs, dtype=torch.bool, device=device)
    res.accept_index[:, 0] = (rows * n).to(torch.int32)
    for step in range(1, max_accept):
        want = target_predict[rows, cur]
        # Walk cur's children in sibling order; take the first whose token matches.
        child = layout.retrieve_next_token[rows, cur]
        found = torch.full_like(cur, -1)
        for _ in range(n - 1):
            ok = (child >= 0) & (found < 0)
            hit = ok & (tokens[rows, child.clamp(min=0)] == want)
            found = torch.where(hit, child, found)
            child = torch.where(ok, layout.retrieve_next_sibling[rows, child.clamp(min=0)], -1)
        take = active & (found >= 0)
        at = rows * n + cur  # index tensors, not boolean masks: no host sync
        res.predict[at] = torch.where(take, want.to(torch.int32), res.predict[at])
        res.accept_index[:, step] = torch.where(take, rows * n + found, -1).to(torch.int32)
        res.accept_length.add_(take.to(torch.int32))
        cur = torch.where(take, found, cur)
        active = take
    res.predict[rows * n + cur] = target_predict[rows, cur].to(torch.int32)
    return res


def accept_sampled(
    layout: TreeLayout,
    tokens: torch.Tensor,  # [bs, W] int64
    probs: torch.Tensor,  # [bs, W, V] float32, target distribution at each node (filters applied)
    coins: torch.Tensor,  # [bs, W] float32 in (0, 1), one per node
    final_coins: torch.Tensor,  # [bs] float32 in (0, 1), one per request for the bonus
    max_accept: int,  # S
    backend: str = "auto",
) -> AcceptResult:
    """Target-only tree sampling (lossless), via sgl_kernel on CUDA or the torch reference.

    ``probs`` come from `sglang_ddtree.core.sampling.target_probs`. Coins are clamped into
    (0, 1) so a zero-probability child can never be accepted.
    """
    bs, n = _check(layout, tokens, max_accept)
    vocab = probs.shape[-1]
    assert probs.shape == (bs, n, vocab), "probs must be [bs, W, V]"
    assert coins.shape == (bs, n) and final_coins.shape == (bs,)
    coins, final_coins = clamp_coins(coins), clamp_coins(final_coins)
    if not _use_kernel(tokens.device, backend):
        return accept_sampled_reference(layout, tokens, probs, coins, final_coins, max_accept)

    from sgl_kernel import tree_speculative_sampling_target_only

    res = _empty_result(bs, n, max_accept, layout)
    # The kernel writes rejected children's mass into draft_probs; it must start at zero.
    draft_probs = torch.zeros_like(probs, dtype=torch.float32)
    tree_speculative_sampling_target_only(
        **_tree_kernel_args(res, tokens, layout),
        uniform_samples=coins.contiguous(),
        uniform_samples_for_final_sampling=final_coins.contiguous(),
        target_probs=probs.float().contiguous(),
        draft_probs=draft_probs,
        threshold_single=1.0,
        threshold_acc=1.0,
        deterministic=True,
    )
    return res


def accept_sampled_reference(
    layout: TreeLayout,
    tokens: torch.Tensor,  # [bs, W] int64
    probs: torch.Tensor,  # [bs, W, V] float32
    coins: torch.Tensor,  # [bs, W] float32 in (0, 1)
    final_coins: torch.Tensor,  # [bs] float32 in (0, 1)
    max_accept: int,  # S
) -> AcceptResult:
    """Plain-torch twin of `tree_speculative_sampling_target_only` (thresholds 1.0, q = 0).

    Same coins, same float32 accumulation order, same inverse-CDF rule for the bonus (first
    token whose running mass exceeds ``coin * total``; the last positive token if rounding
    leaves none), so on shared coins it matches the kernel. Vectorized over the batch.
    """
    bs, n = _check(layout, tokens, max_accept)
    vocab = probs.shape[-1]
    device = tokens.device
    probs = probs.float()
    rows = torch.arange(bs, device=device)
    res = _empty_result(bs, n, max_accept, layout)
    res.accept_index[:, 0] = (rows * n).to(torch.int32)
    cur = torch.zeros(bs, dtype=torch.int64, device=device)
    active = torch.ones(bs, dtype=torch.bool, device=device)
    rejected = torch.zeros(bs, vocab, dtype=torch.bool, device=device)  # tried children at cur
    for step in range(1, max_accept):
        coin = coins[rows, cur]
        child = layout.retrieve_next_token[rows, cur]
        mass = torch.zeros(bs, dtype=torch.float32, device=device)
        found = torch.full_like(cur, -1)
        tried = torch.zeros(bs, vocab, dtype=torch.bool, device=device)
        for _ in range(n - 1):
            ok = active & (child >= 0) & (found < 0)
            tok = tokens[rows, child.clamp(min=0)]
            p = probs[rows, cur, tok]
            mass = torch.where(ok, mass + p, mass)
            hit = ok & ((coin <= mass) | (p >= 1.0))
            found = torch.where(hit, child, found)
            miss = ok & ~hit
            tried[rows, tok] = tried[rows, tok] | miss
            child = torch.where(miss, layout.retrieve_next_sibling[rows, child.clamp(min=0)], -1)
        take = active & (found >= 0)
        stop = active & ~take
        rejected = torch.where(stop[:, None], tried, rejected)
        at = rows * n + cur
        accepted_tok = tokens[rows, found.clamp(min=0)].to(torch.int32)
        res.predict[at] = torch.where(take, accepted_tok, res.predict[at])
        res.accept_index[:, step] = torch.where(take, rows * n + found, -1).to(torch.int32)
        res.accept_length.add_(take.to(torch.int32))
        cur = torch.where(take, found, cur)
        active = take

    # Bonus: inverse CDF of the residual (target at the last node, tried children zeroed).
    residual = probs[rows, cur]
    full_walk = res.accept_length == max_accept - 1  # the kernel subtracts nothing then
    residual = torch.where(rejected & ~full_walk[:, None], torch.zeros_like(residual), residual)
    total = residual.sum(-1)
    u = final_coins.float() * total
    above = torch.cumsum(residual, -1) > u[:, None]
    positive = residual > 0
    first = torch.where(above & positive, torch.arange(vocab, device=device), vocab).min(-1).values
    last_pos = torch.where(positive, torch.arange(vocab, device=device), -1).max(-1).values
    fallback = torch.where(last_pos >= 0, last_pos, vocab - 1)
    bonus = torch.where(first < vocab, first, fallback)
    res.predict[rows * n + cur] = bonus.to(torch.int32)
    return res
