"""``DDTreeVerifyInput``: the data of one DDTREE step's target verify.

The verify forward is DFLASH's (``DFlashVerifyInput.prepare_for_verify``, TARGET_VERIFY mode)
with W tree nodes per request and the ancestor-only custom mask in place of DFLASH's causal
block. The accept decision over the verify's logits is the worker's
(``ddtree_utils.accept_tree``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput

from sglang_ddtree.core.step import TreeStep
from sglang_ddtree.srt.ddtree_utils import verify_mask


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """DFLASH's verify input carrying the step's tree (``TreeStep``: node tokens [bs, W],
    layout, KV slots); ``custom_mask`` is its ancestor mask in SGLang's FULL_MASK layout."""

    tree: TreeStep | None = None

    @classmethod
    def from_tree(
        cls,
        tree: TreeStep,
        batch,
        draft_input,
        full_mask: bool = True,
        mask_capacity: int | None = None,
    ) -> DDTreeVerifyInput:
        """``full_mask``: whether the target's backend reads SGLang's FULL_MASK (triton,
        flashinfer); flashmla's verify reads the tree's own ``[bs, W, W]`` mask instead.
        ``mask_capacity``: the graph's mask buffer, where the verify replays a graph
        (`ddtree_utils.verify_mask`)."""
        w = tree.tokens.shape[1]
        mask = verify_mask(tree, batch, draft_input, w, mask_capacity) if full_mask else None
        return cls(
            draft_token=tree.tokens.reshape(-1),
            positions=tree.layout.positions.reshape(-1),
            draft_token_num=w,
            custom_mask=mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            tree=tree,
        )
