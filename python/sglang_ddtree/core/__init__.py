"""DDTree core: pure, batched, sync-free tensor functions (no SGLang imports).

One decode step, in order (each function from its module; the package re-exports nothing, so
that any subset of its modules is a working package):

    tree    = tree.build_tree_from_candidates(
                  *tree.select_candidates(draft_logits, K, normalize=True), root_tokens, budget)
    layout  = layout.tree_to_retrieve_arrays(tree, prefix_lens)
    # ... target verify forward over the N = budget + 1 nodes with layout.tree_mask ...
    logits  = penalties.apply_tree_penalties(logits, tree.tokens, layout.tree_mask, state)
    result  = accept.accept_greedy(...)   or   accept.accept_sampled(...)
    plan    = commit.commit_accepted(result, prefix_lens, N)
    state   = penalties.count_emitted(state, plan.out_tokens)   # the next step's penalty state

``step`` holds the two halves a worker runs around the verify (``draft_to_tree``,
``accept_and_commit``); ``sampling`` the target law of sampled requests; ``vocab_shard`` the
draft top-K under tensor parallelism; the ``*_triton`` modules and ``topp_radix`` the kernels.
The worker does not apply ``penalties`` yet: it refuses penalized requests.
"""
