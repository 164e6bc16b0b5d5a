"""Test-only changes to DDTREE inside SGLang's scheduler processes, made by the tests, never by
the server.

SGLang starts its scheduler processes by spawning, which imports the launching module again in
each of them (as ``__mp_main__``). A testing module that launches engines calls
`install_from_env` when it is imported; the changes named in the environment it set before a
launch are then made in every process of that engine, before the worker is built:

- ``WRONG_COINS_ENV`` = a float: the verify coins scaled by it, a deliberately wrong sampling
  law (coins below their law accept the first children too often), which a law test must
  reject: its power.
- ``RANK_SKEW_ENV`` = an int: each tensor-parallel rank's coin generator seeded with ``seed +
  skew * rank``, so ranks take different sampled decisions, which the worker's rank-agreement
  check must stop loudly.
- ``GRAPH_STATS_ENV`` = a file: the worker's CUDA-graph counts (``GraphStats.as_dict``) written
  there once its graphs are captured (before any request) and after every decode step.
- ``KV_SENTINEL_ENV`` = a file: every drafter-KV workspace DFLASH's fused materializer
  replaces (a prefill longer than its rows) is kept allocated and filled with a sentinel byte
  instead of freed; after every forward the worker's process checks the sentinels and writes
  ``{"replaced", "intact", "forwards"}`` there. A captured graph still bound to a replaced
  workspace writes into its sentinel.
- ``BIND_DFLASH_WORKSPACE_ENV`` = 1: the known error the sentinels must catch: the KV segment
  appends on DFLASH's own helper (presized to its rows), so its captured graphs bind tensors
  a long prefill replaces.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping

logger = logging.getLogger(__name__)

WRONG_COINS_ENV = "DDTREE_TESTING_WRONG_COINS"
RANK_SKEW_ENV = "DDTREE_TESTING_RANK_SKEW"
GRAPH_STATS_ENV = "DDTREE_TESTING_GRAPH_STATS"
KV_SENTINEL_ENV = "DDTREE_TESTING_KV_SENTINEL"
BIND_DFLASH_WORKSPACE_ENV = "DDTREE_TESTING_BIND_DFLASH_WORKSPACE"
SENTINEL_BYTE = 0xA5
# Where the worker and its glue live: the plugin's modules, or SGLang's tree with the patch.
PLUGIN = "sglang_ddtree.srt"
IN_TREE = "sglang.srt.speculative"


def install_from_env(environ: Mapping[str, str] | None = None, package: str = PLUGIN) -> list[str]:
    """Make the changes ``environ`` names (default ``os.environ``) in ``package``'s modules;
    returns their names. Nothing is imported when none is named."""
    env = os.environ if environ is None else environ
    done = []
    if env.get(WRONG_COINS_ENV):
        scale_coins(float(env[WRONG_COINS_ENV]), package)
        done.append(WRONG_COINS_ENV)
    if env.get(RANK_SKEW_ENV):
        skew_ranks(int(env[RANK_SKEW_ENV]), package)
        done.append(RANK_SKEW_ENV)
    if env.get(GRAPH_STATS_ENV):
        write_graph_stats(env[GRAPH_STATS_ENV], package)
        done.append(GRAPH_STATS_ENV)
    if env.get(KV_SENTINEL_ENV):
        guard_replaced_workspaces(env[KV_SENTINEL_ENV], package)
        done.append(KV_SENTINEL_ENV)
    if env.get(BIND_DFLASH_WORKSPACE_ENV):
        bind_dflash_workspace(package)
        done.append(BIND_DFLASH_WORKSPACE_ENV)
    return done


def scale_coins(scale: float, package: str = PLUGIN) -> None:
    """Every verify's coins (``ddtree_step.draw_coins``, which the accept draws from) times
    ``scale``; the bonus coins stay."""
    import importlib

    step = importlib.import_module(f"{package}.ddtree_step")
    draw = step.draw_coins

    def scaled(*args, **kwargs):
        coins, final_coins = draw(*args, **kwargs)
        return coins * scale, final_coins

    step.draw_coins = scaled
    logger.warning("DDTREE runs a DELIBERATELY WRONG sampling law: coins x %s (tests only).", scale)


def skew_ranks(skew: int, package: str = PLUGIN) -> None:
    """Each worker's step's coin generator reseeded with its tensor-parallel rank times
    ``skew``."""
    import importlib

    worker_cls = importlib.import_module(f"{package}.ddtree_worker_v2").DDTreeWorkerV2
    init = worker_cls.__init__

    def skewed(self, server_args, *args, **kwargs):
        init(self, server_args, *args, **kwargs)
        seed = int(getattr(server_args, "random_seed", 0) or 0)
        self.ddtree_step.coin_generator.manual_seed(seed + skew * int(self.ps.tp_rank))
        logger.warning(
            "DDTREE: rank %d draws DIFFERENT verify coins (tests only).", self.ps.tp_rank
        )

    worker_cls.__init__ = skewed


def write_graph_stats(path: str, package: str = PLUGIN) -> None:
    """The worker's ``init_cuda_graphs`` and every decode step (``_decode_step``) then replace
    ``path`` with its counts, atomically (a test reads it from another process while the server
    runs)."""
    import importlib

    worker_cls = importlib.import_module(f"{package}.ddtree_worker_v2").DDTreeWorkerV2

    def writing(method):
        def wrapped(self, *args, **kwargs):
            result = method(self, *args, **kwargs)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.graph_stats.as_dict(), f)
            os.replace(tmp, path)
            return result

        return wrapped

    worker_cls.init_cuda_graphs = writing(worker_cls.init_cuda_graphs)
    worker_cls._decode_step = writing(worker_cls._decode_step)


def guard_replaced_workspaces(path: str, package: str = PLUGIN) -> None:
    """``KV_SENTINEL_ENV``: replaced drafter-KV workspaces kept as sentinels, checked after
    every forward of the worker (a device sync each: tests only)."""
    import importlib

    import torch
    from sglang.kernels.ops.speculative.fused_kv_materialize import FusedKVMaterializeHelper

    sentinels: list[torch.Tensor] = []
    ensure = FusedKVMaterializeHelper._ensure_workspace

    def ensure_keeping_replaced(self, total_ctx, dtype):
        names = ("_proj_workspace", "_k_workspace", "_v_workspace")
        before = [getattr(self, n) for n in names]
        ensure(self, total_ctx, dtype)
        for old, n in zip(before, names):
            if old is not None and getattr(self, n) is not old:
                old.view(torch.uint8).fill_(SENTINEL_BYTE)
                sentinels.append(old)

    FusedKVMaterializeHelper._ensure_workspace = ensure_keeping_replaced
    worker_cls = importlib.import_module(f"{package}.ddtree_worker_v2").DDTreeWorkerV2
    forward = worker_cls.forward_batch_generation
    forwards = [0]

    def checked(self, *args, **kwargs):
        result = forward(self, *args, **kwargs)
        torch.cuda.synchronize()
        forwards[0] += 1
        intact = all(bool((t.view(torch.uint8) == SENTINEL_BYTE).all()) for t in sentinels)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"replaced": len(sentinels), "intact": intact, "forwards": forwards[0]}, f)
        os.replace(tmp, path)
        return result

    worker_cls.forward_batch_generation = checked
    logger.warning("DDTREE: replaced drafter-KV workspaces kept as sentinels (tests only).")


def bind_dflash_workspace(package: str = PLUGIN) -> None:
    """``BIND_DFLASH_WORKSPACE_ENV``: the KV segment's appends on DFLASH's own helper."""
    import importlib

    kv_commit = importlib.import_module(f"{package}.ddtree_kv_commit")

    def dflash_helper_presized(helper, rows):
        if helper is not None and rows > 0:
            helper._ensure_workspace(rows, helper.flat_kv_weight_t.dtype)
        return helper

    kv_commit.own_draft_kv_workspace = dflash_helper_presized
    logger.warning("DDTREE: the KV segment BINDS DFLASH's drafter-KV workspace (tests only).")
