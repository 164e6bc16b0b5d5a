"""tree_to_retrieve_arrays: first-child/next-sibling arrays, positions, masks."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ddtree.core.layout import flatten_verify_mask, tree_to_retrieve_arrays
from sglang_ddtree.core.tree import build_tree


def random_tree(seed: int, bs: int = 3, depth: int = 5, vocab: int = 6, budget: int = 12):
    gen = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(bs, depth, vocab, generator=gen) * 2, dim=-1)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    return build_tree(lp, budget, roots, topk=min(budget, vocab))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10**6),
    st.integers(1, 4),
    st.integers(1, 6),
    st.integers(1, 5),
    st.integers(1, 20),
)
def test_retrieve_arrays_map_back_to_parents(seed, bs, depth, vocab, budget):
    tree = random_tree(seed, bs, depth, vocab, budget)
    prefix = torch.randint(0, 100, (bs,))
    lay = tree_to_retrieve_arrays(tree, prefix, max_depth=depth)
    n = budget + 1
    for b in range(bs):
        seen_parent = {}
        stack = [0]
        while stack:  # walk the first-child / next-sibling tree from the root
            u = stack.pop()
            c = int(lay.retrieve_next_token[b, u])
            prev = -1
            while c != -1:
                assert c > prev, "siblings in increasing slot order"
                assert c not in seen_parent, "each node reached once"
                seen_parent[c] = u
                stack.append(c)
                prev, c = c, int(lay.retrieve_next_sibling[b, c])
        valid = tree.valid[b].tolist()
        real = {i for i in range(1, n) if valid[i]}
        assert set(seen_parent) == real, "every real node reached, no padded slot"
        for i, p in seen_parent.items():
            assert p == int(tree.parents[b, i])
        for i in range(n):
            assert int(lay.retrieve_index[b, i]) == b * n + i
            assert int(lay.positions[b, i]) == int(prefix[b]) + int(tree.depths[b, i])
            if not valid[i]:
                assert int(lay.retrieve_next_token[b, i]) == -1
                assert int(lay.retrieve_next_sibling[b, i]) == -1


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 15))
def test_tree_mask_is_ancestor_or_self(seed, depth):
    tree = random_tree(seed, bs=2, depth=depth, vocab=3, budget=24)
    lay = tree_to_retrieve_arrays(tree, torch.zeros(2, dtype=torch.int64), max_depth=depth)
    n = tree.num_nodes
    for b in range(2):
        par = tree.parents[b].tolist()
        for i in range(n):
            anc = {i}
            j = par[i]
            while j >= 0:
                anc.add(j)
                j = par[j]
            row = {j for j in range(n) if lay.tree_mask[b, i, j]}
            assert row == anc


@pytest.mark.parametrize("prefix", [[5, 0, 2], [0, 0, 0], [17, 1, 300]])
def test_flatten_verify_mask_layout(prefix):
    tree = random_tree(7, bs=3, depth=4, vocab=4, budget=9)
    prefix = torch.tensor(prefix)
    lay = tree_to_retrieve_arrays(tree, prefix, max_depth=4)
    n = tree.num_nodes
    total = int(sum(n * (int(p) + n) for p in prefix))
    flat = flatten_verify_mask(lay.tree_mask, prefix, total)
    want = []
    for b in range(3):
        for i in range(n):
            want += [True] * int(prefix[b])
            want += lay.tree_mask[b, i].tolist()
    assert flat.tolist() == want


@pytest.mark.parametrize("slack", [[0, 0, 0], [4, 0, 130], [1, 2, 3]])
def test_verify_mask_sized_from_upper_bound_lengths(slack):
    """Sized from host upper bounds of the prefixes (the worker's reserved KV lengths), the mask
    reads the same as the exact one the way SGLang reads it: request b's block starts at
    mask_indptr[b], the cumsum of N * (prefix + N) over the REAL prefixes."""
    from sglang_ddtree.core.layout import scatter_verify_mask, verify_mask_cells, verify_mask_numel

    tree = random_tree(11, bs=3, depth=4, vocab=4, budget=9)
    prefix = torch.tensor([5, 0, 17])
    lay = tree_to_retrieve_arrays(tree, prefix, max_depth=4)
    n = tree.num_nodes
    exact = verify_mask_numel(n, prefix)
    bound = verify_mask_numel(n, prefix + torch.tensor(slack))
    assert exact == int(sum(n * (int(p) + n) for p in prefix))
    mask = scatter_verify_mask(lay.tree_mask, verify_mask_cells(prefix, n), bound)
    assert mask.numel() == bound and bool(mask[exact:].all())
    start = 0
    for b in range(3):  # SGLang's read of block b
        cols = int(prefix[b]) + n
        block = mask[start : start + n * cols].view(n, cols)
        assert bool(block[:, : int(prefix[b])].all())
        assert torch.equal(block[:, int(prefix[b]) :], lay.tree_mask[b])
        start += n * cols
    assert torch.equal(mask[:exact], flatten_verify_mask(lay.tree_mask, prefix, exact))


LAYOUT_CASES = [(3, 5, 6, 12), (2, 15, 3, 70), (1, 1, 2, 1), (2, 15, 4, 130), (4, 7, 50, 64)]

_INTERPRETED_CHECK = """
import torch
from test_layout import LAYOUT_CASES, random_tree
from sglang_ddtree.core.layout import tree_to_retrieve_arrays
from sglang_ddtree.core.layout_triton import tree_layout_triton

for seed, (bs, depth, vocab, budget) in enumerate(LAYOUT_CASES):
    tree = random_tree(seed, bs, depth, vocab, budget)
    prefix = torch.randint(0, 50, (bs,))
    for bound in (None, depth, max(1, depth // 2)):  # the worker passes the drafter's depth
        want = tree_to_retrieve_arrays(tree, prefix, max_depth=bound, backend="torch")
        for a, b, name in zip(want, tree_layout_triton(tree, prefix, bound), want._fields):
            assert torch.equal(a, b), (name, bound)
print("interpreted triton layout OK")
"""


def test_triton_layout_interpreted_equals_torch(run_interpreted):
    run_interpreted(_INTERPRETED_CHECK, "interpreted triton layout OK")


@pytest.mark.gpu
def test_triton_layout_equals_torch_on_gpu():
    for seed, (bs, depth, vocab, budget) in enumerate(LAYOUT_CASES):
        tree = random_tree(seed, bs, depth, vocab, budget)
        tree = type(tree)(*(t.cuda() for t in tree))
        prefix = torch.randint(0, 50, (bs,), device="cuda")
        for bound in (None, depth, max(1, depth // 2)):
            want = tree_to_retrieve_arrays(tree, prefix, max_depth=bound, backend="torch")
            got = tree_to_retrieve_arrays(tree, prefix, max_depth=bound, backend="triton")
            for a, b, name in zip(want, got, want._fields):
                assert torch.equal(a, b), (name, bound)
