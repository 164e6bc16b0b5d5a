"""Registers and spills of the tree-attention Triton kernels, compiled for a GPU target on a
machine that needs no GPU (Triton's compiler, its bundled ``cuobjdump -res-usage``).

Per kernel and shape (8B heads and K2.6's latent at TP 8; W = 17 / 33 / 65; one program per
prefix and 16 shares) at the warps ``core.tree_attention.kernel_warps`` picks and at 4: ``REG``
(registers a thread, 255 the most) and ``STACK`` (bytes a thread spilled to local memory; 0 is
the aim). Registers differ between Triton versions; the GPU's own build decides.

    python benchmark/ddtree/kernel_registers.py            # sm_90 (H100 / H200)
    python benchmark/ddtree/kernel_registers.py --arch 100 # sm_100 (B200 / B300)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile


def _signature(names, pointers: dict[str, str]) -> dict[str, str]:
    """Triton signature: the named pointers, fp32 scale, int32 strides, the rest constexpr."""
    out = {}
    for n in names:
        if n in pointers:
            out[n] = pointers[n]
        elif n == "sm_scale":
            out[n] = "fp32"
        elif n.startswith("stride"):
            out[n] = "i32"
        else:
            out[n] = "constexpr"
    return out


def usage(fn, pointers: dict, constexprs: dict, num_warps: int, arch: int) -> tuple[int, int]:
    """``(registers, stack bytes)`` a thread of ``fn`` compiled with these constants."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    src = ASTSource(
        fn=fn,
        signature=_signature(names, pointers),
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
    )
    kernel = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps}
    )
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", text)
    assert found, text
    return int(found.group(1)), int(found.group(2))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10")
    args = ap.parse_args(argv)
    import triton

    from sglang_ddtree.core import tree_attention as ta

    tree_ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "NodeLoc": "*i64",
                 "Mask": "*i1", "MaskIndptr": "*i32", "KvIndptr": "*i32", "O1": "*fp32",
                 "Lse1": "*fp32"}  # fmt: skip
    prefix_ptrs = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "KvIndptr": "*i32",
                   "KvIndices": "*i32", "Out": "*fp32", "Lse": "*fp32"}  # fmt: skip
    shapes = {
        "8B heads": dict(G=4, D=128, DV=128, hq=32),
        "K2.6 TP8": dict(G=8, D=576, DV=512, hq=8),
    }
    print(f"Triton {triton.__version__}, sm_{args.arch}: registers a thread / stack bytes")
    print("| kernel | shape | W | shares | warps: kernel_warps | warps: 4 |")
    print("|---|---|---:|---:|---|---|")
    for label, s in shapes.items():
        d_tiles = -(-s["D"] // 64)
        dv_block = min(s["DV"], ta.VALUE_TILE)
        for w in (17, 33, 65):
            block_w = max(16, triton.next_power_of_2(w))
            block_r = min(block_w, ta.TREE_ROWS)
            prefix_warps, tree_warps = ta.kernel_warps(block_r, block_w, dv_block, d_tiles)
            for splits in (1, 16):
                tree = dict(W=w, G=s["G"], D=s["D"], DV=s["DV"], BLOCK_R=block_r,
                            BLOCK_W=block_w, BLOCK_DK=64, D_TILES=d_tiles, BLOCK_DV=dv_block,
                            DV_TILES=-(-s["DV"] // dv_block), FULL_MASK=True,
                            SPLITS=splits, BLOCK_S=splits, MIN_SHARE=ta.MIN_SHARE_KEYS,
                            BLOCK_N=ta.PREFIX_BLOCK_N)  # fmt: skip
                fn = ta._tree_attention_kernel
                picked = usage(fn, tree_ptrs, tree, tree_warps, args.arch)
                four = usage(fn, tree_ptrs, tree, 4, args.arch)
                print(f"| tree | {label} | {w} | {splits} | {tree_warps}: {picked} | {four} |")
            for splits in (1, 16):  # the prefix kernel's values whole (`value_tiling`)
                prefix = dict(W=w, G=s["G"], D=s["D"], DV=s["DV"],
                              BLOCK_M=ta._rows_per_program(w, s["G"], s["DV"]),
                              BLOCK_N=ta.PREFIX_BLOCK_N, BLOCK_DK=64, D_TILES=d_tiles,
                              BLOCK_DV=triton.next_power_of_2(s["DV"]), DV_TILES=1,
                              SPLITS=splits, MIN_SHARE=ta.MIN_SHARE_KEYS)  # fmt: skip
                fn = ta._prefix_attention_kernel
                picked = usage(fn, prefix_ptrs, prefix, prefix_warps, args.arch)
                four = usage(fn, prefix_ptrs, prefix, 4, args.arch)
                print(f"| prefix | {label} | {w} | {splits} | {prefix_warps}: {picked} | {four} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
