"""The paper's best-first DDTree builder with Python's heapq: the oracle for `build_tree`.

One request at a time, on host lists. Heap entries are keyed ``(-score, depth, parent slot,
rank)``; popping a node gives it the next slot, then pushes its next sibling (same parent and
depth, rank + 1) and its first child (depth + 1, rank 0). Scores are float32 sums along the path
(parent score + candidate log-prob), the same arithmetic as the tensor builder. Candidates with
log-prob -inf are never pushed.
"""

from __future__ import annotations

import heapq

import numpy as np


def heap_build(cand_logprobs, cand_tokens, root_token: int, budget: int):
    """cand_logprobs, cand_tokens: [D, K] arrays (sorted descending per depth).

    Returns (parents, depths, tokens, logw) lists of length n + 1 (root first), n <= budget.
    """
    lp = np.asarray(cand_logprobs, dtype=np.float32)
    tok = np.asarray(cand_tokens)
    depth_max, k = lp.shape
    parents, depths, tokens, logw = [-1], [0], [int(root_token)], [np.float32(0.0)]
    heap = []

    def push(parent_slot: int, depth: int, rank: int):
        if depth > depth_max or rank >= k:
            return
        score = np.float32(logw[parent_slot] + lp[depth - 1, rank])
        if score == -np.inf:
            return
        heapq.heappush(heap, (-float(score), depth, parent_slot, rank, score))

    push(0, 1, 0)
    while heap and len(parents) <= budget:
        _, depth, parent_slot, rank, score = heapq.heappop(heap)
        slot = len(parents)
        parents.append(parent_slot)
        depths.append(depth)
        tokens.append(int(tok[depth - 1, rank]))
        logw.append(score)
        push(parent_slot, depth, rank + 1)  # next sibling
        push(slot, depth + 1, 0)  # first child
    return parents, depths, tokens, [float(x) for x in logw]
