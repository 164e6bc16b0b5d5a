"""``DDTreeVerifyInput``: the data of one DDTREE step's target verify.

The verify forward is DFLASH's (``DFlashVerifyInput.prepare_for_verify``, TARGET_VERIFY mode) with W
tree nodes per request and the ancestor-only custom mask in place of DFLASH's causal block. The step
builds it (``ddtree_step.DDTreeStep.verify_input``) and takes the accept decision over the verify's
logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput

from sglang_ddtree.core.step import TreeStep


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """DFLASH's verify input carrying the step's tree (``TreeStep``: node tokens [bs, W],
    layout, KV slots); ``custom_mask`` is its ancestor mask in SGLang's FULL_MASK layout."""

    tree: TreeStep | None = None

    @classmethod
    def from_tree(cls, tree: TreeStep, mask: torch.Tensor | None) -> DDTreeVerifyInput:
        """``mask``: the tree's FULL_MASK (``ddtree_step.verify_mask``) where the target's
        verify backend reads it (``reads_full_mask``), None where it reads the tree's own
        ``[bs, W, W]`` mask."""
        return cls(
            draft_token=tree.tokens.reshape(-1),
            positions=tree.layout.positions.reshape(-1),
            draft_token_num=tree.tokens.shape[1],
            custom_mask=mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            tree=tree,
        )
