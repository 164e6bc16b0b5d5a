"""The fixed-pass Triton top-p renormalization (core.topp_triton) against the pure-torch joint
law's nucleus (``sampling.joint_top_k_top_p_renorm`` with top-k off) and, on a GPU, against
sgl_kernel's ``top_p_renorm_prob`` (FlashInfer's), the kernel it can replace.

A token's fate is fixed by ``G = mass strictly above it < top_p``, judged here in float64. The
kernel must decide every token whose ``G`` lies more than ``EDGE`` from ``top_p`` as float64
does, give every kept value the same ``p / Z``, and tied tokens the same fate. The float32
implementations it is also compared with (the torch reference's running sum, FlashInfer's
block sums) may misjudge a token by their summation error, up to ``V * 2**-24``
(``float32_edge``): they are compared outside that band.

CPU: the kernel's logic under Triton's interpreter (a subprocess with TRITON_INTERPRET=1). GPU
(``gpu`` marker): V = 151,936 rows, flat (random weights), gaussian and peaked, against both,
and a CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.core.sampling import joint_top_k_top_p_renorm, rank_and_mass_above

EDGE = 1e-5  # |G - top_p| below this: either decision is a rounding of the same law


def float32_edge(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[M, V] bool: tokens a float32 sum of up to V terms may misjudge (``V * 2**-24``, the
    bound on a running sum's error for values summing to 1)."""
    band = probs.shape[-1] * 2.0**-24
    return (mass_above(probs.cpu()) - top_p.cpu().double()[:, None]).abs() < max(band, EDGE)


def mass_above(probs: torch.Tensor) -> torch.Tensor:
    """[M, V] float64: per token, the mass of the tokens strictly more probable (the joint
    law's own count, in float64)."""
    _, order, _, above = rank_and_mass_above(probs.double())
    return torch.empty_like(above).scatter_(-1, order, above)


def check_nucleus(out: torch.Tensor, probs: torch.Tensor, top_p: torch.Tensor) -> int:
    """Assert ``out`` is ``probs``' nucleus renormalized (module docstring); returns how many
    tokens were at the edge (either decision allowed)."""
    assert out.shape == probs.shape and out.dtype == torch.float32
    out, probs, top_p = out.cpu(), probs.cpu(), top_p.cpu()
    g = mass_above(probs)
    edge = (g - top_p.double()[:, None]).abs() < EDGE
    keep = (g < top_p.double()[:, None]) | (top_p[:, None] >= 1)
    kept = out > 0
    wrong = (kept != keep) & ~edge & (probs > 0)
    assert not wrong.any(), f"{int(wrong.sum())} tokens decided differently"
    # Tied tokens share their fate; the kept set is everything at or above the cut.
    for r in range(probs.shape[0]):
        if kept[r].any():
            cut, nonzero = probs[r][kept[r]].min(), probs[r] > 0
            assert torch.equal(kept[r] & nonzero, (probs[r] >= cut) & nonzero), r
    z = torch.where(kept, probs, 0).double().sum(-1, keepdim=True)
    want = torch.where(kept, probs.double() / z, 0)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-9)
    ref = joint_top_k_top_p_renorm(probs, torch.zeros(probs.shape[0], dtype=torch.int64), top_p)
    loose = float32_edge(probs, top_p)
    assert torch.equal((ref > 0) & ~loose, kept & ~loose)
    return int(edge.sum())


