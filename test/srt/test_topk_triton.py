"""The one-pass Triton draft top-K (core.topk_triton) against select_candidates' torch path.

CPU: the kernel's logic under Triton's interpreter (a subprocess with TRITON_INTERPRET=1):
several vocabulary chunks with a partial last one, K equal to the chunk, one chunk larger than
the vocabulary, bf16 input, ties, draft_to_tree with the triton backend, and `top_k_logits`
(masked chunks) against ``torch.topk``. GPU (``gpu``
marker): the Qwen3-8B draft shape, equality with the torch path, and CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.core.tree import select_candidates
from sglang_ddtree.srt.ddtree_args import draft_topk_backend

# (bs, depth, vocab, K, block): 4 chunks with a partial last one; K == block; block > vocab.
CASES = [(2, 3, 1000, 8, 256), (1, 2, 128, 64, 64), (1, 1, 300, 5, 512), (3, 4, 4096, 16, 1024)]


def check_equal_to_torch(logits: torch.Tensor, k: int, block: int) -> int:
    """Same log-probs as the torch path, the same tokens on every row without ties among its
    top K + 1 logits (returns how many rows those were), valid candidates on the others."""
    from sglang_ddtree.core.topk_triton import select_candidates_triton

    lp, tok = select_candidates_triton(logits, k, block=block)
    ref_lp, ref_tok = select_candidates(logits.float(), k, normalize=True)
    assert lp.dtype == torch.float32 and tok.dtype == torch.int64
    assert lp.shape == ref_lp.shape and tok.shape == ref_tok.shape
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=2e-5)
    flat = logits.float().reshape(-1, logits.shape[-1])
    picked = flat.gather(-1, tok.reshape(flat.shape[0], -1)).view_as(lp)
    # Every candidate's value is its own logit minus the row's logsumexp.
    lse = torch.logsumexp(flat, -1).view(*lp.shape[:2], 1)
    torch.testing.assert_close(lp, (picked - lse).clamp(max=0), rtol=0, atol=2e-5)
    unique = all(len(set(r.tolist())) == len(r) for r in tok.reshape(-1, tok.shape[-1]))
    assert unique, "a token picked twice"
    # A row's tokens are determined when its top K + 1 values are distinct (a tie at the K-th
    # place, or inside the top K, may order equal tokens either way): those rows must agree.
    edge = torch.topk(flat, min(k + 1, flat.shape[-1]), dim=-1).values
    distinct = [len(set(r.tolist())) == len(r) for r in edge]
    got, want = tok.reshape(flat.shape[0], -1), ref_tok.reshape(flat.shape[0], -1)
    for row in (i for i, ok in enumerate(distinct) if ok):
        assert torch.equal(got[row], want[row]), row
    return sum(distinct)


_INTERPRETED_CHECK = """
import torch
from test_topk_triton import CASES, check_equal_to_torch
from sglang_ddtree.core.step import draft_to_tree

g = torch.Generator().manual_seed(0)
for bs, depth, vocab, k, block in CASES:
    logits = torch.randn(bs, depth, vocab, generator=g)  # float32: tie-free in practice
    assert check_equal_to_torch(logits, k, block) == bs * depth
    check_equal_to_torch(logits.to(torch.bfloat16), k, block)  # bf16 input: ties happen
# Many exact ties (small integer logits).
check_equal_to_torch(torch.randint(0, 4, (2, 3, 700), generator=g).float(), 6, 256)

# draft_to_tree with the triton top-K == with the torch top-K (tie-free logits).
bs, block_size, hid, vocab, budget = 2, 5, 16, 300, 9
hidden = torch.randn(bs * block_size, hid, generator=g)
lm_head = torch.randn(vocab, hid, generator=g)
args = (hidden, lm_head, torch.tensor([3, 7]), torch.tensor([10, 20]), torch.tensor([0, 1]),
        torch.arange(2 * 64, dtype=torch.int32).view(2, 64))
kw = dict(block_size=block_size, max_depth=4, budget=budget, topk=4)
a = draft_to_tree(*args, **kw, draft_topk="torch")
b = draft_to_tree(*args, **kw, draft_topk="triton")
assert torch.equal(a.tokens, b.tokens) and torch.equal(a.layout.tree_mask, b.layout.tree_mask)

# top_k_logits (the logprobs' top-n): torch.topk's values and ids, also with whole chunks of
# -inf (a grammar mask); a row with fewer allowed tokens than k gets k distinct ids, its
# masked ones as the float32 minimum.
from sglang_ddtree.core.topk_triton import top_k_logits
rows = torch.randn(5, 1000, generator=g)
rows[0, :700] = float("-inf")
rows[1, 3:] = float("-inf")
for k in (1, 4, 8):
    got_v, got_i = top_k_logits(rows, k, block=256)
    want_v, want_i = rows.clamp(min=torch.finfo(torch.float32).min).topk(k, dim=-1)
    assert torch.equal(got_v, want_v) and len(set(got_i[1].tolist())) == k, k
    assert torch.equal(got_i[:, :3], want_i[:, :3]) and torch.equal(got_i[2:], want_i[2:]), k
# row_index reads the chosen rows in place: as top_k_logits of the gathered rows.
index = torch.tensor([4, 2, 2, 0], dtype=torch.int64)
for k in (1, 4):
    got_v, got_i = top_k_logits(rows, k, block=256, row_index=index)
    want_v, want_i = top_k_logits(rows.index_select(0, index), k, block=256)
    assert torch.equal(got_v, want_v) and torch.equal(got_i, want_i), k
print("interpreted triton top-K OK")
"""


def test_triton_topk_interpreted_equals_torch(run_interpreted):
    """The kernel's logic, run by Triton's CPU interpreter, against torch.topk + logsumexp."""
    run_interpreted(_INTERPRETED_CHECK, "interpreted triton top-K OK")


def test_draft_topk_picks_triton_where_measured_faster():
    # Measured (benchmark/ddtree/RESULTS.md, kernel choices): Triton faster at K <= 32 on
    # V = 151,936, slower at K = 64.
    assert draft_topk_backend(32, 151936) == "triton"
    assert draft_topk_backend(15, 163840) == "triton"
    assert draft_topk_backend(64, 151936) == "torch"
    assert draft_topk_backend(16, 4096) == "torch"  # small vocabularies: not measured


def test_triton_backend_needs_raw_logits():
    with pytest.raises(AssertionError, match="normalize=True"):
        select_candidates(torch.randn(1, 2, 10), 3, normalize=False, backend="triton")


@pytest.mark.gpu
def test_triton_topk_on_gpu_8b_draft_shape_and_in_graph():
    """Qwen3-8B draft shape (15 depths x 151,936), bf16: equal to the torch path, also when
    replayed from a CUDA graph on new logits."""
    from sglang_ddtree.core.topk_triton import select_candidates_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    for bs in (1, 8):
        logits = (3 * torch.randn(bs, 15, 151936, device="cuda", generator=g)).float()
        assert check_equal_to_torch(logits, 8, 4096) == bs * 15
        check_equal_to_torch(logits.to(torch.bfloat16), 8, 4096)
    static = torch.randn(4, 15, 151936, device="cuda", generator=g)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        select_candidates_triton(static, 8)  # compile outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lp, tok = select_candidates_triton(static, 8)
    for seed in range(3):
        static.copy_(torch.randn(4, 15, 151936, device="cuda", generator=g) * (1 + seed))
        graph.replay()
        ref_lp, ref_tok = select_candidates(static, 8, normalize=True)
        assert torch.equal(tok, ref_tok)
        torch.testing.assert_close(lp, ref_lp, rtol=0, atol=2e-5)
