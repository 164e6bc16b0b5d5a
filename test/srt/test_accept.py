"""accept_greedy / accept_sampled / commit_accepted.

Statistical tests (law of emitted tokens): the exact law of (accepted draft tokens + bonus) is
enumerated on a small tree and compared with sampled outcomes by Pearson's chi-squared test.
Sample size and threshold are stated where they are used; each test also shows its power by
rejecting a deliberately wrong law (temperature off by 15%).
"""

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from sglang_ddtree.core.accept import accept_greedy, accept_sampled, accept_sampled_reference
from sglang_ddtree.core.commit import commit_accepted
from sglang_ddtree.core.layout import tree_to_retrieve_arrays
from sglang_ddtree.core.sampling import draw_coins, target_probs
from sglang_ddtree.core.tree import build_tree

P_MIN = 1e-3  # chi-squared p-value below which a law is rejected


def make_tree(seed, bs, depth, vocab, budget):
    gen = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(bs, depth, vocab, generator=gen) * 1.5, dim=-1)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    tree = build_tree(lp, budget, roots, topk=min(budget, vocab))
    lay = tree_to_retrieve_arrays(tree, torch.zeros(bs, dtype=torch.int64), max_depth=depth)
    return tree, lay


def brute_greedy_walk(parents, tokens, valid, predict, max_accept):
    """Host dict walk, as in the reference implementation."""
    children = {}
    for i in range(1, len(parents)):
        if valid[i]:
            children.setdefault(parents[i], {})[tokens[i]] = i
    path, cur = [0], 0
    while len(path) < max_accept and predict[cur] in children.get(cur, {}):
        cur = children[cur][predict[cur]]
        path.append(cur)
    return path, predict[cur]


@pytest.mark.parametrize("seed", range(5))
def test_greedy_walk_equals_brute_force(seed):
    bs, depth, vocab, budget = 16, 6, 4, 20
    tree, lay = make_tree(seed, bs, depth, vocab, budget)
    n = budget + 1
    gen = torch.Generator().manual_seed(100 + seed)
    # Bias the target towards the draft's first child so walks go deep.
    target_predict = torch.randint(0, vocab, (bs, n), generator=gen)
    first = lay.retrieve_next_token.clamp(min=0)
    agree = torch.rand(bs, n, generator=gen) < 0.7
    target_predict = torch.where(agree, tree.tokens.gather(1, first), target_predict)
    for max_accept in (1, 3, depth + 1):
        res = accept_greedy(lay, tree.tokens, target_predict, max_accept, backend="torch")
        plan = commit_accepted(res, torch.full((bs,), 10), n)
        for b in range(bs):
            path, bonus = brute_greedy_walk(
                tree.parents[b].tolist(),
                tree.tokens[b].tolist(),
                tree.valid[b].tolist(),
                target_predict[b].tolist(),
                max_accept,
            )
            k = len(path) - 1
            assert int(res.accept_length[b]) == k
            assert res.accept_index[b, : k + 1].tolist() == [b * n + i for i in path]
            assert (res.accept_index[b, k + 1 :] == -1).all()
            emitted = [tree.tokens[b, i].item() for i in path[1:]] + [bonus]
            assert plan.out_tokens[b, : k + 1].tolist() == emitted
            assert plan.keep_nodes[b, : k + 1].tolist() == path
            assert int(plan.commit_lens[b]) == k + 1 and int(plan.bonus[b]) == bonus
            assert int(plan.new_seq_lens[b]) == 10 + k + 1


def exact_law(parents, tokens, probs, max_accept):
    """{emitted token tuple: probability} of target-only tree sampling on one tree."""
    n = len(parents)
    kids = {u: [i for i in range(1, n) if parents[i] == u] for u in range(n)}
    depth = {0: 0}
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    law = Counter()

    def visit(u, prefix, mass):
        child_tokens = [tokens[c] for c in kids[u]] if depth[u] < max_accept - 1 else []
        for x, p in enumerate(probs[u]):
            if x not in child_tokens and p > 0:
                law[prefix + (x,)] += mass * p
        if depth[u] < max_accept - 1:
            for c in kids[u]:
                if probs[u][tokens[c]] > 0:
                    visit(c, prefix + (tokens[c],), mass * probs[u][tokens[c]])

    visit(0, (), 1.0)
    return law


