"""SGLang's request penalties at every node of a verify tree: frequency, presence, repetition and
min_new_tokens, exact per node, batched, with no host synchronization.

Terms (see also `sglang_ddtree.core.tree`, `.layout` and `.accept`):

- **emitted tokens.** What a request has generated so far, prompt excluded, up to and including
  the root. The root is the previous step's bonus token (on the first decode step, the token
  the prefill sampled): already emitted, only its KV is missing. ``output_counts`` counts the
  emitted tokens per id, ``output_lens`` their number.
- **path of node v.** The draft nodes from the root down to ``v``, ``v`` included, the root
  excluded: ``depth(v)`` nodes. The target's logits at ``v`` predict the token after ``v``, so
  the tokens generated before that token are the emitted tokens followed by the path's tokens.
- **count at v.** ``count_v(x) = output_counts[x] + #{u on the path of v : token(u) = x}``; a
  token both emitted and on the path counts once per occurrence.
- **stop ids.** The tokens min_new_tokens holds back: the request's ``stop_token_ids``, the
  tokenizer's additional stop ids and its EOS id (SGLang's min_new_tokens penalizer's set).

The law at node ``v`` of request ``b`` is the one SGLang's non-speculative decode step applies
after the same generated tokens (``sglang.srt.sampling.penaltylib`` through
``SamplingBatchInfo.apply_logits_bias``: the additive penalties summed first, then the
scaling one, all before the grammar mask, ``logit_bias`` and the temperature):

    seen     = count_v(x) > 0
    additive = -frequency_penalty * count_v(x) - presence_penalty  where seen, else 0
    l        = logit + additive                        (rounded to the logits' dtype)
    scale    = repetition_penalty  where seen, else 1
    l        = l * scale if l < 0 else l / scale       (rounded to the logits' dtype)
    l        = -inf at every stop id if output_lens + depth(v) < min_new_tokens

- SGLang's penalizers count generated tokens only: their counters are fed output tokens, never
  the prompt. That holds for the repetition penalty too (unlike Hugging Face's or vLLM's).
- min_new_tokens: SGLang holds the stop ids back while fewer than ``min_new_tokens`` generated
  tokens precede the one being sampled. At ``v`` that number is ``output_lens + depth(v)``
  (the root is among ``output_lens``): with 3 tokens emitted and min_new_tokens 5, depths 0
  and 1 hold the stop ids back, depths 2 and below do not.
- Floating point: SGLang adds ``frequency_penalty`` to a float32 counter once per occurrence;
  here it is one product ``frequency_penalty * count``. The two are equal for counts up to 5
  (checked on 10**5 random penalties) and differ by float32 rounding beyond (relative ~ count
  * 2**-24). Penalties at their neutral
  values (0, 0, 1, min_new_tokens 0) return the logits bit for bit (an unseen token gets
  ``+ -0.0`` and ``/ 1``). A banned stop id is ``-inf`` for every finite logit (SGLang adds
  ``-inf``, which turns a ``+inf`` logit into NaN).

Cost: one dense pass over the ``[bs, W, V]`` logits for the emitted tokens (SGLang's own
per-row work; it holds one float and one bool buffer of that shape, plus the output unless
``inplace``; on CUDA `penalties_triton` instead, which reads the logits only in the
vocabulary blocks that hold an emitted token), then only the cells the path touches,
``[bs, W, W]`` (each node's row is recomputed at the W node tokens, where the counts include
the path), and the stop ids' cells, ``bs x W x T`` writes from ``[bs, W]`` and ``[bs, T]``
tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RequestPenalties(NamedTuple):
    """Per-request penalty state at the start of a decode step (T = stop ids per request).

    output_counts:      [bs, V] int32. Emitted tokens per id, root included.
    output_lens:        [bs] int64. Emitted tokens, root included.
    frequency_penalty:  [bs] float32. 0 = off.
    presence_penalty:   [bs] float32. 0 = off.
    repetition_penalty: [bs] float32, > 0. 1 = off.
    min_new_tokens:     [bs] int64. 0 = off.
    stop_token_ids:     [bs, T] int64. Stop ids held back by min_new_tokens; -1 padded, T >= 1.
    """

    output_counts: torch.Tensor
    output_lens: torch.Tensor
    frequency_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    repetition_penalty: torch.Tensor
    min_new_tokens: torch.Tensor
    stop_token_ids: torch.Tensor


def _check(penalties: RequestPenalties, bs: int, vocab: int) -> None:
    p = penalties
    assert p.output_counts.shape == (bs, vocab), "output_counts must be [bs, V]"
    assert not p.output_counts.is_floating_point(), "output_counts are integer counts"
    for name in ("output_lens", "frequency_penalty", "presence_penalty"):
        assert getattr(p, name).shape == (bs,), f"{name} must be [bs]"
    assert p.repetition_penalty.shape == (bs,) and p.min_new_tokens.shape == (bs,)
    assert p.stop_token_ids.dim() == 2 and p.stop_token_ids.shape[0] == bs, "stop ids [bs, T]"
    assert p.stop_token_ids.shape[1] >= 1, "pad stop_token_ids to at least one column (-1)"


def _penalize_(
    logits: torch.Tensor,  # [..., n] float, overwritten
    counts: torch.Tensor,  # broadcastable to logits, int: count of each cell's token
    frequency: torch.Tensor,  # broadcastable, float32
    presence: torch.Tensor,  # broadcastable, float32
    repetition: torch.Tensor,  # broadcastable, float32
) -> torch.Tensor:
    """Frequency, presence and repetition penalties in place, in SGLang's order and dtypes.

    The one routine for both the dense pass and the path cells, so a cell's value does not
    depend on which of them wrote it.
    """
    seen = counts > 0
    # -0.0 off the seen tokens: x + -0.0 == x for every x, -0.0 included.
    additive = torch.where(seen, -(frequency * counts.float()) - presence, -0.0)
    scale = torch.where(seen, repetition, 1.0)
    logits.add_(additive)  # SGLang's `logits.add_(acc_additive_penalties)`: one rounding
    negative = logits < 0
    divided = (logits / scale).to(logits.dtype)  # computed in float32, rounded once
    logits.mul_(scale)
    return torch.where(negative, logits, divided, out=logits)


def apply_tree_penalties(
    logits: torch.Tensor,  # [bs, W, V] float, target logits at every node
    node_tokens: torch.Tensor,  # [bs, W] int64, slot 0 = root; ids in [0, V)
    tree_mask: torch.Tensor,  # [bs, W, W] bool, ancestor-or-self (TreeLayout.tree_mask)
    penalties: RequestPenalties,
    inplace: bool = False,
) -> torch.Tensor:
    """Logits [bs, W, V] with each request's penalties applied at every node (module docstring).

    Depths come from ``tree_mask`` (ancestors-or-self minus one; 0 at the root and at padded
    slots, which get the root's law). With ``inplace`` the logits are overwritten and returned.
    Every shape depends on (bs, W, V, T) only; no host synchronization.
    """
    assert logits.dim() == 3 and logits.is_floating_point(), "logits must be [bs, W, V] float"
    bs, w, vocab = logits.shape
    assert node_tokens.shape == (bs, w), "node_tokens must be [bs, W]"
    assert tree_mask.shape == (bs, w, w) and tree_mask.dtype == torch.bool, "tree_mask [bs,W,W]"
    _check(penalties, bs, vocab)
    p = penalties
    tokens = node_tokens.to(torch.int64)
    frequency = p.frequency_penalty.float()[:, None, None]
    presence = p.presence_penalty.float()[:, None, None]
    repetition = p.repetition_penalty.float()[:, None, None]

    # The path of v: ancestors-or-self u of v that are draft nodes (depth >= 1).
    depth = tree_mask.sum(-1) - 1  # [bs, W]
    on_path = tree_mask & (depth >= 1)[:, None, :]  # [bs, W(v), W(u)]
    same_token = tokens[:, :, None] == tokens[:, None, :]  # [bs, W(u'), W(u)]
    # path_count[b, v, u]: occurrences of token(u) on v's path. 0/1 products summed to at most
    # W: exact in float32 (and in TF32).
    path_count = torch.bmm(on_path.float(), same_token.float()).to(torch.int64)
    emitted_count = p.output_counts.gather(1, tokens).to(torch.int64)  # [bs, W(u)]
    node_count = emitted_count[:, None, :] + path_count  # [bs, W(v), W(u)]: count_v(token(u))

    # Every node's row at the W node tokens, from the unpenalized logits. Cells of equal tokens
    # get equal values, so the scatter below is deterministic whatever its write order.
    cells = tokens[:, None, :].expand(bs, w, w)  # [bs, W(v), W(u)]: token(u) in v's row
    path_values = _penalize_(logits.gather(2, cells), node_count, frequency, presence, repetition)

    out = logits if inplace else logits.clone()
    # The emitted tokens' penalties, the same for every node of a request: on CUDA one kernel
    # that touches only the vocabulary blocks holding an emitted token (the same values).
    if out.is_cuda and out.stride(-1) == 1 and p.output_counts.stride(-1) == 1:
        from sglang_ddtree.core.penalties_triton import penalize_emitted_

        penalize_emitted_(
            out, p.output_counts, *(t[:, 0, 0] for t in (frequency, presence, repetition))
        )
    else:
        _penalize_(out, p.output_counts[:, None, :], frequency, presence, repetition)
    out.scatter_(2, cells, path_values)

    # min_new_tokens: stop ids to -inf where fewer than min_new_tokens tokens precede. Memory
    # O(bs x (W + T)): one min-scatter with broadcast index and source, no [bs, W, T] tensor.
    banned = p.output_lens.to(torch.int64)[:, None] + depth < p.min_new_tokens[:, None]  # [bs, W]
    stop_ids = p.stop_token_ids.to(torch.int64)
    valid = stop_ids >= 0  # [bs, T]
    # Pads point at the row's first stop id, so every write to a cell writes the same value; a
    # row without stop ids holds nothing back.
    first = stop_ids.gather(1, valid.to(torch.int8).argmax(1, keepdim=True))  # [bs, 1]
    stop_cells = torch.where(valid, stop_ids, first).clamp(min=0)  # [bs, T]
    held_back = banned & valid.any(1, keepdim=True)  # [bs, W]
    fill = torch.where(held_back, float("-inf"), float("inf")).to(out.dtype)  # min(x, +inf) = x
    s = stop_cells.shape[1]
    out.scatter_reduce_(
        2, stop_cells[:, None, :].expand(bs, w, s), fill[:, :, None].expand(bs, w, s), "amin"
    )
    return out


def count_emitted(
    penalties: RequestPenalties,
    out_tokens: torch.Tensor,  # [bs, S] int64, CommitPlan.out_tokens: emitted, -1 padded
) -> RequestPenalties:
    """The state after a step: ``out_tokens`` added to ``output_counts`` and ``output_lens``.

    A step emits its accepted draft tokens and its bonus, which is the next step's root, so the
    result is the next step's state. No host synchronization.
    """
    p = penalties
    bs = p.output_lens.shape[0]
    assert out_tokens.dim() == 2 and out_tokens.shape[0] == bs, "out_tokens must be [bs, S]"
    emitted = out_tokens >= 0
    counts = p.output_counts.scatter_add(
        1, out_tokens.to(torch.int64).clamp(min=0), emitted.to(p.output_counts.dtype)
    )
    lens = p.output_lens + emitted.sum(1).to(p.output_lens.dtype)
    return p._replace(output_counts=counts, output_lens=lens)
