"""build_tree: equal to the paper's heapq builder, tree invariants, CUDA-graph capture, GPU = CPU."""

import math

import numpy as np
import pytest
import torch
from heap_reference import heap_build
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_ddtree.core.tree import build_tree, build_tree_from_candidates, select_candidates

# Quantized log-probs make many path sums exactly equal, which exercises tie-breaking.
LEVELS = [0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -math.inf]


@st.composite
def candidate_sets(draw):
    bs = draw(st.integers(1, 3))
    depth = draw(st.integers(1, 5))
    vocab = draw(st.integers(1, 7))
    k = draw(st.integers(1, vocab))
    budget = draw(st.integers(max(1, k), 24))  # K <= budget; budget may exceed vocab
    quantized = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    if quantized:
        lp = rng.choice(LEVELS, size=(bs, depth, k), p=[0.2, 0.2, 0.2, 0.15, 0.1, 0.1, 0.05])
    else:
        lp = np.log(rng.dirichlet(np.ones(vocab), size=(bs, depth)))[..., :k]
    lp = -np.sort(-lp, axis=-1)  # descending per depth
    tokens = np.stack(
        [np.stack([rng.permutation(vocab)[:k] for _ in range(depth)]) for _ in range(bs)]
    )
    roots = rng.integers(0, vocab, size=bs)
    return (
        torch.tensor(lp, dtype=torch.float32),
        torch.tensor(tokens, dtype=torch.int64),
        torch.tensor(roots, dtype=torch.int64),
        budget,
    )


def _check_against_heap(lp, tok, roots, budget, tree):
    for b in range(lp.shape[0]):
        parents, depths, tokens, logw = heap_build(lp[b], tok[b], int(roots[b]), budget)
        n = len(parents)
        assert tree.valid[b, :n].all() and not tree.valid[b, n:].any()
        assert tree.parents[b, :n].tolist() == parents
        assert tree.depths[b, :n].tolist() == depths
        assert tree.tokens[b, :n].tolist() == tokens
        assert tree.logw[b, :n].tolist() == logw  # bitwise: same float32 arithmetic
        assert (tree.parents[b, n:] == -1).all() and (tree.depths[b, n:] == 0).all()


@settings(max_examples=300, deadline=None)
@given(candidate_sets())
def test_build_tree_equals_heapq_reference(case):
    lp, tok, roots, budget = case
    tree = build_tree_from_candidates(lp, tok, roots, budget)
    assert tree.parents.shape == (lp.shape[0], budget + 1)
    _check_against_heap(lp, tok, roots, budget, tree)


@settings(max_examples=100, deadline=None)
@given(candidate_sets())
def test_tree_invariants(case):
    lp, tok, roots, budget = case
    tree = build_tree_from_candidates(lp, tok, roots, budget)
    for b in range(lp.shape[0]):
        valid = tree.valid[b]
        n = int(valid.sum())
        assert valid[:n].all()  # real nodes are a prefix of the slots
        par, dep, toks, logw = (x[b, :n].tolist() for x in tree[:4])
        assert par[0] == -1 and dep[0] == 0
        children = {}
        for i in range(1, n):
            assert 0 <= par[i] < i, "parents precede children"
            assert dep[i] == dep[par[i]] + 1
            assert logw[i] <= logw[par[i]]
            children.setdefault(par[i], []).append(i)
        assert logw == sorted(logw, reverse=True), "slots are in pop (score) order"
        for kids in children.values():
            kid_tokens = [toks[i] for i in kids]
            assert len(set(kid_tokens)) == len(kid_tokens), "sibling tokens distinct"


def test_build_tree_from_logprobs_takes_top_budget_prefixes():
    torch.manual_seed(0)
    lp = torch.log_softmax(torch.randn(4, 6, 50), dim=-1)
    budget = 32
    tree = build_tree(lp, budget, torch.arange(4), topk=budget)
    # Brute force the best `budget` prefixes by probability and compare as sets of token paths.
    for b in range(4):
        best = []
        frontier = [((), 0.0)]
        for d in range(6):
            ext = [(p + (v,), s + lp[b, d, v].item()) for p, s in frontier for v in range(50)]
            ext.sort(key=lambda x: -x[1])
            frontier = ext[:budget]
            best += frontier
        best.sort(key=lambda x: -x[1])
        want = {p for p, _ in best[:budget]}
        par, toks = tree.parents[b].tolist(), tree.tokens[b].tolist()

        def path(i, par=par, toks=toks):
            return () if i == 0 else path(par[i]) + (toks[i],)

        assert {path(i) for i in range(1, budget + 1)} == want


