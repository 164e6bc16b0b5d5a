"""Per-token logprobs of a step's committed tokens, from the verify logits: the numbers SGLang's
non-speculative server reports for the same tokens (``return_logprob``, ``top_logprobs_num``).

Terms (see also `sglang_ddtree.core.accept` and `.commit`):

- **committed tokens.** ``CommitPlan.out_tokens``: the accepted draft tokens, then the bonus.
- **predicting node.** The node whose logits predict a committed token: for token ``j`` the
  ``j``-th node of the accepted path, ``CommitPlan.keep_nodes[:, j]`` (the root for the first
  token, the last accepted node for the bonus). Its logits were computed after exactly the
  tokens the non-speculative server had generated before that token.
- **processed logits.** The logits SGLang's sampler receives: penalties, grammar mask and
  ``logit_bias`` applied (``SamplingBatchInfo.apply_logits_bias``), no temperature; for a
  verify tree, `sglang_ddtree.core.penalties.apply_tree_penalties`'s output.

What SGLang's sampler reports (``Sampler.forward``, then ``OutputLogprobProcessor``), per batch:

- a batch with a sampled request (not ``is_all_greedy``): ``log(softmax(processed / T))`` in
  float32, the log of the probabilities it samples from before top-k / top-p / min-p: the
  filters never change a reported logprob;
- an all-greedy batch: ``log_softmax(processed)``, no temperature (a greedy request's
  temperature is 1 unless it asked for top_k 1 with another temperature);
- with the environment variable ``SGLANG_RETURN_ORIGINAL_LOGPROB``: ``log_softmax(processed)``
  for every batch (the temperature left out, the penalties and biases not).

Then ``-inf`` is clamped to the float32 minimum, and the top ``n`` come from ``torch.topk`` of
the whole row (per request SGLang keeps the first ``top_logprobs_num`` of the batch's largest).

Two readings of these numbers: `committed_logprobs` normalizes each predicting row as the
sampler does (the reference, bit for bit SGLang's arithmetic on the CPU); a serving step uses
`predicting_normalizers`, one max and log-sum per predicting row (``row_max``, ``log_sum``),
read in place in the verify's logits by `logprobs_triton` on CUDA, and `logprobs_at` for the
tokens it reports: ``(x / T - row_max) - log_sum``, the same numbers up to float32 rounding
without a ``[bs * S, V]`` float32 row ever being written.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

FLOAT32_MIN = torch.finfo(torch.float32).min
# Below float32's smallest normal, 2**-126, a probability keeps fewer bits, and at or below
# 2**-150 it is 0: a sampled batch reports the log of that rounded probability (of 0: the float32
# minimum, after the clamp), where the log-softmax reading gives the exact value.
LOG_SMALLEST_NORMAL = -126 * math.log(2.0)
# The largest top-n `top_logprobs` takes through the Triton top-K (its K rounds grow with n).
TRITON_TOP_N = 32


class CommittedLogprobs(NamedTuple):
    """Logprobs of a step's committed tokens (S = commit width, n = top count).

    token_logprobs: [bs, S] float32. Logprob of each committed token; 0 at pads.
    top_ids:        [bs, S, n] int64. The n most probable tokens at its predicting node,
                    in decreasing logprob; -1 at pads.
    top_logprobs:   [bs, S, n] float32. Their logprobs; 0 at pads.
    """

    token_logprobs: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


def node_logprobs(
    logits: torch.Tensor,  # [..., V] float, processed logits
    temperature: torch.Tensor,  # broadcastable to logits[..., :1], float32 > 0
    all_greedy: bool,
    before_temperature: bool = False,
) -> torch.Tensor:
    """[..., V] float32: SGLang's reported logprobs of each row (module docstring), ``-inf``
    clamped. ``all_greedy``: SGLang's ``is_all_greedy`` for the batch; ``before_temperature``:
    ``SGLANG_RETURN_ORIGINAL_LOGPROB``."""
    x = logits.float()
    if all_greedy or before_temperature:
        out = torch.log_softmax(x, dim=-1)
    else:
        # As the sampler: divide, softmax, log (not log_softmax: a probability that underflows
        # to 0 reports the float32 minimum, not a finite tail value).
        out = torch.log(torch.softmax(x / temperature.float(), dim=-1))
    return out.clamp_(min=FLOAT32_MIN)


def predicting_rows(
    logits: torch.Tensor,  # [bs, W, V] float, processed logits at every tree node
    keep_nodes: torch.Tensor,  # [bs, S] int64, predicting node of each committed token; -1 pad
    temperature: torch.Tensor,  # [bs] float32 > 0
    all_greedy: bool = False,
    before_temperature: bool = False,
) -> torch.Tensor:
    """[bs, S, V] float32: the reported logprobs (`node_logprobs`) of each committed token's
    predicting node; a pad reads the root's row. Only these S rows of a request are
    normalized. No host synchronization."""
    bs, w, vocab = logits.shape
    s = keep_nodes.shape[1]
    nodes = keep_nodes.to(torch.int64).clamp(0, w - 1)
    rows = logits.gather(1, nodes[:, :, None].expand(bs, s, vocab))  # [bs, S, V]
    return node_logprobs(rows, temperature[:, None, None], all_greedy, before_temperature)


def committed_logprobs(
    logits: torch.Tensor,  # [bs, W, V] float, processed logits at every tree node
    keep_nodes: torch.Tensor,  # [bs, S] int64, predicting node of each committed token; -1 pad
    out_tokens: torch.Tensor,  # [bs, S] int64, committed tokens; -1 pad
    temperature: torch.Tensor,  # [bs] float32 > 0
    top_n: int,
    all_greedy: bool = False,
    before_temperature: bool = False,
) -> CommittedLogprobs:
    """Each committed token's logprob and the ``top_n`` (ids, logprobs) at its predicting node,
    as SGLang's non-speculative server reports them (module docstring).

    ``keep_nodes`` and ``out_tokens`` are `CommitPlan`'s: token ``j`` is predicted by node
    ``keep_nodes[:, j]`` (slot within the request, root first). ``top_n`` (host int): the
    batch's largest ``top_logprobs_num``; 0 gives empty top tensors. ``all_greedy`` /
    ``before_temperature``: `node_logprobs`. Only the S predicting rows of each request are
    normalized (``[bs, S, V]`` float32 at the peak); no host synchronization.
    """
    assert logits.dim() == 3 and logits.is_floating_point(), "logits must be [bs, W, V] float"
    bs, w, vocab = logits.shape
    assert keep_nodes.dim() == 2 and keep_nodes.shape[0] == bs, "keep_nodes must be [bs, S]"
    assert out_tokens.shape == keep_nodes.shape, "out_tokens must be [bs, S] like keep_nodes"
    assert temperature.shape == (bs,), "temperature must be [bs]"
    assert 0 <= top_n <= vocab, (top_n, vocab)
    present = (keep_nodes >= 0) & (out_tokens >= 0)  # [bs, S]
    logprobs = predicting_rows(logits, keep_nodes, temperature, all_greedy, before_temperature)
    tokens = out_tokens.to(torch.int64).clamp(0, vocab - 1)
    token_logprobs = logprobs.gather(2, tokens[:, :, None])[:, :, 0]
    top_logprobs, top_ids = torch.topk(logprobs, top_n, dim=-1)
    return CommittedLogprobs(
        token_logprobs=torch.where(present, token_logprobs, 0.0),
        top_ids=torch.where(present[:, :, None], top_ids, -1),
        top_logprobs=torch.where(present[:, :, None], top_logprobs, 0.0),
    )


class PredictingNormalizers(NamedTuple):
    """The normalizer of each committed-token slot's predicting row (R = bs * S, slot
    ``r = i * S + j``): SGLang reports a token whose processed logit there is ``x`` as
    ``(x / scale - row_max) - log_sum`` (`logprobs_at`).

    rows:    [R] int64. The slot's row of the verify's ``[bs * W, V]`` logits; a pad reads its
             request's root.
    scale:   [R] float32. The request's temperature in a sampled batch, else 1.
    row_max: [R] float32. ``max(x / scale)`` over the row.
    log_sum: [R] float32. ``log(sum(exp(x / scale - row_max)))`` over the row.
    sampled: the sampler's ``log(softmax)``: a probability that underflows reports the float32
             minimum (``log_softmax`` elsewhere).
    """

    rows: torch.Tensor
    scale: torch.Tensor
    row_max: torch.Tensor
    log_sum: torch.Tensor
    sampled: bool


def predicting_normalizers(
    logits: torch.Tensor,  # [bs * W, V] float, processed logits at every tree node
    keep_nodes: torch.Tensor,  # [bs, S] int64, predicting node of each committed token; -1 pad
    temperature: torch.Tensor,  # [bs] or [bs, 1] float32 > 0
    all_greedy: bool = False,
    before_temperature: bool = False,
) -> PredictingNormalizers:
    """One normalizer per committed-token slot (`PredictingNormalizers`); ``all_greedy`` and
    ``before_temperature`` as `node_logprobs`. On CUDA one `logprobs_triton` program per row
    reads the logits in place; elsewhere torch on the gathered rows. No host synchronization."""
    bs, s = keep_nodes.shape
    assert logits.dim() == 2 and logits.shape[0] % bs == 0, "logits must be [bs * W, V]"
    w = logits.shape[0] // bs
    first = torch.arange(bs, device=keep_nodes.device, dtype=torch.int64)[:, None] * w
    rows = (first + keep_nodes.to(torch.int64).clamp(0, w - 1)).view(-1)
    sampled = not (all_greedy or before_temperature)
    if sampled:
        scale = temperature.float().view(bs, 1).expand(bs, s).reshape(-1)
    else:
        scale = torch.ones(bs * s, dtype=torch.float32, device=logits.device)
    if logits.is_cuda:
        from sglang_ddtree.core.logprobs_triton import row_max_log_sum

        row_max, log_sum = row_max_log_sum(logits, rows, scale)
    else:
        y = logits.index_select(0, rows).float() / scale[:, None]
        row_max = y.amax(dim=-1)
        log_sum = torch.log(torch.exp(y - row_max[:, None]).sum(dim=-1))
    return PredictingNormalizers(rows, scale, row_max, log_sum, sampled)


def logprobs_at(
    norm: PredictingNormalizers,
    values: torch.Tensor,  # [R, k] float, processed logits of k tokens at each slot's row
) -> torch.Tensor:
    """[R, k] float32: the logprobs SGLang reports for those tokens (module docstring), the
    underflow and ``-inf`` read as its clamp reads them."""
    shifted = values.float() / norm.scale[:, None] - norm.row_max[:, None]
    out = shifted - norm.log_sum[:, None]
    if norm.sampled:  # below the normals, the probability as the sampler's softmax rounds it
        prob = torch.exp(shifted) / torch.exp(norm.log_sum)[:, None]
        out = torch.where(out < LOG_SMALLEST_NORMAL, torch.log(prob), out)
    return out.clamp_(min=FLOAT32_MIN)


def top_logprobs(
    logits: torch.Tensor,  # [bs * W, V] float, the logits `predicting_normalizers` read
    norm: PredictingNormalizers,
    n: int,
    chunk_rows: int,  # slots gathered at a time by the torch path (bs: the sampler's [bs, V])
) -> tuple[torch.Tensor, torch.Tensor]:
    """([R, n] float32 logprobs, [R, n] int64 ids): each slot's ``n`` most probable tokens in
    decreasing order. The top of the row's logits (dividing by a positive temperature and
    subtracting the normalizer keep the order): on CUDA up to ``TRITON_TOP_N`` by
    `topk_triton.top_k_logits` on the rows in place (n rounded up to a power of two: few
    compiled variants), which reads each logit once where ``torch.topk``'s radix select passes
    over the rows several times; elsewhere ``torch.topk`` on ``chunk_rows`` gathered rows at a
    time, so no step holds a ``[R, V]`` copy (S times the non-speculative sampler's
    ``[bs, V]``)."""
    assert chunk_rows >= 1, "chunk_rows must be positive"
    if logits.is_cuda and n <= TRITON_TOP_N:
        from sglang_ddtree.core.topk_triton import top_k_logits

        k = min(1 << (n - 1).bit_length(), logits.shape[1])
        values, ids = top_k_logits(logits, k, row_index=norm.rows)
        values, ids = values[:, :n], ids[:, :n]
    else:
        tops = [
            logits.index_select(0, part).topk(n, dim=-1) for part in norm.rows.split(chunk_rows)
        ]
        values = torch.cat([t.values for t in tops])
        ids = torch.cat([t.indices for t in tops])
    return logprobs_at(norm, values), ids
