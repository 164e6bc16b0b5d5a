"""Logprobs (``return_logprob``, ``top_logprobs_num``, ``token_ids_logprob``) for DDTREE requests,
as SGLang's non-speculative server reports them.

- **Prefill.** The prompt's logprobs and the first token's come from the target worker, as
  without speculation. SGLang's DFLASH worker, whose prefill DDTREE runs, refuses every batch
  that asks for logprobs at its door although its prefill needs nothing else: `prefill_with_logprobs`
  runs it on a copy of the batch without the flag while the target worker gets the batch itself.
- **Decode step.** Committed token j of request i is reported from its predicting node's row
  (`core.logprobs.predicting_rows`: the processed verify logits and the sampler's temperature
  rule); SGLang's own output logprob processor turns the ``bs * S`` rows into the token
  logprobs, the top-n and the requested ids' logprobs. SGLang's scheduler reads a speculative
  batch's logprobs as ``next_token_logprobs[i][j]`` and its top-n and ids at row ``i * S + j``
  (``process_batch_result_decode``), which is this layout.
"""

from __future__ import annotations

import copy

import torch

from sglang_ddtree.core.logprobs import predicting_rows


def write_step_logprobs(
    logits_output,  # SGLang's LogitsProcessorOutput of the verify: the fields are set on it
    processor,  # SGLang's OutputLogprobProcessor (``compute_logprobs``)
    logits: torch.Tensor,  # [bs * W, V] float, processed logits at every tree node
    keep_nodes: torch.Tensor,  # [bs, S] int64, CommitPlan.keep_nodes: predicting nodes, -1 pad
    next_token_ids: torch.Tensor,  # [bs * S] int64, CommitPlan.next_token_ids (pads 0)
    temperatures: torch.Tensor,  # [bs] or [bs, 1] float32, the sampling info's
    all_greedy: bool,  # SamplingBatchInfo.is_all_greedy
    top_logprobs_nums: list[int] | None,  # per request; None: none asked
    token_ids_logprobs: list | None,  # per request, a list of ids or None
    before_temperature: bool = False,  # SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB
) -> None:
    """The committed tokens' logprobs onto ``logits_output`` (module docstring). No host
    synchronization."""
    bs, s = keep_nodes.shape
    assert logits.dim() == 2 and logits.shape[0] % bs == 0, "logits must be [bs * W, V]"
    assert next_token_ids.shape == (bs * s,), "next_token_ids must be [bs * S]"
    w = logits.shape[0] // bs
    rows = predicting_rows(
        logits.view(bs, w, -1),
        keep_nodes,
        temperatures.view(-1).float(),
        all_greedy,
        before_temperature,
    ).view(bs * s, -1)
    top = [int(n) for n in (top_logprobs_nums or [0] * bs) for _ in range(s)]
    ids = [t for t in (token_ids_logprobs or [None] * bs) for _ in range(s)]
    result = processor.compute_logprobs(rows, top, ids, next_token_ids.to(torch.int64))
    result.write_output_to(logits_output)
    logits_output.next_token_logprobs = logits_output.next_token_logprobs.view(bs, s)


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