def chi2_pvalue(law, samples):
    counts = Counter(samples)
    total = len(samples)
    if not set(counts) <= set(law):
        return 0.0  # an impossible outcome was sampled: reject outright
    keys = sorted(law, key=lambda k: -law[k])
    big = [k for k in keys if law[k] * total >= 5]
    rest = [k for k in keys if law[k] * total < 5]
    obs = [counts[k] for k in big] + [sum(counts[k] for k in rest)]
    exp = [law[k] * total for k in big] + [sum(law[k] for k in rest) * total]
    obs, exp = obs[: len(obs) - (exp[-1] == 0)], exp[: len(exp) - (exp[-1] == 0)]
    scale = sum(obs) / sum(exp)
    return chisquare(obs, [e * scale for e in exp]).pvalue


def law_setup(temperature, top_k, top_p):
    """One small branchy tree (V=6, budget 7, depth 3) and its target distributions."""
    vocab, depth, budget = 6, 3, 7
    lp = torch.log_softmax(
        torch.tensor(
            [[[2.0, 1.5, 0.0, -1, -1, -2], [1.0, 0.8, 0, -1, -2, -3], [2, 0, 0, -1, -1, -1]]]
        ),
        dim=-1,
    )
    tree = build_tree(lp, budget, torch.tensor([5]))
    lay = tree_to_retrieve_arrays(tree, torch.zeros(1, dtype=torch.int64), max_depth=depth)
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, budget + 1, vocab, generator=gen) * 1.5
    probs = target_probs(
        logits, torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p])
    )
    return tree, lay, logits, probs, depth + 1


def sample_outcomes(tree, lay, probs, max_accept, num, backend, device="cpu"):
    n = tree.num_nodes
    rep = lambda x: x.expand(num, *x.shape[1:]).contiguous().to(device)  # noqa: E731
    lay_b = type(lay)(*(rep(t) for t in lay[:-1]), rep(lay.tree_mask))
    lay_b = lay_b._replace(
        retrieve_index=(
            torch.arange(num, device=device)[:, None] * n + torch.arange(n, device=device)
        )
    )
    gen = torch.Generator(device=device).manual_seed(1234)
    coins, final = draw_coins(num, n, device, generator=gen)
    res = accept_sampled(lay_b, rep(tree.tokens), rep(probs), coins, final, max_accept, backend)
    plan = commit_accepted(res, torch.zeros(num, dtype=torch.int64, device=device), n)
    out = plan.out_tokens.cpu().tolist()
    lens = plan.commit_lens.cpu().tolist()
    return [tuple(row[:k]) for row, k in zip(out, lens)]


LAW_CASES = [  # (temperature, top_k, top_p)
    (1.0, 0, 1.0),
    (0.7, 0, 0.9),
    (1.3, 4, 1.0),
    (0.8, 5, 0.8),
]


@pytest.mark.parametrize("temperature,top_k,top_p", LAW_CASES)
def test_reference_sampling_law_is_exact(temperature, top_k, top_p):
    """120k samples per case; reject if chi-squared p < 1e-3; a 15% temperature error must be
    rejected at the same sample size (the test's power)."""
    num = 120_000
    tree, lay, logits, probs, s = law_setup(temperature, top_k, top_p)
    law = exact_law(tree.parents[0].tolist(), tree.tokens[0].tolist(), probs[0].tolist(), s)
    assert abs(sum(law.values()) - 1) < 1e-5
    samples = sample_outcomes(tree, lay, probs, s, num, backend="torch")
    assert chi2_pvalue(law, samples) > P_MIN
    wrong = target_probs(
        logits, torch.tensor([temperature * 1.15]), torch.tensor([top_k]), torch.tensor([top_p])
    )
    wrong_samples = sample_outcomes(tree, lay, wrong, s, num, backend="torch")
    assert chi2_pvalue(law, wrong_samples) < P_MIN


def test_zero_probability_child_never_accepted():
    tree, lay, logits, probs, s = law_setup(1.0, 1, 1.0)  # top-k 1: one token per node
    samples = sample_outcomes(tree, lay, probs, s, 20_000, backend="torch")
    argmax = probs[0].argmax(-1).tolist()
    for out in samples:  # every emitted token must be the target's only allowed token
        cur = 0
        for tok in out:
            assert tok == argmax[cur]
            kids = [
                i
                for i in range(tree.num_nodes)
                if int(tree.parents[0, i]) == cur and int(tree.tokens[0, i]) == tok
            ]
            cur = kids[0] if kids else cur


