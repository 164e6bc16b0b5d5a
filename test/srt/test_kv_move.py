"""The accepted-KV mover (core.kv_move_triton) against a row-by-row torch reference.

Trees come from the real builder (random draft candidates, best-first), accepted paths are
random root-to-node walks of those trees, and the KV "pool" is a list of per-layer buffers
(rows of different widths, like K and V of different head sizes) with distinct row contents,
so a row moved from the wrong slot, or overwritten before it was read, changes the result.

CPU: the kernel's logic under Triton's interpreter (subprocess, TRITON_INTERPRET=1). GPU
(``gpu`` marker): bigger batches, bf16 buffers, and replay from a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.core.tree import build_tree_from_candidates, select_candidates


def random_case(bs: int, budget: int, depth: int, vocab: int, seed: int, device="cpu"):
    """(keep_index [bs, S] int64, verify_loc [bs * N] int64, N) for random trees and paths.

    S = depth + 1. Each request's path is a uniformly random walk from the root through the
    tree's children (stopping at a random depth), so paths both along and off the first-child
    spine occur; KV slots are a random permutation (requests own disjoint slots)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, depth, vocab, generator=g)
    lp, tok = select_candidates(logits, min(budget, vocab), normalize=True)
    tree = build_tree_from_candidates(lp, tok, torch.zeros(bs, dtype=torch.int64), budget)
    n = budget + 1
    parents = tree.parents.cpu()
    keep = torch.full((bs, depth + 1), -1, dtype=torch.int64)
    for b in range(bs):
        node, d = 0, 0
        keep[b, 0] = b * n
        stop = int(torch.randint(0, depth + 1, (1,), generator=g))
        while d < stop:
            children = [i for i in range(n) if int(parents[b, i]) == node and i != node]
            if not children:
                break
            node = children[int(torch.randint(0, len(children), (1,), generator=g))]
            d += 1
            keep[b, d] = b * n + node
    slots = torch.randperm(bs * n * 3, generator=g)[: bs * n].to(torch.int64)
    return keep.to(device), slots.to(device), n


# Paths where an earlier depth reads the slot a later depth writes ([root, node 2, node 3]: depth 1 reads slot 2, depth 2 writes it),
# so copying depths in the wrong order fails; N = 6, two requests, -1 past the path.
HAZARD_KEEP = [[0, 2, 3, 5], [6, 9, 10, -1]]


def check_against_reference(bs, budget, depth, widths, dtype, seed, device="cpu", keep=None) -> int:
    """Run kernel and reference on equal pools; returns the number of rows that moved.
    ``keep`` (a list of paths) replaces the random paths; budget is then N - 1."""
    from sglang_ddtree.core.kv_move_triton import move_accepted_kv, move_accepted_kv_reference

    if keep is None:
        keep, loc, n = random_case(bs, budget, depth, 50, seed, device)
    else:
        keep, n = torch.tensor(keep, device=device), budget + 1
        loc = torch.randperm(3 * bs * n, generator=torch.Generator().manual_seed(seed))[: bs * n]
        loc = loc.to(device)
    slots = int(loc.max()) + 1
    g = torch.Generator().manual_seed(seed + 1)
    pool = [torch.randn(slots, w, generator=g).to(dtype).to(device) for w in widths]
    ref = [b.clone() for b in pool]
    move_accepted_kv_reference(ref, keep, loc, n)
    ptrs = torch.tensor([b.data_ptr() for b in pool], dtype=torch.uint64, device=device)
    row_bytes = torch.tensor([b[0].numel() * b.element_size() for b in pool], device=device)
    move_accepted_kv(ptrs, row_bytes, keep, loc, n, int(row_bytes.max()))
    for got, want in zip(pool, ref):
        assert torch.equal(got, want)
    rows = torch.arange(bs, device=device)[:, None]
    depths = torch.arange(keep.shape[1], device=device)[None, :]
    return int(((keep >= 0) & (keep != rows * n + depths)).sum())


_INTERPRETED_CHECK = """
import torch
from test_kv_move import HAZARD_KEEP, check_against_reference

moved = 0
# (bs, budget, depth, row widths): rows wider than one 2048-byte tile; a chain-like budget.
for seed, (bs, budget, depth, widths) in enumerate(
    [(3, 12, 4, (8, 24)), (2, 6, 6, (600,)), (4, 20, 5, (16, 16, 40))]
):
    moved += check_against_reference(bs, budget, depth, widths, torch.float32, seed)
assert moved > 5, moved  # the cases exercise real moves, not only in-place rows
assert check_against_reference(2, 5, 3, (40,), torch.float32, 7, keep=HAZARD_KEEP) == 5
print("interpreted kv move OK", moved)
"""


def test_move_accepted_kv_interpreted_equals_reference(run_interpreted):
    run_interpreted(_INTERPRETED_CHECK, "interpreted kv move OK")


def test_reference_moves_off_spine_rows_in_depth_order():
    """The reference itself: path [root, node 2, node 3] in one request of N = 4 moves node 2
    to depth 1's slot and node 3 to depth 2's slot (which held node 2: read first)."""
    from sglang_ddtree.core.kv_move_triton import move_accepted_kv_reference

    buf = torch.arange(4.0)[:, None].repeat(1, 2)  # slot i holds value i
    keep = torch.tensor([[0, 2, 3]])
    move_accepted_kv_reference([buf], keep, torch.arange(4), 4)
    assert buf[:, 0].tolist() == [0.0, 2.0, 3.0, 3.0]


@pytest.mark.gpu
def test_move_accepted_kv_on_gpu_and_in_graph():
    from sglang_ddtree.core.kv_move_triton import move_accepted_kv

    assert check_against_reference(2, 5, 3, (1024,), torch.bfloat16, 7, "cuda", HAZARD_KEEP) == 5
    moved = 0
    for seed, (bs, budget) in enumerate([(64, 16), (8, 64), (1, 128)]):
        moved += check_against_reference(bs, budget, 15, (1024, 1024), torch.bfloat16, seed, "cuda")
    assert moved > 50, moved
    # Captured once, replayed on new paths written into the same input tensors.
    keep, loc, n = random_case(16, 32, 15, 50, 10, "cuda")
    slots = int(loc.max()) + 1
    pool = [torch.randn(slots, 1024, device="cuda").bfloat16() for _ in range(4)]
    ptrs = torch.tensor([b.data_ptr() for b in pool], dtype=torch.uint64, device="cuda")
    row_bytes = torch.full((4,), 2048, device="cuda", dtype=torch.int64)
    move_accepted_kv(ptrs, row_bytes, keep, loc, n, 2048)  # compile outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        move_accepted_kv(ptrs, row_bytes, keep, loc, n, 2048)
    from sglang_ddtree.core.kv_move_triton import move_accepted_kv_reference

    for seed in range(11, 14):
        new_keep, new_loc, _ = random_case(16, 32, 15, 50, seed, "cuda")
        keep.copy_(new_keep)
        loc.copy_(new_loc)
        ref = [b.clone() for b in pool]
        move_accepted_kv_reference(ref, keep, loc, n)
        graph.replay()
        for got, want in zip(pool, ref):
            assert torch.equal(got, want)
