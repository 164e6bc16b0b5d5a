"""Top-p (nucleus) renormalization of ``[M, V]`` probability rows in a fixed number of passes
(Triton, no host sync, deterministic).

Same contract as sgl_kernel's ``top_p_renorm_prob(probs, top_p)``: token ``x`` stays when the
mass of the tokens strictly more probable than it is below ``top_p`` (``sum{p_y : p_y > p_x} <
top_p``, so every token tied at the nucleus edge stays); the kept tokens are renormalized, the
rest are 0. A row with ``top_p >= 1`` keeps every token.

Why: FlashInfer's kernel searches each row's threshold in one thread block, and on flat rows
(all probabilities sharing their leading bits, as with random weights) its search takes many
rounds: on an H200 at V = 151,936 a flat row costs it 14-21 us of the GPU (peaked rows 2-7),
and a tree verify has ``bs x W`` rows. Here every pass reads each row once, split over
vocabulary chunks that run in parallel, so the cost does not depend on the rows' shape (on
peaked rows FlashInfer's search is as fast at a few dozen rows and faster beyond, and stays
the default).

How: probabilities are non-negative, so their float32 bit patterns (``key``) order like their
values. ``G(t) = sum{p_y : key_y > t}`` falls as ``t`` grows, and the kept set is ``key_x >=
t*`` with ``t* = min{t : G(t) < top_p}``: a key at or above ``t*`` has ``G <= G(t*) < top_p``,
and any key below it has ``G >= top_p``. ``t*`` lies in ``(-1, key(1.0)]`` (``G(key(1.0)) =
0``). Each pass evaluates ``G`` at 31 evenly spaced keys of the current interval in one read
(``_pivot_pass``: one program per (row, chunk) writes its chunk's 32 partial sums) and keeps
the 32nd of the interval where ``G`` first drops below ``top_p``: six passes narrow 2^30 keys
to one. Every program narrows its row's interval itself, from the previous pass's interval and
partial sums (summed over the chunks in a fixed order), so all programs of a row agree and the
result does not depend on scheduling (ranks under tensor parallelism compute the same set). Then
``_finish`` sums the kept probabilities per chunk and, launched again, writes ``p / Z``.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

PIVOTS = 32  # per pass: 31 interior keys plus the interval's top
ONE_KEY = 0x3F800000  # float32 1.0's bit pattern: no probability lies above it
_ONE_KEY = tl.constexpr(ONE_KEY)
CHUNK = 8192  # vocabulary entries per program; fixed per row count, so the sums' order is too
CHUNK_FEW_ROWS = 4096  # below FEW_ROWS rows: more, shorter programs to fill the GPU
FEW_ROWS = 32
BLOCK = 128  # entries per step inside a program
_SCALE = tl.constexpr(2.0**127)  # keys are at most 1.0: p * 2^127 stays finite


def _passes() -> int:
    """Passes that narrow ``(-1, ONE_KEY]`` to one key, ``PIVOTS`` parts per pass."""
    size, n = ONE_KEY + 1, 0
    while size > 1:
        size, n = -(-size // PIVOTS), n + 1
    return n


NUM_PASSES = _passes()


@triton.jit
def _narrow(lo, hi, g, top_p, idx, NP: tl.constexpr):
    """One pass's step: the pivots of ``(lo, hi]`` and, from ``g`` (``G`` at them), the new
    interval: the part where ``G`` first falls below ``top_p``."""
    step = (hi - lo + NP - 1) // NP
    piv = tl.minimum(lo + step * (idx + 1), hi)  # the last pivot is ``hi`` itself
    below = (g < top_p) | (idx == NP - 1)  # G(hi) < top_p holds by construction
    first = tl.min(tl.where(below, idx, NP), axis=0)
    new_hi = tl.sum(tl.where(idx == first, piv, 0), axis=0)
    new_lo = tl.where(first > 0, tl.sum(tl.where(idx == first - 1, piv, 0), axis=0), lo)
    return new_lo, new_hi, piv


@triton.jit
def _interval(partial_ptr, state_ptr, row, M, C, top_p, idx, PREV: tl.constexpr, NP: tl.constexpr):
    """``(lo, hi, pivots)`` of ``row`` before pass ``PREV``: the interval before pass ``PREV - 1``
    (``state[PREV - 1, row]``) narrowed by that pass's partial sums (``partial[PREV - 1, row,
    chunk, NP]``, summed over the chunks in order)."""
    if PREV == 0:
        lo = tl.full([], -1, tl.int32)
        hi = tl.full([], _ONE_KEY, tl.int32)
    else:
        lo = tl.load(state_ptr + ((PREV - 1) * M + row) * 2)
        hi = tl.load(state_ptr + ((PREV - 1) * M + row) * 2 + 1)
        g = tl.zeros([NP], dtype=tl.float32)
        base = partial_ptr + (((PREV - 1) * M + row) * C) * NP
        for c in range(C):
            g += tl.load(base + c * NP + idx)
        lo, hi, _ = _narrow(lo, hi, g, top_p, idx, NP)
    piv = tl.minimum(lo + ((hi - lo + NP - 1) // NP) * (idx + 1), hi)
    return lo, hi, piv


@triton.jit
def _pivot_pass(
    probs_ptr,  # [M, V] float32, rows contiguous
    top_p_ptr,  # [M] float32
    partial_ptr,  # [NUM_PASSES, M, C, NP] float32: G at each pass's pivots, per chunk
    state_ptr,  # [NUM_PASSES, M, 2] int32: (lo, hi) before each pass
    M,
    V,
    C,
    PASS: tl.constexpr,
    NP: tl.constexpr,
    CHUNK_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    idx = tl.arange(0, NP)
    top_p = tl.load(top_p_ptr + row)
    lo, hi, piv = _interval(partial_ptr, state_ptr, row, M, C, top_p, idx, PASS, NP)
    if chunk == 0:  # every program of the row derived the same interval; one records it
        tl.store(state_ptr + (PASS * M + row) * 2, lo)
        tl.store(state_ptr + (PASS * M + row) * 2 + 1, hi)
    # One [NP, BLOCK] accumulator, reduced once at the end: a reduction across the block per
    # step would cost more than the compares themselves. The vocabulary runs along the last
    # axis so each thread compares the entry it loaded against every pivot; the [BLOCK, NP]
    # orientation made the compiler move every loaded block through shared memory.
    acc = tl.zeros([NP, BLOCK_SIZE], dtype=tl.float32)
    # ``key > pivot`` as floats, two float ops per pivot (no integer compare and select):
    # ``ind = sat(p * 2^127 - pivot * 2^127)`` (both products exact) is 1 when ``p > pivot``
    # and 0 otherwise, then ``acc += p * ind``. Only where ``p - pivot`` is below 2^-127 (both
    # under ~2^-103) can ``ind`` fall in between, which moves ``G`` by less than 1e-26.
    neg_pivot = -(piv.to(tl.float32, bitcast=True) * _SCALE)
    start = chunk * CHUNK_SIZE
    base = probs_ptr + row.to(tl.int64) * V
    cols = start + tl.arange(0, BLOCK_SIZE)
    p = tl.load(base + cols, mask=cols < V, other=0.0)
    for off in range(BLOCK_SIZE, CHUNK_SIZE + BLOCK_SIZE, BLOCK_SIZE):
        nxt = start + off + tl.arange(0, BLOCK_SIZE)  # loaded one step ahead of its use
        p_next = tl.load(base + nxt, mask=(nxt < V) & (off < CHUNK_SIZE), other=0.0)
        scaled = (p * _SCALE)[None, :] + neg_pivot[:, None]
        acc = tl.fma(p[None, :], tl.minimum(tl.maximum(scaled, 0.0), 1.0), acc)
        p = p_next
    tl.store(partial_ptr + ((PASS * M + row) * C + chunk) * NP + idx, tl.sum(acc, axis=1))


@triton.jit
def _threshold(
    partial_ptr, state_ptr, top_p_ptr, row, M, C, idx, NPASS: tl.constexpr, NP: tl.constexpr
):
    """The row's ``t*`` (0 where ``top_p >= 1``: every token stays)."""
    top_p = tl.load(top_p_ptr + row)
    _, hi, _ = _interval(partial_ptr, state_ptr, row, M, C, top_p, idx, NPASS, NP)
    return tl.where(top_p >= 1.0, 0, hi)


