"""DDTREE's per-row penalty state (`srt.ddtree_penalties`), on the CPU: a prefill resets a row
to its request's parameters and the sampled token, decode steps count what they commit, and the
state a step reads is always that of the tokens the request emitted so far, so
`core.penalties` applies the non-speculative law at every node."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang_ddtree.core.penalties import RequestPenalties, apply_tree_penalties
from sglang_ddtree.srt.ddtree_penalties import PenaltyRows, has_penalties, stop_ids

V = 12


def _req(row, freq=0.0, pres=0.0, rep=1.0, min_new=0, stops=(), eos=1, extra=()):
    sp = SimpleNamespace(
        frequency_penalty=freq, presence_penalty=pres, repetition_penalty=rep,
        min_new_tokens=min_new, stop_token_ids=set(stops),
    )  # fmt: skip
    tok = SimpleNamespace(eos_token_id=eos, additional_stop_token_ids=set(extra))
    return SimpleNamespace(sampling_params=sp, tokenizer=tok, req_pool_idx=row)


def _from_scratch(reqs, emitted) -> RequestPenalties:
    """The state straight from each request's emitted tokens (what the rows must equal)."""
    counts = torch.zeros(len(reqs), V, dtype=torch.int32)
    for i, toks in enumerate(emitted):
        for t in toks:
            counts[i, t] += 1
    stops = [stop_ids(r, V) if r.sampling_params.min_new_tokens > 0 else [] for r in reqs]
    width = max([len(s) for s in stops] + [1])
    stop = torch.full((len(reqs), width), -1, dtype=torch.int64)
    for i, s in enumerate(stops):
        stop[i, : len(s)] = torch.tensor(s)
    sp = [r.sampling_params for r in reqs]
    return RequestPenalties(
        output_counts=counts,
        output_lens=torch.tensor([len(e) for e in emitted]),
        frequency_penalty=torch.tensor([s.frequency_penalty for s in sp]),
        presence_penalty=torch.tensor([s.presence_penalty for s in sp]),
        repetition_penalty=torch.tensor([s.repetition_penalty for s in sp]),
        min_new_tokens=torch.tensor([s.min_new_tokens for s in sp]),
        stop_token_ids=stop,
    )


def test_has_penalties_and_stop_ids():
    assert not has_penalties(_req(0).sampling_params)
    assert has_penalties(_req(0, freq=0.5).sampling_params)
    assert has_penalties(_req(0, rep=1.05).sampling_params)
    assert has_penalties(_req(0, min_new=3).sampling_params)
    assert stop_ids(_req(0, stops=(7, 3), eos=1, extra=(9,)), V) == [1, 3, 7, 9]
    assert stop_ids(_req(0, eos=None), V) == []
    # Ids the target never emits are not held back: out of the vocabulary, negative, huge.
    wild = _req(0, stops=(3, 3, V, V + 7, -1, -(2**70), 2**63, 2**64 + 3), eos=None)
    assert stop_ids(wild, V) == [3]


def test_rows_follow_each_request_through_prefill_and_steps():
    g = torch.Generator().manual_seed(0)
    state = PenaltyRows(rows=8, vocab=V, device="cpu")
    reqs = [
        _req(5, freq=0.7, pres=0.3, min_new=4, stops=(2, 3)),
        _req(2, rep=1.3),
        _req(6),  # no penalty: a neutral row in a penalized batch
    ]
    first = torch.tensor([4, 4, 0])
    state.reset([r.req_pool_idx for r in reqs], reqs, first)
    assert state.penalized == {5, 2}  # the rows a decode step looks up
    assert set(state.stops) == {5}  # only min_new_tokens rows hold stop ids (eos 1, 2, 3)
    emitted = [[4], [4], [0]]
    pool_idx = torch.tensor([r.req_pool_idx for r in reqs])
    w = 5
    for _ in range(3):
        got = state.gather(pool_idx, pool_idx.tolist())
        want = _from_scratch(reqs, emitted)
        for name, a, b in zip(RequestPenalties._fields, got, want):
            if name in ("output_counts", "output_lens"):  # a neutral row ignores its counts
                a, b = a[:2], b[:2]
            assert torch.equal(a.to(b.dtype), b), name
        logits = torch.randn(len(reqs), w, V, generator=g)
        tokens = torch.randint(0, V, (len(reqs), w), generator=g)
        mask = torch.eye(w, dtype=torch.bool).expand(len(reqs), w, w).clone()
        mask[:, 1:, 0] = True  # a star: every node a child of the root
        assert torch.equal(
            apply_tree_penalties(logits, tokens, mask, got),
            apply_tree_penalties(logits, tokens, mask, want),
        )
        out = torch.randint(0, V, (len(reqs), 3), generator=g)
        out[1, 2] = -1  # a shorter path
        # As the decode step counts: from the state it gathered for the penalties.
        state.record(pool_idx, out, got)
        for i in range(len(reqs)):
            emitted[i] += [t for t in out[i].tolist() if t >= 0]