# --------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_kernel_greedy_equals_torch_walk(seed):
    bs, depth, vocab, budget = 64, 15, 8, 64
    tree, lay = make_tree(seed, bs, depth, vocab, budget)
    n = budget + 1
    gen = torch.Generator().manual_seed(seed)
    first = lay.retrieve_next_token.clamp(min=0)
    target = torch.where(
        torch.rand(bs, n, generator=gen) < 0.8,
        tree.tokens.gather(1, first),
        torch.randint(0, vocab, (bs, n), generator=gen),
    )
    ref = accept_greedy(lay, tree.tokens, target, depth + 1, backend="torch")
    lay_c = type(lay)(*(t.cuda() for t in lay))
    got = accept_greedy(lay_c, tree.tokens.cuda(), target.cuda(), depth + 1, backend="kernel")
    for a, b in zip(ref, got):
        assert torch.equal(a, b.cpu())
    assert ref.accept_length.float().mean() > 1.0  # the walks went deep


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(3))
def test_kernel_sampled_equals_reference_on_shared_coins(seed):
    bs, depth, vocab, budget = 512, 6, 16, 24
    tree, lay = make_tree(seed, bs, depth, vocab, budget)
    n = budget + 1
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, n, vocab, generator=gen) * 2
    temp = torch.rand(bs, generator=gen) + 0.5
    top_k = torch.randint(0, 8, (bs,), generator=gen)
    top_p = torch.rand(bs, generator=gen) * 0.5 + 0.5
    probs = target_probs(logits, temp, top_k, top_p)
    coins, final = draw_coins(bs, n, "cpu", generator=gen)
    ref = accept_sampled_reference(lay, tree.tokens, probs, coins, final, depth + 1)
    lay_c = type(lay)(*(t.cuda() for t in lay))
    got = accept_sampled(
        lay_c, tree.tokens.cuda(), probs.cuda(), coins.cuda(), final.cuda(), depth + 1, "kernel"
    )
    assert torch.equal(ref.accept_index, got.accept_index.cpu())
    assert torch.equal(ref.accept_length, got.accept_length.cpu())
    # Bonus tokens come from an inverse CDF; a different summation order may flip a draw that
    # lands within float rounding of a bucket edge. Allow at most 1 such request in 512.
    mismatch = (ref.predict != got.predict.cpu()).view(bs, n).any(1).sum().item()
    assert mismatch <= 1


