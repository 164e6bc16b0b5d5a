"""A fingerprint by which tensor-parallel ranks check that they took the same decision.

Terms: every **rank** (tensor-parallel process) runs the same step and must build the same tree
and accept the same path (else they commit different KV). A **fingerprint** is ``[h, -h]``
int64, ``h`` a random linear hash of integer tensors; an all-reduce MAX across ranks leaves
``[max h, -min h]``: the ranks agree iff the two are equal. Pure torch, no device read.
"""

from __future__ import annotations

import torch

_SEED = 0x5EED
_weights: dict = {}  # (device, numel) -> [numel] int64, made once per shape


def rank_fingerprint(*tensors: torch.Tensor) -> torch.Tensor:  # each: integer, any shape
    """``[h, -h]`` int64, ``h`` the tensors' integer contents times random weights, summed
    (int64, wrapping): equal inputs give equal ``h`` on every rank (the weights come from one
    seeded device generator); a changed element changes it but with chance ~2^-64."""
    assert tensors and not any(t.is_floating_point() for t in tensors)
    flat = torch.cat([t.reshape(-1).to(torch.int64) for t in tensors])
    key = (flat.device, flat.numel())
    if key not in _weights:
        gen = torch.Generator(device=flat.device).manual_seed(_SEED)
        _weights[key] = torch.randint(
            -(2**62), 2**62, (flat.numel(),), generator=gen, device=flat.device
        )
    h = (flat * _weights[key]).sum()
    return torch.stack([h, -h])


def ranks_agree(reduced: torch.Tensor) -> torch.Tensor:  # [2] int64
    """Bool scalar: every rank's fingerprint was the same (``reduced``: `rank_fingerprint`
    after an all-reduce MAX across ranks)."""
    assert reduced.shape == (2,), tuple(reduced.shape)
    return reduced[0] == -reduced[1]
