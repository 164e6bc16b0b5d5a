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

Every row is written at its request's prefill, so a row never carries a finished request's
parameters into the next request of that row.
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


def stop_ids(req, vocab: int) -> list[int]:
    """The ids min_new_tokens holds back, as SGLang's min_new_tokens penalizer collects them (the
    request's stop token ids, the tokenizer's additional stop ids and its EOS id), less those
    outside ``[0, vocab)``: the target never emits them, so holding them back changes nothing,
    and a client may send any integer."""
    sp, tok = req.sampling_params, getattr(req, "tokenizer", None)
    ids = set(getattr(sp, "stop_token_ids", None) or ())
    ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
    eos = getattr(tok, "eos_token_id", None)
    if eos is not None:
        ids.add(eos)
    return sorted(i for i in {int(i) for i in ids} if 0 <= i < vocab)


def _finished(req) -> bool:
    finished = getattr(req, "finished", None)
    return bool(finished()) if callable(finished) else False


class PenaltyRows:
    """The penalty state of every request-pool row (R rows, V the logits' width).

    Allocated with the worker, before SGLang sizes the KV pool, so the pool is sized around it.
    Stop ids are held on the host, per row whose request has min_new_tokens, and reach the
    device per step for the step's rows only: a request with many stop ids costs its own rows,
    never every row's.
    """

    def __init__(self, rows: int, vocab: int, device):
        self.vocab = vocab
        self.counts = torch.zeros(rows, vocab, dtype=torch.int32, device=device)  # [R, V]
        self.lens = torch.zeros(rows, dtype=torch.int64, device=device)  # [R]
        self.frequency = torch.zeros(rows, dtype=torch.float32, device=device)  # [R]
        self.presence = torch.zeros(rows, dtype=torch.float32, device=device)  # [R]
        self.repetition = torch.ones(rows, dtype=torch.float32, device=device)  # [R]
        self.min_new_tokens = torch.zeros(rows, dtype=torch.int64, device=device)  # [R]
        # Host: the rows whose request has a penalty, as of each row's last prefill. A decode
        # step asks it per request (a set lookup) instead of reading sampling parameters.
        self.penalized: set[int] = set()
        # Host: row -> (request, [n] int64 stop ids) for rows whose request has
        # min_new_tokens > 0; a finished request's entry goes at the next prefill.
        self.stops: dict[int, tuple[object, torch.Tensor]] = {}
        # The stop table of a step without min_new_tokens rows, sliced (no launch a step).
        self._no_stops = torch.full((rows, 1), -1, dtype=torch.int64, device=device)  # [R, 1]

    @property
    def rows(self) -> int:
        return int(self.counts.shape[0])

    def nbytes(self) -> int:
        """Device bytes held (the counts, [R, V] int32, are nearly all of it)."""
        held = (self.counts, self.lens, self.frequency, self.presence, self.repetition,
                self.min_new_tokens, self._no_stops)  # fmt: skip
        return sum(t.numel() * t.element_size() for t in held)

    def reset(
        self,
        pool_rows: list[int],  # host: the prefill batch's request-pool rows
        reqs: list,  # its requests, in that order
        first_tokens: torch.Tensor,  # [n] int, the token the prefill sampled per request
    ) -> None:
        """A prefill batch: its penalized rows, and rows a penalized request left, restart from
        their requests' parameters and one emitted token (a row that stays neutral has nothing
        to restart: neutral parameters ignore the counts). One host-to-device copy of their
        parameters; the counts stay on the device."""
        assert len(pool_rows) == len(reqs) == first_tokens.shape[0]
        assert max(pool_rows, default=-1) < self.rows, (
            f"request-pool row {max(pool_rows)} beyond the {self.rows} penalty rows"
        )
        for row, (req, _) in list(self.stops.items()):
            if _finished(req):
                del self.stops[row]
        restart = []
        for i, (row, req) in enumerate(zip(pool_rows, reqs)):
            penalized = has_penalties(req.sampling_params)
            if penalized or row in self.penalized:
                restart.append(i)
            (self.penalized.add if penalized else self.penalized.discard)(row)
            ids = stop_ids(req, self.vocab)
            if int(getattr(req.sampling_params, "min_new_tokens", 0) or 0) > 0 and ids:
                self.stops[row] = (req, torch.tensor(ids, dtype=torch.int64))
            else:
                self.stops.pop(row, None)
        if not restart:
            return
        device = self.counts.device
        params = torch.tensor(
            [
                [
                    float(getattr(sp, "frequency_penalty", 0.0) or 0.0),
                    float(getattr(sp, "presence_penalty", 0.0) or 0.0),
                    float(getattr(sp, "repetition_penalty", 1.0) or 1.0),
                    float(getattr(sp, "min_new_tokens", 0) or 0),
                ]
                for sp in (reqs[i].sampling_params for i in restart)
            ],
            dtype=torch.float32,
        ).to(device, non_blocking=True)
        rows = torch.tensor([pool_rows[i] for i in restart], dtype=torch.int64)
        rows = rows.to(device, non_blocking=True)
        self.frequency[rows] = params[:, 0]
        self.presence[rows] = params[:, 1]
        self.repetition[rows] = params[:, 2]
        self.min_new_tokens[rows] = params[:, 3].to(torch.int64)
        self.counts[rows] = 0
        self.lens[rows] = 0
        picked = torch.tensor(restart, dtype=torch.int64).to(first_tokens.device, non_blocking=True)
        self.record(rows, first_tokens.view(-1)[picked].view(-1, 1))

    def stop_table(self, pool_rows: list[int] | None, bs: int) -> torch.Tensor:
        """``[bs, S]`` int64 stop ids of a step's rows (host ``pool_rows``, in batch order),
        -1 padded, S >= 1 the most any of them holds; one copy from pinned memory."""
        device = self.counts.device
        held = [self.stops.get(r) for r in pool_rows] if pool_rows is not None else []
        if not any(h is not None for h in held):
            return self._no_stops[:bs]
        assert len(held) == bs, "one host row per request"
        empty = torch.empty(0, dtype=torch.int64)
        table = torch.nn.utils.rnn.pad_sequence(
            [empty if h is None else h[1] for h in held], batch_first=True, padding_value=-1
        )
        if device.type == "cuda":
            table = table.pin_memory()
        return table.to(device, non_blocking=True)

    def gather(
        self,
        pool_idx: torch.Tensor,  # [bs] int, SGLang's req_pool_indices
        pool_rows: list[int] | None = None,  # host: the same rows (their stop ids); None: none
    ) -> RequestPenalties:
        """The state of a decode batch's rows."""
        rows = pool_idx.to(torch.int64)
        return RequestPenalties(
            output_counts=self.counts[rows],
            output_lens=self.lens[rows],
            frequency_penalty=self.frequency[rows],
            presence_penalty=self.presence[rows],
            repetition_penalty=self.repetition[rows],
            min_new_tokens=self.min_new_tokens[rows],
            stop_token_ids=self.stop_table(pool_rows, int(rows.shape[0])),
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
