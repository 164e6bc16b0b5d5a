"""Registers and spills of the tree-attention Triton kernels as the attention hook launches them,
compiled for a GPU target on a machine that needs no GPU (Triton's compiler and its bundled
``ptxas`` / ``cuobjdump -res-usage``).

`record_launches` runs ``core.tree_attention.tree_attention`` on CPU tensors with its two kernels
replaced by recorders, so the launches are exactly the hook's (`launch_settings`: tiles, shares,
warps, stages, the latent variant, the chunked merge); `compile_launch` compiles one of them;
`usage` reads a compiled kernel's registers a thread (``REG``, 255 the most) and spilled bytes a
thread (``STACK``; 0 is the aim). Shapes: one K2.6 TP-8 rank's latent (8 query heads, keys 576,
values 512, W 8) on FlashMLA's 64-slot pages, and the 8B shape (32 / 8 heads of 128, W 16), at
bs 1 / 8 / 32. Registers differ between Triton versions; the GPU's own build decides
(`bench_tree_attention.py --sweep` reports that build's).

    python benchmark/ddtree/kernel_registers.py            # sm_90a (H100 / H200)
    python benchmark/ddtree/kernel_registers.py --arch 100 # sm_100a (B200 / B300)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager

import torch

KERNELS = ("_prefix_attention_kernel", "_tree_attention_kernel")
GLUON_KERNELS = ("_latent_prefix_gluon",)  # in core.tree_attention_gluon


class _LaunchRecorder:
    """Stands in for a Triton kernel: ``kernel[grid](*args, **kw)`` records the launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((args, kw))


@contextmanager
def record_launches():
    """Within the block, `core.tree_attention`'s kernels (and `core.tree_attention_gluon`'s
    where Gluon imports) only record their launches: yields ``{kernel name: (the real kernel,
    [(args, kwargs), ...])}``."""
    import sglang_ddtree.core.tree_attention as ta

    modules = {name: ta for name in KERNELS}
    try:
        import sglang_ddtree.core.tree_attention_gluon as tg

        modules.update({name: tg for name in GLUON_KERNELS})
    except ImportError:  # a Triton without Gluon
        pass
    real = {name: getattr(module, name) for name, module in modules.items()}
    recorders = {name: _LaunchRecorder() for name in modules}
    out = {name: (real[name], recorders[name].launches) for name in modules}
    try:
        for name, module in modules.items():
            setattr(module, name, recorders[name])
        yield out
    finally:
        for name, module in modules.items():
            setattr(module, name, real[name])


def compile_launch(kernel, args, kw, arch: int = 90):
    """``kernel`` compiled as this launch would run it, for ``sm_<arch>a``, by Triton's own
    compiler (front end, target passes, ptxas), without a GPU. Each runtime argument is
    specialized as Triton's launcher specializes it (`native_specialize_impl`: pointers and
    integers divisible by 16 marked so, integers equal to 1 made constants): without the
    divisibility marks the loads cannot become asynchronous copies, and the kernel compiled
    differs from the one the GPU runs. Raises what Triton raises."""
    import triton
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource

    kw = dict(kw)
    options = {
        k: kw.pop(k) for k in ("num_warps", "num_stages", "enable_fp_fusion", "maxnreg") if k in kw
    }
    names = kernel.arg_names
    types, constants, attrs = {}, dict(kw), {}
    for i, (param, a) in enumerate(zip(kernel.params, args)):
        if param.is_constexpr:
            constants[param.name] = a
            continue
        kind, attr = native_specialize_impl(
            BaseBackend, a, param.is_const, not param.do_not_specialize,
            not param.do_not_specialize_on_alignment,
        )  # fmt: skip
        if kind == "constexpr":
            constants[param.name] = attr
            continue
        types[param.name] = kind
        if attr == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    if getattr(kernel, "is_gluon", lambda: False)():  # a Gluon kernel: its own front end
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    src = ASTSource(
        fn=kernel,
        signature={n: types.get(n, "constexpr") for n in names},
        constexprs={(names.index(k),): v for k, v in constants.items()},
        attrs=attrs,
    )
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compiler_missing() -> str | None:
    """Why kernels cannot be compiled here (no Triton, or a Triton without ``ptxas``), or None."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if not os.path.exists(_tool("ptxas")):
        return "this Triton has no bundled ptxas"
    return None


def usage(compiled) -> tuple[int, int]:
    """``(registers, stack bytes)`` a thread of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    assert found, text
    return int(found.group(1)), int(found.group(2))


