"""Per-request target distributions and verify coins for sampled (temperature > 0) requests.

Every tree node of a request uses that request's temperature, top-k and top-p, applied in the
order SGLang's own sampler uses: temperature, then top-k (renormalize), then top-p
(renormalize). So a speculative step draws from exactly the distribution that non-speculative
decoding would draw from at the same prefix.
"""

from __future__ import annotations

import torch

# Coins live strictly inside (0, 1): the accept kernel accepts a child when
# ``coin <= cumulative target mass``, so a zero coin could accept a zero-probability child.
COIN_EPS = 2.0**-24


def _sgl_kernel_renorm():
    try:
        from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob
    except Exception:  # not installed, or no CUDA build
        return None
    return top_k_renorm_prob, top_p_renorm_prob


def top_k_top_p_renorm(
    probs: torch.Tensor,  # [M, V] float32, rows sum to 1
    top_k: torch.Tensor,  # [M] int64; values <= 0 or >= V mean "no top-k"
    top_p: torch.Tensor,  # [M] float32 in (0, 1]
) -> torch.Tensor:
    """Keep each row's top-k tokens, renormalize, keep its top-p nucleus, renormalize.

    Top-p keeps the smallest prefix of tokens (by decreasing probability) whose mass reaches
    ``top_p``: a token stays when the mass strictly before it is below ``top_p``.
    Pure torch; used on the CPU and as the reference for the CUDA kernels.
    """
    vocab = probs.shape[-1]
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).to(torch.int64)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=probs.device)
    keep = rank[None, :] < k[:, None]
    sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    sorted_probs = sorted_probs / sorted_probs.sum(-1, keepdim=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep = keep & (mass_before < top_p.float()[:, None])
    sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
    sorted_probs = sorted_probs / sorted_probs.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def target_probs(
    logits: torch.Tensor,  # [bs, N, V] float, one row per tree node
    temperature: torch.Tensor,  # [bs] float32, > 0
    top_k: torch.Tensor,  # [bs] int64
    top_p: torch.Tensor,  # [bs] float32
    use_kernels: bool | None = None,
    need_top_k: bool = True,
    need_top_p: bool = True,
) -> torch.Tensor:
    """Target distribution at every node, [bs, N, V] float32 contiguous.

    ``need_top_k`` / ``need_top_p`` (host bools, e.g. SGLang's ``need_top_k_sampling`` /
    ``need_top_p_sampling``): False promises that no row uses that filter (top_k <= 0 or >= V;
    top_p = 1), so its renormalization pass over ``[bs * N, V]`` is skipped (the law is the
    same). True always applies it.

    On CUDA this uses sgl_kernel's ``top_k_renorm_prob`` / ``top_p_renorm_prob`` (what SGLang's
    EAGLE verify uses); elsewhere the pure-torch `top_k_top_p_renorm`.
    """
    bs, n, vocab = logits.shape
    assert temperature.shape == (bs,) and top_k.shape == (bs,) and top_p.shape == (bs,)
    probs = torch.softmax(logits.float() / temperature.float()[:, None, None], dim=-1)
    probs = probs.reshape(bs * n, vocab)
    # expand + reshape, not repeat_interleave: no output-size computation, capture-safe.
    k = top_k.to(torch.int64)[:, None].expand(bs, n).reshape(-1)
    p = top_p.float()[:, None].expand(bs, n).reshape(-1)
    kernels = _sgl_kernel_renorm() if (use_kernels is not False and probs.is_cuda) else None
    if use_kernels and kernels is None:
        raise RuntimeError("sgl_kernel renorm kernels requested but not available")
    if kernels is not None:
        top_k_renorm_prob, top_p_renorm_prob = kernels
        if need_top_k:
            k = torch.where((k <= 0) | (k > vocab), vocab, k).to(torch.int32)
            probs = top_k_renorm_prob(probs, k)
        if need_top_p:
            probs = top_p_renorm_prob(probs, p)
    elif need_top_k or need_top_p:  # a filter not needed is switched off, as above
        k = k if need_top_k else torch.zeros_like(k)
        p = p if need_top_p else torch.ones_like(p)
        probs = top_k_top_p_renorm(probs, k, p)
    return probs.reshape(bs, n, vocab).contiguous()


def draw_coins(
    bs: int,
    num_nodes: int,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform coins inside (0, 1): one per node [bs, N] and one for the bonus [bs], float32."""
    coins = torch.rand(bs, num_nodes, device=device, generator=generator)
    final = torch.rand(bs, device=device, generator=generator)
    return clamp_coins(coins), clamp_coins(final)


def clamp_coins(coins: torch.Tensor) -> torch.Tensor:
    """Clamp coins into [COIN_EPS, 1 - COIN_EPS] (float32)."""
    return coins.float().clamp(COIN_EPS, 1.0 - COIN_EPS)
