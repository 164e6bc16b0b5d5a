"""DDTree core: pure, batched, sync-free tensor functions (no SGLang imports).

Terms, fixed here and used in every module of the core (each module's docstring adds its own):

- **block** (B): what the DFlash drafter reads and fills in one forward, the root then B - 1
  masked slots, which give D = B - 1 per-depth draft distributions.
- **node**: one draft prefix; its token is the prefix's last one. **depth**: its length.
- **root**: node 0 of every tree, the token the target emitted last step (the previous step's
  bonus token), not yet in the target's KV cache; depth 0.
- **budget**: draft nodes per request, root excluded. **W** = budget + 1: the tree's slots,
  which is what one request puts through the target's verify forward (the verify width).
- **accepted path**: the root, then the draft nodes the target accepts, each a child of the
  one before; **accept length**: its draft nodes (0..S - 1, S = max depth + 1).
- **bonus token**: the target's own token after the accepted path's last node; the step
  commits accept length + 1 tokens and the bonus token becomes the next root.
- **K**: draft candidates per depth (`select_candidates`).

One decode step, in order:

    tree    = build_tree_from_candidates(*select_candidates(draft_logits, K, normalize=True),
                                         root_tokens, budget)
    layout  = tree_to_retrieve_arrays(tree, prefix_lens)
    # ... target verify forward over the W = budget + 1 nodes with layout.tree_mask ...
    logits  = apply_tree_penalties(logits, tree.tokens, layout.tree_mask, penalties)
    result  = accept_greedy(...)   or   accept_sampled(...)
    plan    = commit_accepted(result, prefix_lens, W)
    logprobs = committed_logprobs(logits, plan.keep_nodes, plan.out_tokens, temperature, n)
    penalties = count_emitted(penalties, plan.out_tokens)   # the next step's penalty state
"""

from sglang_ddtree.core.accept import (
    AcceptResult,
    accept_greedy,
    accept_sampled,
    accept_sampled_reference,
)
from sglang_ddtree.core.commit import CommitPlan, commit_accepted
from sglang_ddtree.core.layout import (
    TreeLayout,
    ancestor_mask,
    flatten_verify_mask,
    scatter_verify_mask,
    tree_to_retrieve_arrays,
    verify_mask_cells,
)
from sglang_ddtree.core.logprobs import CommittedLogprobs, committed_logprobs, node_logprobs
from sglang_ddtree.core.penalties import (
    RequestPenalties,
    apply_tree_penalties,
    count_emitted,
)
from sglang_ddtree.core.sampling import (
    draw_coins,
    joint_top_k_top_p_renorm,
    min_p_renorm,
    target_probs,
    top_k_top_p_min_p_renorm,
)
from sglang_ddtree.core.tree import (
    DraftTree,
    build_tree,
    build_tree_from_candidates,
    select_candidates,
)
from sglang_ddtree.core.vocab_shard import merge_shard_candidates, shard_candidates

__all__ = [
    "AcceptResult",
    "CommitPlan",
    "CommittedLogprobs",
    "DraftTree",
    "RequestPenalties",
    "TreeLayout",
    "accept_greedy",
    "accept_sampled",
    "accept_sampled_reference",
    "ancestor_mask",
    "apply_tree_penalties",
    "build_tree",
    "build_tree_from_candidates",
    "commit_accepted",
    "committed_logprobs",
    "count_emitted",
    "draw_coins",
    "flatten_verify_mask",
    "joint_top_k_top_p_renorm",
    "merge_shard_candidates",
    "min_p_renorm",
    "node_logprobs",
    "scatter_verify_mask",
    "select_candidates",
    "shard_candidates",
    "target_probs",
    "top_k_top_p_min_p_renorm",
    "tree_to_retrieve_arrays",
    "verify_mask_cells",
]
