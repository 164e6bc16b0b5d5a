"""Per-request target distributions and verify coins for sampled (temperature > 0) requests.

The law to match is SGLang's non-speculative sampler's: logits divided by the temperature,
softmax, then top-k and top-p judged **jointly** on that one distribution (FlashInfer's
``top_k_top_p_sampling_from_probs(..., filter_apply_order="joint")``), then renormalized.
Token ``x`` (probability ``p_x``) stays when both hold:

- ``#{y : p_y > p_x} < top_k``: fewer than ``top_k`` tokens are strictly more probable, so
  every token tied at the k-th place stays;
- ``sum{p_y : p_y > p_x} < top_p``: the mass strictly above it is below ``top_p``, so every
  token tied at the nucleus edge stays.

This is not top-k, renormalize, then top-p (SGLang's EAGLE verify order): there the nucleus is
cut from the top-k-renormalized distribution and holds fewer tokens.

**min-p path.** When any request of the batch has ``min_p > 0`` (SGLang's batch flag
``need_min_p_sampling``), SGLang's sampler takes another path for the **whole batch**, with the
default FlashInfer sampling backend (``Sampler._sample_from_probs``)::

    probs = top_k_renorm_prob(probs, top_ks)      # top-k (ties kept), renormalized
    probs = top_p_renorm_prob(probs, top_ps)      # top-p of that, renormalized
    token = min_p_sampling_from_probs(probs, min_ps)

and FlashInfer's min-p sampler keeps ``p_x >= max_y p_y * min_p`` (float32 product, ties
kept) and draws in proportion to the kept mass. So on that path top-k and top-p are applied one
after the other (the nucleus is cut from the top-k-renormalized distribution: fewer tokens than
the joint rule), then min-p, relative to the most probable token, after the temperature, then
renormalized (`top_k_top_p_min_p_renorm`). Rows with ``min_p = 0`` in such a batch get the
sequential top-k / top-p too (their min-p keeps every token): the flag changes their law. It is
batch state: or-merged when batches merge and not cleared when the min-p request leaves
(``SamplingBatchInfo.merge_batch`` / ``filter_batch``), so the caller passes SGLang's flag as
it stands. The pure-torch ``sampling_backend="pytorch"`` (CPU, deterministic inference) applies
top-k by position (no ties) and top-p jointly instead; that backend is not matched here.
"""

from __future__ import annotations

import torch

# Coins live strictly inside (0, 1): the accept kernel accepts a child when
# ``coin <= cumulative target mass``, so a zero coin could accept a zero-probability child.
COIN_EPS = 2.0**-24


# `minp_triton` runs one program per row: with fewer rows than about one per SM, torch's
# passes, each spread over the whole GPU, keep more of it busy (reasoned, not yet timed).
MIN_P_KERNEL_ROWS = 128


def _sgl_kernel_renorm():
    """``(top_k_renorm_prob, top_p_renorm)``: sgl_kernel's top-k one (FlashInfer's) and
    `topp_radix.top_p_renorm_radix` (the same set as sgl_kernel's top-p one; its cost does not
    depend on the rows' shape); None without sgl_kernel."""
    try:
        from sgl_kernel import top_k_renorm_prob
    except Exception:  # not installed, or no CUDA build
        return None
    from sglang_ddtree.core.topp_radix import top_p_renorm_radix

    return top_k_renorm_prob, top_p_renorm_radix


def _effective_top_k(top_k: torch.Tensor, vocab: int) -> torch.Tensor:
    """[M] int64: ``top_k`` with "off" (<= 0 or > V, e.g. SGLang's 1 << 30) mapped to V."""
    return torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).to(torch.int64)


def rank_and_mass_above(
    probs: torch.Tensor,  # [M, V] float, non-negative
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sorted_probs, order, above, mass_above)``, each ``[M, V]`` in descending order
    (``order``: the token of each place): per token, how many tokens are strictly more probable
    and their mass. Tied tokens share both (those of the first of them)."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    rank = torch.arange(probs.shape[-1], device=probs.device).expand_as(sorted_probs)
    run_start = torch.ones_like(sorted_probs, dtype=torch.bool)
    run_start[:, 1:] = sorted_probs[:, 1:] != sorted_probs[:, :-1]
    above = torch.cummax(torch.where(run_start, rank, 0), dim=-1).values
    # `above` counts the tokens strictly more probable; the mass before it is theirs.
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    return sorted_probs, order, above, torch.gather(before, -1, above)


def mass_above_each(probs: torch.Tensor) -> torch.Tensor:  # [M, V] float, non-negative
    """[M, V]: per token, in vocabulary order, the mass of the tokens strictly more probable
    (`rank_and_mass_above` scattered back; pass float64 rows for a float64 judge)."""
    _, order, _, above = rank_and_mass_above(probs)
    return torch.empty_like(above).scatter_(-1, order, above)


