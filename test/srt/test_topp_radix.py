"""The radix-select top-p renormalization (core.topp_radix, the CUDA kernel
``sgl-kernel/csrc/ddtree/top_p_radix.cuh``) against the float64 law's nucleus and sgl_kernel's
``top_p_renorm_prob`` (FlashInfer's), with the judge of ``test_topp_triton.check_nucleus``:
every token whose mass above lies more than ``EDGE`` from ``top_p`` decided as float64 does,
kept values ``p / Z``, tied tokens one fate.

CPU: the kernel's source is found, or its absence named with the fix, and CPU tensors are
refused before anything is built. GPU (``gpu`` marker): V = 151,936 rows of six shapes at 136
and 17 rows, rows with top_p = 1 and one-hot rows, the same bits on a second call, a CUDA-graph
replay on new rows; vocabularies not a multiple of 4 and rows off a 16-byte boundary.
"""

from __future__ import annotations

import pytest
import torch
from test_topp_triton import check_graph_replay, check_nucleus, float32_edge, rows


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
def test_radix_top_p_on_rows_not_16_byte_aligned():
    """Vocabularies that are not a multiple of 4, and a view whose rows start off a 16-byte
    boundary, take the kernel's one-float-at-a-time reads: the same nucleus."""
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
