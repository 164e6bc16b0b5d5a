"""The split-row Triton argmax (core.argmax_triton) against torch.argmax(dim=-1), bit for bit.

CPU: the kernels' logic under Triton's interpreter (a subprocess with TRITON_INTERPRET=1),
compared with torch's CPU argmax, whose rule (first index of the max, the first NaN above
everything) is checked first on a hand case: several chunks with a partial last chunk and a
partial last block, one chunk larger than the vocabulary, V = 1, float32 / bf16 / fp16, exact
ties (also across chunks and across lanes), NaN / -inf / +inf / signed-zero rows, strided row
views; `step.target_argmax` is torch's argmax on CPU tensors. GPU (``gpu`` marker): the
Qwen3-8B vocabulary at 1-1024 rows against torch's CUDA argmax, a CUDA-graph replay on new
logits, and `step.target_argmax` on CUDA logits.
"""

from __future__ import annotations

import pytest
import torch

NAN, INF = float("nan"), float("inf")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# (rows, vocab, chunk, block): 4 chunks of 4 blocks, the last chunk partial (232 = 3 x 64 + 40);
# one chunk larger than the vocabulary; V = 1; the default chunk and block (5 chunks a row).
CASES = [(5, 1000, 256, 64), (3, 300, 512, 128), (4, 1, 16, 16), (3, 5000, None, None)]


def special_rows(vocab: int) -> torch.Tensor:
    """[16, vocab] float32 rows of ties and special values; `vocab` >= 1000 (chunks of 256,
    blocks of 64 in the interpreted check: index i sits in lane i % 64 of chunk i // 256)."""
    z = torch.zeros(16, vocab)
    z[0, [10, 600]] = 5.0  # the max in chunks 0 and 2: the later chunk's copy loses
    z[1, [70, 130]] = 5.0  # lane 6 (block 1) before lane 2 (block 2): the lower index wins
    z[2, [3, 67]] = 5.0  # one lane, blocks 0 and 1
    z[3, 5], z[3, 700] = 9.0, NAN  # a NaN in a later chunk than the max
    z[4, [900, 300]] = NAN  # two NaNs: the first
    z[5, 0] = NAN  # NaN at index 0
    z[6] = NAN  # all NaN
    z[7] = -INF  # all -inf: index 0
    z[8] = -INF
    z[8, vocab - 1] = -1.0  # the only finite logit is the last
    z[9, [400, 800]] = INF  # +inf twice: the first
    z[10, [400, 800]] = INF
    z[10, 950] = NAN  # +inf, then a NaN: the NaN
    z[11] = -1.0
    z[11, 200], z[11, 500] = -0.0, 0.0  # -0.0 == +0.0: the first
    z[12, 0] = -0.0  # an all-zero row starting with -0.0: index 0
    z[13] = -INF
    z[13, 257] = NAN  # NaN among -inf
    z[14, vocab - 1] = 1.0  # the max at the very last index (the partial last block)
    z[15, [255, 256]] = 1.0  # the max at the last index of chunk 0 and the first of chunk 1
    return z


def check_reference_rule() -> None:
    """torch's CPU argmax follows the rule the CUDA one does (the reference of these tests)."""
    x = torch.tensor(
        [
            [1.0, 3.0, NAN, 3.0, NAN],
            [-INF, -INF, -INF, -INF, -INF],
            [0.0, INF, 2.0, INF, NAN],
            [-1.0, -0.0, 0.0, 0.0, -1.0],
            [1.0, 5.0, 5.0, 2.0, 2.0],
        ]
    )
    for dtype in DTYPES:
        assert torch.argmax(x.to(dtype), dim=-1).tolist() == [2, 0, 4, 1, 1], dtype


def check_equal_to_torch(x: torch.Tensor, chunk: int | None = None, block: int | None = None):
    from sglang_ddtree.core.argmax_triton import argmax_rows

    got = argmax_rows(x, chunk=chunk, block=block)
    want = torch.argmax(x, dim=-1)
    assert got.dtype == torch.int64 and got.shape == want.shape
    assert torch.equal(got, want), (x.dtype, chunk, block, got, want)


def test_cpu_reference_rule():
    check_reference_rule()


_INTERPRETED_CHECK = """
import torch
from test_argmax_triton import CASES, DTYPES, check_equal_to_torch, check_reference_rule
from test_argmax_triton import special_rows

check_reference_rule()
g = torch.Generator().manual_seed(0)
for rows, vocab, chunk, block in CASES:
    logits = torch.randn(rows, vocab, generator=g)
    ties = torch.randint(0, 4, (rows, vocab), generator=g).float()  # many exact ties
    for dtype in DTYPES:
        check_equal_to_torch(logits.to(dtype), chunk, block)
        check_equal_to_torch(ties.to(dtype), chunk, block)
special = special_rows(1000)
for dtype in DTYPES:
    check_equal_to_torch(special.to(dtype), 256, 64)
    check_equal_to_torch(special[:, :300].to(dtype), 512, 128)  # one chunk, larger than V
# Strided views: rows of a wider buffer (row stride 1200 > V = 1000), at an offset and not.
wide = torch.randint(0, 3, (6, 1200), generator=g).float()
wide[2, 150] = float("nan")
for view in (wide[:, 100:1100], wide[:, :1000], wide[::2, 7:1007]):
    assert view.stride(0) > view.shape[1]
    check_equal_to_torch(view, 256, 64)
    check_equal_to_torch(view.to(torch.bfloat16), 256, 64)
# Many rows, several chunks each (programs are (row, chunk) on one grid axis).
check_equal_to_torch(torch.randint(0, 2, (40, 100), generator=g).float(), 32, 16)
print("interpreted triton argmax OK")
"""


