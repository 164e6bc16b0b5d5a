"""Target-verify CUDA graphs that carry the DDTREE tree mask.

SGLang's DFlash-family graph dummy is mask-less on triton/flashinfer (a DFLASH block is plain
causal), which freezes the captured attention metadata to "no custom mask": a replayed tree
verify would then silently attend causally. The subclass below captures the target's
TARGET_VERIFY graphs with the runner's static all-True mask buffer, so the backend's replay path
copies each step's tree mask in. The drafter's graphs are untouched (its block is not a tree).

Installed on the *target* model runner through its ``_decode_cuda_graph_runner_cls`` override
point, from the worker's constructor (which runs before any capture).
"""

from __future__ import annotations

from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner


class DDTreeDecodeCudaGraphRunner(DecodeCudaGraphRunner):
    """Decode/verify graph runner whose target-verify capture dummy has a tree mask."""

    def get_spec_info(self, num_tokens: int):
        spec_info = super().get_spec_info(num_tokens)
        if spec_info is not None and not self.model_runner.is_draft_worker:
            # [(max_bs * fill + max_tokens) * width] bool, all True: mask mode on at capture.
            spec_info.custom_mask = self.buffers.custom_mask
        return spec_info


def install_target_graph_runner(model_runner) -> None:
    """Make ``model_runner`` build `DDTreeDecodeCudaGraphRunner` for its decode graphs."""
    model_runner._decode_cuda_graph_runner_cls = lambda: DDTreeDecodeCudaGraphRunner