@triton.jit
def _finish(
    probs_ptr,
    top_p_ptr,
    partial_ptr,
    state_ptr,
    zpart_ptr,  # [M, C] float32: each chunk's kept mass (written when not WRITE, read when WRITE)
    out_ptr,  # [M, V] float32 out (WRITE)
    M,
    V,
    C,
    WRITE: tl.constexpr,
    NPASS: tl.constexpr,
    NP: tl.constexpr,
    CHUNK_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Not WRITE: the chunk's kept mass. WRITE: ``p / Z`` where kept, else 0, ``Z`` the row's
    kept mass (the chunks' summed in order)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    t = _threshold(partial_ptr, state_ptr, top_p_ptr, row, M, C, tl.arange(0, NP), NPASS, NP)
    z = tl.zeros([], dtype=tl.float32)
    if WRITE:
        for c in range(C):
            z += tl.load(zpart_ptr + row * C + c)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    start = chunk * CHUNK_SIZE
    for off in range(0, CHUNK_SIZE, BLOCK_SIZE):
        cols = start + off + tl.arange(0, BLOCK_SIZE)
        ok = cols < V
        p = tl.load(probs_ptr + row.to(tl.int64) * V + cols, mask=ok, other=0.0)
        kept = p.to(tl.int32, bitcast=True) >= t
        if WRITE:
            tl.store(out_ptr + row.to(tl.int64) * V + cols, tl.where(kept, p / z, 0.0), mask=ok)
        else:
            acc += tl.where(kept, p, 0.0)
    if not WRITE:
        tl.store(zpart_ptr + row * C + chunk, tl.sum(acc, axis=0))


def top_p_renorm_triton(
    probs: torch.Tensor,  # [M, V] float32, rows of non-negative probabilities
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
    chunk: int | None = None,
) -> torch.Tensor:
    """``[M, V]`` float32: each row restricted to its nucleus and renormalized (module
    docstring); a new tensor, ``probs`` unchanged. ``chunk`` (a multiple of ``BLOCK``): the
    vocabulary entries per program, which fixes the order of every sum; by default ``CHUNK``,
    or ``CHUNK_FEW_ROWS`` below ``FEW_ROWS`` rows (a function of the shape only, so every
    tensor-parallel rank picks the same)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # CPU tests run the interpreter
    assert probs.is_cuda or interpreted, "the triton top-p needs CUDA tensors"
    assert probs.dim() == 2 and probs.dtype == torch.float32, "probs must be [M, V] float32"
    assert top_p.shape == probs.shape[:1], "top_p must be [M]"
    m, vocab = probs.shape
    if chunk is None:
        chunk = CHUNK_FEW_ROWS if m < FEW_ROWS else CHUNK
    assert chunk % BLOCK == 0, "chunk must be a multiple of BLOCK"
    probs = probs.contiguous()
    top_p = top_p.to(torch.float32).contiguous()
    c = triton.cdiv(vocab, chunk)
    dev = probs.device
    partial = torch.empty(NUM_PASSES, m, c, PIVOTS, dtype=torch.float32, device=dev)
    state = torch.empty(NUM_PASSES, m, 2, dtype=torch.int32, device=dev)
    zpart = torch.empty(m, c, dtype=torch.float32, device=dev)
    out = torch.empty_like(probs)
    grid = (m, c)
    sizes = dict(NP=PIVOTS, CHUNK_SIZE=chunk, BLOCK_SIZE=BLOCK)
    for q in range(NUM_PASSES):
        _pivot_pass[grid](probs, top_p, partial, state, m, vocab, c, PASS=q, **sizes)
    for write in (False, True):  # the kept mass per chunk, then p / Z
        _finish[grid](probs, top_p, partial, state, zpart, out, m, vocab, c, WRITE=write,
                      NPASS=NUM_PASSES, **sizes)  # fmt: skip
    return out
