"""torch.argmax vs core.argmax_triton.argmax_rows under CUDA-graph replay (us per call).

Rows of float32 and bfloat16 logits over Qwen3's 151,936-token vocabulary, 16 to 1,024 rows:
each call replayed from a CUDA graph and timed between CUDA events; the last column says
whether the two results are equal (the split kernel keeps torch's first-index tie rule)."""

import torch

from sglang_ddtree.core.argmax_triton import argmax_rows, default_chunk

V = 151936


def timed(fn, x, iters=200):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(x)
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(True), torch.cuda.Event(True)
    a.record()
    for _ in range(iters):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / iters, out


print("rows dtype chunk torch_us triton_us equal")
for dtype in (torch.float32, torch.bfloat16):
    for rows in (16, 32, 65, 128, 256, 1024):
        x = torch.randn(rows, V, device="cuda").to(dtype)
        t0, o0 = timed(lambda t: torch.argmax(t, dim=-1), x)
        t1, o1 = timed(argmax_rows, x)
        name = str(dtype).split(".")[1]
        eq = bool(torch.equal(o0, o1))
        print(rows, name, default_chunk(rows, V), f"{t0:.1f}", f"{t1:.1f}", eq)
