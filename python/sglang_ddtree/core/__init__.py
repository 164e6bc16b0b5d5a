"""DDTree core: pure, batched, sync-free tensor functions (no SGLang imports).

Terms, fixed here and used in every module of the core (each module's docstring adds its own):

- **block** (B): what the DFlash drafter reads and fills in one forward, the root then B - 1
  masked slots, which give B - 1 per-depth draft distributions.
- **node**: one draft prefix; its token is the prefix's last one. **depth**: its length.
- **root**: node 0 of every tree, the token the target emitted last step (the previous step's
  bonus token), not yet in the target's KV cache; depth 0.
- **budget**: draft nodes per request, root excluded. **W** = budget + 1: the tree's slots,
  which is what one request puts through the target's verify forward (the verify width).
- **D**: the tree's max depth, min(B - 1, budget). **S** = D + 1: the commit width, the most
  tokens one step commits per request (one accepted path plus its bonus token).
- **accepted path**: the root, then the draft nodes the target accepts, each a child of the
  one before; **accept length**: its draft nodes (0..D).
- **bonus token**: the target's own token after the accepted path's last node; the step
  commits accept length + 1 tokens and the bonus token becomes the next root.
- **K**: draft candidates per depth (`tree.select_candidates`).

Where SGLang's own names mean something else: its ``speculative_num_draft_tokens`` is W on the
target's side and B on the drafter's (`srt/ddtree_spec.py` sets each), and its ``accept_lens``
holds accept length + 1 (the bonus token counted).

One decode step, in order (each function from its module; the package re-exports nothing, so
that any subset of its modules is a working package):

    tree    = tree.build_tree_from_candidates(
                  *tree.select_candidates(draft_logits, K, normalize=True), root_tokens, budget)
    layout  = layout.tree_to_retrieve_arrays(tree, prefix_lens)
    # ... target verify forward over the W = budget + 1 nodes with layout.tree_mask ...
    logits  = penalties.apply_tree_penalties(logits, tree.tokens, layout.tree_mask, state)
    result  = accept.accept_greedy(...)   or   accept.accept_sampled(...)
    plan    = commit.commit_accepted(result, prefix_lens, W)
    probs   = logprobs.committed_logprobs(logits, plan.keep_nodes, plan.out_tokens, ...)
    state   = penalties.count_emitted(state, plan.out_tokens)   # the next step's penalty state

``step`` holds the two halves a step runs around the verify (``draft_to_tree``,
``accept_and_commit``); ``sampling`` the target law of sampled requests (min-p included);
``vocab_shard`` the draft top-K and ``fingerprint`` the ranks' agreement under tensor
parallelism; ``padding`` the glue at a padded batch size; the ``*_triton`` modules and
``topp_radix`` the kernels. The server's step applies all of them.
"""
