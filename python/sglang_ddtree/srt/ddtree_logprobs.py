"""Logprobs (``return_logprob``, ``top_logprobs_num``, ``token_ids_logprob``) for DDTREE requests,
as SGLang's non-speculative server reports them.

- **Prefill.** The prompt's logprobs and the first token's come from the target worker, as
  without speculation. SGLang's DFLASH worker, whose prefill DDTREE runs, refuses every batch
  that asks for logprobs at its door although its prefill needs nothing else: `prefill_with_logprobs`
  runs it on a copy of the batch without the flag while the target worker gets the batch itself.
- **Decode step.** Committed token j of request i is reported from its predicting node's row
  of the processed verify logits, by the sampler's temperature rule: one normalizer per row
  (`core.logprobs.predicting_normalizers`), then the committed token's, the top-n's and the
  requested ids' logprobs from their logits alone (`core.logprobs.logprobs_at`); no
  ``[bs * S, V]`` tensor is written (the top-n reads the rows' logits in place, or gathers
  at most ``[bs, V]`` at a time, as much as the non-speculative sampler's logprobs).
  SGLang's scheduler reads a speculative batch's logprobs as ``next_token_logprobs[i][j]`` and
  its top-n and ids at row ``i * S + j`` (``process_batch_result_decode``), which is this layout.
- **To the host.** The scheduler turns each top-n or ids entry into a list with ``.tolist()``
  once the step's outputs are on the host, and copies an entry that is a device tensor on its
  own. SGLang's output logprob processor gives each row its own device tensor: 2 x bs x S
  small copies and conversions a step, which a speculative step's S rows a request make a
  host cost that grows with the batch. Here each field's rows travel in one copy to pinned
  host memory (`HostRows`), and its entries read that copy.
"""

from __future__ import annotations

import copy

import torch

from sglang_ddtree.core.logprobs import logprobs_at, predicting_normalizers, top_logprobs


def write_step_logprobs(
    logits_output,  # SGLang's LogitsProcessorOutput of the verify: the fields are set on it
    logits: torch.Tensor,  # [bs * W, V] float, processed logits at every tree node
    keep_nodes: torch.Tensor,  # [bs, S] int64, CommitPlan.keep_nodes: predicting nodes, -1 pad
    next_token_ids: torch.Tensor,  # [bs * S] int64, CommitPlan.next_token_ids (pads 0)
    temperatures: torch.Tensor,  # [bs] or [bs, 1] float32, the sampling info's
    all_greedy: bool,  # SamplingBatchInfo.is_all_greedy
    top_logprobs_nums: list[int] | None,  # per request; None: none asked
    token_ids_logprobs: list | None,  # per request, a list of ids or None
    before_temperature: bool = False,  # SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB
) -> None:
    """The committed tokens' logprobs onto ``logits_output``, in the fields and layout SGLang's
    ``LogprobResult.write_output_to`` fills (module docstring). No host synchronization."""
    bs, s = keep_nodes.shape
    assert logits.dim() == 2 and logits.shape[0] % bs == 0, "logits must be [bs * W, V]"
    assert next_token_ids.shape == (bs * s,), "next_token_ids must be [bs * S]"
    norm = predicting_normalizers(
        logits, keep_nodes, temperatures.view(-1), all_greedy, before_temperature
    )
    tokens = next_token_ids.to(torch.int64)
    token_logprobs = logprobs_at(norm, logits[norm.rows, tokens][:, None])
    logits_output.next_token_logprobs = token_logprobs.view(bs, s)
    top = [int(n) for n in (top_logprobs_nums or [0] * bs) for _ in range(s)]
    ids = [t for t in (token_ids_logprobs or [None] * bs) for _ in range(s)]
    if any(top):
        values, indices = top_logprobs(logits, norm, max(top), chunk_rows=bs)
        logits_output.next_token_top_logprobs_val = HostRows(values, top).entries
        logits_output.next_token_top_logprobs_idx = HostRows(indices, top).entries
    if any(t is not None for t in ids):
        width = max(len(t) for t in ids if t is not None)
        padded = [list(t) + [0] * (width - len(t)) if t else [0] * width for t in ids]
        # Pinned: a copy from pageable memory would wait for the stream.
        index = torch.tensor(padded, dtype=torch.int64, pin_memory=logits.is_cuda)
        index = index.to(logits.device, non_blocking=True)
        counts = [0 if t is None else len(t) for t in ids]
        values = logprobs_at(norm, logits[norm.rows[:, None], index])
        logits_output.next_token_token_ids_logprobs_val = HostRows(values, counts).entries
        logits_output.next_token_token_ids_logprobs_idx = [[] if t is None else t for t in ids]


class HostRows:
    """The rows of a ``[R, n]`` device tensor, copied to pinned host memory in one transfer;
    ``entries[r].tolist()`` is row ``r``'s first ``counts[r]`` values, read once the copy has
    completed. The entries are not tensors, so SGLang's ``copy_to_cpu`` passes them through.
    No host synchronization before the first ``tolist()``."""

    def __init__(self, rows: torch.Tensor, counts: list[int]):  # rows: [R, n]
        assert rows.dim() == 2 and rows.shape[0] == len(counts), "rows must be [len(counts), n]"
        self._host = torch.empty(
            rows.shape, dtype=rows.dtype, device="cpu", pin_memory=rows.is_cuda
        )
        self._host.copy_(rows, non_blocking=True)
        self._copied = None
        if rows.is_cuda:
            self._copied = torch.cuda.Event()
            self._copied.record()
        self._rows = rows  # the copy's source stays alive until it is read
        self._lists = None
        self.entries = [_HostRow(self, r, k) for r, k in enumerate(counts)]

    def lists(self) -> list:
        if self._lists is None:
            if self._copied is not None:
                self._copied.synchronize()
            self._lists = self._host.tolist()
            self._rows = None
        return self._lists


class _HostRow:
    __slots__ = ("_table", "_row", "_count")

    def __init__(self, table: HostRows, row: int, count: int):
        self._table, self._row, self._count = table, row, count

    def tolist(self) -> list:
        return self._table.lists()[self._row][: self._count]


def prefill_with_logprobs(run_prefill, target_worker, batch):
    """``run_prefill(b)`` (the DFLASH worker's forward) on a shallow copy of ``batch`` whose
    ``return_logprob`` is False, with ``target_worker.forward_batch_generation`` handed
    ``batch`` itself in place of the copy for the length of the call: the target computes the
    logprobs the batch asks for, as in a non-speculative prefill. Returns what ``run_prefill``
    returns."""
    quiet = copy.copy(batch)
    quiet.return_logprob = False
    name = "forward_batch_generation"
    own = vars(target_worker).get(name)  # an instance attribute to put back, if any
    forward = getattr(target_worker, name)

    def forward_the_batch(b, *args, **kwargs):
        return forward(batch if b is quiet else b, *args, **kwargs)

    setattr(target_worker, name, forward_the_batch)
    try:
        return run_prefill(quiet)
    finally:
        if own is None:
            delattr(target_worker, name)
        else:
            setattr(target_worker, name, own)
