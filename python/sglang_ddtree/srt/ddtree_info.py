"""``DDTreeVerifyInput``: the target verify of one DDTREE step and its accept decision.

The verify forward is DFLASH's (``DFlashVerifyInput.prepare_for_verify``, TARGET_VERIFY mode)
with W tree nodes per request and the ancestor-only custom mask in place of DFLASH's causal
block; ``verify`` then takes the target's logits over the nodes to the accepted path, the bonus
token and the commit plan: greedy requests by the tree walk, sampled ones by target-only tree
sampling (``core.step.accept_and_commit``, one pass for a mixed batch), through the step's
captured accept graph (``ddtree_utils``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput

from sglang_ddtree.core.commit import CommitPlan
from sglang_ddtree.core.step import TreeStep
from sglang_ddtree.srt.ddtree_utils import accept_tree, verify_mask


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

    def verify(
        self,
        logits: torch.Tensor,  # [bs * W, V] target logits at every node (penalties applied)
        sampling_info,  # SGLang's SamplingBatchInfo, or None (every request greedy)
        accept_graphs,  # ddtree_glue_graph.SegmentGraphs over core.step.accept_and_commit
        key,  # its graph key (bs,), or None to run eagerly
        coin_generator: torch.Generator,
        mode: tuple | None = None,  # ddtree_utils.accept_mode(sampling_info), if known
    ) -> CommitPlan:
        """Accept per request and plan the commit (``ddtree_utils.accept_tree``)."""
        return accept_tree(
            self.tree, logits, sampling_info, accept_graphs, key, coin_generator, mode
        )
