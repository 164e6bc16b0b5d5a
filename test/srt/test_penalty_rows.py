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
    stops = [stop_ids(r) for r in reqs]
    width = max(len(s) for s in stops)
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
    assert stop_ids(_req(0, stops=(7, 3), eos=1, extra=(9,))) == [1, 3, 7, 9]
    assert stop_ids(_req(0, eos=None)) == []


def test_rows_follow_each_request_through_prefill_and_steps():
    g = torch.Generator().manual_seed(0)
    state = PenaltyRows(rows=8, vocab=V, device="cpu", stop_width=1)
    reqs = [
        _req(5, freq=0.7, pres=0.3, min_new=4, stops=(2, 3)),
        _req(2, rep=1.3),
        _req(6),  # no penalty: a neutral row in a penalized batch
    ]
    first = torch.tensor([4, 4, 0])
    state.reset([r.req_pool_idx for r in reqs], reqs, first)
    assert state.penalized == {5, 2}  # the rows a decode step looks up
    assert state.stop.shape[1] == 3  # grown to the widest stop set (eos 1, 2, 3)
    emitted = [[4], [4], [0]]
    pool_idx = torch.tensor([r.req_pool_idx for r in reqs])
    w = 5
    for _ in range(3):
        got = state.gather(pool_idx)
        want = _from_scratch(reqs, emitted)
        for a, b in zip(got, want):
            assert torch.equal(a.to(b.dtype), b)
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
    its row: the prefill writes every row of its batch."""
    state = PenaltyRows(rows=4, vocab=V, device="cpu")
    old = _req(1, freq=2.0, rep=1.5, min_new=9, stops=(3,))
    state.reset([1], [old], torch.tensor([7]))
    state.record(torch.tensor([1]), torch.tensor([[7, 7, 8]]))
    assert state.penalized == {1}
    new = _req(1)
    state.reset([1], [new], torch.tensor([2]))
    assert state.penalized == set()
    got = state.gather(torch.tensor([1]))
    want = _from_scratch([new], [[2]])
    for name in RequestPenalties._fields:
        a, b = getattr(got, name), getattr(want, name)
        if name == "stop_token_ids":  # the state keeps a wider, -1 padded table
            assert a[0][a[0] >= 0].tolist() == b[0][b[0] >= 0].tolist() == [1]
        else:
            assert torch.equal(a, b.to(a.dtype)), name