def test_budget_above_vocab_pads():
    lp = torch.log_softmax(torch.tensor([[[1.0, 0.0], [0.5, 0.0]]]), dim=-1)  # V=2, D=2
    tree = build_tree(lp, budget=10)
    assert int(tree.valid.sum()) == 1 + 2 + 4  # root + all prefixes
    assert (tree.parents[0, 7:] == -1).all()


def test_select_candidates_normalizes_logits():
    logits = torch.randn(2, 3, 40)
    lp, tok = select_candidates(logits, 5, normalize=True)
    ref_lp, ref_tok = torch.topk(torch.log_softmax(logits, -1), 5, dim=-1)
    assert torch.equal(tok, ref_tok)
    torch.testing.assert_close(lp, ref_lp)
    assert (lp[..., :-1] >= lp[..., 1:]).all()


@pytest.mark.gpu
def test_build_tree_gpu_equals_cpu():
    torch.manual_seed(1)
    for bs, depth, vocab, budget in [(1, 15, 1000, 64), (8, 15, 151936, 32), (3, 7, 64, 128)]:
        lp = torch.log_softmax(torch.randn(bs, depth, vocab) * 3, dim=-1)
        roots = torch.randint(0, vocab, (bs,))
        k = min(budget, vocab)
        cpu = build_tree(lp, budget, roots, topk=k)
        for backend in ("torch", "triton"):
            gpu = build_tree(lp.cuda(), budget, roots.cuda(), topk=k, backend=backend)
            for a, b in zip(cpu, gpu):
                assert torch.equal(a, b.cpu()), backend


@pytest.mark.gpu
@settings(max_examples=150, deadline=None)
@given(candidate_sets())
def test_triton_builder_equals_heapq_reference(case):
    lp, tok, roots, budget = case
    tree = build_tree_from_candidates(lp.cuda(), tok.cuda(), roots.cuda(), budget, "triton")
    _check_against_heap(lp, tok, roots, budget, type(tree)(*(t.cpu() for t in tree)))


@pytest.mark.gpu
def test_build_tree_cuda_graph_capture_and_replay():
    torch.manual_seed(2)
    bs, depth, vocab, budget = 4, 15, 2000, 64
    static_logits = torch.randn(bs, depth, vocab, device="cuda")
    static_roots = torch.randint(0, vocab, (bs,), device="cuda")

    def step(backend):
        lp, tok = select_candidates(static_logits, budget, normalize=True)
        return build_tree_from_candidates(lp, tok, static_roots, budget, backend)

    for backend in ("torch", "triton"):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step(backend)  # warm-up (and Triton compile) outside the graph
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(backend)
        for seed in range(3):
            gen = torch.Generator(device="cuda").manual_seed(seed)
            static_logits.copy_(torch.randn(bs, depth, vocab, device="cuda", generator=gen) * 2)
            static_roots.copy_(torch.randint(0, vocab, (bs,), device="cuda", generator=gen))
            graph.replay()
            want = step("torch")
            for a, b in zip(out, want):
                assert torch.equal(a, b), backend


_INTERPRETED_CHECK = """
from hypothesis import given, settings
from test_tree import _check_against_heap, candidate_sets
from sglang_ddtree.core.tree_triton import build_tree_triton

@settings(max_examples=int(sys.argv[1]), deadline=None)
@given(candidate_sets())
def check(case):
    lp, tok, roots, budget = case
    _check_against_heap(lp, tok, roots, budget, build_tree_triton(lp, tok, roots, budget))

check()
print("interpreted triton builder OK")
"""


def test_triton_builder_interpreted_equals_heapq_reference(run_interpreted):
    """The GPU kernel's logic, run by Triton's CPU interpreter, against the heapq oracle."""
    run_interpreted("import sys\n" + _INTERPRETED_CHECK, "interpreted triton builder OK", "60")
