"""The emitted tokens' penalties over every node's logits as one Triton kernel (no host sync).

``penalize_emitted_(logits, counts, frequency, presence, repetition)`` equals
`core.penalties._penalize_` on ``logits [bs, W, V]`` with ``counts [bs, 1, V]`` (the penalties
every node of a request shares: its emitted tokens), bit for bit, in place.

Why: `core.penalties.apply_tree_penalties`' dense pass is elementwise torch, eight or nine
passes over ``[bs, W, V]`` (151,936 float32 logits a row on Qwen3: 311 MB at bs 32 x W 16, each
pass ~0.1 ms on an H200). But a token that was never emitted is left bit for bit as it is
(``x + -0.0``, ``/ 1``, ``* 1``), and a request emits far fewer tokens than the vocabulary
holds. So one program takes one request's ``BLOCK`` vocabulary ids and reads its counts
there once: where none is positive, or where the request's penalties are neutral, it stops;
elsewhere it rewrites the block in each of the request's W rows. Reads: the counts once per
request, and the logits only in blocks holding an emitted token.

Exactness: each value follows `_penalize_`'s operations and roundings: the additive part
``-(frequency * count) - presence`` in float32, added to the logit and rounded once to the
logits' dtype; then ``l * scale`` where that is negative, else ``l / scale`` (IEEE division,
``div_rn``), each computed in float32 and rounded once. The launch turns off floating-point
contraction (``enable_fp_fusion=False``) so that no multiply-add is fused into one rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DEFAULT_BLOCK = 1024  # vocabulary ids per program


@triton.jit
def _penalize_emitted_kernel(
    logits_ptr,  # [bs, W, V] float32 / bf16 / fp16, last dim contiguous; overwritten
    counts_ptr,  # [bs, V] int32 / int64, last dim contiguous
    frequency_ptr,  # [bs] float32
    presence_ptr,  # [bs] float32
    repetition_ptr,  # [bs] float32
    stride_lb,
    stride_lw,
    stride_cb,
    W,
    V,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < V
    count = tl.load(counts_ptr + b.to(tl.int64) * stride_cb + offs, mask=ok, other=0)
    frequency = tl.load(frequency_ptr + b)
    presence = tl.load(presence_ptr + b)
    repetition = tl.load(repetition_ptr + b)
    neutral = (frequency == 0.0) & (presence == 0.0) & (repetition == 1.0)
    seen = count > 0
    if (tl.max(seen.to(tl.int32), axis=0) > 0) & (neutral == 0):
        additive = tl.where(seen, -(frequency * count.to(tl.float32)) - presence, -0.0)
        scale = tl.where(seen, repetition, 1.0)
        request = logits_ptr + b.to(tl.int64) * stride_lb + offs
        for w in range(W):
            row = request + w * stride_lw
            x = tl.load(row, mask=ok, other=0.0)
            added = (x.to(tl.float32) + additive).to(x.dtype)  # one rounding, as add_
            a = added.to(tl.float32)
            times = (a * scale).to(x.dtype)
            over = tl.math.div_rn(a, scale).to(x.dtype)
            tl.store(row, tl.where(a < 0, times, over), mask=ok)


def penalize_emitted_(
    logits: torch.Tensor,  # [bs, W, V] float32 / bf16 / fp16, last dim contiguous; overwritten
    counts: torch.Tensor,  # [bs, V] int32 / int64: each request's emitted tokens per id
    frequency: torch.Tensor,  # [bs] float32
    presence: torch.Tensor,  # [bs] float32
    repetition: torch.Tensor,  # [bs] float32, > 0
    *,
    block: int = DEFAULT_BLOCK,
) -> torch.Tensor:
    """`core.penalties._penalize_(logits, counts[:, None, :], ...)` in place, bit for bit;
    returns ``logits``. Shapes fixed by (bs, W, V): capturable in a CUDA graph."""
    assert logits.dim() == 3 and logits.stride(-1) == 1, "logits must be [bs, W, V], V contiguous"
    bs, w, vocab = logits.shape
    assert counts.shape == (bs, vocab) and counts.stride(-1) == 1, "counts must be [bs, V]"
    assert not counts.is_floating_point(), "counts are integer counts"
    for t in (frequency, presence, repetition):
        assert t.shape == (bs,) and t.dtype == torch.float32, "penalties must be [bs] float32"
    if logits.numel() == 0:
        return logits
    grid = (bs, triton.cdiv(vocab, block))
    _penalize_emitted_kernel[grid](
        logits, counts, frequency.contiguous(), presence.contiguous(), repetition.contiguous(),
        logits.stride(0), logits.stride(1), counts.stride(0), w, vocab,
        BLOCK=block, enable_fp_fusion=False,
    )  # fmt: skip
    return logits
