"""The SGLang integration of DDTREE, one file per file of SGLang's tree
(``python/sglang/srt/speculative/ddtree_*.py``; ``upstream/generate.py`` maps them):

- ``ddtree_worker_v2``: ``DDTreeWorkerV2``, the spec-v2 worker: SGLang's adapter to the step.
- ``ddtree_step``: ``DDTreeStep``, one decode step (draft tree, tree verify, accept, commit).
- ``ddtree_info``: ``DDTreeVerifyInput``, the tree verify's input.
- ``ddtree_kv_commit``: the step's KV commit segment (target KV moves, drafter-KV append).
- ``ddtree_cuda_graph_runner``: the target-verify CUDA graphs, one set per W of the budget schedule.
- ``ddtree_glue_graph``: CUDA graphs of the step's pure-tensor glue segments.
- ``ddtree_glue_warmup``: those graphs captured at startup, their memory held before the KV
  pool is sized.
- ``ddtree_spec``: ``DDTreeSpecAlgo`` and the server-argument checks.
- ``ddtree_args``, ``ddtree_budget``, ``ddtree_requests``: options and startup checks, the
  adaptive budget schedule, per-request refusals (plain Python).
- ``ddtree_envs``: every ``SGLANG_DDTREE_*`` environment variable, declared once and parsed by
  SGLang's rules (plain Python); in SGLang's tree, fields of its ``Envs`` (``environ.py``).
"""