def test_triton_argmax_interpreted_equals_torch(run_interpreted):
    """The kernels' logic, run by Triton's CPU interpreter, against torch.argmax."""
    run_interpreted(_INTERPRETED_CHECK, "interpreted triton argmax OK")


def test_default_chunk_fills_the_gpu_and_keeps_partials_small():
    pytest.importorskip("triton")
    from sglang_ddtree.core.argmax_triton import MIN_CHUNK, default_chunk

    vocab = 151936
    for rows in (1, 16, 17, 65, 128, 256, 1024, 4096):
        chunk = default_chunk(rows, vocab)
        assert chunk & (chunk - 1) == 0 and chunk >= MIN_CHUNK
        chunks = -(-vocab // chunk)
        if 16 <= rows <= 128:
            assert rows * chunks >= 4 * 132  # several waves over an H200's 132 SMs
        assert chunks <= 160  # small partials (and stage 2's one row of them)
        if rows >= 1024:
            assert chunks <= 2
    assert default_chunk(16, vocab) == 2048 and default_chunk(128, vocab) == 16384
    assert default_chunk(4, 1) == MIN_CHUNK  # V = 1: one chunk


def test_asserts_at_the_boundary():
    pytest.importorskip("triton")
    from sglang_ddtree.core.argmax_triton import argmax_rows

    with pytest.raises(AssertionError, match=r"\[rows, vocab\]"):
        argmax_rows(torch.zeros(2, 3, 4))
    with pytest.raises(AssertionError, match="dtype"):
        argmax_rows(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(AssertionError, match="contiguous"):
        argmax_rows(torch.zeros(4, 3).t())
    with pytest.raises(AssertionError, match="CUDA"):
        argmax_rows(torch.zeros(2, 3))  # a CPU tensor outside the interpreter


@pytest.mark.gpu
def test_triton_argmax_on_gpu_qwen_vocab():
    """V = 151,936 at 1-1024 rows: random float32 / bf16 logits, ties across chunks, NaN /
    -inf / +inf rows and a strided view, equal to torch.argmax on CUDA."""
    g = torch.Generator(device="cuda").manual_seed(0)
    vocab = 151936
    for rows in (1, 17, 65, 128, 1024):
        x = 4 * torch.randn(rows, vocab, device="cuda", generator=g)
        check_equal_to_torch(x)
        check_equal_to_torch(x.to(torch.bfloat16))
        ties = torch.randint(0, 3, (rows, vocab), device="cuda", generator=g).float()
        check_equal_to_torch(ties)
        check_equal_to_torch(ties.half())
    special = special_rows(vocab).cuda()
    special[0, [10, 100000]] = 50.0  # the max in chunks far apart: the first
    special[3, 150000] = NAN
    for dtype in DTYPES:
        for chunk in (None, 1024, 4096, 262144):
            check_equal_to_torch(special.to(dtype), chunk)
    wide = torch.randn(65, vocab + 128, device="cuda", generator=g)
    check_equal_to_torch(wide[:, 64 : 64 + vocab])
    check_equal_to_torch(wide[:, 3 : 3 + vocab])  # an unaligned row start


@pytest.mark.gpu
def test_triton_argmax_in_cuda_graph():
    """Captured on a static input, replayed after the input changes in place."""
    from sglang_ddtree.core.argmax_triton import argmax_rows

    g = torch.Generator(device="cuda").manual_seed(1)
    static = torch.randn(65, 151936, device="cuda", generator=g)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        argmax_rows(static)  # compile outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax_rows(static)
    for seed in range(3):
        static.copy_(torch.randn(65, 151936, device="cuda", generator=g) * (1 + seed))
        static[seed, [7, 151000]] = NAN if seed == 2 else 1e4
        graph.replay()
        assert torch.equal(out, torch.argmax(static, dim=-1)), seed


def test_step_target_argmax_is_torch_argmax_on_cpu():
    """accept_and_commit's argmax: torch's on CPU tensors (the CPU suite never needs triton)."""
    from sglang_ddtree.core.step import target_argmax

    x = special_rows(1000)
    for dtype in DTYPES:
        assert torch.equal(target_argmax(x.to(dtype)), torch.argmax(x.to(dtype), dim=-1))


@pytest.mark.gpu
def test_step_target_argmax_on_gpu():
    from sglang_ddtree.core.step import SPLIT_ARGMAX_MAX_ROWS, target_argmax

    x = torch.randn(65, 151936, device="cuda")
    x[3, [5, 90000]] = NAN
    for view in (x, x.bfloat16(), x.t().contiguous().t()[:, :1000]):
        assert torch.equal(target_argmax(view), torch.argmax(view, dim=-1))
    # Past SPLIT_ARGMAX_MAX_ROWS rows: torch's argmax, the same answer.
    y = torch.randn(SPLIT_ARGMAX_MAX_ROWS + 1, 4096, device="cuda")
    assert torch.equal(target_argmax(y), torch.argmax(y, dim=-1))
