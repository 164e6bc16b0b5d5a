"""The log-normalizers of `core.logprobs.predicting_normalizers` as one Triton kernel.

``row_max_log_sum(logits, rows, scale)``: for each ``r``, with ``y = logits[rows[r]] / scale[r]``
in float32, ``max(y)`` and ``log(sum(exp(y - max(y))))``.

Why: a step's logprobs need one normalizer per committed token's predicting row, ``bs * S`` rows
of the whole vocabulary; written in torch (gather, divide, max, exp, sum) that is several passes
over ``[bs * S, V]`` float32 with temporaries of that shape: at bs 32 x S 16 rows of Qwen3's
151,936 tokens, 311 MB a pass. One program per row here reads its row once, in place in the
verify's logits (no gather), keeping a running max and sum per lane.

Exactness: the division is IEEE's (as the sampler's ``div_``), the max is exact; the sum is taken
in another order than torch's, so the log-sum may differ from torch's in its last float32 bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DEFAULT_BLOCK = 2048  # logits per loop iteration


@triton.jit
def _row_max_log_sum_kernel(
    logits_ptr,  # [N, V] float, last dim contiguous
    rows_ptr,  # [R] int64, the row of logits each program reads
    scale_ptr,  # [R] float32 > 0
    max_ptr,  # [R] float32, out
    log_sum_ptr,  # [R] float32, out
    stride_row,
    V,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    row = logits_ptr + tl.load(rows_ptr + r).to(tl.int64) * stride_row
    scale = tl.load(scale_ptr + r)
    lane = tl.arange(0, BLOCK)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + lane
        x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        y = tl.math.div_rn(x, scale)
        new_max = tl.maximum(run_max, y)
        seen = new_max > float("-inf")  # a lane with only -inf so far keeps a zero sum
        shift = tl.where(seen, new_max, 0.0)
        run_sum = run_sum * tl.exp(tl.where(seen, run_max - shift, 0.0)) + tl.exp(y - shift)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    lane_sum = tl.where(run_max > float("-inf"), run_sum * tl.exp(run_max - row_max), 0.0)
    tl.store(max_ptr + r, row_max)
    tl.store(log_sum_ptr + r, tl.log(tl.sum(lane_sum, axis=0)))


def row_max_log_sum(
    logits: torch.Tensor,  # [N, V] float, last dim contiguous
    rows: torch.Tensor,  # [R] int64 in [0, N)
    scale: torch.Tensor,  # [R] float32 > 0
    *,
    block: int = DEFAULT_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([R] float32 max, [R] float32 log-sum) of ``logits[rows] / scale`` (module docstring).
    Every row needs one finite logit. Shapes fixed by (R, V): capturable in a CUDA graph."""
    assert logits.dim() == 2 and logits.is_floating_point() and logits.stride(-1) == 1, (
        "logits must be [N, V] float, V contiguous"
    )
    assert rows.dim() == 1 and scale.shape == rows.shape, "rows and scale must be [R]"
    out_max = torch.empty(rows.shape, dtype=torch.float32, device=logits.device)
    out_log_sum = torch.empty_like(out_max)
    if rows.numel() == 0:
        return out_max, out_log_sum
    _row_max_log_sum_kernel[(rows.shape[0],)](
        logits,
        rows.to(torch.int64).contiguous(),
        scale.float().contiguous(),
        out_max,
        out_log_sum,
        logits.stride(0),
        logits.shape[1],
        BLOCK=block,
    )
    return out_max, out_log_sum