def test_a_new_request_on_a_used_row_starts_clean():
    """A finished penalized request's parameters and counts never reach the next request of
    its row: the prefill writes every row a penalized request held."""
    state = PenaltyRows(rows=4, vocab=V, device="cpu")
    old = _req(1, freq=2.0, rep=1.5, min_new=9, stops=(3,))
    state.reset([1], [old], torch.tensor([7]))
    state.record(torch.tensor([1]), torch.tensor([[7, 7, 8]]))
    assert state.penalized == {1}
    new = _req(1)
    state.reset([1], [new], torch.tensor([2]))
    assert state.penalized == set()
    assert state.stops == {}  # the old request's stop ids went with it
    got = state.gather(torch.tensor([1]), [1])
    want = _from_scratch([new], [[2]])
    for name in RequestPenalties._fields:
        a, b = getattr(got, name), getattr(want, name)
        assert torch.equal(a, b.to(a.dtype)), name


def test_wild_stop_ids_in_a_penalized_batch():
    """Stop ids out of the vocabulary, negative, huge (beyond int64) or repeated, on a plain
    request and on a min_new_tokens one sharing a batch with a penalized request: served, with
    the law of the ids the target can emit (the others can never be sampled)."""
    wild = (3, 3, V, V + 9, -1, -(2**70), 2**63, 2**64 + 3)
    reqs = [
        _req(0, freq=0.5, min_new=6, stops=wild),
        _req(1, stops=wild),  # plain: holds nothing back
        _req(2, rep=1.2),
    ]
    state = PenaltyRows(rows=4, vocab=V, device="cpu")
    state.reset([0, 1, 2], reqs, torch.tensor([5, 5, 5]))
    got = state.gather(torch.tensor([0, 1, 2]), [0, 1, 2])
    assert got.stop_token_ids[0].tolist() == [1, 3] and bool((got.stop_token_ids[1:] < 0).all())
    w = 4
    logits = torch.zeros(3, w, V)
    mask = torch.ones(w, w, dtype=torch.bool).tril().expand(3, w, w).clone()  # a chain
    out = apply_tree_penalties(logits, torch.tensor([[5, 6, 7, 8]] * 3), mask, got)
    assert out[0, :, 3].tolist() == [float("-inf")] * w  # 1 emitted + depth < 6
    assert out[0, :, 1].tolist() == [float("-inf")] * w  # the tokenizer's EOS
    assert bool(torch.isfinite(out[1:]).all()) and bool(torch.isfinite(out[0, :, 4:]).all())


def test_many_stop_ids_cost_their_own_rows():
    """A min_new_tokens request with thousands of stop ids: the step's stop table is as wide
    as the batch's own ids, goes with the request, and applying it allocates nothing wider than
    the logits (no [bs, S, S] tensor, which is larger at S = 3,000)."""
    from torch.profiler import ProfilerActivity, profile

    vocab, bs, w, many = 5000, 4, 8, 3000
    state = PenaltyRows(rows=8, vocab=vocab, device="cpu")
    big = _req(3, min_new=50, stops=range(1000, 1000 + many))
    plain = [_req(r, freq=0.1) for r in (0, 1, 2)]
    state.reset([3, 0, 1, 2], [big, *plain], torch.tensor([7, 7, 7, 7]))
    assert tuple(state.stop_table([0, 1, 2], 3).shape) == (3, 1)  # the step without it
    got = state.gather(torch.tensor([3, 0, 1, 2]), [3, 0, 1, 2])
    assert tuple(got.stop_token_ids.shape) == (bs, many + 1)  # its ids and the EOS
    logits = torch.randn(bs, w, vocab)
    mask = torch.eye(w, dtype=torch.bool).expand(bs, w, w).clone()
    mask[:, 1:, 0] = True
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = apply_tree_penalties(logits, torch.randint(0, vocab, (bs, w)), mask, got)
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert largest <= logits.numel() * logits.element_size() < bs * many * many
    assert bool((out[0, :, 1000 : 1000 + many] == float("-inf")).all())
    big.finished = lambda: True  # the request ends; the next prefill drops its ids
    state.reset([5], [_req(5)], torch.tensor([1]))
    assert 3 not in state.stops
