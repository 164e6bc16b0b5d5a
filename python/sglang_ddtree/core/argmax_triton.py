"""Row-wise argmax of logits split across the GPU (Triton, no host sync).

``argmax_rows(x)`` equals ``torch.argmax(x, dim=-1)`` bit for bit on ``[R, V]`` float32, bf16
or fp16 logits: the first (lowest) index of the row's maximum; NaN ranks above everything, so
a row with a NaN gives its first NaN; ``-0.0 == +0.0`` (the first wins); an all ``-inf`` row
gives 0. The output is ``[R]`` int64.

Why: the greedy tree walk (`step.accept_and_commit`) takes the target's argmax at every tree
node, ``[bs * W, V]`` logits with few rows (16 to a few hundred) and a wide vocabulary
(151,936 on Qwen3). Reading those logits once is the whole cost: at an H200's ~3.5 TB/s,
65 rows of float32 (39.5 MB) take ~11 us, but with so few rows ``torch.argmax`` runs well
short of that (H200 profiles), and a kernel with one program per row would leave most of the
132 SMs idle. Here stage 1 splits every row into chunks, one program per (row, chunk) on a 1-D
grid (the chunks of a row consecutive; rows on grid axis 1 would cap R at 65,535): each keeps
a running max and its first index per lane over ``BLOCK``-wide vectorized loads, then reduces
the lanes to the chunk's (max, first index). Stage 2, one program per row, reduces the row's
``C`` chunk partials the same way; chunks are in vocabulary order, so the lowest index again
wins ties. The chunk size (`default_chunk`) is chosen from R and V so that the grid holds
about `TARGET_PROGRAMS` programs: several waves over the SMs at 16-128 rows, a handful of
chunks per row (small partials) at 1024 rows (the target, the block size and the warps are
reasoned starting points, not tuned). Both launches have shapes fixed by (R, V) and read
nothing on the host, so the function can be captured in a CUDA graph.
`step.target_argmax` (the greedy walk's argmax) takes it for CUDA logits of up to
`step.SPLIT_ARGMAX_MAX_ROWS` rows, torch's elsewhere (with hundreds of rows torch's own
reduction already runs at the memory bandwidth).

Comparisons run in float32 (bf16 and fp16 convert exactly, order and NaN preserved); NaN is
detected on the bits (exponent all ones, mantissa non-zero), independent of compiler
floating-point flags.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

DEFAULT_BLOCK = 2048  # logits per lane-vector load of a stage-1 loop iteration
MIN_CHUNK = 1024
TARGET_PROGRAMS = 1024  # ~8 programs per SM of an H200 (132 SMs)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_NO_INDEX = 2147483647  # int32 max: above every index of a row (V < 2^31)


@triton.jit
def _isnan(v):
    """NaN test on the float32 bits (exponent all ones, mantissa non-zero)."""
    return (v.to(tl.int32, bitcast=True) & 0x7FFFFFFF) > 0x7F800000


@triton.jit
def _first_argmax(v, i, NO_INDEX: tl.constexpr):
    """(max, its lowest index) over lanes ``v`` [N] float32 with indices ``i`` [N] int32: the
    lowest-index NaN if any (value NaN), else the lowest index whose value equals the max."""
    nan = _isnan(v)
    first_nan = tl.min(tl.where(nan, i, NO_INDEX), axis=0)
    clean = tl.where(nan, float("-inf"), v)
    m = tl.max(clean, axis=0)
    first = tl.min(tl.where(clean == m, i, NO_INDEX), axis=0)
    has_nan = first_nan != NO_INDEX
    return tl.where(has_nan, float("nan"), m), tl.where(has_nan, first_nan, first)


@triton.jit
def _chunk_argmax_kernel(
    x_ptr,  # [R, V] logits (float32 / bf16 / fp16), row stride `stride_row`, last dim contiguous
    val_ptr,  # [R, C] float32 out: the chunk's max (NaN if the chunk holds one)
    idx_ptr,  # [R, C] int32 out: the row index of its first occurrence
    stride_row,
    V,
    C,
    CHUNK: tl.constexpr,  # logits per chunk, a multiple of BLOCK
    BLOCK: tl.constexpr,
    NO_INDEX: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid // C
    c = pid % C
    row = x_ptr + r.to(tl.int64) * stride_row
    lane = tl.arange(0, BLOCK)
    start = c * CHUNK
    # Per lane: the running max and its first index. A lane starts at its first index with
    # -inf, so an all -inf chunk keeps the lowest index; lanes past V keep indices >= V, which
    # lose every tie to a real one (every chunk holds at least one index < V).
    acc_v = tl.full([BLOCK], float("-inf"), tl.float32)
    acc_i = start + lane
    for k in range(0, CHUNK, BLOCK):
        offs = start + k + lane
        x = tl.load(row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        # Strictly greater, or the lane's first NaN: a lane's indices only grow, so the
        # first index of its max (or first NaN) is kept.
        take = (x > acc_v) | (_isnan(x) & ~_isnan(acc_v))
        acc_v = tl.where(take, x, acc_v)
        acc_i = tl.where(take, offs, acc_i)
    m, i = _first_argmax(acc_v, acc_i, NO_INDEX)
    tl.store(val_ptr + pid, m)
    tl.store(idx_ptr + pid, i)


@triton.jit
def _row_argmax_kernel(
    val_ptr,  # [R, C] float32: chunk maxima from `_chunk_argmax_kernel`
    idx_ptr,  # [R, C] int32: their first indices
    out_ptr,  # [R] int64 out: the row's argmax
    C,
    CP: tl.constexpr,  # next power of two >= C
    NO_INDEX: tl.constexpr,
):
    r = tl.program_id(0)
    cc = tl.arange(0, CP)
    ok = cc < C
    v = tl.load(val_ptr + r * C + cc, mask=ok, other=float("-inf"))
    i = tl.load(idx_ptr + r * C + cc, mask=ok, other=NO_INDEX)
    _, first = _first_argmax(v, i, NO_INDEX)
    tl.store(out_ptr + r, first.to(tl.int64))


def default_chunk(rows: int, vocab: int) -> int:
    """The largest power of two >= `MIN_CHUNK` that still leaves about `TARGET_PROGRAMS`
    (row, chunk) programs, capped at the first power of two >= ``vocab`` (one chunk per row).
    V = 151,936: 16 rows -> 2048 (75 chunks a row), 65 -> 8192 (19), 128 -> 16384 (10),
    1024 -> 131072 (2)."""
    want = max(rows, 1) * vocab // TARGET_PROGRAMS
    chunk = MIN_CHUNK
    while chunk * 2 <= want and chunk < vocab:
        chunk *= 2
    return chunk


def argmax_rows(
    x: torch.Tensor,  # [R, V] float32 / bf16 / fp16, last dim contiguous
    *,
    chunk: int | None = None,  # logits per (row, chunk) program; None: `default_chunk`
    block: int | None = None,  # logits per loop iteration; None: min(DEFAULT_BLOCK, chunk)
) -> torch.Tensor:
    """``torch.argmax(x, dim=-1)``, ``[R]`` int64, bit for bit (first index of the max; the
    first NaN if a row holds one)."""
    assert x.dim() == 2, "x must be [rows, vocab]"
    assert x.dtype in _DTYPES, f"unsupported dtype {x.dtype}"
    assert x.stride(-1) == 1, "the last dim must be contiguous"
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # CPU tests run the interpreter
    assert x.is_cuda or interpreted, "the triton argmax needs CUDA tensors"
    rows, vocab = x.shape
    assert 1 <= vocab < _NO_INDEX, "vocab must be in [1, 2^31 - 1)"
    if chunk is None:
        chunk = default_chunk(rows, vocab)
    if block is None:
        block = min(DEFAULT_BLOCK, chunk)
    assert chunk & (chunk - 1) == 0 and block & (block - 1) == 0, "powers of two"
    assert block <= chunk, "block must not exceed chunk"
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows == 0:
        return out
    chunks = triton.cdiv(vocab, chunk)
    vals = torch.empty(rows, chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, chunks, dtype=torch.int32, device=x.device)
    _chunk_argmax_kernel[(rows * chunks,)](
        x, vals, idx, x.stride(0), vocab, chunks,
        CHUNK=chunk, BLOCK=block, NO_INDEX=_NO_INDEX, num_warps=8 if block >= 4096 else 4,
    )  # fmt: skip
    _row_argmax_kernel[(rows,)](
        vals, idx, out, chunks, CP=triton.next_power_of_2(chunks), NO_INDEX=_NO_INDEX,
        num_warps=1 if chunks <= 128 else 4,
    )  # fmt: skip
    return out
