"""Request penalties over the verify tree: the per-request state `core.penalties` reads, kept on
the device by request-pool row, so it follows each request through SGLang's batch filtering and
merging without being moved.

SGLang's speculative workers get no per-token penalty state (its penalizers are fed one token
per decode step, and speculative decode steps skip them), so DDTREE keeps its own: per row of
``req_to_token``, the emitted tokens' counts and number and the request's frequency, presence
and repetition penalties, ``min_new_tokens`` and the stop ids it holds back. The law is that of
SGLang's non-speculative server with ``--disable-overlap-schedule`` (its overlap scheduler
feeds its penalizers one token late):

- A prefill (every extend batch, every chunk) resets its requests' rows and counts the token it
  sampled: SGLang's penalizers start from zero for every prefill batch, a retracted request's
  re-prefill included, and the prefill's own token is drawn by SGLang's sampler.
- A decode step applies `core.penalties.apply_tree_penalties` at every node, then counts the
  committed tokens (the accepted path and the bonus).

Every row is written at its request's prefill while the state exists, so a row never carries a
finished request's parameters into the next request of that row.
"""

from __future__ import annotations

import torch

from sglang_ddtree.core.penalties import RequestPenalties, count_emitted


def has_penalties(sampling_params) -> bool:
    """Whether a request's parameters change its logits through a penalty (host)."""
    sp = sampling_params
    return (
        float(getattr(sp, "frequency_penalty", 0.0) or 0.0) != 0.0
        or float(getattr(sp, "presence_penalty", 0.0) or 0.0) != 0.0
        or float(getattr(sp, "repetition_penalty", 1.0) or 1.0) != 1.0
        or int(getattr(sp, "min_new_tokens", 0) or 0) > 0
    )


def stop_ids(req) -> list[int]:
    """The ids min_new_tokens holds back, as SGLang's min_new_tokens penalizer collects them:
    the request's stop token ids, the tokenizer's additional stop ids and its EOS id."""
    sp, tok = req.sampling_params, getattr(req, "tokenizer", None)
    ids = set(getattr(sp, "stop_token_ids", None) or ())
    ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
    eos = getattr(tok, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    return sorted(int(i) for i in ids)


class PenaltyRows:
    """The penalty state of every request-pool row (R rows, V the logits' width, S stop ids)."""

    def __init__(self, rows: int, vocab: int, device, stop_width: int = 8):
        self.vocab = vocab
        self.counts = torch.zeros(rows, vocab, dtype=torch.int32, device=device)  # [R, V]
        self.lens = torch.zeros(rows, dtype=torch.int64, device=device)  # [R]
        self.frequency = torch.zeros(rows, dtype=torch.float32, device=device)  # [R]
        self.presence = torch.zeros(rows, dtype=torch.float32, device=device)  # [R]
        self.repetition = torch.ones(rows, dtype=torch.float32, device=device)  # [R]
        self.min_new_tokens = torch.zeros(rows, dtype=torch.int64, device=device)  # [R]
        self.stop = torch.full((rows, stop_width), -1, dtype=torch.int64, device=device)  # [R, S]
        # Host: the rows whose request has a penalty, as of each row's last prefill. A decode
        # step asks it per request (a set lookup) instead of reading sampling parameters.
        self.penalized: set[int] = set()

    def reset(
        self,
        pool_rows: list[int],  # host: the prefill batch's request-pool rows
        reqs: list,  # its requests, in that order
        first_tokens: torch.Tensor,  # [n] int, the token the prefill sampled per request
    ) -> None:
        """A prefill batch: its rows restart from its requests' parameters and one emitted
        token. One host-to-device copy of n parameter rows; the counts stay on the device."""
        assert len(pool_rows) == len(reqs) == first_tokens.shape[0]
        for row, req in zip(pool_rows, reqs):
            if has_penalties(req.sampling_params):
                self.penalized.add(row)
            else:
                self.penalized.discard(row)
        device = self.counts.device
        stops = [stop_ids(r) for r in reqs]
        width = max([len(s) for s in stops] + [1])
        if width > self.stop.shape[1]:  # a request with more stop ids than any before
            grown = torch.full((self.stop.shape[0], width), -1, dtype=torch.int64, device=device)
            grown[:, : self.stop.shape[1]] = self.stop
            self.stop = grown
        params = torch.tensor(
            [
                [
                    float(getattr(r.sampling_params, "frequency_penalty", 0.0) or 0.0),
                    float(getattr(r.sampling_params, "presence_penalty", 0.0) or 0.0),
                    float(getattr(r.sampling_params, "repetition_penalty", 1.0) or 1.0),
                    float(getattr(r.sampling_params, "min_new_tokens", 0) or 0),
                ]
                for r in reqs
            ],
            dtype=torch.float32,
        ).to(device, non_blocking=True)
        padded = torch.full((len(reqs), self.stop.shape[1]), -1, dtype=torch.int64)
        for i, s in enumerate(stops):
            padded[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
        rows = torch.tensor(pool_rows, dtype=torch.int64).to(device, non_blocking=True)
        self.frequency[rows] = params[:, 0]
        self.presence[rows] = params[:, 1]
        self.repetition[rows] = params[:, 2]
        self.min_new_tokens[rows] = params[:, 3].to(torch.int64)
        self.stop[rows] = padded.to(device, non_blocking=True)
        self.counts[rows] = 0
        self.lens[rows] = 0
        self.record(rows, first_tokens.view(-1, 1))

    def gather(self, pool_idx: torch.Tensor) -> RequestPenalties:
        """The state of a decode batch's rows (``pool_idx``: [bs], SGLang's req_pool_indices)."""
        rows = pool_idx.to(torch.int64)
        return RequestPenalties(
            output_counts=self.counts[rows],
            output_lens=self.lens[rows],
            frequency_penalty=self.frequency[rows],
            presence_penalty=self.presence[rows],
            repetition_penalty=self.repetition[rows],
            min_new_tokens=self.min_new_tokens[rows],
            stop_token_ids=self.stop[rows],
        )

    def record(
        self,
        pool_idx: torch.Tensor,  # [bs] int, the rows
        out_tokens: torch.Tensor,  # [bs, S'] int, emitted tokens, -1 padded
        state: RequestPenalties | None = None,  # the rows' `gather`, if the step made it
    ) -> None:
        """Count a step's emitted tokens into their rows (`core.penalties.count_emitted`);
        ``state``: the same rows' state from this step's `gather` (not gathered again)."""
        rows = pool_idx.to(torch.int64)
        state = count_emitted(
            self.gather(rows) if state is None else state, out_tokens.to(torch.int64)
        )
        self.counts[rows] = state.output_counts
        self.lens[rows] = state.output_lens
