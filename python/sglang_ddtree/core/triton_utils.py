"""Small helpers shared by the core's Triton kernels."""

from __future__ import annotations

import os

import triton
import triton.language as tl


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (how the CPU tests run them)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def pow2(x: int) -> int:
    """Smallest power of two >= x (>= 1)."""
    return 1 << max(0, (x - 1).bit_length())


@triton.jit
def _and(mask, cond):
    """``mask & cond`` for a scalar ``cond``, broadcast explicitly (the interpreter cannot `&` a
    tensor with a scalar bool)."""
    return mask & ((mask.to(tl.int32) * 0 + cond.to(tl.int32)) != 0)
