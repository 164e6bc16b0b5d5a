"""The radix-select top-p renormalization (core.topp_radix, the CUDA kernel
``sgl-kernel/csrc/ddtree/top_p_radix.cuh``; the sampled verify's nucleus) against the
float64 law's nucleus, the pure-torch joint law's (``sampling.joint_top_k_top_p_renorm`` with
top-k off) and sgl_kernel's ``top_p_renorm_prob`` (FlashInfer's).

A token's fate is fixed by ``G = mass strictly above it < top_p``, judged here in float64. The
kernel must decide every token whose ``G`` lies more than ``EDGE`` from ``top_p`` as float64
does, give every kept value the same ``p / Z``, and tied tokens the same fate. The float32
implementations it is also compared with (the torch reference's running sum, FlashInfer's
block sums) may misjudge a token by their summation error, up to ``V * 2**-24``
(``float32_edge``): they are compared outside that band.

CPU: the judge fails on a wrong nucleus; the kernel's source is found (in a checkout and in
SGLang's tree), or its absence named with the fix; CPU tensors are refused before anything is
built; the start-up error of a failed build names its cause.
GPU (``gpu`` marker): V = 151,936 rows of six shapes at 136 and 17 rows, rows with top_p = 1
and one-hot rows, the same bits on a second call, a CUDA-graph replay on new rows; vocabularies
not a multiple of 4, rows off a 16-byte boundary and 70,000 rows; from logits (the softmax
never written) against torch's softmax.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ddtree.core.sampling import joint_top_k_top_p_renorm, mass_above_each

EDGE = 1e-5  # |G - top_p| below this: either decision is a rounding of the same law


def float32_edge(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[M, V] bool: tokens a float32 sum of up to V terms may misjudge (``V * 2**-24``, the
    bound on a running sum's error for values summing to 1)."""
    band = probs.shape[-1] * 2.0**-24
    return (mass_above_each(probs.cpu().double()) - top_p.cpu().double()[:, None]).abs() < max(
        band, EDGE
    )


def check_nucleus(
    out: torch.Tensor, probs: torch.Tensor, top_p: torch.Tensor, value_band=None
) -> int:
    """Assert ``out`` is ``probs``' nucleus renormalized (module docstring); returns how many
    tokens were at the edge (either decision allowed). ``value_band`` ([M, 1] float64, for
    kernels that compute the probabilities themselves): tokens whose value lies within that
    relative distance of the nucleus' smallest value are also at the edge, since rounding the
    probabilities may reorder them."""
    assert out.shape == probs.shape and out.dtype == torch.float32
    out, probs, top_p = out.cpu(), probs.cpu(), top_p.cpu()
    g = mass_above_each(probs.double())
    edge = (g - top_p.double()[:, None]).abs() < EDGE
    keep = (g < top_p.double()[:, None]) | (top_p[:, None] >= 1)
    if value_band is not None:
        cut = torch.where(keep, probs.double(), float("inf")).min(-1, keepdim=True).values
        edge |= (probs.double() / cut - 1).abs() < value_band.cpu()
    kept = out > 0
    wrong = (kept != keep) & ~edge & (probs > 0)
    assert not wrong.any(), f"{int(wrong.sum())} tokens decided differently"
    # Tied tokens share their fate; the kept set is everything at or above the cut (with a
    # value band: everything above the band, and no tied value split inside it).
    for r in range(probs.shape[0]):
        if kept[r].any():
            cut, nonzero = probs[r][kept[r]].min(), probs[r] > 0
            if value_band is None:
                assert torch.equal(kept[r] & nonzero, (probs[r] >= cut) & nonzero), r
                continue
            top = cut.double() * (1 + float(value_band[r]))
            assert kept[r][probs[r].double() > top].all(), r
            inside = (probs[r] >= cut) & (probs[r].double() <= top)
            assert not torch.isin(probs[r][inside & ~kept[r]], probs[r][inside & kept[r]]).any(), r
    z = torch.where(kept, probs, 0).double().sum(-1, keepdim=True)
    want = torch.where(kept, probs.double() / z, 0)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-9)
    if value_band is None:
        ref = joint_top_k_top_p_renorm(probs, torch.zeros(probs.shape[0], dtype=torch.int64), top_p)
        loose = float32_edge(probs, top_p)
        assert torch.equal((ref > 0) & ~loose, kept & ~loose)
    return int(edge.sum())