def joint_top_k_top_p_renorm(
    probs: torch.Tensor,  # [M, V] float32, rows sum to 1
    top_k: torch.Tensor,  # [M] int64; values <= 0 or > V mean "no top-k"
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
) -> torch.Tensor:
    """[M, V] float32: ``probs`` restricted to the joint top-k / top-p set, renormalized.

    Pure torch (one sort per row); the CPU path and the reference for the CUDA path.
    """
    k = _effective_top_k(top_k, probs.shape[-1])
    sorted_probs, order, above, mass_above = rank_and_mass_above(probs)
    # top_p >= 1 keeps every token, as `topp_radix` does (FlashInfer's kernel too, but for
    # float32 rounding of its sums), whatever rounding does to the mass above the far tail.
    top_p = top_p.float()[:, None]
    keep = (above < k[:, None]) & ((mass_above < top_p) | (top_p >= 1.0))
    kept = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    kept = kept / kept.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, kept)


def sequential_top_k_top_p_renorm(
    probs: torch.Tensor,  # [M, V] float32, rows sum to 1
    top_k: torch.Tensor,  # [M] int64; values <= 0 or > V mean "no top-k"
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
) -> torch.Tensor:
    """[M, V] float32: top-k (ties kept), renormalized, then top-p of that distribution,
    renormalized: SGLang's ``top_k_renorm_prob`` then ``top_p_renorm_prob`` on its min-p path.

    Pure torch (two sorts per row); the CPU path and the reference for the CUDA path.
    """
    in_top_k = joint_top_k_top_p_renorm(probs, top_k, torch.ones_like(top_p, dtype=torch.float32))
    return joint_top_k_top_p_renorm(in_top_k, torch.zeros_like(top_k), top_p)


