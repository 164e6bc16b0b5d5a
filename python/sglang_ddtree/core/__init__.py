"""DDTree core: pure, batched, sync-free tensor functions (no SGLang imports).

One decode step, in order:

    tree    = build_tree_from_candidates(*select_candidates(draft_logits, K, normalize=True),
                                         root_tokens, budget)
    layout  = tree_to_retrieve_arrays(tree, prefix_lens)
    # ... target verify forward over the N = budget + 1 nodes with layout.tree_mask ...
    logits  = apply_tree_penalties(logits, tree.tokens, layout.tree_mask, penalties)
    result  = accept_greedy(...)   or   accept_sampled(...)
    plan    = commit_accepted(result, prefix_lens, N)
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