def rows(m: int, vocab: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    """[m, vocab] float32 probability rows of a named shape."""
    if kind == "flat":  # random weights: logits N(0, 0.01), all probabilities alike
        logits = 0.01 * torch.randn(m, vocab, generator=generator)
    elif kind == "gaussian":
        logits = torch.randn(m, vocab, generator=generator)
    elif kind == "peaked":  # p ~ rank^-1.5, shuffled
        ranks = torch.argsort(torch.rand(m, vocab, generator=generator), dim=-1) + 1
        logits = -1.5 * torch.log(ranks.float())
    elif kind == "ties":  # few distinct values: ties at the nucleus edge
        logits = torch.randint(0, 4, (m, vocab), generator=generator).float()
    elif kind == "bf16":  # bf16-rounded logits: many exact ties
        logits = (3 * torch.randn(m, vocab, generator=generator)).bfloat16().float()
    elif kind == "wide":  # logits N(0, 40^2): probabilities down to denormals and zeros
        logits = 40 * torch.randn(m, vocab, generator=generator)
    else:
        raise ValueError(kind)
    return torch.softmax(logits, dim=-1)


def check_graph_replay(renorm, m: int, vocab: int, top_p: torch.Tensor, g: torch.Generator):
    """``renorm(probs, top_p)`` captured in a CUDA graph on gaussian rows and replayed on flat
    and peaked ones: the eager call's output, bit for bit, and the nucleus (GPU)."""
    static = rows(m, vocab, "gaussian", g).cuda()
    renorm(static, top_p)  # compile / build outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = renorm(static, top_p)
    for kind in ("flat", "peaked"):
        static.copy_(rows(m, vocab, kind, g))
        graph.replay()
        torch.testing.assert_close(out, renorm(static, top_p), rtol=0, atol=0)
        check_nucleus(out, static, top_p)


_INTERPRETED_CHECK = """
import torch
from test_topp_triton import check_nucleus, rows
from sglang_ddtree.core.topp_triton import top_p_renorm_triton

g = torch.Generator().manual_seed(0)
top_p = torch.tensor([0.9, 0.5, 1.0, 1e-4, 0.999, 0.95])
for kind in ("flat", "gaussian", "peaked", "ties", "bf16", "wide"):
    # 3 chunks of 256 with a partial last one; V not a multiple of the 128-entry step.
    probs = rows(6, 700, kind, g)
    out = top_p_renorm_triton(probs, top_p, chunk=256)
    check_nucleus(out, probs, top_p)
# One chunk; a top_p above the row's float sum keeps everything; rows that are one-hot.
probs = rows(3, 300, "gaussian", g)
one_hot = torch.zeros(2, 300)
one_hot[0, 7] = 1.0
one_hot[1, 299] = 1.0
probs = torch.cat([probs, one_hot])
top_p = torch.tensor([0.99999999, 0.3, 0.7, 0.5, 0.95])
out = top_p_renorm_triton(probs, top_p)
check_nucleus(out, probs, top_p)
assert torch.equal(out[3:], one_hot)
# The input is left as it was.
before = probs.clone()
top_p_renorm_triton(probs, top_p)
assert torch.equal(probs, before)
print("interpreted triton top-p OK")
"""


def test_triton_top_p_interpreted_equals_reference(run_interpreted):
    """The kernel's logic, run by Triton's CPU interpreter, against the torch nucleus."""
    run_interpreted(_INTERPRETED_CHECK, "interpreted triton top-p OK")


def test_read_top_p_kernel_and_launch_refuses_a_bad_value(monkeypatch):
    from sglang_ddtree.core.sampling import TOP_P_KERNELS
    from sglang_ddtree.srt.ddtree_args import TOP_P_KERNEL_ENV, read_top_p_kernel
    from sglang_ddtree.srt.ddtree_args import TOP_P_KERNELS as ARG_CHOICES

    assert ARG_CHOICES == TOP_P_KERNELS  # the env's choices are the ones target_probs takes
    assert read_top_p_kernel({}) == "flashinfer"  # the default until measured otherwise
    assert read_top_p_kernel({TOP_P_KERNEL_ENV: " Triton "}) == "triton"
    with pytest.raises(ValueError, match=TOP_P_KERNEL_ENV):
        read_top_p_kernel({TOP_P_KERNEL_ENV: "cuda"})


def test_the_check_catches_a_wrong_nucleus():
    """The comparison can fail: a nucleus cut one distinct value too low, a renormalization
    off by a factor, and a tie split are each rejected."""
    g = torch.Generator().manual_seed(1)
    probs = rows(4, 500, "ties", g)
    top_p = torch.tensor([0.5, 0.8, 0.3, 0.95])
    ref = joint_top_k_top_p_renorm(probs, torch.zeros(4, dtype=torch.int64), top_p)
    assert check_nucleus(ref, probs, top_p) == 0
    # One more distinct value kept in row 0.
    cut = probs[0][ref[0] > 0].min()
    below = probs[0][probs[0] < cut].max()
    wider = ref.clone()
    wider[0] = torch.where(probs[0] >= below, probs[0], 0)
    wider[0] /= wider[0].sum()
    with pytest.raises(AssertionError):
        check_nucleus(wider, probs, top_p)
    with pytest.raises(AssertionError):
        check_nucleus(ref * 1.01, probs, top_p)
    split = ref.clone()
    tied = torch.nonzero(probs[1] == probs[1][ref[1] > 0].min()).flatten()
    assert len(tied) > 1
    split[1, tied[0]] = 0
    split[1] /= split[1].sum()
    with pytest.raises(AssertionError):
        check_nucleus(split, probs, top_p)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_top_p_on_gpu_matches_flashinfer_and_replays_in_a_graph():
    """V = 151,936 rows, M = 136 (bs 8 x W 17): the same nucleus as the torch reference and as
    sgl_kernel's ``top_p_renorm_prob`` (up to edge tokens), and the same output when replayed
    from a CUDA graph on new rows; M = 17 (the shorter chunks) against the reference."""
    from sgl_kernel import top_p_renorm_prob

    from sglang_ddtree.core.topp_triton import top_p_renorm_triton

    g = torch.Generator().manual_seed(0)
    m, vocab = 136, 151936
    top_p = torch.rand(m, generator=g).clamp(0.05, 1.0)
    top_p[:8] = 0.95
    top_p[8] = 1.0
    top_p = top_p.cuda()
    for kind in ("flat", "gaussian", "peaked", "bf16", "wide"):
        probs = rows(m, vocab, kind, g).cuda()
        ours = top_p_renorm_triton(probs, top_p)
        check_nucleus(ours, probs, top_p)
        theirs = top_p_renorm_prob(probs, top_p)
        differ = ((ours > 0) != (theirs > 0)).cpu() & ~float32_edge(probs, top_p)
        assert not differ.any(), (kind, int(differ.sum()))
    few = 17  # below FEW_ROWS: the shorter chunks
    for kind in ("flat", "peaked"):
        probs = rows(few, vocab, kind, g).cuda()
        check_nucleus(top_p_renorm_triton(probs, top_p[:few]), probs, top_p[:few])
    check_graph_replay(top_p_renorm_triton, m, vocab, top_p, g)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kernel", ["triton", "radix"])
def test_target_probs_with_each_top_p_kernel_is_the_flashinfer_law(kernel):
    """``target_probs(top_p_kernel=...)`` with the Triton or the radix nucleus, alone and
    jointly with top-k, equals the FlashInfer path on every non-edge token."""
    from sglang_ddtree.core.sampling import target_probs

    g = torch.Generator().manual_seed(2)
    bs, n, vocab = 4, 17, 151936
    logits = (2 * torch.randn(bs, n, vocab, generator=g)).cuda()
    temperature = torch.tensor([1.0, 0.7, 1.3, 1.0]).cuda()
    top_k = torch.tensor([1 << 30, 20, 50, 1 << 30]).cuda()
    top_p = torch.tensor([0.95, 0.9, 0.8, 1.0]).cuda()
    # The nucleus is judged on the unfiltered softmax: its edge tokens may go either way.
    base = torch.softmax(logits.float() / temperature[:, None, None], dim=-1).cpu()
    edge = mass_above(base.view(-1, vocab)) - top_p.cpu().double().repeat_interleave(n)[:, None]
    edge = edge.abs().view(bs, n, vocab) < EDGE
    for need_top_k in (False, True):
        a = target_probs(logits, temperature, top_k, top_p, need_top_k=need_top_k)
        b = target_probs(logits, temperature, top_k, top_p, need_top_k=need_top_k,
                         top_p_kernel=kernel)  # fmt: skip
        differ = ((a > 0) != (b > 0)).cpu() & ~edge
        assert not differ.any(), int(differ.sum())
        both = (a > 0) & (b > 0)
        torch.testing.assert_close(b[both], a[both], rtol=1e-4, atol=1e-7)
