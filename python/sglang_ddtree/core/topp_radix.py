"""Top-p (nucleus) renormalization of ``[M, V]`` probability rows by radix select (CUDA, no
host sync, deterministic): the kernel ``top_p_radix.cuh``, built at first use by SGLang's JIT
loader (``sglang.kernels.jit``).

Same contract as sgl_kernel's ``top_p_renorm_prob(probs, top_p)``: token ``x`` stays when the
mass of the tokens strictly more probable than it is below ``top_p`` (every token tied at the
edge stays); the kept tokens are renormalized, the rest are 0; a row with ``top_p >= 1`` keeps
every token.

How (the kernel's header has the details): float32 bit patterns of probabilities order like their
values, so the smallest kept key is found digit by digit (10 + 10 + 10 bits) from 1,024-bin
histograms of the mass, one read of each row per digit, each row split over programs that run in
parallel; then one more read writes ``p / Z``. Rows are read four floats at a time where they are
16-byte aligned (``V % 4 == 0``), one at a time otherwise. Masses are summed in 62-bit fixed point
by integer atomics, so the result does not depend on scheduling (tensor-parallel ranks agree) and a
row's sums are off by at most ``V * 2^-63``. Four reads of the rows in all, whatever the rows' shape
(FlashInfer's per-row search slows down on flat rows)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

PASSES = 3
BINS = 1024
# int64 per row: histograms, state, per-pass done counts, the softmax constants and their count
WORK = PASSES * BINS + 5 + PASSES + 3
LOADS = 8  # float4 loads per thread: 8,192 vocabulary entries per program
CHUNK = 256 * LOADS * 4  # entries per program (threads x loads x 4)
# The kernel source: under SGLang's JIT sources in-tree; under ``sgl-kernel/csrc/`` in this
# repository, found from an editable install or a checkout.
SOURCE = "ddtree/top_p_radix.cuh"
_CHECKOUT_SOURCE = Path(__file__).resolve().parents[3] / "sgl-kernel" / "csrc" / SOURCE


def kernel_source() -> dict:
    """``load_jit`` keyword for the kernel's source file; raises if there is none."""
    if _CHECKOUT_SOURCE.is_file():
        return {"external_cuda_files": [str(_CHECKOUT_SOURCE)]}
    try:
        from sglang.kernels.jit.utils import KERNEL_PATH
    except ImportError:  # no SGLang here: nothing could build the kernel anyway
        KERNEL_PATH = None
    if KERNEL_PATH is not None and (Path(KERNEL_PATH) / "csrc" / SOURCE).is_file():
        return {"cuda_files": [SOURCE]}
    raise RuntimeError(
        f"the radix top-p kernel's source {SOURCE} was not found (looked in {_CHECKOUT_SOURCE} "
        "and SGLang's JIT sources): install sglang-ddtree from a checkout (pip install -e .)"
    )


@functools.cache
def load_kernel():
    """The built kernel module (built, or loaded from SGLang's JIT cache, on the first call).
    A server calls it at start so that no request waits for the build."""
    from sglang.kernels.jit.utils import load_jit

    return load_jit(
        "ddtree_top_p_radix",
        **kernel_source(),
        cuda_wrappers=[
            ("top_p_radix", f"TopPRadix<{LOADS}>::run"),
            ("top_p_softmax_radix", f"TopPSoftmaxRadix<{LOADS}>::run"),
        ],
    )


def top_p_renorm_radix(
    probs: torch.Tensor,  # [M, V] float32 CUDA, rows of non-negative probabilities
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
) -> torch.Tensor:
    """``[M, V]`` float32: each row restricted to its nucleus and renormalized (module
    docstring); a new tensor, ``probs`` unchanged. Buffers come from the caching allocator (in
    a CUDA graph, its pool)."""
    assert probs.is_cuda, "the radix top-p needs CUDA tensors"
    assert probs.dim() == 2 and probs.dtype == torch.float32, "probs must be [M, V] float32"
    assert top_p.shape == probs.shape[:1], "top_p must be [M]"
    probs = probs.contiguous()
    top_p = top_p.to(torch.float32).contiguous()
    work = torch.zeros(probs.shape[0], WORK, dtype=torch.int64, device=probs.device)
    out = torch.empty_like(probs)
    load_kernel().top_p_radix(probs, top_p, work, out)
    return out


def top_p_softmax_renorm_radix(
    logits: torch.Tensor,  # [M, V] float32 CUDA
    temperature: torch.Tensor,  # [M] float32, > 0
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
) -> torch.Tensor:
    """``[M, V]`` float32: ``top_p_renorm_radix(softmax(logits / temperature), top_p)`` without
    writing the softmax out: a first pass takes each row's max and sum of exponentials, then
    every pass evaluates the probability of each entry where it reads the logit (five reads of
    the logits and one write, against seven reads and three writes for the division, the
    softmax and the nucleus apart). The probabilities differ from ``torch.softmax``'s by
    rounding only (the kernel works in base 2: one FMA and one exp2 per entry)."""
    assert logits.is_cuda, "the radix top-p needs CUDA tensors"
    assert logits.dim() == 2 and logits.dtype == torch.float32, "logits must be [M, V] float32"
    assert temperature.shape == logits.shape[:1] and top_p.shape == logits.shape[:1]
    m, vocab = logits.shape
    logits = logits.contiguous()
    temperature = temperature.to(torch.float32).contiguous()
    top_p = top_p.to(torch.float32).contiguous()
    stats = torch.empty(m, -(-vocab // CHUNK), 2, dtype=torch.float32, device=logits.device)
    work = torch.zeros(m, WORK, dtype=torch.int64, device=logits.device)
    out = torch.empty_like(logits)
    load_kernel().top_p_softmax_radix(logits, temperature, top_p, stats, work, out)
    return out
