"""The SGLang integration of DDTREE, one file per file of SGLang's tree
(``python/sglang/srt/speculative/ddtree_*.py``; ``upstream/generate.py`` maps them):

- ``ddtree_worker_v2``: ``DDTreeWorkerV2``, the spec-v2 worker (draft tree, tree verify,
  accept, commit).
- ``ddtree_info``: ``DDTreeVerifyInput``, the tree verify and its accept decision (greedy and
  sampled requests in one pass).
- ``ddtree_utils``: the verify mask's buffer and the accept decision (no SGLang import).
- ``ddtree_cuda_graph_runner``: the target-verify CUDA graphs, one set per budget bucket.
- ``ddtree_glue_graph``: CUDA graphs of the step's pure-tensor glue segments.
- ``ddtree_glue_warmup``: those graphs captured at startup, their memory held before the KV
  pool is sized.
- ``ddtree_spec``: ``DDTreeSpecAlgo`` and the server-argument checks.
- ``ddtree_args``, ``ddtree_budget``, ``ddtree_requests``: options and startup checks, the
  adaptive budget schedule, per-request refusals (plain Python).
- ``ddtree_envs``: every ``SGLANG_DDTREE_*`` environment variable, declared once and parsed by
  SGLang's rules (plain Python).
"""
