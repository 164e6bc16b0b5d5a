"""The verify tree's host arrays for the grammar mask's walk (`HostArrayGrammarTree`): the same
values as SGLang's ``GrammarTree`` resolves, as NumPy; and, where SGLang imports, SGLang's own
``generate_token_bitmask`` over them gives the mask it gives over the torch tensors, bit for
bit."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sglang_ddtree.srt.ddtree_step import HostArrayGrammarTree

VOCAB = 200  # 7 words of 32 bits: tokens on bit 31 of a word included
WIDTH = 12
BATCH = 6


class ResolvedTree:
    """Stands in for SGLang's ``GrammarTree`` on a machine without SGLang: ``resolve`` returns
    its host tensors (the real one first waits for their copy)."""

    def __init__(self, *tensors: torch.Tensor):
        self.tensors = tensors

    def resolve(self) -> tuple:
        return self.tensors


class CountingGrammar:
    """A grammar object with the methods of SGLang's ``BaseGrammarObject`` that the mask walk
    calls: after n accepted tokens it allows the tokens t with ``(t + n) % 3 != 0`` and
    ``t % 32 != n % 32`` (about 2/3 of the vocabulary, bit 31 of a word among them), and it
    terminates after ``length`` tokens."""

    def __init__(self, length: int):
        self.accepted: list[int] = []
        self.length = length

    def allowed(self, token: int) -> bool:
        n = len(self.accepted)
        return (token + n) % 3 != 0 and token % 32 != n % 32

    def accept_token(self, token: int) -> None:
        assert self.allowed(token), (token, self.accepted)
        self.accepted.append(token)

    def rollback(self, k: int) -> None:
        del self.accepted[-k:]

    def is_terminated(self) -> bool:
        return len(self.accepted) >= self.length

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device) -> torch.Tensor:
        return torch.zeros(batch_size, (vocab_size + 31) // 32, dtype=torch.int32)

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        words = [0] * vocab_mask.shape[1]
        for token in range(VOCAB):
            if self.allowed(token):
                words[token // 32] |= 1 << (token % 32)
        vocab_mask[idx] = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words])


def random_trees(load_benchmark, seed: int) -> tuple:
    """`bench_grammar_walk.random_trees` of ``BATCH`` x ``WIDTH`` nodes, some tokens past the
    vocabulary."""
    bench = load_benchmark("bench_grammar_walk")
    return bench.random_trees(BATCH, WIDTH, VOCAB + 8, random.Random(seed))


def test_host_arrays_hold_the_trees_values(load_benchmark):
    arrays = random_trees(load_benchmark, 0)
    host = HostArrayGrammarTree(ResolvedTree(*arrays)).resolve()
    for got, want in zip(host, arrays, strict=True):
        assert isinstance(got, np.ndarray) and got.shape == tuple(want.shape)
        assert np.array_equal(got, want.numpy())
        assert got.numel() == want.numel() and got[1].numel() == WIDTH  # torch's, as SGLang asks
        assert isinstance(got[1][2], np.integer)  # a scalar read is NumPy's, not a tensor


def test_sglangs_mask_walk_gives_the_same_mask_over_host_arrays(load_benchmark):
    """Over 6 requests x 12 nodes of random trees and tokens (some out of the vocabulary, so the
    walk takes both its accepted and rejected branches, and some grammars end inside a tree),
    SGLang's ``generate_token_bitmask`` gives the same mask over `HostArrayGrammarTree`'s
    arrays as over SGLang's ``GrammarTree``'s tensors, and rolls every grammar back. Calibration:
    the mask has filled and unfilled rows (not two empty masks), and a tree with one token
    changed gives a different mask."""
    spec_utils = pytest.importorskip("sglang.srt.speculative.spec_utils")

    def mask(tree, arrays) -> torch.Tensor:
        reqs = [SimpleNamespace(grammar=CountingGrammar(3 + b % 4)) for b in range(BATCH)]
        got, _ = spec_utils.generate_token_bitmask(reqs, *tree.resolve(), VOCAB)
        assert all(not r.grammar.accepted for r in reqs)  # every token rolled back
        return got

    arrays = random_trees(load_benchmark, 0)
    want = mask(spec_utils.GrammarTree.from_host(*arrays), arrays)
    got = mask(HostArrayGrammarTree(spec_utils.GrammarTree.from_host(*arrays)), arrays)
    assert torch.equal(got, want)
    filled = int((want != 0).any(-1).sum())
    assert 0 < filled < BATCH * WIDTH
    # The root's first child's token flipped between allowed (1) and rejected (0) by the
    # root's mask: that node's row is filled in one walk and not in the other.
    changed = [a.clone() for a in arrays]
    child = int(changed[0][0, 0])
    changed[2][0, child] = 0 if CountingGrammar(3).allowed(int(arrays[2][0, child])) else 1
    other = mask(HostArrayGrammarTree(spec_utils.GrammarTree.from_host(*changed)), changed)
    assert not torch.equal(other[child], want[child])


def test_bench_trees_are_trees(load_benchmark):
    """`bench_grammar_walk.random_trees`: from each root, the first-child / next-sibling links
    reach every node exactly once (so the walk it times visits the whole tree)."""
    bench = load_benchmark("bench_grammar_walk")
    first_child, next_sibling, tokens = bench.random_trees(5, 16, 1000, random.Random(3))
    assert tokens.shape == (5, 16) and int(tokens.max()) < 1000
    for b in range(5):
        seen, stack = [], [0]
        while stack:
            node = stack.pop()
            seen.append(node)
            for link in (int(next_sibling[b, node]), int(first_child[b, node])):
                if link != -1:
                    stack.append(link)
        assert sorted(seen) == list(range(16)), b
