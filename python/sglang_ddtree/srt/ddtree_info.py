"""``DDTreeVerifyInput``: the target verify of one DDTREE step and its accept decision.

The verify forward is DFLASH's (``DFlashVerifyInput.prepare_for_verify``, TARGET_VERIFY mode)
with W tree nodes per request and the ancestor-only custom mask in place of DFLASH's causal
block; ``verify`` then takes the target's logits over the nodes to the accepted path, the bonus
token and the commit plan: greedy requests by the tree walk, sampled ones by target-only tree
sampling (``core.step.accept_and_commit``, one pass for a mixed batch), through the step's
captured accept graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.dflash_info import DFlashVerifyInput

from sglang_ddtree.core.commit import CommitPlan
from sglang_ddtree.core.layout import scatter_verify_mask, verify_mask_numel
from sglang_ddtree.core.sampling import draw_coins
from sglang_ddtree.core.step import TreeStep


def verify_mask(tree: TreeStep, batch, draft_input, num_nodes: int) -> torch.Tensor:
    """FULL_MASK bool [>= W * sum(prefix) + bs * W * W], sized from host lengths only.

    The reserved KV lengths (committed + 2 W per request, never clamped: near the context limit
    a prefix may pass the context length by one accepted path) bound every prefix, also under
    overlap scheduling, where the host's committed lengths lag the device's by a step. Reading
    the device lengths instead would cost one host sync per step.
    """
    if draft_input.reserved_seq_lens_cpu is not None:
        prefix = draft_input.reserved_seq_lens_cpu
    elif batch.seq_lens_cpu is not None:
        prefix = batch.seq_lens_cpu
    else:
        raise RuntimeError("DDTREE needs host sequence lengths to size the verify mask.")
    total = verify_mask_numel(num_nodes, prefix)
    return scatter_verify_mask(tree.layout.tree_mask, tree.mask_cells, total)


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """DFLASH's verify input carrying the step's tree (``TreeStep``: node tokens [bs, W],
    layout, KV slots); ``custom_mask`` is its ancestor mask in SGLang's FULL_MASK layout."""

    tree: TreeStep | None = None

    @classmethod
    def from_tree(cls, tree: TreeStep, batch, draft_input) -> DDTreeVerifyInput:
        w = tree.tokens.shape[1]
        return cls(
            draft_token=tree.tokens.reshape(-1),
            positions=tree.layout.positions.reshape(-1),
            draft_token_num=w,
            custom_mask=verify_mask(tree, batch, draft_input, w),
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
    ) -> CommitPlan:
        """Accept per request and plan the commit; the key adds the sampling mode."""
        tree = self.tree
        bs, w = tree.tokens.shape
        bound = {"logits": logits, "tokens": tree.tokens, "seq_lens": tree.seq_lens}
        bound.update(tree.layout._asdict())
        if sampling_info is None or sampling_info.is_all_greedy:
            return accept_graphs(key and (*key, "greedy"), bound)
        # SGLang's host flags: skip a renorm pass over [bs * W, V] that no request needs.
        need_k = bool(getattr(sampling_info, "need_top_k_sampling", True))
        need_p = bool(getattr(sampling_info, "need_top_p_sampling", True))
        # The coins are drawn here, eagerly (two launches), and copied in like the sampling
        # parameters: the law then never depends on how captured graphs replay the RNG.
        coins, final_coins = draw_coins(bs, w, logits.device, generator=coin_generator)
        copied = {
            "temperatures": sampling_info.temperatures.view(-1),
            "top_ks": sampling_info.top_ks.view(-1),
            "top_ps": sampling_info.top_ps.view(-1),
            "coins": coins,
            "final_coins": final_coins,
        }
        static = {"need_top_k": need_k, "need_top_p": need_p}
        return accept_graphs(key and (*key, "sampled", need_k, need_p), bound, copied, static)
