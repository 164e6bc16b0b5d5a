"""DDTREE verify helpers that need no SGLang import (as ``dflash_utils.py`` holds DFLASH's):
the verify mask's buffer, the accept decision of one step (greedy and sampled requests in one
pass) through the accept segment's captured graphs, the KV commit segment's call, `StepGlue`
(one W's segments and coins, which the worker and the startup capture drive); the verify
tree's host arrays for the grammar mask's walk. Their pure parts (the segments' functions, the
padded rows, the ranks' fingerprint) are the core's, named here for their callers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from sglang_ddtree.core.commit import CommitPlan
from sglang_ddtree.core.fingerprint import rank_fingerprint, ranks_agree  # noqa: F401
from sglang_ddtree.core.layout import scatter_verify_mask, verify_mask_numel
from sglang_ddtree.core.padding import leading_rows, pad_rows, padded_tensors, padded_view  # noqa: F401
from sglang_ddtree.core.sampling import draw_coins
from sglang_ddtree.core.step import TreeStep, make_accept_fn, make_tree_fns  # noqa: F401


def verify_mask(
    tree: TreeStep, batch, draft_input, num_nodes: int, capacity: int | None = None
) -> torch.Tensor:
    """FULL_MASK bool [>= W * sum(prefix) + bs * W * W], sized from host lengths only.

    The reserved KV lengths (committed + 2 W per request, never clamped: near the context limit
    a prefix may pass the context length by one accepted path) bound every prefix, also under
    overlap scheduling, where the host's committed lengths lag the device's by a step. Reading
    the device lengths instead would cost one host sync per step.

    ``capacity``: the cells of the static buffer a graph replay copies the mask into (SGLang
    sizes it max graph bs x W x (context + W)); the mask is cut to it. Near the context limit
    the reserved lengths pass the context by 2 W, so a full captured batch there would
    otherwise overflow that copy, while the device's own lengths stay within the context. A
    batch whose device lengths need more cells than the buffer (requests past the limit in
    every slot) fails the scatter's bounds check instead of writing past it.
    """
    if draft_input.reserved_seq_lens_cpu is not None:
        prefix = draft_input.reserved_seq_lens_cpu
    elif batch.seq_lens_cpu is not None:
        prefix = batch.seq_lens_cpu
    else:
        raise RuntimeError("DDTREE needs host sequence lengths to size the verify mask.")
    total = verify_mask_numel(num_nodes, prefix)
    if capacity is not None:
        total = min(total, int(capacity))
    return scatter_verify_mask(tree.layout.tree_mask, tree.mask_cells, total)


TOP_K_ALL = 1 << 30  # SGLang's top_k for "no top-k"


def accept_tree(
    tree: TreeStep,
    logits: torch.Tensor,  # [bs * W, V] target logits at every node (penalties applied)
    sampling_info,  # SGLang's SamplingBatchInfo, or None (every request greedy)
    accept_graphs,  # ddtree_glue_graph.SegmentGraphs over make_accept_fn's function
    key,  # its graph key (bs,), or None to run eagerly
    coin_generator: torch.Generator | None,
    mode: tuple | None = None,  # accept_mode(sampling_info), when the caller has it already
    rows: int | None = None,  # > bs: run at this many requests' rows (`StepGlue`'s padding)
) -> CommitPlan:
    """Accept per request and plan the commit; the graph key adds the sampling mode. With
    ``rows`` the tree and the logits are read at that many requests' rows (their storage
    holds the padded rows of the same step, else no padding), the sampling parameters and
    coins padded alike (temperature 1, every token, top-p 1, min-p 0), the graph keyed by
    ``(rows,)``; the plan returned is the real requests' rows of it."""
    bs, w = tree.tokens.shape
    bound = {"logits": logits, "tokens": tree.tokens, "seq_lens": tree.seq_lens}
    bound.update(tree.layout._asdict())
    padded = padded_tensors(bound, bs, rows) if key is not None else None
    n = rows if padded is not None else bs
    if padded is not None:
        bound, key = padded, (rows,)
    mode = mode or accept_mode(sampling_info)
    if mode == ("greedy",):
        plan = accept_graphs(key and (*key, *mode), bound)
        return plan if n == bs else leading_rows(plan, bs, n)
    _, need_k, need_p, need_min_p = mode
    fills = {"temperatures": 1.0, "top_ks": TOP_K_ALL, "top_ps": 1.0}
    if need_min_p:
        fills["min_ps"] = 0.0
    copied = {}
    for name, fill in fills.items():
        rows_of_request = getattr(sampling_info, name).view(-1)
        # Fewer rows than requests would be padded with the defaults, a wrong law in silence:
        # a host check of the shape (no device read).
        assert rows_of_request.shape[0] == bs, (name, tuple(rows_of_request.shape), bs)
        copied[name] = pad_rows(rows_of_request, n, fill)
    # The coins are drawn here, eagerly (two launches), and copied in like the sampling
    # parameters: the law then never depends on how captured graphs replay the RNG.
    copied["coins"], copied["final_coins"] = draw_coins(
        n, w, logits.device, generator=coin_generator
    )
    static = {"need_top_k": need_k, "need_top_p": need_p, "need_min_p": need_min_p}
    plan = accept_graphs(key and (*key, *mode), bound, copied, static)
    return plan if n == bs else leading_rows(plan, bs, n)