def min_p_renorm(
    probs: torch.Tensor,  # [M, V] float32, non-negative
    min_p: torch.Tensor,  # [M] float32 in [0, 1]; 0 keeps every token
) -> torch.Tensor:
    """[M, V] float32: tokens with ``p_x >= max(p) * min_p`` kept (ties kept), renormalized:
    FlashInfer's ``min_p_sampling_from_probs`` written out as a distribution (its pivot is the
    float32 product ``max * min_p``; it draws in proportion to the kept mass). No host sync."""
    pivot = probs.amax(-1, keepdim=True) * min_p.float()[:, None]
    kept = torch.where(probs >= pivot, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def top_k_top_p_min_p_renorm(
    probs: torch.Tensor,  # [M, V] float32, rows sum to 1
    top_k: torch.Tensor,  # [M] int64; values <= 0 or > V mean "no top-k"
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
    min_p: torch.Tensor,  # [M] float32 in [0, 1]
) -> torch.Tensor:
    """[M, V] float32: SGLang's min-p path (module docstring), pure torch."""
    return min_p_renorm(sequential_top_k_top_p_renorm(probs, top_k, top_p), min_p)


def _renorm_kernels(
    probs, k, p, need_top_k: bool, need_top_p: bool, kernels, sequential: bool = False
):
    """`_joint_renorm_kernels`, or with ``sequential`` SGLang's min-p path order: top-p of the
    top-k-renormalized rows (both kernels, one after the other, as SGLang calls them)."""
    if not (sequential and need_top_k and need_top_p):  # one filter: the two orders agree
        return _joint_renorm_kernels(probs, k, p, need_top_k, need_top_p, kernels)
    top_k_renorm_prob, top_p_renorm_prob = kernels
    in_top_k = top_k_renorm_prob(probs, _effective_top_k(k, probs.shape[-1]).to(torch.int32))
    return top_p_renorm_prob(in_top_k, p)


def _joint_renorm_kernels(probs, k, p, need_top_k: bool, need_top_p: bool, kernels):
    """The joint law from the two renorm kernels (`_sgl_kernel_renorm`), each applied to the
    unfiltered ``probs``: ``top_k_renorm_prob`` keeps ``p_x >=`` the k-th largest value (the
    top-k set, ties kept) and the top-p one keeps ``p_x >=`` the smallest value whose
    mass above is below ``top_p`` (the nucleus, ties kept); their intersection, renormalized,
    is the joint set. No host sync; capture-safe."""
    top_k_renorm_prob, top_p_renorm_prob = kernels
    vocab = probs.shape[-1]
    if need_top_k and not need_top_p:
        return top_k_renorm_prob(probs, _effective_top_k(k, vocab).to(torch.int32))
    if need_top_p and not need_top_k:
        return top_p_renorm_prob(probs, p)
    # In place where the values allow it (sign of a renormed probability: 1 kept, 0 not; x * 1
    # and x * 0 are exact): three [M, V] float32 buffers at the peak, not five.
    in_top_k = top_k_renorm_prob(probs, _effective_top_k(k, vocab).to(torch.int32)).sign_()
    in_nucleus = top_p_renorm_prob(probs, p).sign_()
    kept = probs.mul_(in_top_k).mul_(in_nucleus)
    del in_top_k, in_nucleus
    return kept.div_(kept.sum(-1, keepdim=True))


def target_probs(
    logits: torch.Tensor,  # [bs, W, V] float, one row per tree node
    temperature: torch.Tensor,  # [bs] float32, > 0
    top_k: torch.Tensor,  # [bs] int64
    top_p: torch.Tensor,  # [bs] float32
    use_kernels: bool | None = None,
    need_top_k: bool = True,
    need_top_p: bool = True,
    min_p: torch.Tensor | None = None,  # [bs] float32 in [0, 1]; read when need_min_p
    need_min_p: bool = False,
) -> torch.Tensor:
    """Target distribution at every node, [bs, W, V] float32 contiguous: the law SGLang's
    non-speculative sampler draws from at that node (module docstring).

    ``need_top_k`` / ``need_top_p`` (host bools, e.g. SGLang's ``need_top_k_sampling`` /
    ``need_top_p_sampling``): False promises that no row uses that filter (top_k <= 0 or >= V;
    top_p = 1), so its pass over ``[bs * W, V]`` is skipped (the law is the same). True always
    applies it.

    ``need_min_p`` (host bool, SGLang's ``need_min_p_sampling``) is not only a skip flag: True
    selects the min-p path for every row (top-k, then top-p of the renormalized top-k, then
    min-p; `top_k_top_p_min_p_renorm`), rows with ``min_p = 0`` included; False promises that
    no row has ``min_p > 0`` and ignores ``min_p``.

    On CUDA this uses sgl_kernel's ``top_k_renorm_prob`` and `topp_radix`'s nucleus
    (`_joint_renorm_kernels`; on the min-p path the two one after the other); with top-p alone,
    radix takes the logits and never writes the softmax out
    (`topp_radix.top_p_softmax_renorm_radix`); min-p is `minp_triton.min_p_renorm_`
    (`min_p_renorm` in one kernel, in place) from ``MIN_P_KERNEL_ROWS`` rows on, `min_p_renorm`
    below. Elsewhere the pure-torch functions above.
    """
    bs, n, vocab = logits.shape
    assert temperature.shape == (bs,) and top_k.shape == (bs,) and top_p.shape == (bs,)
    assert not need_min_p or (min_p is not None and min_p.shape == (bs,)), "min_p must be [bs]"
    # expand + reshape, not repeat_interleave: no output-size computation, capture-safe.
    k = top_k.to(torch.int64)[:, None].expand(bs, n).reshape(-1)
    p = top_p.float()[:, None].expand(bs, n).reshape(-1).contiguous()
    on_device = use_kernels is not False and logits.is_cuda
    kernels = _sgl_kernel_renorm() if on_device and (need_top_k or need_top_p) else None
    if use_kernels and (need_top_k or need_top_p) and kernels is None:
        raise RuntimeError("sgl_kernel renorm kernels requested but not available")
    if kernels is not None and need_top_p and not need_top_k:
        from sglang_ddtree.core.topp_radix import top_p_softmax_renorm_radix

        t = temperature.float()[:, None].expand(bs, n).reshape(-1).contiguous()
        probs = top_p_softmax_renorm_radix(logits.float().reshape(bs * n, vocab), t, p)
    else:
        # As SGLang's sampler: float32 logits divided by the temperature, then softmax.
        probs = torch.softmax(logits.float() / temperature.float()[:, None, None], dim=-1)
        probs = probs.reshape(bs * n, vocab)
        if kernels is not None:
            probs = _renorm_kernels(probs, k, p, need_top_k, need_top_p, kernels, need_min_p)
        elif need_top_k or need_top_p:  # a filter not needed is switched off, as above
            k = k if need_top_k else torch.zeros_like(k)
            p = p if need_top_p else torch.ones_like(p)
            renorm = sequential_top_k_top_p_renorm if need_min_p else joint_top_k_top_p_renorm
            probs = renorm(probs, k, p)
    if need_min_p:
        min_ps = min_p.float()[:, None].expand(bs, n).reshape(-1)
        if on_device and bs * n >= MIN_P_KERNEL_ROWS:  # this function's own buffer: in place
            from sglang_ddtree.core.minp_triton import min_p_renorm_

            probs = min_p_renorm_(probs.contiguous(), min_ps)
        else:
            probs = min_p_renorm(probs, min_ps)
    return probs.reshape(bs, n, vocab).contiguous()


def draw_coins(
    bs: int,
    num_nodes: int,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform coins inside (0, 1): one per node [bs, W] and one for the bonus [bs], float32."""
    coins = torch.rand(bs, num_nodes, device=device, generator=generator)
    final = torch.rand(bs, device=device, generator=generator)
    return clamp_coins(coins), clamp_coins(final)


def clamp_coins(coins: torch.Tensor) -> torch.Tensor:
    """Clamp coins into [COIN_EPS, 1 - COIN_EPS] (float32)."""
    return coins.float().clamp(COIN_EPS, 1.0 - COIN_EPS)
