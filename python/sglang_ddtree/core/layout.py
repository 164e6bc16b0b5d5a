"""Lay a draft tree out for the target's tree verify and for SGLang's accept kernels.

From parent pointers (terms as in `sglang_ddtree.core`) we derive, per request:

- ``retrieve_index[b, i] = b * W + i``: the global node id. It indexes the flattened verify
  rows (logits, hidden states, ``out_cache_loc``) and ``AcceptResult.predict``.
- ``retrieve_next_token[b, i]``: the first child of node ``i`` (the child with the smallest
  slot, i.e. the highest draft log-prob), or -1.
- ``retrieve_next_sibling[b, i]``: the next child of ``i``'s parent after ``i`` in slot order,
  or -1.

These are exactly the first-child / next-sibling arrays that ``sgl_kernel.verify_tree_greedy``
and ``sgl_kernel.tree_speculative_sampling_target_only`` walk. Padded slots are inert: nothing
links to them, so no walk reaches them and they are never committed.

For the verify forward: ``positions = prefix_len + depth`` (siblings share a position) and an
ancestor-or-self mask: node ``i`` attends to the whole committed prefix, the root, its ancestors
and itself; never to siblings or cousins.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sglang_ddtree.core.tree import DraftTree


class TreeLayout(NamedTuple):
    """Verify-ready arrays for a batch of trees with W slots each.

    retrieve_index:        [bs, W] int64. b * W + i.
    retrieve_next_token:   [bs, W] int64. First child slot, -1 if none.
    retrieve_next_sibling: [bs, W] int64. Next sibling slot, -1 if none.
    positions:             [bs, W] int64. prefix_len + depth.
    tree_mask:             [bs, W, W] bool. tree_mask[b, i, j]: node i may attend to node j.
    """

    retrieve_index: torch.Tensor
    retrieve_next_token: torch.Tensor
    retrieve_next_sibling: torch.Tensor
    positions: torch.Tensor
    tree_mask: torch.Tensor


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """Ancestor-or-self mask [bs, W, W] bool from parents [bs, W] int64 (-1 = none).

    Pointer jumping: after step s every row holds its ancestors up to distance 2**s, so
    ceil(log2(max_depth + 1)) fixed steps cover every tree of that depth.
    """
    bs, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(bs, n, n)
    has_parent = parents >= 0
    jump = torch.where(has_parent, parents, torch.arange(n, device=parents.device))
    mask = eye | (torch.nn.functional.one_hot(jump, n).bool() & has_parent[..., None])
    steps = max(1, int(max_depth).bit_length())
    for _ in range(steps):
        mask = mask | torch.gather(mask, 1, jump[..., None].expand(bs, n, n))
        jump = torch.gather(jump, 1, jump)
    return mask


def tree_to_retrieve_arrays(
    tree: DraftTree,
    prefix_lens: torch.Tensor,  # [bs] int64, tokens already in the target KV cache
    max_depth: int | None = None,
    backend: str = "auto",
) -> TreeLayout:
    """Parent pointers -> first-child / next-sibling arrays, positions and the tree mask.

    ``max_depth`` bounds the tree depth (default: W - 1); pass the drafter's ``D`` to save
    pointer-jumping steps. No host synchronization. ``backend``: "torch" (any device),
    "triton" (one launch, CUDA) or "auto" (triton on CUDA when importable); same output.
    """
    parents, valid = tree.parents, tree.valid
    bs, n = parents.shape
    assert prefix_lens.shape == (bs,)
    assert backend in ("auto", "torch", "triton"), backend
    if backend != "torch" and parents.is_cuda:
        try:
            from sglang_ddtree.core.layout_triton import tree_layout_triton
        except ImportError:
            if backend == "triton":
                raise
        else:
            return TreeLayout(*tree_layout_triton(tree, prefix_lens, max_depth))
    elif backend == "triton":
        raise RuntimeError("the triton layout needs CUDA tensors")
    device = parents.device
    slots = torch.arange(n, device=device, dtype=torch.int64)
    is_child = valid & (parents >= 0)

    # First child: smallest child slot per parent. Non-children scatter into a spare column n.
    target = torch.where(is_child, parents, n)
    first = torch.full((bs, n + 1), n, device=device, dtype=torch.int64)
    first.scatter_reduce_(1, target, slots.expand(bs, n), reduce="amin", include_self=True)
    next_token = first[:, :n]
    next_token = torch.where(next_token == n, -1, next_token)

    # Next sibling: smallest later slot with the same parent.
    same_parent = (parents[:, None, :] == parents[:, :, None]) & is_child[:, None, :]
    later = slots[None, :] > slots[:, None]  # [W, W]: j > i
    cand = torch.where(same_parent & later & is_child[:, :, None], slots, n)
    next_sibling = cand.min(dim=2).values
    next_sibling = torch.where(next_sibling == n, -1, next_sibling)

    retrieve_index = torch.arange(bs, device=device, dtype=torch.int64)[:, None] * n + slots
    positions = prefix_lens.to(torch.int64)[:, None] + tree.depths
    depth_bound = n - 1 if max_depth is None else max_depth
    mask = ancestor_mask(parents, depth_bound)
    return TreeLayout(retrieve_index, next_token, next_sibling, positions, mask)


def verify_mask_cells(
    prefix_lens: torch.Tensor,  # [bs] int64
    num_nodes: int,  # W
) -> torch.Tensor:
    """[bs * W * W] int64: where tree cell (b, i, j) lands in SGLang's flattened FULL_MASK.

    Per request b the mask is a row-major block of W rows x (prefix_len_b + W) columns, blocks
    concatenated in request order; cell (b, i, j) is column prefix_len_b + j of row i of block
    b. Shapes depend on (bs, W) only, so this part can be captured in a CUDA graph.
    """
    n = num_nodes
    prefix = prefix_lens.to(torch.int64)
    widths = prefix + n  # [bs] columns per row
    starts = torch.cumsum(widths * n, 0) - widths * n  # [bs] block offsets
    rows = torch.arange(n, device=prefix.device, dtype=torch.int64)
    cells = (
        starts[:, None, None]
        + rows[None, :, None] * widths[:, None, None]
        + prefix[:, None, None]
        + rows[None, None, :]
    )
    return cells.reshape(-1)


def verify_mask_numel(
    num_nodes: int,  # W
    host_prefix_lens: torch.Tensor,  # [bs] int CPU, each >= the request's real prefix length
) -> int:
    """Cells of a FULL_MASK buffer that holds the verify mask: ``W * sum(prefix) + bs * W * W``.

    Only needs an upper bound of each prefix length: SGLang locates request b's block from
    ``mask_indptr``, which it computes on the device from the real lengths, and the blocks are
    packed from the start, so cells past the real total are never read (they stay True).
    A host tensor: no device read.
    """
    assert host_prefix_lens.device.type == "cpu", "host lengths only (no device sync)"
    bs = host_prefix_lens.numel()
    return num_nodes * int(host_prefix_lens.to(torch.int64).sum()) + bs * num_nodes * num_nodes


def scatter_verify_mask(
    tree_mask: torch.Tensor,  # [bs, W, W] bool
    cells: torch.Tensor,  # [bs * W * W] int64, from verify_mask_cells
    total: int,
) -> torch.Tensor:
    """SGLang's FULL_MASK for TARGET_VERIFY, [total] bool: all True except the tree cells.

    ``total >= sum_b W * (prefix_len_b + W)`` comes from host lengths (`verify_mask_numel`; no
    device-to-host copy); cells past the real total are unused. Only the bs * W * W tree cells
    are written, not O(total) index math: total grows with the context length.
    """
    out = torch.ones(total, dtype=torch.bool, device=tree_mask.device)
    out[cells] = tree_mask.reshape(-1)
    return out


def flatten_verify_mask(
    tree_mask: torch.Tensor,  # [bs, W, W] bool
    prefix_lens: torch.Tensor,  # [bs] int64
    total: int,
) -> torch.Tensor:
    """SGLang's FULL_MASK layout for TARGET_VERIFY: [total] bool.

    Per request b, a row-major block of W rows x (prefix_len_b + W) columns: the prefix columns
    are True, the tree columns are ``tree_mask[b]``; blocks are concatenated in request order.
    ``total = sum_b W * (prefix_len_b + W)`` is passed in by the caller, who knows the prefix
    lengths on the host, so no device-to-host copy is needed here.
    """
    cells = verify_mask_cells(prefix_lens, tree_mask.shape[1])
    return scatter_verify_mask(tree_mask, cells, total)