def softmax_law(logits: torch.Tensor, t: torch.Tensor):
    """The float64 law of ``softmax(logits / t)`` ([M, V] float64) and the relative value band
    ([M, 1] float64) within which a float32 evaluation may misorder it. With y = logits *
    log2(e) / t, a float32 evaluation (torch's or the kernel's base-2 one) rounds the scale, y,
    the row's max and y - max (each at most |y| * 2^-24, at most 2 * max|y| for y - max) and the
    exp and 1 / sum (a few ulps): 2^-23 * (4 + max|y|) bounds twice the relative error."""
    y = logits.cpu().double() * (1.4426950408889634 / t.cpu().double()[:, None])
    law = torch.softmax(y * 0.6931471805599453, dim=-1)
    return law, 2.0**-23 * (4 + y.abs().amax(-1, keepdim=True))


def rows(m: int, vocab: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    """[m, vocab] float32 probability rows of a named shape."""
    return torch.softmax(row_logits(m, vocab, kind, generator), dim=-1)


def row_logits(m: int, vocab: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    """[m, vocab] float32 logits of the rows of ``rows``."""
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
    return logits


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


@pytest.mark.parametrize("from_logits", [False, True])
def test_the_check_catches_a_wrong_nucleus(from_logits):
    """The comparison can fail: a nucleus cut one distinct value too low, a renormalization
    off by a factor, and a tie split are each rejected, with and without ``softmax_law``'s
    value band."""
    g = torch.Generator().manual_seed(1)
    logits = row_logits(4, 500, "ties", g)
    probs, band = (
        softmax_law(logits, torch.ones(4)) if from_logits else (rows(4, 500, "ties", g), None)
    )
    probs = probs.float()
    top_p = torch.tensor([0.5, 0.8, 0.3, 0.95])
    ref = joint_top_k_top_p_renorm(probs, torch.zeros(4, dtype=torch.int64), top_p)
    # At the edge: none; with the band, the tokens tied at each row's cut (distinct values are
    # a factor e apart here, far outside it).
    cuts = torch.where(ref > 0, probs, float("inf")).min(-1, keepdim=True).values
    assert check_nucleus(ref, probs, top_p, band) == (
        0 if band is None else int((probs == cuts).sum())
    )
    # One more distinct value kept in row 0.
    cut = probs[0][ref[0] > 0].min()
    below = probs[0][probs[0] < cut].max()
    wider = ref.clone()
    wider[0] = torch.where(probs[0] >= below, probs[0], 0)
    wider[0] /= wider[0].sum()
    with pytest.raises(AssertionError):
        check_nucleus(wider, probs, top_p, band)
    with pytest.raises(AssertionError):
        check_nucleus(ref * 1.01, probs, top_p, band)
    split = ref.clone()
    tied = torch.nonzero(probs[1] == probs[1][ref[1] > 0].min()).flatten()
    assert len(tied) > 1
    split[1, tied[0]] = 0
    split[1] /= split[1].sum()
    with pytest.raises(AssertionError):
        check_nucleus(split, probs, top_p, band)


def base2_softmax_float32(logits: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """[M, V] float32: the from-logits kernel's probabilities, emulated on the CPU (header of
    ``top_p_radix.cuh``): k = fl(log2(e) / t), m = max fl(logit * k), p = fl(2^fl(logit * k - m)
    / sum), the FMA and exp2 exact in float64 before rounding."""
    k = (torch.tensor(1.4426950408889634, dtype=torch.float32) / t.float()).double()[:, None]
    x = logits.double()
    m = (x * k).float().amax(-1, keepdim=True).double()
    e = torch.exp2((x * k - m).float().double()).float().double()
    return (e / e.sum(-1, keepdim=True)).float()


def test_the_value_band_admits_the_kernels_rounding_of_the_law():
    """The null for the from-logits judge: the exact nucleus of the kernel's float32
    probabilities (emulated, ``base2_softmax_float32``) on flat rows, where rounding reorders
    near-equal tokens, passes against the float64 law with ``softmax_law``'s band, and fails
    without it."""
    g = torch.Generator().manual_seed(7)
    m, vocab = 20, 151936
    logits = row_logits(m, vocab, "flat", g)
    t = torch.tensor([1.0, 0.7, 1.3, 0.25, 2.0]).repeat(4)
    top_p = torch.rand(m, generator=g).clamp(0.05, 1.0)
    p32 = base2_softmax_float32(logits, t)
    keep = mass_above_each(p32.double()) < top_p.double()[:, None]
    ours = torch.where(keep, p32.double(), 0)
    ours = (ours / ours.sum(-1, keepdim=True)).float()
    law, band = softmax_law(logits, t)
    check_nucleus(ours, law, top_p, band)
    with pytest.raises(AssertionError, match="decided differently"):  # the band is needed
        check_nucleus(ours, law, top_p, torch.zeros_like(band))


def test_a_build_failure_names_its_cause():
    from sglang_ddtree.srt.ddtree_args import top_p_kernel_unavailable

    error = top_p_kernel_unavailable(OSError("nvcc: not found"))
    assert "nvcc: not found" in str(error)


def test_kernel_source_is_found_in_the_checkout():
    from sglang_ddtree.core.topp_radix import SOURCE, kernel_source

    found = kernel_source()["external_cuda_files"]
    assert len(found) == 1 and found[0].endswith(SOURCE)
    text = open(found[0]).read()
    assert "struct TopPRadix" in text  # the class the loader exports


def test_a_missing_kernel_source_is_a_clear_error(monkeypatch, tmp_path):
    """An install with neither a checkout's copy of the kernel source nor SGLang's in-tree one
    gets an error that names the fix."""
    from sglang_ddtree.core import topp_radix

    monkeypatch.setattr(topp_radix, "_CHECKOUT_SOURCE", tmp_path / "missing.cuh")
    with pytest.raises(RuntimeError, match=r"pip install -e \."):
        topp_radix.kernel_source()


def test_in_tree_the_kernel_source_is_found_under_sglang_jit_sources(monkeypatch, tmp_path):
    """In SGLang's tree (the upstream patch puts the kernel under ``sglang/kernels/jit/csrc/``)
    the loader is handed the source by its path under SGLang's ``KERNEL_PATH``."""
    import sys
    import types

    from sglang_ddtree.core import topp_radix

    (tmp_path / "csrc" / "ddtree").mkdir(parents=True)
    (tmp_path / "csrc" / topp_radix.SOURCE).write_text("// the kernel")
    utils = types.ModuleType("sglang.kernels.jit.utils")
    utils.KERNEL_PATH = str(tmp_path)
    for name in ("sglang", "sglang.kernels", "sglang.kernels.jit"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.kernels.jit.utils", utils)
    monkeypatch.setattr(topp_radix, "_CHECKOUT_SOURCE", tmp_path / "missing.cuh")
    assert topp_radix.kernel_source() == {"cuda_files": [topp_radix.SOURCE]}


def test_radix_refuses_cpu_tensors():
    from sglang_ddtree.core.topp_radix import top_p_renorm_radix

    with pytest.raises(AssertionError, match="CUDA"):
        top_p_renorm_radix(torch.rand(2, 8), torch.full((2,), 0.9))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_radix_top_p_on_gpu_is_the_law_deterministic_and_replays_in_a_graph():
    from sgl_kernel import top_p_renorm_prob

    from sglang_ddtree.core.topp_radix import top_p_renorm_radix

    g = torch.Generator().manual_seed(3)
    vocab = 151936
    for m in (136, 17):
        top_p = torch.rand(m, generator=g).clamp(0.05, 1.0)
        top_p[:4] = 0.95
        top_p[4] = 1.0
        top_p[5] = 1e-4
        top_p[6] = 0.999
        top_p = top_p.cuda()
        for kind in ("flat", "gaussian", "peaked", "ties", "bf16", "wide"):
            probs = rows(m, vocab, kind, g).cuda()
            ours = top_p_renorm_radix(probs, top_p)
            check_nucleus(ours, probs, top_p)
            assert torch.equal(ours, top_p_renorm_radix(probs, top_p)), kind  # same bits
            theirs = top_p_renorm_prob(probs, top_p)
            differ = ((ours > 0) != (theirs > 0)).cpu() & ~float32_edge(probs, top_p)
            assert not differ.any(), (m, kind, int(differ.sum()))
    # One-hot rows keep their one token; a row of zeros past the first chunk is fine.
    one_hot = torch.zeros(3, vocab, device="cuda")
    one_hot[0, 7] = 1.0
    one_hot[1, vocab - 1] = 1.0
    one_hot[2, 9000] = 1.0
    out = top_p_renorm_radix(one_hot, torch.tensor([0.5, 0.95, 1.0], device="cuda"))
    assert torch.equal(out, one_hot)
    # Replayed from a CUDA graph on new rows: the same output as an eager call.
    check_graph_replay(top_p_renorm_radix, 136, vocab, torch.full((136,), 0.9, device="cuda"), g)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_radix_top_p_on_rows_not_16_byte_aligned_and_on_many_rows():
    """Vocabularies that are not a multiple of 4, and a view whose rows start off a 16-byte
    boundary, take the kernel's one-float-at-a-time reads: the same nucleus. And 70,000 rows."""
    from sglang_ddtree.core.topp_radix import top_p_renorm_radix

    g = torch.Generator().manual_seed(5)
    for vocab in (151937, 50257, 10):
        m = 33
        top_p = torch.rand(m, generator=g).clamp(0.05, 1.0).cuda()
        for kind in ("flat", "gaussian", "ties"):
            probs = rows(m, vocab, kind, g).cuda()
            ours = top_p_renorm_radix(probs, top_p)
            check_nucleus(ours, probs, top_p)
            assert torch.equal(ours, top_p_renorm_radix(probs, top_p)), (vocab, kind)
    # V % 4 == 0 but every row one float past a 16-byte boundary: the kernel is handed the
    # view itself (already contiguous), so it must not take the float4 reads.
    vocab, m = 151936, 17
    flat = torch.empty(m * vocab + 1, device="cuda")
    flat[1:] = rows(m, vocab, "gaussian", g).cuda().reshape(-1)
    view = flat[1:].view(m, vocab)
    assert view.is_contiguous() and view.data_ptr() % 16 != 0
    top_p = torch.full((m,), 0.9, device="cuda")
    ours = top_p_renorm_radix(view, top_p)
    check_nucleus(ours, view, top_p)
    assert torch.equal(ours, top_p_renorm_radix(view.clone(), top_p))
    # More rows than a 2-D grid's 65,535 (bs x W can pass it): the last rows are decided, the
    # same as on their own.
    from sgl_kernel import top_p_renorm_prob

    m = 70000
    probs = rows(m, 12, "gaussian", g).cuda()
    top_p = torch.full((m,), 0.9, device="cuda")
    out = top_p_renorm_radix(probs, top_p)
    assert torch.equal(out[-100:], top_p_renorm_radix(probs[-100:], top_p[-100:]))
    differ = ((out > 0) != (top_p_renorm_prob(probs, top_p) > 0)).cpu()
    assert not (differ & ~float32_edge(probs, top_p)).any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_radix_from_logits_is_the_nucleus_of_the_softmax_law():
    """``top_p_softmax_renorm_radix(logits, t, top_p)``: the nucleus of the float64
    ``softmax(logits / t)`` (the judge above with ``softmax_law``'s value band: the kernel's
    float32 probabilities, like torch's, misorder tokens closer than their rounding), the same
    bits on a second call, rows not 16-byte aligned, and a CUDA-graph replay; and the two-step
    path's (torch's softmax, then `top_p_renorm_radix`) outside the float32 band."""
    from sglang_ddtree.core.topp_radix import top_p_renorm_radix, top_p_softmax_renorm_radix

    g = torch.Generator().manual_seed(7)
    for vocab, m in ((151936, 136), (151937, 17), (1000, 9)):
        top_p = torch.rand(m, generator=g).clamp(0.05, 1.0)
        top_p[:3] = 0.95
        top_p[3] = 1.0
        top_p = top_p.cuda()
        t = torch.tensor([1.0, 0.7, 1.3, 0.25, 2.0], dtype=torch.float32).repeat(m)[:m].cuda()
        for kind in ("flat", "gaussian", "peaked", "ties", "bf16", "wide"):
            logits = row_logits(m, vocab, kind, g).cuda()
            ours = top_p_softmax_renorm_radix(logits, t, top_p)
            law, band = softmax_law(logits, t)
            check_nucleus(ours, law, top_p, band)
            probs = torch.softmax(logits / t[:, None], dim=-1)
            assert torch.equal(ours, top_p_softmax_renorm_radix(logits, t, top_p)), kind
            two_step = top_p_renorm_radix(probs, top_p)
            differ = ((ours > 0) != (two_step > 0)).cpu() & ~float32_edge(probs, top_p)
            assert not differ.any(), (vocab, kind, int(differ.sum()))
    # Replayed from a CUDA graph on new logits: the eager call's output, bit for bit.
    m, vocab = 136, 151936
    top_p = torch.full((m,), 0.9, device="cuda")
    t = torch.full((m,), 0.8, device="cuda")
    static = row_logits(m, vocab, "gaussian", g).cuda()
    top_p_softmax_renorm_radix(static, t, top_p)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = top_p_softmax_renorm_radix(static, t, top_p)
    for kind in ("flat", "peaked"):
        static.copy_(row_logits(m, vocab, kind, g))
        graph.replay()
        torch.testing.assert_close(
            out, top_p_softmax_renorm_radix(static, t, top_p), rtol=0, atol=0
        )
        law, band = softmax_law(static, t)
        check_nucleus(out, law, top_p, band)
