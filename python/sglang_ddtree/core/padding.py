"""A step's glue at a padded batch size: views over the padded rows, cuts back to the real ones.

Terms (and those of `sglang_ddtree.core`): the **padded batch size** (``rows``) is the captured
size SGLang pads a forward of bs requests to, its static outputs holding ``rows`` requests' rows,
the bs real ones first; a **request-major** tensor has a leading dimension ``n x k`` for n
requests, request b's k rows at ``b * k .. (b + 1) * k``. Pure torch, no device read.
"""

from __future__ import annotations

import torch


def padded_view(t: torch.Tensor, rows: int) -> torch.Tensor | None:  # t: [n, ...]
    """``t`` seen with ``rows`` >= n leading rows over its own storage, or None where the
    storage ends before them (or ``t`` is a scalar, or not contiguous). For the first rows of
    a larger static buffer (SGLang's padded graph replays return their outputs so; so does a
    padded glue graph after `leading_rows`): the view then holds this step's padded rows too."""
    if t.dim() == 0 or (rows > t.shape[0] and not t.is_contiguous()):
        return None
    assert rows >= t.shape[0], (rows, tuple(t.shape))
    if rows == t.shape[0]:
        return t
    last = (
        t.storage_offset()
        + (rows - 1) * t.stride(0)
        + sum((n - 1) * st for n, st in zip(t.shape[1:], t.stride()[1:]))
    )
    if (last + 1) * t.element_size() > t.untyped_storage().nbytes():
        return None
    return t.as_strided((rows, *t.shape[1:]), t.stride(), t.storage_offset())


def padded_tensors(tensors: dict, bs: int, rows: int | None) -> dict | None:
    """Every request-major tensor of ``tensors`` (each [bs * k, ...]) at ``rows`` requests'
    rows (`padded_view`), or None: no padding asked (``rows`` None or <= bs), or a tensor with
    no padded rows behind it."""
    if rows is None or rows <= bs:
        return None
    out = {}
    for name, t in tensors.items():
        view = padded_view(t, t.shape[0] // bs * rows)
        if view is None:
            return None
        out[name] = view
    return out


def leading_rows(nest, bs: int, rows: int):
    """A NamedTuple of request-major tensors of ``rows`` requests (nested NamedTuples too), cut
    to its first ``bs`` requests' rows (views)."""
    assert 0 < bs <= rows, (bs, rows)
    return type(nest)(
        *(leading_rows(t, bs, rows) if hasattr(t, "_fields") else t[: t.shape[0] // rows * bs]
          for t in nest)
    )  # fmt: skip


def pad_rows(t: torch.Tensor, rows: int, fill) -> torch.Tensor:  # t: [n, ...]
    """``t`` followed by ``rows - n`` rows of ``fill`` (a new tensor; ``t`` where n = rows)."""
    assert rows >= t.shape[0], (rows, tuple(t.shape))
    if rows == t.shape[0]:
        return t
    pad = t.new_full((rows - t.shape[0], *t.shape[1:]), fill)
    return torch.cat([t, pad])