def hook_case(
    bs: int,
    shape: str,
    num_sms: int = 132,
    prefix: int = 300,
    gluon: bool = False,
    width: int | None = None,
    **overrides,
):
    """``(args, kwargs)`` of `tree_attention` as the hook calls it for ``shape`` (``k26``: one
    K2.6 TP-8 rank on FlashMLA's pages; ``tiny``: the tiny pair's 4-head latent on a slot
    table; ``8b``: the 8B shape on a slot table), CPU tensors; ``gluon``: as on Hopper, where
    the hook may take the Gluon prefix kernel; ``width``: W (default the shape's: 8, or 16 for
    ``8b``); ``overrides`` replace launch keywords."""
    import sglang_ddtree.core.tree_attention as ta

    hq, hkv, d, dv, w = {"k26": (8, 1, 576, 512, 8), "tiny": (4, 1, 576, 512, 8),
                         "8b": (32, 8, 128, 128, 16)}[shape]  # fmt: skip
    w = width or w
    latent = d != dv
    q = torch.randn(bs * w, hq, d, dtype=torch.bfloat16)
    slots = bs * (prefix + w) + 64
    k = torch.randn(slots, hkv, d, dtype=torch.bfloat16)
    v = k[..., :dv] if latent else torch.randn(slots, hkv, dv, dtype=torch.bfloat16)
    page = 64 if shape == "k26" else 0
    # The flashmla hook's own prefix offsets are int64; the triton backend's kv_indptr int32.
    indptr = torch.arange(bs + 1, dtype=torch.int64 if page else torch.int32) * prefix
    loc = torch.arange(bs * w, dtype=torch.int64) + bs * prefix
    mask = torch.ones(bs, w, w, dtype=torch.bool).tril()
    kw = dict(ta.launch_settings(bs, w, hq, hkv, dv, num_sms, d if latent else 0, page, gluon))
    if page:  # a block table of 64-slot pages
        indices = torch.arange(bs * -(-prefix // 64), dtype=torch.int32).view(bs, -1)
        kw["page_size"] = page
    else:
        indices = torch.arange(bs * prefix, dtype=torch.int32)
    kw.update(overrides)
    return (q, k, v, indptr, indices, loc, mask, d**-0.5), kw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10")
    args = ap.parse_args(argv)
    missing = compiler_missing()
    if missing:
        raise SystemExit(f"kernel_registers.py compiles with Triton's bundled ptxas: {missing}.")
    import triton

    from sglang_ddtree.core.tree_attention import tree_attention

    print(f"Triton {triton.__version__}, sm_{args.arch}a, the hook's launches")
    print("| shape | bs | kernel | warps | stages | registers | spilled bytes |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for shape in ("k26", "8b"):
        for bs in (1, 8, 32):
            call, kw = hook_case(bs, shape)
            with record_launches() as launches:
                tree_attention(*call, **kw)
            for name, (kernel, recorded) in launches.items():
                for launch_args, launch_kw in recorded:
                    regs, stack = usage(compile_launch(kernel, launch_args, launch_kw, args.arch))
                    stages = launch_kw.get("num_stages", "-")
                    print(f"| {shape} | {bs} | {name.strip('_')} | "
                          f"{launch_kw.get('num_warps', 4)} | {stages} | {regs} | {stack} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