def commit_kv(
    kv_graphs,  # ddtree_glue_graph.SegmentGraphs over the worker's KV-commit function
    key,  # the step's graph key (bs,), or None to run eagerly
    target_hidden: torch.Tensor,  # [bs * W, H_aux] the target's captured hidden states
    commit: CommitPlan,
    tree: TreeStep,
) -> None:
    """Run the KV commit (accepted target KV to contiguous slots, the path's drafter KV). The
    segment binds the accept graph's outputs, which every accept mode of a batch size writes
    into the same buffers (the accept segment's output group is the batch size), so one graph
    per batch size serves batches that switch between greedy and sampled."""
    kv_graphs(
        key,
        bound={
            "hidden": target_hidden,
            "keep_index": commit.keep_index,
            "accept_length": commit.accept_length,
            "commit_lens": commit.commit_lens,
            "verify_loc": tree.verify_loc,
            "seq_lens": tree.seq_lens,
            "pool_idx": tree.req_pool_indices,
        },
    )


class StepGlue:
    """The glue of the decode steps at one W, as captured graphs: the draft tree (under tensor
    parallelism, each rank's candidates, the all-gather, then the tree), the accept and the KV
    commit, each a ``ddtree_glue_graph.SegmentGraphs`` keyed by ``(bs,)`` and, for the accept
    segment, the step's accept mode (`accept_mode`, decided by `accept`; every mode writes the
    batch size's output buffers, which the KV commit binds); and the generator the verify coins
    come from. The worker drives it once a step and the startup capture drives it the same way
    on placeholders. ``key=None`` runs a segment eagerly."""

    def __init__(
        self,
        segments: dict,  # {"tree", "accept", "kv"} and "shard" under tensor parallelism
        coin_generator: torch.Generator,
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,  # [...] -> [tp, ...]
    ):
        assert {"tree", "accept", "kv"} <= set(segments), sorted(segments)
        assert (gather is None) == ("shard" not in segments), "a gather goes with a shard segment"
        self.segments = segments
        self.coin_generator = coin_generator
        self._gather = gather
        self.mode: tuple | None = None  # the last accept's mode
        self.tree_rows: int | None = None  # the last draft tree's padded batch size, if padded

    def draft_tree(
        self,
        key,
        hidden: torch.Tensor,  # [bs * B, H] the drafter's block hidden states
        bonus: torch.Tensor,  # [bs] int64, the roots
        seq_lens: torch.Tensor,  # [bs] committed lengths
        req_pool_indices: torch.Tensor,  # [bs] request-pool rows
        rows: int | None = None,  # > bs: the padded batch size (`padded_view`'s rows)
    ) -> TreeStep:
        """The draft tree and the verify's inputs (`core.step.draft_to_tree`). With ``rows``
        (a graph key given, and ``hidden`` the first rows of the drafter graph's padded output)
        the segment runs at that many requests, keyed ``(rows,)``, the padded rows' roots,
        lengths and pool rows 0 (they read request row 0 and write nothing); the tree returned
        is the real requests' rows of its outputs."""
        bs = seq_lens.shape[0]
        padded = padded_tensors({"hidden": hidden}, bs, rows) if key is not None else None
        n = rows if padded is not None else bs
        if padded is not None:
            hidden, key = padded["hidden"], (rows,)
        copied = {
            "bonus": pad_rows(bonus.view(-1), n, 0),
            "seq_lens": pad_rows(seq_lens, n, 0),
            "req_pool_indices": pad_rows(req_pool_indices, n, 0),
        }
        if self._gather is None:
            tree = self.segments["tree"](key, bound={"hidden": hidden}, copied=copied)
        else:
            packed = self.segments["shard"](key, bound={"hidden": hidden})
            gathered = self._gather(packed)
            tree = self.segments["tree"](key, bound={}, copied={"gathered": gathered, **copied})
        self.tree_rows = n if n != bs else None
        return tree if n == bs else leading_rows(tree, bs, n)

    def accept(
        self,
        key,
        tree: TreeStep,
        logits: torch.Tensor,  # [bs * W, V] the verify's processed logits
        sampling_info,  # SGLang's SamplingBatchInfo, or None (every request greedy)
        mode: tuple | None = None,  # the accept mode; None: accept_mode(sampling_info)
        rows: int | None = None,  # > bs: the padded batch size, as for `draft_tree`
    ) -> CommitPlan:
        """The accepted paths and the commit plan (`accept_tree`), in the step's accept mode;
        with ``rows``, at the padded batch size, where the last `draft_tree` ran at it (its
        tree and the verify's logits are then the first rows of padded outputs)."""
        self.mode = mode or accept_mode(sampling_info)
        return accept_tree(
            tree, logits, sampling_info, self.segments["accept"], key, self.coin_generator,
            self.mode, rows=rows if rows is not None and rows == self.tree_rows else None,
        )  # fmt: skip

    def commit_kv(
        self,
        key,
        target_hidden: torch.Tensor,  # [bs * W, H_aux]
        commit: CommitPlan,  # the last `accept`'s
        tree: TreeStep,
    ) -> None:
        """The accepted path's target KV to contiguous slots and its drafter KV (`commit_kv`),
        from the last accept's outputs."""
        assert self.mode is not None, "commit_kv follows an accept"
        commit_kv(self.segments["kv"], key, target_hidden, commit, tree)