@pytest.mark.gpu
@pytest.mark.parametrize("temperature,top_k,top_p", LAW_CASES)
def test_kernel_sampling_law_is_exact(temperature, top_k, top_p):
    """sgl_kernel path, 200k samples per case, chi-squared p > 1e-3; the GPU renorm kernels
    produce the probabilities; a 15% temperature error must be rejected."""
    num = 200_000
    tree, lay, logits, _, s = law_setup(temperature, top_k, top_p)
    args = (torch.tensor([top_k]).cuda(), torch.tensor([top_p]).cuda())
    probs = target_probs(logits.cuda(), torch.tensor([temperature]).cuda(), *args)
    law = exact_law(tree.parents[0].tolist(), tree.tokens[0].tolist(), probs[0].tolist(), s)
    samples = sample_outcomes(tree, lay, probs, s, num, backend="kernel", device="cuda")
    assert chi2_pvalue(law, samples) > P_MIN
    wrong = target_probs(logits.cuda(), torch.tensor([temperature * 1.15]).cuda(), *args)
    wrong_samples = sample_outcomes(tree, lay, wrong, s, num, backend="kernel", device="cuda")
    assert chi2_pvalue(law, wrong_samples) < P_MIN


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_target_probs_skips_only_filters_no_request_uses(device):
    """need_top_k / need_top_p = False (SGLang's host flags) skip a renorm pass; under their
    contract (filter off in every row) the distribution is unchanged. With the filter on in some
    row, the flags must stay True: skipping then changes the law, and this test shows it."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    gen = torch.Generator().manual_seed(7)
    bs, n, vocab = 6, 5, 40
    logits = (torch.randn(bs, n, vocab, generator=gen) * 2).to(device)
    temp = (torch.rand(bs, generator=gen) + 0.5).to(device)
    k_off = torch.zeros(bs, dtype=torch.int64, device=device)  # 0 = off
    p_off = torch.ones(bs, device=device)
    p_on = torch.full((bs,), 0.7, device=device)
    k_on = torch.full((bs,), 5, dtype=torch.int64, device=device)
    full = target_probs(logits, temp, k_off, p_off)
    plain = torch.softmax(logits.float() / temp[:, None, None], dim=-1)
    assert torch.allclose(full, plain, atol=1e-6)
    skipped = target_probs(logits, temp, k_off, p_off, need_top_k=False, need_top_p=False)
    assert torch.allclose(skipped, full, atol=1e-6)
    top_p_only = target_probs(logits, temp, k_off, p_on, need_top_k=False)
    assert torch.allclose(top_p_only, target_probs(logits, temp, k_off, p_on), atol=1e-6)
    assert (top_p_only == 0).any()  # top-p really applied
    top_k_only = target_probs(logits, temp, k_on, p_off, need_top_p=False)
    assert torch.allclose(top_k_only, target_probs(logits, temp, k_on, p_off), atol=1e-6)
    assert ((top_k_only > 0).sum(-1) == 5).all()
    # Broken contract (top-k on, flag False): the filter is not applied.
    assert not torch.allclose(target_probs(logits, temp, k_on, p_off, need_top_k=False), top_k_only)


def test_kernel_calls_pass_sglangs_argument_names(monkeypatch):
    """Both sgl_kernel calls on the CPU, through a stand-in ``sgl_kernel`` whose two functions
    take exactly the parameters of SGLang's wrappers (``sgl_kernel/speculative.py`` of
    sglang-kernel 0.4.5, the version SGLang 0.5.17 pins), none defaulted: a misspelt or missing
    argument fails the call. The stand-ins check the layout arrays they are handed and run the
    torch path into the handed outputs, so both results equal the torch path's."""
    import sys
    import types

    from sglang_ddtree.core import accept as accept_mod

    bs, depth, vocab, budget = 8, 5, 6, 12
    tree, lay = make_tree(3, bs, depth, vocab, budget)
    n = budget + 1
    gen = torch.Generator().manual_seed(3)
    target = torch.randint(0, vocab, (bs, n), generator=gen)
    probs = target_probs(torch.randn(bs, n, vocab, generator=gen), torch.ones(bs),
                         torch.zeros(bs, dtype=torch.int64), torch.ones(bs))  # fmt: skip
    coins, final = draw_coins(bs, n, "cpu", generator=gen)
    calls = []

    def handed(retrive_index, retrive_next_token, retrive_next_sibling, candidates):
        assert torch.equal(retrive_index, lay.retrieve_index)
        assert torch.equal(retrive_next_token, lay.retrieve_next_token)
        assert torch.equal(retrive_next_sibling, lay.retrieve_next_sibling)
        assert candidates.dtype == torch.int64 and torch.equal(candidates, tree.tokens)

    def fill(out, predicts, accept_index, accept_token_num):
        predicts.copy_(out.predict)
        accept_index.copy_(out.accept_index)
        accept_token_num.copy_(out.accept_length)

    def verify_tree_greedy(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, target_predict,
    ):  # fmt: skip
        handed(retrive_index, retrive_next_token, retrive_next_sibling, candidates)
        out = accept_greedy(lay, candidates, target_predict, depth + 1, backend="torch")
        fill(out, predicts, accept_index, accept_token_num)
        calls.append("greedy")

    def tree_speculative_sampling_target_only(
        predicts, accept_index, accept_token_num, candidates, retrive_index,
        retrive_next_token, retrive_next_sibling, uniform_samples,
        uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single,
        threshold_acc, deterministic,
    ):  # fmt: skip
        handed(retrive_index, retrive_next_token, retrive_next_sibling, candidates)
        assert (threshold_single, threshold_acc, deterministic) == (1.0, 1.0, True)
        assert not draft_probs.any()  # target-only: the draft's mass starts at zero
        out = accept_sampled_reference(
            lay, candidates, target_probs, uniform_samples, uniform_samples_for_final_sampling,
            depth + 1,
        )  # fmt: skip
        fill(out, predicts, accept_index, accept_token_num)
        calls.append("sampled")

    stand_in = types.ModuleType("sgl_kernel")
    stand_in.verify_tree_greedy = verify_tree_greedy
    stand_in.tree_speculative_sampling_target_only = tree_speculative_sampling_target_only
    monkeypatch.setitem(sys.modules, "sgl_kernel", stand_in)
    monkeypatch.setattr(accept_mod, "_use_kernel", lambda device, backend: backend != "torch")

    got = accept_greedy(lay, tree.tokens, target, depth + 1, backend="kernel")
    ref = accept_greedy(lay, tree.tokens, target, depth + 1, backend="torch")
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    got = accept_sampled(lay, tree.tokens, probs, coins, final, depth + 1, backend="kernel")
    ref = accept_sampled_reference(lay, tree.tokens, probs, coins, final, depth + 1)
    assert all(torch.equal(a, b) for a, b in zip(got, ref))
    assert calls == ["greedy", "sampled"]