def accept_mode(sampling_info) -> tuple:
    """The accept segment's host branch: ``("greedy",)`` or ``("sampled", need_top_k,
    need_top_p, need_min_p)`` (SGLang's host flags: a renorm pass over ``[bs * W, V]`` that no
    request needs is skipped). With SGLang's ``need_min_p_sampling`` every row takes its min-p
    path, top-k then top-p then min-p (`core.sampling`), as SGLang's sampler does: the top-p
    pass always (as SGLang calls it), the top-k pass only where some row has top-k (SGLang's
    ``need_top_k_sampling``): sgl_kernel's ``top_k_renorm_prob`` at k >= V keeps every token
    and renormalizes a distribution that sums to 1 (values move by float32 rounding only), so
    skipping it is the same law and leaves the top-p pass free to take the logits
    (`topp_radix`). Each mode is its own accept graph; all of a batch size's modes write the
    same output buffers (the accept segment's output group), so the KV commit that binds them
    is one graph per batch size."""
    if sampling_info is None or sampling_info.is_all_greedy:
        return ("greedy",)
    need_k = bool(getattr(sampling_info, "need_top_k_sampling", True))
    if bool(getattr(sampling_info, "need_min_p_sampling", False)):
        return ("sampled", need_k, True, True)
    need_p = bool(getattr(sampling_info, "need_top_p_sampling", True))
    return ("sampled", need_k, need_p, False)


def accept_output_group(key: tuple) -> tuple:
    """The output group of an accept graph key ``(bs, *mode)``: its batch size."""
    return key[:1]


class _HostTreeArray(np.ndarray):
    """A host array of the verify tree as NumPy that also answers ``numel``, the one torch
    method SGLang's mask walk (``generate_token_bitmask``) calls on it."""

    def numel(self) -> int:
        return self.size


class HostArrayGrammarTree:
    """SGLang's ``GrammarTree`` (the verify tree's first-child / next-sibling arrays and tokens,
    copied to the host asynchronously) as ``build_grammar_vocab_mask`` reads it, its arrays
    resolved as NumPy views of the same host copies: the walk (``traverse_tree``) reads a few
    scalars a node, and a NumPy scalar read costs a fraction of a torch 0-d tensor op (the
    masks are the same)."""

    def __init__(self, tree):
        self.tree = tree

    def resolve(self) -> tuple:
        return tuple(t.numpy().view(_HostTreeArray) for t in self.tree.resolve())
