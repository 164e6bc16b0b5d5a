"""Generate ``upstream/sglang-ddtree.patch``: DDTREE in-tree for SGLang (``git apply`` at the root
of an SGLang checkout of the pinned version).

    python upstream/generate.py                      # writes upstream/sglang-ddtree.patch
    python upstream/generate.py --out /tmp/x.patch   # somewhere else
    python upstream/generate.py --sglang-src DIR     # pristine sources: DIR/sglang or DIR itself
    python upstream/generate.py --apply-check 0.5.23 # does the committed patch apply to 0.5.23?
    python upstream/generate.py --series             # the same tree as parts: upstream/series/
    python upstream/generate.py --base 0.5.23 [--series]   # the same for SGLang 0.5.23:
                                                     # upstream/0.5.23/{sglang-ddtree.patch,series/}

Method: the pristine SGLang files the patch edits are committed into a temporary git repository
at their repository paths (``python/sglang/...``); then the new files (this repository's modules,
mapped by ``MODULE_MAP`` with their ``sglang_ddtree`` imports rewritten; tests and docs from
``upstream/templates/``) and the anchored edits (``EDITS``) are written, and ``git diff`` of the
two trees is the patch. The output depends only on the inputs (pinned pristine file hashes, fixed
git options, sorted paths), so CI regenerates it and compares byte for byte.

Bases (``--base``, ``BASES``): the same modules, templates and edits on each release of SGLang;
what differs on a base is listed in ``PRISTINE_SHA256`` (the files it edits), ``BASE_EDITS``
(an edit made otherwise there, or not at all), ``BASE_REWRITES`` (a generated file's line that
must read otherwise there) and ``BASE_TEXT`` (the part texts' words for what differs).

Pristine sources of the base, first found: ``--sglang-src``; ``$SGLANG_DDTREE_SGLANG_SRC`` (unless
it holds another release); an installed ``sglang`` of that release; a wheel cached under
``.upstream-cache/``; else ``pip download sglang==<version> --no-deps`` into that cache.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
PKG_DIR = REPO / "python" / "sglang_ddtree"
UPSTREAM_DIR = REPO / "upstream"
TEMPLATES = UPSTREAM_DIR / "templates"
PATCH_PATH = UPSTREAM_DIR / "sglang-ddtree.patch"
CACHE_DIR = REPO / ".upstream-cache"
# The releases of SGLang the patch and the series are generated for. The first is the default
# (the plugin's pin, proven on GPUs); the outputs of another base go into upstream/<base>/.
BASES = ("0.5.17", "0.5.23")
SGLANG_VERSION = BASES[0]
SPEC = "python/sglang/srt/speculative"

# --- the mapping: plugin module -> file in SGLang's tree (one entry per module) ----------------
MODULE_MAP = {
    # The pure algorithm: a subpackage, one file per module.
    "sglang_ddtree.core": f"{SPEC}/ddtree/__init__.py",
    "sglang_ddtree.core.accept": f"{SPEC}/ddtree/accept.py",
    "sglang_ddtree.core.argmax_triton": f"{SPEC}/ddtree/argmax_triton.py",
    "sglang_ddtree.core.batch_accept": f"{SPEC}/ddtree/batch_accept.py",
    "sglang_ddtree.core.commit": f"{SPEC}/ddtree/commit.py",
    "sglang_ddtree.core.fingerprint": f"{SPEC}/ddtree/fingerprint.py",
    "sglang_ddtree.core.kv_move_triton": f"{SPEC}/ddtree/kv_move_triton.py",
    "sglang_ddtree.core.layout": f"{SPEC}/ddtree/layout.py",
    "sglang_ddtree.core.layout_triton": f"{SPEC}/ddtree/layout_triton.py",
    "sglang_ddtree.core.logprobs": f"{SPEC}/ddtree/logprobs.py",
    "sglang_ddtree.core.logprobs_triton": f"{SPEC}/ddtree/logprobs_triton.py",
    "sglang_ddtree.core.penalties": f"{SPEC}/ddtree/penalties.py",
    "sglang_ddtree.core.penalties_triton": f"{SPEC}/ddtree/penalties_triton.py",
    "sglang_ddtree.core.tree_attention_gluon": f"{SPEC}/ddtree/tree_attention_gluon.py",
    "sglang_ddtree.core.minp_triton": f"{SPEC}/ddtree/minp_triton.py",
    "sglang_ddtree.core.padding": f"{SPEC}/ddtree/padding.py",
    "sglang_ddtree.core.sampling": f"{SPEC}/ddtree/sampling.py",
    "sglang_ddtree.core.step": f"{SPEC}/ddtree/step.py",
    "sglang_ddtree.core.topk_triton": f"{SPEC}/ddtree/topk_triton.py",
    "sglang_ddtree.core.topp_radix": f"{SPEC}/ddtree/topp_radix.py",
    "sglang_ddtree.core.tree": f"{SPEC}/ddtree/tree.py",
    "sglang_ddtree.core.tree_attention": f"{SPEC}/ddtree/tree_attention.py",
    "sglang_ddtree.core.tree_triton": f"{SPEC}/ddtree/tree_triton.py",
    "sglang_ddtree.core.vocab_shard": f"{SPEC}/ddtree/vocab_shard.py",
    # The SGLang integration, named like SGLang's other algorithms (dflash_worker_v2.py, ...).
    "sglang_ddtree.srt.ddtree_worker_v2": f"{SPEC}/ddtree_worker_v2.py",
    "sglang_ddtree.srt.ddtree_step": f"{SPEC}/ddtree_step.py",
    "sglang_ddtree.srt.ddtree_info": f"{SPEC}/ddtree_info.py",
    "sglang_ddtree.srt.ddtree_kv_commit": f"{SPEC}/ddtree_kv_commit.py",
    "sglang_ddtree.srt.ddtree_cuda_graph_runner": f"{SPEC}/ddtree_cuda_graph_runner.py",
    "sglang_ddtree.srt.ddtree_glue_graph": f"{SPEC}/ddtree_glue_graph.py",
    "sglang_ddtree.srt.ddtree_glue_warmup": f"{SPEC}/ddtree_glue_warmup.py",
    "sglang_ddtree.srt.ddtree_spec": f"{SPEC}/ddtree_spec.py",
    "sglang_ddtree.srt.ddtree_args": f"{SPEC}/ddtree_args.py",
    "sglang_ddtree.srt.ddtree_budget": f"{SPEC}/ddtree_budget.py",
    "sglang_ddtree.srt.ddtree_requests": f"{SPEC}/ddtree_requests.py",
    "sglang_ddtree.srt.ddtree_penalties": f"{SPEC}/ddtree_penalties.py",
    "sglang_ddtree.srt.ddtree_logprobs": f"{SPEC}/ddtree_logprobs.py",
    # The verify attention backends: a subpackage, each module named as the file of SGLang's
    # layers/attention/ whose backend it verifies on (triton_backend.py, flashmla_backend.py,
    # flashinfer_backend.py), beside the interface and the registry (attention_registry.py).
    "sglang_ddtree.srt.ddtree_attention": f"{SPEC}/ddtree_attention/__init__.py",
    "sglang_ddtree.srt.ddtree_attention.verify_backend": (
        f"{SPEC}/ddtree_attention/verify_backend.py"
    ),
    "sglang_ddtree.srt.ddtree_attention.triton_extend_backend": (
        f"{SPEC}/ddtree_attention/triton_extend_backend.py"
    ),
    "sglang_ddtree.srt.ddtree_attention.triton_backend": (
        f"{SPEC}/ddtree_attention/triton_backend.py"
    ),
    "sglang_ddtree.srt.ddtree_attention.flashmla_backend": (
        f"{SPEC}/ddtree_attention/flashmla_backend.py"
    ),
    "sglang_ddtree.srt.ddtree_attention.flashinfer_backend": (
        f"{SPEC}/ddtree_attention/flashinfer_backend.py"
    ),
    "sglang_ddtree.srt.ddtree_attention.attention_registry": (
        f"{SPEC}/ddtree_attention/attention_registry.py"
    ),
}

# Modules that stay out of SGLang (a module or a package prefix). Every module of the package
# is either mapped or listed here, so a new module forces a decision.
# Package markers stay out too, matched exactly (a prefix match would cover every module).
PACKAGE_MARKERS = {
    "sglang_ddtree": "package marker (version only)",
    "sglang_ddtree.srt": "package marker (its modules are mapped one by one)",
}
NOT_UPSTREAM = {
    "sglang_ddtree.plugin": "entry point; in-tree registration is the spec_info.py edit",
    "sglang_ddtree.serve": "launcher tooling",
    "sglang_ddtree.demo": "CPU demo",
    "sglang_ddtree.srt.ddtree_attention_hook": (
        "plugin hooks; in-tree the triton_backend.py and flashmla_backend.py edits"
    ),
    "sglang_ddtree.srt.ddtree_envs": (
        "the table of DDTREE's environment variables; in-tree fields of SGLang's Envs (the "
        "environ.py edit envs-fields), which its imports become (STAND_INS)"
    ),
    "sglang_ddtree.pair": "the shipped trained model pair and its training",
    "sglang_ddtree.testing": "this repository's GPU checks",
}

# Modules that do not go upstream but stand in for a module of SGLang's own, which in-tree holds
# what they hold (an edit adds it there): {module: (SGLang's module, the names a mapped module
# may import from it)}. Their imports are rewritten to SGLang's module (`rewrite`); importing any
# other name of them fails the generator (`check_imports`).
STAND_INS = {
    # ``envs``: in the plugin the table of the SGLANG_DDTREE_* variables (``DDTreeEnvs``), read
    # as SGLang reads its own (``envs.<NAME>.get()``); in-tree SGLang's ``envs``, whose ``Envs``
    # gains the same variables as fields (edit ``envs-fields``, written from the table).
    "sglang_ddtree.srt.ddtree_envs": ("sglang.srt.environ", ("envs",)),
}

# Mentions (in docstrings and comments) of modules that do not go upstream, and what they become.
TEXT_REWRITES = {
    "sglang_ddtree.plugin": "sglang.srt.speculative.spec_info",
    "sglang_ddtree.srt": "sglang.srt.speculative",  # ``from sglang_ddtree.srt import ddtree_x``
}

# Where a mapped module reads otherwise in-tree, on every base: (module, old, new), ``old``
# occurring exactly once. Kept to what the plugin must do through SGLang's registry and
# in-tree is SGLang's own: DDTREE is a member of ``SpeculativeAlgorithm`` (the ``spec_info.py``
# edits), not a ``CustomSpecAlgo`` registered at runtime.
IN_TREE_REWRITES = (
    (
        "sglang_ddtree.srt.ddtree_spec",
        "from sglang.srt.speculative.spec_registry import CustomSpecAlgo\n\n",
        "",
    ),
    (
        "sglang_ddtree.srt.ddtree_spec",
        "\n``DDTreeSpecAlgo`` (at the end) answers the same for SGLang 0.5.17's registry of speculative\n"
        "algorithms: the predicates, and the three methods the runtime calls but ``CustomSpecAlgo`` lacks\n"
        "(``carries_draft_hidden_states``, ``create_future_map``, ``need_topk``).\n",
        "",
    ),
    (
        "sglang_ddtree.srt.ddtree_attention.verify_backend",
        '        str(getattr(server_args, "speculative_algorithm", None)).upper() == "DDTREE"\n',
        "        model_runner.spec_algorithm.is_ddtree()\n",
    ),
    # What only the plugin has (its hooks, its install, this repository's docs) is not named.
    (
        "sglang_ddtree.srt.ddtree_spec",
        " (every\nSGLang branch on either, audited: docs/integration.md).",
        ".",
    ),
    (
        "sglang_ddtree.srt.ddtree_attention.verify_backend",
        " (in\nSGLang's tree a line in each, in the plugin ``ddtree_attention_hook``).",
        " (a line\nin each).",
    ),
    (
        "sglang_ddtree.srt.ddtree_attention.attention_registry",
        "(were DDTREE's plugin hooks applied in this process before the ",
        "(was ``ddtree_takes_verify`` set when the ",
    ),
    (
        "sglang_ddtree.srt.ddtree_args",
        "# Server flags: ServerArgs fields in SGLang's tree; added to SGLang's parser by the plugin.",
        "# Server flags: ServerArgs fields.",
    ),
    (
        "sglang_ddtree.srt.ddtree_args",
        "multiple tokenizer workers (they do not load plugins); ",
        "multiple tokenizer workers; ",
    ),
    (
        "sglang_ddtree.srt.ddtree_worker_v2",
        "from sglang_ddtree.srt.ddtree_cuda_graph_runner import install_target_graph_runner\n",
        "",
    ),
    (
        "sglang_ddtree.srt.ddtree_worker_v2",
        "        # Before super(): the target's verify graphs are captured after this constructor.\n"
        "        install_target_graph_runner(target_worker.model_runner)\n",
        "",
    ),
    (
        "sglang_ddtree.srt.ddtree_cuda_graph_runner",
        "Installed on the *target* model runner through its ``_decode_cuda_graph_runner_cls`` override\n"
        "point, from the worker's constructor (which runs before any capture); it reads",
        "The *target* model runner's ``_decode_cuda_graph_runner_cls`` picks it for DDTREE; it reads",
    ),
    (
        "sglang_ddtree.core.topp_radix",
        "install sglang-ddtree from a checkout (pip install -e .)",
        "reinstall SGLang with its JIT sources",
    ),
)
# Where the in-tree DDTREE modules call DFLASH's public methods (the `DFLASH_EDITS` of
# part 00) instead of reading its privates as the plugin must on 0.5.17, on every base:
# (module, old, new, why); ``old`` occurs exactly once, or is a (first, next) pair of lines, the
# text from ``first`` up to ``next`` replaced.
IN_TREE_DFLASH_CALLS = (
    (
        "sglang_ddtree.srt.ddtree_step",
        (
            "        As DFLASH's decode runs it (in-tree its methods, which a plugin cannot add",
            "        hidden = draft_out.logits_output.hidden_states\n",
        ),
        '        DFLASH\'s draft block and drafter forward, as DFLASH\'s decode runs them."""\n'
        "        dflash, draft_input = self.dflash, batch.spec_info\n"
        "        block_ids, positions_2d, cache_loc_2d = dflash.prepare_draft_block(batch, draft_input)\n"
        "        draft_out = dflash.forward_draft_block(\n"
        "            batch, draft_input, block_ids, positions_2d, cache_loc_2d\n"
        "        )\n",
        "the draft block and the drafter's forward are DFLASH's methods, not a copy of its decode",
    ),
    (
        "sglang_ddtree.srt.ddtree_kv_commit",
        "(`own_draft_kv_workspace`; in-tree\nDFLASH's methods)",
        "(DFLASH's\n`new_fused_kv_helper`)",
        "the workspace is DFLASH's to make",
    ),
    (
        "sglang_ddtree.srt.ddtree_kv_commit",
        "import contextlib\nimport copy\n",
        "",
        "what the plugin's stand-ins below import",
    ),
    (
        "sglang_ddtree.srt.ddtree_kv_commit",
        ("def own_draft_kv_workspace(", "class KVCommit:"),
        "",
        "the plugin's stand-ins for new_fused_kv_helper and use_fused_kv_helper",
    ),
    (
        "sglang_ddtree.srt.ddtree_kv_commit",
        'own_draft_kv_workspace(getattr(dflash, "_fused_kv_helper", None), rows)',
        "dflash.new_fused_kv_helper(rows)",
        "DFLASH's helper, with a workspace of the segment's own",
    ),
    (
        "sglang_ddtree.srt.ddtree_kv_commit",
        "kv_commit_workspace(self.dflash, self.helper, self.rows, bs * s)",
        "self.dflash.use_fused_kv_helper(self.helper if bs * s <= self.rows else None)",
        "the own workspace where the rows fit it (every captured key), else DFLASH's",
    ),
    (
        "sglang_ddtree.srt.ddtree_worker_v2",
        (
            '            if getattr(batch, "return_logprob", False):  # DFLASH refuses them at its door\n',
            "            if batch.forward_mode.is_idle():\n",
        ),
        "            result = super().forward_batch_generation(batch, on_publish, grammar_barrier)\n",
        "DFLASH's prefill serves the logprobs a DDTREE batch asks for (the worker part's edit)",
    ),
    (
        "sglang_ddtree.srt.ddtree_worker_v2",
        "from sglang_ddtree.srt.ddtree_logprobs import prefill_with_logprobs\n",
        "",
        "no prefill around DFLASH's refusal",
    ),
    (
        "sglang_ddtree.srt.ddtree_logprobs",
        "import copy\n\n",
        "",
        "what the prefill around DFLASH's refusal imports",
    ),
    (
        "sglang_ddtree.srt.ddtree_logprobs",
        " SGLang's DFLASH worker, whose prefill DDTREE runs, refuses every batch\n"
        "  that asks for logprobs at its door although its prefill needs nothing else: `prefill_with_logprobs`\n"
        "  runs it on a copy of the batch without the flag while the target worker gets the batch itself.\n",
        " DDTREE's prefill is DFLASH's.\n",
        "DFLASH's prefill serves them",
    ),
    (
        "sglang_ddtree.srt.ddtree_kv_commit",
        "self.dflash._append_target_hidden_to_draft_kv_by_loc(",
        "self.dflash.append_target_hidden_to_draft_kv_by_loc(",
        "DFLASH's drafter-KV append by its public name",
    ),
)


def dflash_calls(mod: str, text: str) -> str:
    """``text`` of module ``mod`` with its `IN_TREE_DFLASH_CALLS` made."""
    for name, old, new, _ in IN_TREE_DFLASH_CALLS:
        if name != mod:
            continue
        first, nxt = old if isinstance(old, tuple) else (old, None)
        if text.count(first) != 1 or (nxt is not None and text.count(nxt) != 1):
            raise SystemExit(f"generate.py: IN_TREE_DFLASH_CALLS: {mod} lacks, once:\n{old}")
        i = text.index(first)
        j = i + len(first) if nxt is None else text.index(nxt)
        if j < i:
            raise SystemExit(f"generate.py: IN_TREE_DFLASH_CALLS: {mod}: {nxt!r} before {first!r}")
        text = text[:i] + new + text[j:]
    return text


# The tail of a mapped module that stays out of SGLang: {module: the line it starts at}.
IN_TREE_CUTS = {
    "sglang_ddtree.srt.ddtree_spec": "# --- the plugin's registration: in-tree, DDTREE is a member",
    # In-tree, ModelRunner picks the target's graph runner by the algorithm ("graph-runner").
    "sglang_ddtree.srt.ddtree_cuda_graph_runner": "def install_target_graph_runner(",
    # In-tree, DFLASH's prefill serves a DDTREE batch's logprobs ("logprobs-prefill").
    "sglang_ddtree.srt.ddtree_logprobs": "def prefill_with_logprobs(",
}

# New files that are not modules: (template, path in SGLang's tree).
TEMPLATE_FILES = [
    ("test_ddtree_tree.py", "test/registered/spec/ddtree/test_ddtree_tree.py"),
    ("test_ddtree_top_p_radix.py", "test/registered/spec/ddtree/test_ddtree_top_p_radix.py"),
    ("test_ddtree_accept.py", "test/registered/spec/ddtree/test_ddtree_accept.py"),
    (
        "test_ddtree_latent_prefix_gluon.py",
        "test/registered/spec/ddtree/test_ddtree_latent_prefix_gluon.py",
    ),
    ("test_ddtree_tree_attention.py", "test/registered/spec/ddtree/test_ddtree_tree_attention.py"),
    ("test_ddtree_budget.py", "test/registered/spec/ddtree/test_ddtree_budget.py"),
    (
        "test_dflash_worker_methods.py",
        "test/registered/unit/speculative/test_dflash_worker_methods.py",
    ),
    ("test_ddtree_glue_graph.py", "test/registered/spec/ddtree/test_ddtree_glue_graph.py"),
    ("test_ddtree_request_laws.py", "test/registered/spec/ddtree/test_ddtree_request_laws.py"),
    ("test_ddtree.py", "test/registered/spec/ddtree/test_ddtree.py"),
    ("test_ddtree_refusals.py", "test/registered/spec/ddtree/test_ddtree_refusals.py"),
    ("ddtree.md", "docs/advanced_features/ddtree.md"),
    # Each kernel part's benchmark against what runs without it.
    ("bench_ddtree_draft_tree.py", "benchmark/kernels/ddtree/bench_ddtree_draft_tree.py"),
    ("bench_ddtree_top_p_radix.py", "benchmark/kernels/ddtree/bench_ddtree_top_p_radix.py"),
    ("bench_ddtree_accept.py", "benchmark/kernels/ddtree/bench_ddtree_accept.py"),
    (
        "bench_ddtree_tree_attention.py",
        "benchmark/kernels/ddtree/bench_ddtree_tree_attention.py",
    ),
]

# Kernels of ours that SGLang's JIT loader builds: (path here, path in SGLang's tree, the module
# that loads it). In-tree `core.topp_radix` finds its source under sglang/kernels/jit/csrc/.
KERNEL_FILES = [
    (
        "sgl-kernel/csrc/ddtree/top_p_radix.cuh",
        "python/sglang/kernels/jit/csrc/ddtree/top_p_radix.cuh",
        "sglang_ddtree.core.topp_radix",
    ),
]

# sha256 of every pristine SGLang file the patch edits, per base (each base lists exactly the
# files its edits touch).
PRISTINE_SHA256 = {
    "0.5.17": {
        "python/sglang/srt/layers/attention/triton_backend.py": (
            "5b60f958359d03d742776c29bbb3cf412661a6b6cf0feec6da4886d922092fbe"
        ),
        "python/sglang/srt/layers/attention/flashmla_backend.py": (
            "1568c9f98ab127a5d40552f235d0389bfc1144ade29568863e7aea80ae8d9ce5"
        ),
        "python/sglang/srt/arg_groups/speculative_hook.py": (
            "6ffb0b4066e92257ac88c03627df28f7e226fef25eae63a5d2771a74f656bac1"
        ),
        "python/sglang/srt/environ.py": (
            "85f728eef50c73d660a8466f91c774adfb6d5abdca268c0ed02ff97c44ccac80"
        ),
        "python/sglang/srt/mem_cache/allocation_sizing.py": (
            "1f3d920a3dca48f0e0598f32b8432f1b6b51db16dcac86fdf35922e0391eb1e3"
        ),
        "python/sglang/srt/server_args.py": (
            "79d9bbb61b429574e31e7a7e319831fcd129a83a475e6ffe2b7e8a5e8eb06b0f"
        ),
        "python/sglang/srt/speculative/dflash_utils.py": (
            "c432efd27a08689cb32008506bc68956cf7689450cb947337f0770dae432e6a5"
        ),
        "python/sglang/srt/speculative/dflash_worker_v2.py": (
            "c3f3eca69abafa2436ed9e757287e2a2496109346f093aa5a688f0f0c8a57bb8"
        ),
        "python/sglang/srt/speculative/spec_info.py": (
            "1435f9d2ba846f813ca7f50ca2dbb90564b60006ecddfd3a852dc8ac6fb25506"
        ),
        "python/sglang/srt/model_executor/model_runner.py": (
            "221032bf7ae57d2ebdb96801150a48d23244840a9b7938dc586e911671c11102"
        ),
    },
    "0.5.23": {
        "python/sglang/srt/layers/attention/triton_backend.py": (
            "2e095cfafcd30ad0e720fd1ecd70c92f1a83f47a86a28da0ab739ab5717100aa"
        ),
        "python/sglang/srt/layers/attention/flashmla_backend.py": (
            "bc38c9e9a9b07b0a4257bb7e298dceeff591612a27e0974739887feed73d8424"
        ),
        "python/sglang/srt/arg_groups/speculative_hook.py": (
            "d10577c3b5f333ae560adc467e8ca8864196154da5a26683011328c6765a59f0"
        ),
        "python/sglang/srt/arg_groups/fields/spec.py": (
            "3ff1187434d9fef6ad6d290d90c02be20d9899f851eed5d879f65c4b5b8da5fb"
        ),
        "python/sglang/srt/arg_groups/field_order.py": (
            "b7cabb504246b97c09b49ea69298b42da6c05940e4914adab5dd5720675a62e9"
        ),
        "python/sglang/srt/environ.py": (
            "967ede87488967cf87a95f8c38ccd72a3a0055a03cbdac303b38c2322b987c55"
        ),
        "python/sglang/srt/mem_cache/allocation_sizing.py": (
            "c0a757827ab883850058a517629c98b9cfab69a2a9e0d26a3d5b9b4730f2f484"
        ),
        "python/sglang/srt/speculative/dflash_utils.py": (
            "72270b7d4e01012e4b0d04b283db0f57120be37ea0c94c820056ad9a5a9a0d5a"
        ),
        "python/sglang/srt/speculative/dflash_worker_v2.py": (
            "87a7f5808ea12bec0fb4abb8ffc0d2082963a79b5de9ab435063e0dfa8ce8431"
        ),
        "python/sglang/srt/speculative/spec_info.py": (
            "11d25b728ea18aeff82bc269c65a6608b5c9638b0ab754f284b2df76bead7910"
        ),
        "python/sglang/srt/model_executor/model_runner.py": (
            "2ef478a3c5093c476e606c46d182184722350dd87e3e84284ef421eb4cf624f0"
        ),
    },
}


# --- the hand-written edits of existing SGLang files: anchored insertions -----------------------
class Edit:
    """Insert ``text`` before or after ``anchor``, which must occur exactly once in ``path``;
    an anchor given as a ``(head, tail)`` pair matches ``head + tail`` and inserts between.
    ``name`` says what the edit is (the series assigns edits to parts by it)."""

    def __init__(self, name: str, path: str, anchor, text: str, where: str = "after"):
        assert where in ("before", "after")
        self.name = name
        if isinstance(anchor, tuple):  # insert after the head of the pair
            head, tail = anchor
            anchor, where, self.skip = head + tail, "after", len(tail)
        else:
            self.skip = 0
        self.path, self.anchor, self.text, self.where = path, anchor, text, where

    def apply(self, source: str) -> str:
        count = source.count(self.anchor)
        if count != 1:
            raise SystemExit(
                f"generate.py: anchor for {self.path} found {count} times (need exactly 1); "
                f"SGLang changed there. Anchor:\n{self.anchor}"
            )
        i = source.index(self.anchor)
        j = i if self.where == "before" else i + len(self.anchor) - self.skip
        return source[:j] + self.text + source[j:]


def _once(source: str, text: str, path: str) -> int:
    """Where ``text`` occurs in ``source``, which it must exactly once."""
    count = source.count(text)
    if count != 1:
        raise SystemExit(
            f"generate.py: anchor for {path} found {count} times (need exactly 1); "
            f"SGLang changed there. Anchor:\n{text}"
        )
    return source.index(text)


class Replace:
    """Replace ``old``, which must occur exactly ``count`` times in ``path``, by ``new``."""

    def __init__(self, name: str, path: str, old: str, new: str, count: int = 1):
        self.name, self.path, self.old, self.new, self.count = name, path, old, new, count

    def apply(self, source: str) -> str:
        if source.count(self.old) != self.count:
            raise SystemExit(
                f"generate.py: {self.path} holds {source.count(self.old)} times (need "
                f"{self.count}); SGLang changed there:\n{self.old}"
            )
        return source.replace(self.old, self.new)


class Move:
    """Move SGLang's statements from the line ``start`` up to the line ``stop`` (each found
    exactly once; blank lines before ``stop`` stay) into a new method, ``head`` + the moved lines
    + ``tail``, inserted before ``before`` (found exactly once); ``call`` takes their place. The
    lines are moved as they are, not rewritten: the method's indentation is the body's."""

    def __init__(self, name, path, start, stop, call, head, tail, before):
        self.name, self.path, self.start, self.stop = name, path, start, stop
        self.call, self.head, self.tail, self.before = call, head, tail, before

    def apply(self, source: str) -> str:
        i = _once(source, self.start, self.path)
        j = _once(source, self.stop, self.path)
        if j <= i:
            raise SystemExit(f"generate.py: {self.path}: {self.stop!r} before {self.start!r}")
        moved = source[i:j].rstrip("\n") + "\n"
        source = source[:i] + self.call + source[i + len(moved) :]
        at = _once(source, self.before, self.path)
        return source[:at] + self.head + moved + self.tail + source[at:]


SPEC_INFO = "python/sglang/srt/speculative/spec_info.py"
ENVIRON = "python/sglang/srt/environ.py"
# SGLang's field class for each type of the table's knobs (``Knob(int, ...)``: ``EnvInt``).
ENV_FIELD_TYPES = {"int": "EnvInt", "str": "EnvStr"}


def envs_fields() -> str:
    """DDTREE's fields of SGLang's ``Envs``, written from the table the plugin reads instead
    (``DDTreeEnvs`` in ``srt/ddtree_envs.py``, parsed, not imported): per knob, in the table's
    order, its meaning as a comment and ``NAME = EnvInt(default)`` (or ``EnvStr``)."""
    path = PKG_DIR / "srt" / "ddtree_envs.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    table = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DDTreeEnvs")
    lines = []
    for node in table.body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
            continue
        (target,) = node.targets
        kind, default, meaning = node.value.args[:3]
        if getattr(node.value.func, "id", None) != "Knob" or kind.id not in ENV_FIELD_TYPES:
            raise SystemExit(f"generate.py: {target.id} in DDTreeEnvs is no Knob of int or str")
        default = ast.literal_eval(default)
        comment = textwrap.wrap(
            f"DDTREE {ast.literal_eval(meaning)}.", width=88 - len("    # "),
            break_long_words=False, break_on_hyphens=False,
        )  # fmt: skip
        lines += [f"    # {line}" for line in comment]
        value = f'"{default}"' if isinstance(default, str) else repr(default)
        lines.append(f"    {target.id} = {ENV_FIELD_TYPES[kind.id]}({value})")
    if not lines:
        raise SystemExit(f"generate.py: no knob in DDTreeEnvs ({path})")
    return "\n".join(lines) + "\n"


EDITS = [
    # 1. DDTREE, a member of the SpeculativeAlgorithm enum beside DFLASH: its predicate, the
    #    DFLASH family's, its argument handling, the drafter's width and its worker.
    Edit("register", SPEC_INFO, "    DFLASH = auto()\n", "    DDTREE = auto()\n", where="before"),
    Edit(
        "register-predicate",
        SPEC_INFO,
        "    def is_dflash(self) -> bool:\n        return self == SpeculativeAlgorithm.DFLASH\n",
        "\n    def is_ddtree(self) -> bool:\n        return self == SpeculativeAlgorithm.DDTREE\n",
    ),
    Edit(
        "register-family",
        SPEC_INFO,
        ("        return self.is_dflash() or self.is_dspark()", "\n"),
        " or self.is_ddtree()",
    ),
    Edit(
        "register-args",
        SPEC_INFO,
        "        if self.is_dflash():\n            _handle_dflash(server_args)\n",
        """        elif self.is_ddtree():
            from sglang.srt.speculative.ddtree_spec import handle_ddtree

            handle_ddtree(server_args)
""",
    ),
    Edit(
        "register-widths",
        SPEC_INFO,
        "        if self.is_dspark() and is_draft_worker:\n",
        """        if self.is_ddtree() and is_draft_worker:
            # The target verifies W tokens per request, the drafter its block of B.
            from sglang.srt.speculative.ddtree_spec import draft_block_size

            return draft_block_size()
""",
        where="before",
    ),
    Edit(
        "register-worker",
        SPEC_INFO,
        "        if self.is_dflash():\n            # V2 worker drives both overlap and non-overlap",
        """        if self.is_ddtree():
            from sglang.srt.speculative.ddtree_worker_v2 import DDTreeWorkerV2

            return DDTreeWorkerV2

""",
        where="before",
    ),
    Edit(
        "graph-runner",
        "python/sglang/srt/model_executor/model_runner.py",
        "        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (\n"
        "            DecodeCudaGraphRunner,\n",
        """        if self.spec_algorithm.is_ddtree() and not self.is_draft_worker:
            # Verify graphs with the tree mask, one width per budget bucket.
            from sglang.srt.speculative.ddtree_cuda_graph_runner import (
                DDTreeDecodeCudaGraphRunner,
            )

            return DDTreeDecodeCudaGraphRunner

""",
        where="before",
    ),
    # 2. Per-request refusals (HTTP 400), where the scheduler checks DFLASH-family requests.
    Edit(
        "request-refusals",
        "python/sglang/srt/speculative/dflash_utils.py",
        "def validate_dflash_request(req: Req, enable_overlap: bool) -> Optional[str]:\n",
        """    # DDTREE refuses more sampling options than DFLASH; its messages name DDTREE.
    from sglang.srt.speculative import ddtree_requests

    if ddtree_requests.ddtree_active():
        error_msg = ddtree_requests.refuse_request(req)
        if error_msg is not None:
            return error_msg

""",
    ),
    # ... and serves the logprobs DFLASH refuses (ddtree_logprobs).
    Edit(
        "logprobs-admitted",
        "python/sglang/srt/speculative/dflash_utils.py",
        (
            "    if req.return_logprob",
            ':\n        return "DFLASH speculative decoding does not support return_logprob yet."\n',
        ),
        " and not ddtree_requests.ddtree_active()",
    ),
    # DDTREE's prefill is DFLASH's, whose target computes the logprobs a batch asks for.
    Replace(
        "logprobs-prefill",
        "python/sglang/srt/speculative/dflash_worker_v2.py",
        '        if getattr(batch, "return_logprob", False):\n            raise ValueError(\n'
        '                "DFLASH speculative decoding does not support return_logprob yet."',
        "        if (\n"
        '            getattr(batch, "return_logprob", False)\n'
        '            and self.server_args.speculative_algorithm != "DDTREE"\n'
        "        ):\n            raise ValueError(\n"
        '                "DFLASH speculative decoding does not support return_logprob yet."',
    ),
    # 3. req_to_token row headroom.
    Edit(
        "row-headroom",
        "python/sglang/srt/mem_cache/allocation_sizing.py",
        "            get_alloc_reserve_per_decode(server_args) + server_args.page_size - 1,\n"
        "        )\n",
        """    if server_args.speculative_algorithm == "DDTREE":
        # 2 W + B + 4 columns past the context; see ddtree_args.req_to_token_headroom.
        from sglang.srt.speculative.ddtree_args import req_to_token_headroom

        block = (
            server_args.speculative_dflash_block_size
            or server_args.speculative_num_draft_tokens
        )
        extra = max(
            extra,
            req_to_token_headroom(server_args.speculative_num_draft_tokens, block),
        )
""",
    ),
    # 4. Server flags: dataclass fields (SGLang derives the argparse flags from them) ...
    Edit(
        "server-flags",
        "python/sglang/srt/server_args.py",
        """    speculative_dflash_block_size: A[
        Optional[int],
        "DFLASH only. Block size (verify window length). Alias of --speculative-num-draft-tokens for DFLASH.",
        NS("spec"),
    ] = None
""",
        """    speculative_ddtree_budget_schedule: A[
        Optional[str],
        "DDTREE only. Adaptive tree budget: tree nodes verified per request (root included) by running batch size, as comma-separated min_batch_size:num_nodes pairs, e.g. '1:65,8:33,32:17' (bs 1-7 verify 65 nodes, 8-31 33, 32+ 17). Thresholds start at 1 and increase; every value must be >= the drafter block size B. Exclusive with --speculative-num-draft-tokens (a fixed budget). Default: 1:2B,4:B (1:B for mixture-of-experts targets).",
        NS("spec"),
    ] = None
    speculative_ddtree_topk: A[
        Optional[int],
        "DDTREE only. Draft candidates per tree depth (default 8), capped by the tree budget and the vocabulary size.",
        NS("spec"),
    ] = None
    speculative_ddtree_verify_attention: A[
        Optional[str],
        "DDTREE only. The target verify's attention, by its name in speculative/ddtree_attention/attention_registry.py. Default: the one named as the verify's attention backend (triton, flashmla: DDTREE's split tree attention; flashinfer: its custom-mask prefill). triton_extend: triton's custom-mask extend kernel, the reference the split is tested against.",
        NS("spec"),
    ] = None
""",
    ),
    # 5. ... which the DDTREE modules read from the server args; they mean nothing without DDTREE.
    Edit(
        "flag-check",
        "python/sglang/srt/arg_groups/speculative_hook.py",
        "    algo = None\n    if server_args.speculative_algorithm is not None:\n",
        """    if server_args.speculative_algorithm != "DDTREE" and (
        server_args.speculative_ddtree_budget_schedule is not None
        or server_args.speculative_ddtree_topk is not None
        or server_args.speculative_ddtree_verify_attention is not None
    ):
        raise ValueError(
            "--speculative-ddtree-budget-schedule, --speculative-ddtree-topk and "
            "--speculative-ddtree-verify-attention need --speculative-algorithm DDTREE."
        )

""",
        where="before",
    ),
    # 6. DDTREE's tree-verify attention (prefix part + ancestor block), ahead of the
    #    custom-mask extend kernel, on a backend built for a DDTREE server's target (decided
    #    once, at construction); it returns None for anything but a DDTREE verify.
    Edit(
        "triton-verify-init",
        "python/sglang/srt/layers/attention/triton_backend.py",
        "        super().__init__()\n\n"
        "        self.decode_attention_fwd = torch.compiler.disable(decode_attention_fwd)\n",
        """        from sglang.srt.speculative.ddtree_attention.triton_backend import (
            TritonSplitVerify,
        )
        from sglang.srt.speculative.ddtree_attention.verify_backend import (
            takes_ddtree_verify,
        )

        self.ddtree_takes_verify = takes_ddtree_verify(model_runner, TritonSplitVerify)
""",
    ),
    Edit(
        "triton-verify",
        "python/sglang/srt/layers/attention/triton_backend.py",
        ("        aux_tensors=None,\n    ):\n", "        # TODO: reuse the buffer across layers\n"),
        """        if self.ddtree_takes_verify and forward_batch.forward_mode.is_target_verify():
            from sglang.srt.speculative.ddtree_attention.triton_backend import (
                TritonSplitVerify,
            )

            out = TritonSplitVerify.forward_extend(
                self, q, k, v, layer, forward_batch, save_kv_cache,
                sinks=sinks, score_mod=score_mod, aux_tensors=aux_tensors,
            )  # fmt: skip
            if out is not None:
                return out
""",
    ),
    # 7. On flashmla: the DDTREE verify by core.tree_attention on FlashMLA's pages; the prefix
    #    offsets and tree mask set per forward by the two metadata calls (eager, and before
    #    each replay).
    Edit(
        "flashmla-verify-init",
        "python/sglang/srt/layers/attention/flashmla_backend.py",
        "        self.is_draft_runner = model_runner.is_draft_worker\n",
        """        from sglang.srt.speculative.ddtree_attention.flashmla_backend import (
            FlashMLASplitVerify,
        )
        from sglang.srt.speculative.ddtree_attention.verify_backend import (
            takes_ddtree_verify,
        )

        self.ddtree_takes_verify = takes_ddtree_verify(
            model_runner, FlashMLASplitVerify
        )
""",
    ),
    Edit(
        "flashmla-verify",
        "python/sglang/srt/layers/attention/flashmla_backend.py",
        "            # target_verify / draft_extend_v2: fixed-q decode-style kernel.\n",
        """            if self.ddtree_takes_verify:
                from sglang.srt.speculative.ddtree_attention.flashmla_backend import (
                    FlashMLASplitVerify,
                )

                out = FlashMLASplitVerify.forward_extend(
                    self, q, k, v, layer, forward_batch, save_kv_cache
                )
                if out is not None:
                    return out
""",
    ),
    Edit(
        "flashmla-metadata",
        "python/sglang/srt/layers/attention/flashmla_backend.py",
        (
            "            super().init_forward_metadata(forward_batch)\n",
            "\n    def init_cuda_graph_state(",
        ),
        """        if self.ddtree_takes_verify:
            from sglang.srt.speculative.ddtree_attention.flashmla_backend import (
                FlashMLASplitVerify,
            )

            # A no-op but for a DDTREE verify.
            FlashMLASplitVerify.init_forward_metadata(
                self, forward_batch, in_graph=False
            )
""",
    ),
    Edit(
        "flashmla-metadata-graph",
        "python/sglang/srt/layers/attention/flashmla_backend.py",
        (
            "                forward_batch, in_capture=in_capture\n            )\n",
            "\n    def _eager_block_kv_indices(",
        ),
        """        if self.ddtree_takes_verify:
            from sglang.srt.speculative.ddtree_attention.flashmla_backend import (
                FlashMLASplitVerify,
            )

            # A no-op but for a DDTREE verify.
            FlashMLASplitVerify.init_forward_metadata(
                self, forward_batch, in_graph=True
            )
""",
    ),
    # 8. DDTREE's environment variables: fields of SGLang's ``Envs`` beside DFLASH's, read as
    #    SGLang reads its own (``envs.<NAME>.get()``); written from the plugin's table.
    Edit(
        "envs-fields",
        ENVIRON,
        "    SGLANG_DFLASH_EAGER_DRAFT_SAMPLER = EnvBool(False)\n",
        envs_fields(),
    ),
]


# --- DFLASH's draft block and drafter-KV append as public methods of DFlashWorkerV2 ------------
# DDTREE's decode step drafts as DFLASH's decode does and appends the drafter KV as it does; the
# code is DFLASH's, moved out of its ``forward_batch_generation`` into methods that DFLASH's decode
# and DDTREE's both call (SGLang's lines moved as they are: `Move`; the tests compare their ASTs).
DFLASH_WORKER = f"{SPEC}/dflash_worker_v2.py"
_DRAFT_BLOCK_HEAD = '''    def prepare_draft_block(
        self, batch: ScheduleBatch, draft_input: DFlashDraftInputV2
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A decode batch's draft block in this worker's buffers, each
        ``[bs, block_size]``: its tokens (the bonus token, then mask tokens), their
        positions and the KV slots they write."""
        bs = len(batch.seq_lens)
        device = self.device
        block_size = int(self.block_size)
'''
_DRAFT_FORWARD_HEAD = '''    def forward_draft_block(
        self,
        batch: ScheduleBatch,
        draft_input: DFlashDraftInputV2,
        block_ids: torch.Tensor,
        positions_2d: torch.Tensor,
        verify_out_cache_loc_2d: torch.Tensor,
    ):
        """The drafter's forward over the draft block of `prepare_draft_block`
        (``TARGET_VERIFY`` mode, no hidden capture): the draft runner's output, whose
        ``logits_output.hidden_states`` are the block's hidden states.{returns}"""
        bs = len(batch.seq_lens)
{device}        block_size = int(self.block_size)
        prefix_lens = batch.seq_lens
        target_model = self.target_worker.model_runner.model
{embed}'''
_DRAFT_BLOCK_CALL = (
    "        block_ids, positions_2d, verify_out_cache_loc_2d = self.prepare_draft_block(\n"
    "            batch, draft_input\n        )\n        prefix_lens = batch.seq_lens\n"
)
_DRAFT_FORWARD_CALL = """        {outputs} = self.forward_draft_block(
            batch, draft_input, block_ids, positions_2d, verify_out_cache_loc_2d
        )
        positions = positions_2d.reshape(-1)
        verify_out_cache_loc = verify_out_cache_loc_2d.reshape(-1)
"""
DFLASH_EDITS = [
    Edit(
        "dflash-imports",
        DFLASH_WORKER,
        "import logging\nimport math\n",
        "import contextlib\nimport copy\n",
        where="before",
    ),  # fmt: skip
    Move(
        "dflash-draft-block",
        DFLASH_WORKER,
        start="        self._ensure_draft_block_buffers(bs)\n",
        stop="        noise_embedding = embed_module(block_ids)\n",
        call=_DRAFT_BLOCK_CALL,
        head=_DRAFT_BLOCK_HEAD,
        tail="        return block_ids, positions_2d, verify_out_cache_loc_2d\n\n",
        before="    def forward_batch_generation(\n",
    ),
    Move(
        "dflash-draft-forward",
        DFLASH_WORKER,
        start="        noise_embedding = embed_module(block_ids)\n",
        stop="        draft_logits_output = draft_out.logits_output\n",
        call=_DRAFT_FORWARD_CALL.format(outputs="draft_out"),
        head=_DRAFT_FORWARD_HEAD.format(
            returns="",
            device="",
            embed="        embed_module = target_model.get_input_embeddings()\n",
        ),  # fmt: skip
        tail="        return draft_out\n\n",
        before="    def forward_batch_generation(\n",
    ),
    # The decode's embedding module is the drafter forward's alone now (moved there).
    Replace(
        "dflash-draft-embed",
        DFLASH_WORKER,
        "        embed_module = target_model.get_input_embeddings()\n"
        "        lm_head = getattr(target_model",
        "        lm_head = getattr(target_model",
    ),
    # The drafter-KV append by a public name (no other caller in either release's package).
    Replace(
        "dflash-kv-append",
        DFLASH_WORKER,
        "_append_target_hidden_to_draft_kv_by_loc(",
        "append_target_hidden_to_draft_kv_by_loc(",
        count=3,
    ),
    # A fused-KV helper with a workspace of a caller's own, for appends replayed from a graph.
    Edit(
        "dflash-kv-workspace",
        DFLASH_WORKER,
        "    def _append_target_hidden_sequential(\n",
        '''    def new_fused_kv_helper(self, rows: int) -> Optional[object]:
        """The fused drafter-KV helper on the same stacked weights, with a workspace
        of its own for ``rows`` context rows allocated now; None without the fused
        path. For appends replayed from a CUDA graph: prefill grows the shared
        helper's workspace by replacing its tensors, which a graph would go on using."""
        helper = self._fused_kv_helper
        if helper is None or rows <= 0:
            return None
        own = copy.copy(helper)  # shares the weights
        own._workspace_capacity = 0  # so the next call allocates tensors of its own
        own._ensure_workspace(rows, helper.flat_kv_weight_t.dtype)
        return own

    @contextlib.contextmanager
    def use_fused_kv_helper(self, helper: Optional[object]):
        """Drafter-KV appends inside run on ``helper`` (`new_fused_kv_helper`; None:
        the shared one) on the fused path; a fused failure still turns the path off."""
        shared = self._fused_kv_helper
        if helper is None or shared is None:
            yield
            return
        self._fused_kv_helper = helper
        try:
            yield
        finally:
            if self._fused_kv_helper is helper:  # None if the fused path failed
                self._fused_kv_helper = shared

''',
        where="before",
    ),
]
EDITS += DFLASH_EDITS
# On 0.5.23 the decode embeds the block through the drafter's embedding (and keeps it: Domino's
# rollout reads it) and plans the iteration's KV window after the draft block: the drafter
# forward returns that plan too (the verify and the drafter-KV append write the same window).
DFLASH_BASE_EDITS = {
    "0.5.23": {
        "dflash-draft-block": (
            Move(
                "dflash-draft-block",
                DFLASH_WORKER,
                start="        self._ensure_draft_block_buffers(bs)\n",
                stop="        if self._full_embed_gpu is not None:\n",
                call=_DRAFT_BLOCK_CALL,
                head=_DRAFT_BLOCK_HEAD,
                tail="        return block_ids, positions_2d, verify_out_cache_loc_2d\n\n",
                before="    def forward_batch_generation(\n",
            ),
        ),
        "dflash-draft-forward": (
            Move(
                "dflash-draft-forward",
                DFLASH_WORKER,
                start="        if self._full_embed_gpu is not None:\n",
                stop="        draft_logits_output = draft_out.logits_output\n",
                call=_DRAFT_FORWARD_CALL.format(outputs="draft_out, kv_loc_plan"),
                head=_DRAFT_FORWARD_HEAD.format(
                    returns=" With it the\n        iteration's KV write plan (the verify and "
                    "the drafter-KV append write the\n        same window).",
                    device="        device = self.device\n",
                    embed="        embed_module = unwrap_lora_layer(\n"
                    "            _resolve_dflash_embedding_module(self.draft_model, target_model)\n"
                    "        )\n",
                ),
                tail="        return draft_out, kv_loc_plan\n\n",
                before="    def forward_batch_generation(\n",
            ),
        ),
        "dflash-draft-embed": (),
    },
}


# --- what differs on another base: every difference between the bases is in these tables --------
def _edit(name: str) -> Edit:
    """The edit of ``EDITS`` named ``name`` (the first base's)."""
    return next(e for e in EDITS if e.name == name)


# Edits made otherwise on a base: {base: {edit name: the edits made there instead (none: the
# edit is not made there)}}. The replacements carry the same name, so the series assigns them to
# the same part.
BASE_EDITS = {
    "0.5.23": {
        # The speculative fields are declared in arg_groups/fields/spec.py (its Spec namespace
        # class: no NS marker); a new built-in field is appended to the positional order.
        "server-flags": (
            Edit(
                "server-flags",
                "python/sglang/srt/arg_groups/fields/spec.py",
                _edit("server-flags").anchor.replace('        NS("spec"),\n', ""),
                _edit("server-flags").text.replace('        NS("spec"),\n', ""),
            ),
            Edit(
                "server-flags",
                "python/sglang/srt/arg_groups/field_order.py",
                ('    "return_aux_hidden_state_layer_ids",\n', ")\n# fmt: on\n"),
                "".join(
                    f'    "{field}",\n'
                    for field in re.findall(r"^    (\w+): A\[$", _edit("server-flags").text, re.M)
                ),
            ),
        ),
        # handle_speculative_decoding reads the arguments through a resolving view, ``cfg``.
        "flag-check": (
            Edit(
                "flag-check",
                "python/sglang/srt/arg_groups/speculative_hook.py",
                "    algo = None\n    if cfg.speculative_algorithm is not None:\n",
                _edit("flag-check").text.replace("server_args.", "cfg."),
                where="before",
            ),
        ),
        # get_req_to_token_extra_context_len takes no server args: it reads the published spec
        # bag (``spec_algorithm`` is its local).
        "row-headroom": (
            Edit(
                "row-headroom",
                "python/sglang/srt/mem_cache/allocation_sizing.py",
                (
                    "            extra = max(extra, get_alloc_reserve_per_decode() + page_size - 1)\n",
                    "    return extra\n",
                ),
                """    if spec_algorithm == "DDTREE":
        # 2 W + B + 4 columns past the context; see ddtree_args.req_to_token_headroom.
        from sglang.srt.speculative.ddtree_args import req_to_token_headroom

        spec = get_spec()
        block = spec.speculative_dflash_block_size or spec.speculative_num_draft_tokens
        extra = max(
            extra,
            req_to_token_headroom(spec.speculative_num_draft_tokens, block),
        )
""",
            ),
        ),
        # DFLASH serves logprobs: there is no refusal of them to step around.
        "logprobs-admitted": (),
        "logprobs-prefill": (),
        # forward_extend first tries its dense FP8 chunked path; DDTREE's verify goes before it.
        "triton-verify": (
            Edit(
                "triton-verify",
                "python/sglang/srt/layers/attention/triton_backend.py",
                (
                    "        aux_tensors=None,\n    ):\n",
                    "        if (\n            k is not None\n",
                ),
                _edit("triton-verify").text + "\n",
            ),
        ),
    },
}

for _base, _instead in DFLASH_BASE_EDITS.items():
    BASE_EDITS.setdefault(_base, {}).update(_instead)

# Lines of a generated file that read otherwise on a base: {base: ((file, old, new), ...)}, the
# file a ``MODULE_MAP`` key, a template or a ``KERNEL_FILES`` source; ``old`` occurs exactly once
# in it. Kept to where SGLang's own names for the same thing moved.
BASE_REWRITES = {
    "0.5.23": (
        # The JIT headers declare their helpers (host::, kDLGPU) in namespace sglang.
        (
            "sgl-kernel/csrc/ddtree/top_p_radix.cuh",
            "#include <cstdint>\n\nnamespace {\n",
            "#include <cstdint>\n\n// SGLang's JIT helpers (host::, kDLGPU) are declared in namespace "
            "sglang.\nusing namespace sglang;\n\nnamespace {\n",
        ),
        # The tree accept kernels are SGLang's JIT ops (sgl_kernel no longer ships them); the
        # sampling one and the renorms by their platform-resolved names, as DFLASH imports them.
        (
            "sglang_ddtree.core.accept",
            "        import sgl_kernel  # noqa: F401\n",
            "        import sglang.kernels.ops.speculative.tree  # noqa: F401\n",
        ),
        (
            "sglang_ddtree.core.accept",
            "        from sgl_kernel import verify_tree_greedy\n",
            "        from sglang.kernels.ops.speculative.tree import verify_tree_greedy\n",
        ),
        (
            "sglang_ddtree.core.accept",
            "    from sgl_kernel import tree_speculative_sampling_target_only\n",
            "    from sglang.kernels.ops.speculative.verify_sampling import (\n"
            "        tree_speculative_sampling_target_only,\n    )\n",
        ),
        (
            "sglang_ddtree.core.sampling",
            "        from sgl_kernel import top_k_renorm_prob\n",
            "        from sglang.kernels.ops.sampling.renorm import top_k_renorm_prob\n",
        ),
        (
            "bench_ddtree_top_p_radix.py",
            "from sgl_kernel import top_p_renorm_prob\n",
            "from sglang.kernels.ops.sampling.renorm import top_p_renorm_prob\n",
        ),
        # FlashMLA comes from the sgl-flash-mla wheel, behind sgl_kernel's former signatures.
        (
            "bench_ddtree_tree_attention.py",
            'importlib.util.find_spec("sgl_kernel.flash_mla")',
            'importlib.util.find_spec("flash_mla")',
        ),
        (
            "bench_ddtree_tree_attention.py",
            "        from sgl_kernel.flash_mla import flash_mla_with_kvcache, get_mla_metadata\n",
            "        from sglang.kernels.ops.attention.flash_mla_interface import (\n"
            "            flash_mla_with_kvcache,\n            get_mla_metadata,\n        )\n",
        ),
        # The record keeps the raw input: resolution declares its decisions (read through a
        # live view); the schedule, no field, rides on the record as bookkeeping (pickled).
        (
            "sglang_ddtree.srt.ddtree_spec",
            """    from sglang.srt.arg_groups.speculative_hook import _handle_dflash

    user_nodes = server_args.speculative_num_draft_tokens  # None unless passed explicitly
    server_args.speculative_num_draft_tokens = None
    try:
        _handle_dflash(server_args)
    except Exception:
        server_args.speculative_num_draft_tokens = user_nodes
        raise
    block = int(server_args.speculative_num_draft_tokens)
    flag = getattr(server_args, dargs.BUDGET_FLAG, None)
    moe = budget.is_moe_target(server_args.get_model_config().hf_config)
    schedule = budget.resolve_schedule(user_nodes, block, flag, moe)
    nodes = schedule.max_num_nodes
    server_args.speculative_dflash_block_size = block
    server_args.speculative_num_draft_tokens = nodes
""",
            """    from sglang.srt.arg_groups.overrides import (
        declare_resolution,
        model_config_of,
        resolving_view,
    )
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash

    cfg, source = resolving_view(server_args), "handle_speculative_decoding.ddtree"
    user_nodes = cfg.speculative_num_draft_tokens  # None unless passed explicitly
    declare_resolution(server_args, source, speculative_num_draft_tokens=None)
    _handle_dflash(server_args)  # declares B
    block = int(cfg.speculative_num_draft_tokens)
    flag = getattr(cfg, dargs.BUDGET_FLAG, None)
    moe = budget.is_moe_target(model_config_of(server_args).hf_config)
    schedule = budget.resolve_schedule(user_nodes, block, flag, moe)
    nodes = schedule.max_num_nodes
    declare_resolution(
        server_args,
        source,
        speculative_dflash_block_size=block,
        speculative_num_draft_tokens=nodes,
    )
""",
        ),
        # The worker and the graph runner read the resolved arguments (the record's fields are
        # the raw input).
        (
            "sglang_ddtree.srt.ddtree_cuda_graph_runner",
            "from sglang.srt.model_executor.runner.decode_cuda_graph_runner import",
            "from sglang.srt.arg_groups.overrides import resolved_view\n"
            "from sglang.srt.model_executor.runner.decode_cuda_graph_runner import",
        ),
        (
            "sglang_ddtree.srt.ddtree_cuda_graph_runner",
            "schedule_from_args(model_runner.server_args)",
            "schedule_from_args(resolved_view(model_runner.server_args))",
        ),
        (
            "sglang_ddtree.srt.ddtree_worker_v2",
            "import copy\nimport logging\n",
            "import logging\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_worker_v2",
            "from sglang.srt.runtime_context import get_exec\n",
            "from sglang.srt.arg_groups.overrides import resolved_view\n"
            "from sglang.srt.runtime_context import get_exec, get_spec\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_worker_v2",
            "        block = server_args.speculative_dflash_block_size\n",
            "        record, server_args = server_args, resolved_view(server_args)\n"
            "        block = server_args.speculative_dflash_block_size\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_worker_v2",
            "            self.model_runner.server_args,\n",
            "            resolved_view(self.model_runner.server_args),\n",
        ),
        # ServerArgs is sealed (no override) and DFLASH reads its block from the spec bag: the
        # bag says B while DFLASH builds, as the 0.5.17 form hands it a copy of the arguments.
        (
            "sglang_ddtree.srt.ddtree_worker_v2",
            "        parent_args = copy.deepcopy(server_args)\n"
            '        parent_args.override("ddtree.drafter_block", '
            "speculative_num_draft_tokens=shape.block_size)\n"
            "        super().__init__(parent_args, gpu_id, target_worker=target_worker, **kw)\n",
            "        # DFLASH reads its block from the spec bag: B while it builds, W after.\n"
            "        with get_spec().override(speculative_num_draft_tokens=shape.block_size):\n"
            "            super().__init__(record, gpu_id, target_worker=target_worker, **kw)\n",
        ),
        # KV is written through a KVWriteLoc (its physical mark: unified pools refuse a bare
        # loc); the split verify reads untranslated ids only, so it leaves unified pools to
        # the backend's own kernel.
        (
            "sglang_ddtree.srt.ddtree_attention.triton_backend",
            '            and getattr(backend, "_translate_kv_loc", None) is None  # unified pools\n',
            "            and not backend.kv_index_translator.reads_are_translated  # unified pools\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_attention.triton_backend",
            "            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)\n",
            "            pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v)\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_attention.triton_backend",
            "        from sglang.srt.speculative.ddtree.tree_attention import is_latent_view, tree_attention\n",
            "        from sglang.srt.mem_cache.memory_pool import KVWriteLoc\n"
            "        from sglang.srt.speculative.ddtree.tree_attention import is_latent_view, tree_attention\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_attention.flashmla_backend",
            "            and backend.dcp_world_size == 1\n",
            "            and backend.dcp_world_size == 1\n"
            "            and not backend.kv_index_translator.reads_are_translated\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_attention.flashmla_backend",
            "            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)\n",
            "            pool.set_kv_buffer(layer, KVWriteLoc.for_batch(forward_batch), k, v)\n",
        ),
        (
            "sglang_ddtree.srt.ddtree_attention.flashmla_backend",
            "        from sglang.srt.speculative.ddtree.tree_attention import gluon_prefix_runs, tree_attention\n",
            "        from sglang.srt.mem_cache.memory_pool import KVWriteLoc\n"
            "        from sglang.srt.speculative.ddtree.tree_attention import gluon_prefix_runs, tree_attention\n",
        ),
        # prepare_server_args no longer resolves the arguments (where the flag check runs).
        (
            "test_ddtree_refusals.py",
            '                    "4",\n                ]\n            )\n',
            '                    "4",\n                ]\n            ).resolve_once()\n',
        ),
    ),
}

# DFLASH's drafter forward returns the iteration's KV write plan too on 0.5.23 (its draft
# block's window; DDTREE's verify writes a window of its own).
BASE_REWRITES["0.5.23"] += (
    (
        "sglang_ddtree.srt.ddtree_step",
        "        draft_out = dflash.forward_draft_block(\n",
        "        draft_out, _ = dflash.forward_draft_block(\n",
    ),
)

# Words of the part texts that read otherwise on a base: {base: ((old, new), ...)}; each ``old``
# occurs in the series' texts.
BASE_TEXT = {
    "0.5.23": (
        (
            " and lets logprobs through under DDTREE\n"
            "  (served from the verify logits, part 7; DFLASH's refusal stays for DFLASH), as\n"
            "  `DFlashWorkerV2.forward_batch_generation` does for DDTREE's prefill (its target computes them)",
            "; logprobs, which DFLASH\n  serves too, are served from the verify logits (part 7)",
        ),
        (
            "`server_args.py` gains",
            "`arg_groups/fields/spec.py` (and `field_order.py`'s positional order)\n  gains",
        ),
        ("the request refusals (logprobs served past DFLASH's)", "the request refusals"),
    ),
}


def edits(base: str) -> list[Edit]:
    """The edits made on ``base``, in ``EDITS`` order: each named in ``BASE_EDITS[base]``
    replaced by that entry's."""
    instead = BASE_EDITS.get(base, {})
    out = []
    for e in EDITS:
        out += list(instead[e.name]) if e.name in instead else [e]
    return out


def check_bases() -> None:
    """Every base has its pins; the tables name known bases, edits and files only."""
    names = {e.name for e in EDITS}
    files = set(MODULE_MAP) | {t for t, _ in TEMPLATE_FILES} | {k for k, _, _ in KERNEL_FILES}
    problems = [f"  no PRISTINE_SHA256 for base {b}" for b in BASES if b not in PRISTINE_SHA256]
    for table in (PRISTINE_SHA256, BASE_EDITS, BASE_REWRITES, BASE_TEXT):
        problems += [f"  unknown base {b}" for b in table if b not in BASES]
    for base, instead in BASE_EDITS.items():
        problems += [f"  {base}: unknown edit {n}" for n in instead if n not in names]
        problems += [f"  {base}: an edit replacing {n} is named {e.name}"
                     for n, made in instead.items() for e in made if e.name != n]  # fmt: skip
    for base, rewrites in BASE_REWRITES.items():
        problems += [f"  {base}: rewrite of unknown file {f}" for f, _, _ in rewrites
                     if f not in files]  # fmt: skip
    problems += [f"  in-tree rewrite of unknown module {m}"
                 for m in [m for m, _, _ in IN_TREE_REWRITES] + list(IN_TREE_CUTS)
                 if m not in MODULE_MAP]  # fmt: skip
    problems += [
        f"  stand-in {m} is not in NOT_UPSTREAM" for m in STAND_INS if m not in NOT_UPSTREAM
    ]
    problems += [f"  DFLASH call of unknown module {m}" for m, _, _, _ in IN_TREE_DFLASH_CALLS
                 if m not in MODULE_MAP]  # fmt: skip
    if problems:
        raise SystemExit("generate.py: the base tables are out of date:\n" + "\n".join(problems))


def output_dir(base: str) -> Path:
    """Where ``base``'s patch and series go: ``upstream/`` for the first base, else
    ``upstream/<base>/``."""
    return UPSTREAM_DIR if base == BASES[0] else UPSTREAM_DIR / base


# --- the series: the same tree as a sequence of pull requests, each applying on the last ----
class Part(NamedTuple):
    """One pull request of the series: what it adds to the tree the parts before it left."""

    name: str  # upstream/series/NN-<name>.patch and .md; its text: templates/series/<name>.md
    title: str
    summary: str  # one sentence: what it adds (the part before names it as the next)
    modules: tuple[str, ...] = ()  # MODULE_MAP keys
    kernels: tuple[str, ...] = ()  # KERNEL_FILES sources
    templates: tuple[str, ...] = ()  # TEMPLATE_FILES templates
    edits: tuple[str, ...] = ()  # Edit names
    serves: bool = False  # DDTREE is registered from this part on: in-tree tests and smoke run
    # A change to SGLang's own code that DDTREE's parts build on, its own small pull request
    # ahead of them: numbered 00, outside DDTREE's count.
    prelude: bool = False


# Bottom-up: a part may import only what it or an earlier part adds (module-level and lazy
# imports alike; `check_series_imports`), because every module is this repository's module as
# it is. The worker imports the budget, graph runner, decode step and glue warm-up at module
# level, the step the penalties and logprobs, and the core modules reach their kernels through
# lazy imports, so DDTREE registers in the part that adds the worker, after all it imports.
SERIES = [
    Part(
        "dflash-draft-block",
        "DFLASH's draft block, drafter forward and drafter-KV append as public methods",
        "public methods of DFlashWorkerV2 that DFLASH's decode calls: the draft block and the "
        "drafter's forward over it (moved out of forward_batch_generation), the drafter-KV "
        "append by a public name, and a fused-KV helper with a workspace of a caller's own",
        edits=(
            "dflash-imports",
            "dflash-draft-block",
            "dflash-draft-forward",
            "dflash-draft-embed",
            "dflash-kv-append",
            "dflash-kv-workspace",
        ),
        templates=("test_dflash_worker_methods.py",),
        prelude=True,
    ),
    Part(
        "draft-tree",
        "the draft tree and its verify layout",
        "the draft tree (best-first top prefixes of the drafter's per-depth distributions), its "
        "verify layout and ancestor mask, the vocabulary-sharded top-K and their Triton paths",
        modules=(
            "sglang_ddtree.core",
            "sglang_ddtree.core.tree",
            "sglang_ddtree.core.topk_triton",
            "sglang_ddtree.core.tree_triton",
            "sglang_ddtree.core.layout",
            "sglang_ddtree.core.layout_triton",
            "sglang_ddtree.core.vocab_shard",
        ),
        templates=("test_ddtree_tree.py", "bench_ddtree_draft_tree.py"),
    ),
    Part(
        "top-p-radix",
        "radix-select top-p renormalization kernel",
        "a CUDA top-p renormalization by radix select (JIT-built), deterministic and "
        "shape-independent in cost, for the sampled verify's target rows",
        modules=("sglang_ddtree.core.topp_radix",),
        kernels=("sgl-kernel/csrc/ddtree/top_p_radix.cuh",),
        templates=("test_ddtree_top_p_radix.py", "bench_ddtree_top_p_radix.py"),
    ),
    Part(
        "tree-accept",
        "target law, tree accept and commit",
        "the target law of sampled requests, greedy and sampled tree accept through "
        "sgl_kernel, the commit plan, the step's two pure halves, and the argmax and KV-move "
        "kernels",
        modules=(
            "sglang_ddtree.core.sampling",
            "sglang_ddtree.core.minp_triton",
            "sglang_ddtree.core.accept",
            "sglang_ddtree.core.batch_accept",
            "sglang_ddtree.core.commit",
            "sglang_ddtree.core.argmax_triton",
            "sglang_ddtree.core.kv_move_triton",
            "sglang_ddtree.core.step",
        ),
        templates=("test_ddtree_accept.py", "bench_ddtree_accept.py"),
    ),
    Part(
        "latent-prefix-gluon",
        "MLA's latent prefix as a Gluon kernel for Hopper",
        "MLA's latent prefix attention on FlashMLA's 64-slot pages as a Gluon kernel for "
        "Hopper, each key tile's TMA copy issued as soon as its buffer is free (the next part's "
        "flashmla verify takes it on Hopper with a bfloat16 cache)",
        modules=("sglang_ddtree.core.tree_attention_gluon",),
        templates=("test_ddtree_latent_prefix_gluon.py",),
    ),
    Part(
        "tree-verify-attention",
        "verify attention backends: the split tree attention on triton and flashmla",
        "the verify attention backend interface and the tree-verify attention split into a "
        "prefix part and the ancestor block, as triton's and flashmla's verify backends called "
        "from SGLang's (inert until a DDTREE worker runs)",
        modules=(
            "sglang_ddtree.core.tree_attention",
            "sglang_ddtree.srt.ddtree_attention",
            "sglang_ddtree.srt.ddtree_attention.verify_backend",
            "sglang_ddtree.srt.ddtree_attention.triton_extend_backend",
            "sglang_ddtree.srt.ddtree_attention.triton_backend",
            "sglang_ddtree.srt.ddtree_attention.flashmla_backend",
        ),
        templates=("test_ddtree_tree_attention.py", "bench_ddtree_tree_attention.py"),
        edits=(
            "triton-verify-init",
            "triton-verify",
            "flashmla-verify-init",
            "flashmla-verify",
            "flashmla-metadata",
            "flashmla-metadata-graph",
        ),  # fmt: skip
    ),
    Part(
        "args-budget-graphs",
        "options, adaptive budget and target-verify graphs",
        "the verify backends' registry (with flashinfer's), DDTREE's options (its environment "
        "variables as fields of SGLang's Envs) and startup checks, the adaptive tree budget by "
        "batch size, and the target-verify CUDA graphs per budget bucket with the tree mask",
        modules=(
            "sglang_ddtree.srt.ddtree_attention.flashinfer_backend",
            "sglang_ddtree.srt.ddtree_attention.attention_registry",
            "sglang_ddtree.srt.ddtree_args",
            "sglang_ddtree.srt.ddtree_budget",
            "sglang_ddtree.srt.ddtree_cuda_graph_runner",
        ),
        templates=("test_ddtree_budget.py",),
        edits=("envs-fields",),
    ),
    Part(
        "request-parameter-laws",
        "request penalties and logprobs per tree node",
        "SGLang's frequency, presence and repetition penalties and min_new_tokens at every "
        "tree node with their per-request state, and each committed token's logprobs, for the "
        "decode step (next part) to apply",
        modules=(
            "sglang_ddtree.core.penalties",
            "sglang_ddtree.core.penalties_triton",
            "sglang_ddtree.core.logprobs",
            "sglang_ddtree.core.logprobs_triton",
            "sglang_ddtree.srt.ddtree_penalties",
            "sglang_ddtree.srt.ddtree_logprobs",
        ),
        templates=("test_ddtree_request_laws.py",),
    ),
    Part(
        "glue",
        "the decode step and its glue as CUDA graphs",
        "the decode step (draft tree, verify input, accept, KV commit) with its tensor glue "
        "captured as CUDA graphs per batch size, W and sampling mode",
        modules=(
            "sglang_ddtree.srt.ddtree_glue_graph",
            "sglang_ddtree.core.padding",
            "sglang_ddtree.core.fingerprint",
            "sglang_ddtree.srt.ddtree_info",
            "sglang_ddtree.srt.ddtree_kv_commit",
            "sglang_ddtree.srt.ddtree_step",
        ),
        templates=("test_ddtree_glue_graph.py",),
    ),
    Part(
        "worker",
        "the worker and --speculative-algorithm DDTREE",
        "the DDTREE worker, the glue's capture at startup, its registration, the server flags, "
        "the request refusals (logprobs served past DFLASH's), the req_to_token row headroom, "
        "the in-tree tests and the docs",
        modules=(
            "sglang_ddtree.srt.ddtree_worker_v2",
            "sglang_ddtree.srt.ddtree_glue_warmup",
            "sglang_ddtree.srt.ddtree_spec",
            "sglang_ddtree.srt.ddtree_requests",
        ),
        templates=("test_ddtree.py", "test_ddtree_refusals.py", "ddtree.md"),
        edits=(
            "register",
            "register-predicate",
            "register-family",
            "register-args",
            "register-widths",
            "register-worker",
            "graph-runner",
            "request-refusals",
            "logprobs-admitted",
            "logprobs-prefill",
            "row-headroom",
            "server-flags",
            "flag-check",
        ),
        serves=True,
    ),
]
# What a later part adds to a module an earlier part added: {part name: ((MODULE_MAP key,
# qualname), ...)}, a qualname a top-level function or class (``f``, ``C``) or a method
# (``C.m``). The trees before that part hold the module without them (`cut_items`), so that a
# capability's code lands in the part that adds the capability, not in the part that adds its
# module.
LATER_ITEMS: dict[str, tuple[tuple[str, str], ...]] = {}


SERIES_DIR = UPSTREAM_DIR / "series"  # the first base's; series_dir(base) for any


def patch_path(base: str) -> Path:
    return output_dir(base) / PATCH_PATH.name


def series_dir(base: str) -> Path:
    return output_dir(base) / SERIES_DIR.name


# Lines a part may change (added + deleted, as `git apply --numstat` counts them), formatted as
# SGLang formats its code (`format_python`: 88 columns wrap about one line in ten of this
# repository's 100-column modules).
MAX_PART_LINES = 1750
# Every in-tree DDTREE module's name starts so (the ddtree package and the ddtree_* modules).
IN_TREE_PREFIX = "sglang.srt.speculative.ddtree"


# --- pristine sources -----------------------------------------------------------------------
class Source:
    """Read-only access to pristine SGLang files by repository path (``python/sglang/...``) of
    release ``base`` (the pins of ``PRISTINE_SHA256[base]`` check the files the patch edits)."""

    def __init__(self, where: Path, label: str, base: str = SGLANG_VERSION):
        self.where, self.label, self.base = Path(where), label, base
        self._zip = zipfile.ZipFile(self.where) if self.where.suffix == ".whl" else None

    def read(self, repo_path: str) -> bytes:
        assert repo_path.startswith("python/sglang/"), repo_path
        rel = repo_path[len("python/") :]  # sglang/...
        if self._zip is not None:
            return self._zip.read(rel)
        return (self.where / rel).read_bytes()

    def package_files(self) -> list[str]:
        """Repository paths of every file of the ``sglang`` package (no ``__pycache__``)."""
        if self._zip is not None:
            names = [n for n in self._zip.namelist() if n.startswith("sglang/")]
            names = [n for n in names if not n.endswith("/")]
        else:
            names = [p.relative_to(self.where).as_posix()
                     for p in (self.where / "sglang").rglob("*") if p.is_file()]  # fmt: skip
        return sorted(f"python/{n}" for n in names if "__pycache__/" not in n)

    def python_files(self, under: str = "python/sglang/srt/") -> list[str]:
        """Repository paths of the ``.py`` files under ``under``, sorted."""
        assert under.startswith("python/sglang/"), under
        rel = under[len("python/") :]
        if self._zip is not None:
            names = [n for n in self._zip.namelist() if n.startswith(rel)]
        else:
            names = [p.relative_to(self.where).as_posix() for p in (self.where / rel).rglob("*")]
        return sorted(f"python/{n}" for n in names if n.endswith(".py"))

    def version(self) -> str | None:
        if self._zip is not None:
            names = [n for n in self._zip.namelist() if n.endswith(".dist-info/METADATA")]
            for n in names:
                if n.startswith("sglang-"):
                    for line in self._zip.read(n).decode().splitlines():
                        if line.startswith("Version:"):
                            return line.split(":", 1)[1].strip()
            return None
        text = (self.where / "sglang" / "_version.py").read_text()
        m = re.search(r"""__version__\s*=\s*version\s*=\s*['"]([^'"]+)""", text) or re.search(
            r"""version\s*=\s*['"]([^'"]+)""", text
        )
        return m.group(1) if m else None


def _as_source_root(path: Path) -> Path | None:
    """DIR holding ``sglang/srt`` (DIR given as the parent or as the package itself)."""
    path = Path(path)
    if (path / "sglang" / "srt").is_dir():
        return path
    if (path / "srt").is_dir() and path.name == "sglang":
        return path.parent
    return None


def _cached_wheel(version: str) -> Path | None:
    wheels = sorted((CACHE_DIR / f"sglang-{version}").glob(f"sglang-{version}-*.whl"))
    return wheels[0] if wheels else None


def download_wheel(version: str) -> Path:
    """``pip download sglang==<version> --no-deps`` into the cache (any wheel of the release)."""
    dest = CACHE_DIR / f"sglang-{version}"
    dest.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps"]
    base += ["--only-binary=:all:", "-q", "-d", str(dest)]
    attempts = [
        base + ["--python-version", "3.12", "--platform", "manylinux_2_34_x86_64"],
        base,
    ]
    errors = []
    for cmd in attempts:
        r = subprocess.run(cmd, capture_output=True, text=True)
        wheel = _cached_wheel(version)
        if wheel is not None:
            return wheel
        errors.append(f"$ {' '.join(cmd)}\n{r.stderr.strip()[-2000:]}")
    raise RuntimeError(f"could not download sglang=={version}:\n" + "\n".join(errors))


def find_source(
    explicit: str | None = None, version: str = SGLANG_VERSION, download: bool = True
) -> Source:
    """Pristine SGLang sources of ``version`` (see the module docstring for the order)."""
    for label, cand in (("--sglang-src", explicit), ("$SGLANG_DDTREE_SGLANG_SRC", None)):
        if label.startswith("$"):
            cand = os.environ.get("SGLANG_DDTREE_SGLANG_SRC")
        if not cand:
            continue
        p = Path(cand)
        if p.suffix == ".whl" and p.is_file():
            src = Source(p, f"{label} {p}", version)
        else:
            root = _as_source_root(p)
            if root is None:
                raise SystemExit(f"generate.py: {label} {cand}: no sglang/srt there")
            src = Source(root, f"{label} {root}", version)
        if label.startswith("$") and src.version() not in (None, version):
            continue  # another release's sources (another base's run)
        return src
    try:
        if importlib.metadata.version("sglang") == version:
            spec = importlib.util.find_spec("sglang")
            if spec is not None and spec.submodule_search_locations:
                root = Path(list(spec.submodule_search_locations)[0]).parent
                return Source(root, f"installed sglang {version} at {root}", version)
    except importlib.metadata.PackageNotFoundError:
        pass
    wheel = _cached_wheel(version)
    if wheel is None and download:
        wheel = download_wheel(version)
    if wheel is None:
        raise RuntimeError(f"no pristine sglang {version} sources found")
    return Source(wheel, f"wheel {wheel.name}", version)


# --- module discovery, import checks and rewriting ------------------------------------------
def module_name(path: Path) -> str:
    rel = path.relative_to(PKG_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def in_tree_name(repo_path: str) -> str:
    parts = repo_path[len("python/") : -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _excluded(mod: str) -> bool:
    if mod in PACKAGE_MARKERS:
        return True
    return any(mod == ex or mod.startswith(ex + ".") for ex in NOT_UPSTREAM)


def check_coverage() -> None:
    """Every module of the package is mapped or excluded; every mapped module exists."""
    mods = {module_name(p) for p in PKG_DIR.rglob("*.py")}
    unknown = sorted(m for m in mods if m not in MODULE_MAP and not _excluded(m))
    missing = sorted(m for m in MODULE_MAP if m not in mods)
    if unknown or missing:
        raise SystemExit(
            "generate.py: MODULE_MAP is out of date.\n"
            + "".join(
                f"  unmapped module (map it or add it to NOT_UPSTREAM): {m}\n" for m in unknown
            )
            + "".join(f"  mapped module not found: {m}\n" for m in missing)
        )


def _module_file(mod: str) -> Path | None:
    base = PKG_DIR.parent.joinpath(*mod.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def ddtree_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, imported module)`` for every ``sglang_ddtree`` import of a file (nested ones too).
    ``from sglang_ddtree import X`` imports module ``sglang_ddtree.X`` when X is a module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "sglang_ddtree":
                    out.append((node.lineno, a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "sglang_ddtree":
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((node.lineno, sub if _module_file(sub) else node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            out.append((node.lineno, "<relative import>"))
    return sorted(set(out))


def stand_in_imports(path: Path) -> list[tuple[int, str, tuple[str, ...] | None]]:
    """``(line, module, names)`` of every import of a ``STAND_INS`` module in a file (nested
    ones too): the names imported from it, None where the module itself is imported."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name in STAND_INS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in STAND_INS:
                out.append((node.lineno, node.module, tuple(a.name for a in node.names)))
            out += [(node.lineno, f"{node.module}.{a.name}", None) for a in node.names
                    if f"{node.module}.{a.name}" in STAND_INS]  # fmt: skip
    return sorted(out, key=lambda row: row[:2])


def check_imports() -> None:
    """Fail loudly, listing them, when a mapped module imports an unmapped module, or from a
    stand-in (``STAND_INS``) anything but the names SGLang's module has."""
    bad = []
    for mod in sorted(MODULE_MAP):
        path = _module_file(mod)
        rel = path.relative_to(REPO)
        for line, imported in ddtree_imports(path):
            if imported not in MODULE_MAP and imported not in STAND_INS:
                why = NOT_UPSTREAM.get(imported, "not in MODULE_MAP")
                bad.append(f"  {rel}:{line}: imports {imported} ({why})")
        for line, imported, names in stand_in_imports(path):
            sglang_module, allowed = STAND_INS[imported]
            if names is None or not set(names) <= set(allowed):
                what = "the module" if names is None else ", ".join(names)
                bad.append(
                    f"  {rel}:{line}: imports {what} from {imported}, which stands in for "
                    f"{sglang_module}: import only {', '.join(allowed)} from it"
                )
    if bad:
        raise SystemExit(
            "generate.py: mapped modules import modules that do not go upstream:\n" + "\n".join(bad)
        )


_DOTTED = re.compile(r"\bsglang_ddtree(?:\.[A-Za-z_]\w*)*")
_FROM_PKG = re.compile(r"^(\s*)from sglang_ddtree import (\w+)(?: as (\w+))?[ \t]*$", re.M)


def _rewrite_dotted(m: re.Match) -> str:
    parts = m.group(0).split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        rest = parts[n:]
        if prefix in MODULE_MAP:
            return ".".join([in_tree_name(MODULE_MAP[prefix]), *rest])
        if prefix in STAND_INS:
            return ".".join([STAND_INS[prefix][0], *rest])
        if prefix in TEXT_REWRITES:
            return ".".join([TEXT_REWRITES[prefix], *rest])
    return m.group(0)  # left for the final check to report


def rewrite(text: str, origin: str) -> str:
    def from_pkg(m: re.Match) -> str:
        indent, name, alias = m.groups()
        target = in_tree_name(MODULE_MAP[f"sglang_ddtree.{name}"])
        parent, leaf = target.rsplit(".", 1)
        bound = alias or name
        return f"{indent}from {parent} import {leaf}" + ("" if leaf == bound else f" as {bound}")

    text = _FROM_PKG.sub(from_pkg, text)
    text = _DOTTED.sub(_rewrite_dotted, text)
    left = sorted({m.group(0) for m in _DOTTED.finditer(text)})
    if left:
        raise SystemExit(
            f"generate.py: {origin}: references left after rewriting: {left}; map them "
            "(MODULE_MAP) or give them a TEXT_REWRITES entry."
        )
    return text


def _algorithm_name() -> str:
    tree = ast.parse((PKG_DIR / "srt" / "ddtree_args.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "ALGORITHM_NAME" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise SystemExit("generate.py: ALGORITHM_NAME not found in srt/ddtree_args.py")


def render_template(name: str, base: str = SGLANG_VERSION) -> str:
    text = (TEMPLATES / name).read_text()
    subs = {"@@ALGORITHM@@": _algorithm_name(), "@@SGLANG_VERSION@@": base}
    for key, value in subs.items():
        text = text.replace(key, value)
    left = sorted(set(re.findall(r"@@\w+@@", text)))
    if left:
        raise SystemExit(f"generate.py: template {name}: unknown placeholders {left}")
    return text


# --- SGLang's formatters: the Python files the patch adds are written as SGLang's pre-commit
# hooks leave them on each base -----------------------------------------------------------------
# SGLang's pre-commit configuration sorts imports with isort (``.isort.cfg``: profile black,
# known_first_party sglang) and formats with black; by 0.5.23 with ruff's formatter instead.
# Neither at its defaults (line length 88) leaves this repository's 100-column modules as they are,
# and their rewritten imports join SGLang's. The versions are the ones SGLang's own files of each
# release pass (its configuration at those tags was not at hand; the one stored for its repository
# is older): every Python file of pristine 0.5.17 passes black 24.10.0 (that configuration's pin),
# and of 0.5.23 (vendored kernels and the generated _version.py aside) ruff format 0.15.0-0.17.6,
# which black 24-26 would change (asserts, right-hand sides); both bases' files pass isort 6.0.1's
# black profile, which keeps a wrapped import that ends in a comma (the stored configuration's
# isort 5.13.2 joins them: it would re-sort 381 of 0.5.17's files). Imports are first sorted the
# 5.13.2 way (``split_on_trailing_comma`` off: what fits on a line is joined), which isort 6 then
# keeps, so a generated file is clean under either isort. Codespell as the configuration pins it,
# with its words (``CODESPELL_ARGS``): a misspelling in a generated file fails the generator.
FORMATTERS = {
    "0.5.17": {"isort": "6.0.1", "black": "24.10.0", "codespell": "2.4.1"},
    "0.5.23": {"isort": "6.0.1", "ruff": "0.15.0", "codespell": "2.4.1"},
}
# SGLang's codespell hook: its ``-L`` words and those of python/pyproject.toml's [tool.codespell].
CODESPELL_ARGS = (
    "-L", "cann,thi,makro,wil,rouge,PRIS",
    "--ignore-words-list", "ans,als,hel,boostrap,childs,te,vas,hsa,ment",
)  # fmt: skip
# An interpreter with a base's tools (tried first), else this one if it has them, else a virtual
# environment per base under .upstream-cache/, made with pip on first use.
FORMAT_PYTHON_ENV = "SGLANG_DDTREE_FORMAT_PYTHON"
# Whether a missing formatter environment may be made with pip (``--no-download``: not).
FORMAT_DOWNLOAD = True

# Run by the formatters' interpreter: argv[1] the pins, stdin {key: text}, stdout {key: text}.
_FORMAT_SCRIPT = r"""
import json, subprocess, sys
import isort

want = json.loads(sys.argv[1])
texts = json.load(sys.stdin)
settings = dict(profile="black", known_first_party={"sglang"})
join = isort.Config(**settings, split_on_trailing_comma=False)  # isort 5.13.2's black profile
keep = isort.Config(**settings)  # isort 6's


def formatted(text):
    if "black" in want:
        import black

        try:
            return black.format_file_contents(text, fast=False, mode=black.Mode())
        except black.NothingChanged:
            return text
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--isolated", "--no-cache",
         "--stdin-filename", "generated.py", "-"],
        input=text, capture_output=True, text=True, check=True,
    )
    return r.stdout


out, unstable = {}, []
for key, text in texts.items():
    text = formatted(isort.code(isort.code(text, config=join), config=keep))
    if formatted(text) != text or isort.code(text, config=join) != text:
        unstable.append(key)
    out[key] = text
if unstable:
    sys.exit(f"isort and the formatter disagree on {len(unstable)} texts")
json.dump(out, sys.stdout)
"""
_VERSIONS_SCRIPT = r"""
import importlib.metadata, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


@functools.cache
def _formatter_versions(python: str, names: tuple[str, ...]) -> dict | None:
    r = subprocess.run([python, "-c", _VERSIONS_SCRIPT, json.dumps(names)],
                       capture_output=True, text=True)  # fmt: skip
    return json.loads(r.stdout) if r.returncode == 0 else None


def format_venv(base: str) -> Path:
    return CACHE_DIR / ("formatters-" + "-".join(f"{k}{v}" for k, v in FORMATTERS[base].items()))


@functools.cache
def formatter_python(base: str) -> str:
    """An interpreter with ``FORMATTERS[base]``: ``$SGLANG_DDTREE_FORMAT_PYTHON``, this one, or
    the virtual environment `format_venv` (made with pip where it is missing, unless
    ``FORMAT_DOWNLOAD`` is off)."""
    pins = FORMATTERS[base]
    venv, names = format_venv(base), tuple(sorted(pins))
    venv_python = venv / "bin" / "python"
    for python in (os.environ.get(FORMAT_PYTHON_ENV), sys.executable, str(venv_python)):
        if python and Path(python).exists() and _formatter_versions(python, names) == pins:
            return python
    if not FORMAT_DOWNLOAD:
        raise RuntimeError(
            f"no interpreter with {pins} for SGLang {base}'s formatting (set "
            f"${FORMAT_PYTHON_ENV}, or allow the download into {venv})"
        )
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                   capture_output=True)  # fmt: skip
    reqs = [f"{name}=={version}" for name, version in pins.items()]
    r = subprocess.run([str(venv_python), "-m", "pip", "install", "-q", *reqs],
                       capture_output=True, text=True)  # fmt: skip
    _formatter_versions.cache_clear()
    if r.returncode != 0 or _formatter_versions(str(venv_python), names) != pins:
        raise RuntimeError(f"could not install {reqs} into {venv}:\n{r.stderr[-2000:]}")
    return str(venv_python)


_FORMATTED: dict[str, str] = {}  # key of a text (`_format_key`) -> the text formatted
FORMAT_CACHE = CACHE_DIR / "formatted"  # the same, across runs: <key>.py


def _format_key(base: str, text: str) -> str:
    return hashlib.sha256(json.dumps([FORMATTERS[base], _FORMAT_SCRIPT, text]).encode()).hexdigest()


def format_python(files: dict[str, str], base: str = SGLANG_VERSION) -> dict[str, str]:
    """``files`` ({path: Python source}) as SGLang ``base``'s isort and formatter leave them
    (``FORMATTERS[base]``); one run of the formatters for the texts not formatted before (in
    this process, or cached under ``FORMAT_CACHE``)."""
    keys = {path: _format_key(base, text) for path, text in files.items()}
    for key in set(keys.values()) - set(_FORMATTED):
        cached = FORMAT_CACHE / f"{key}.py"
        if cached.is_file():
            _FORMATTED[key] = cached.read_text()
    todo = {keys[path]: text for path, text in files.items() if keys[path] not in _FORMATTED}
    if todo:
        with tempfile.TemporaryDirectory(prefix="ddtree-format-") as tmp:  # no src paths
            r = subprocess.run(
                [formatter_python(base), "-c", _FORMAT_SCRIPT, json.dumps(FORMATTERS[base])],
                input=json.dumps(todo), capture_output=True, text=True, cwd=tmp,
            )  # fmt: skip
        if r.returncode != 0:
            raise SystemExit(f"generate.py: formatting for {base} failed:\n{r.stderr[-3000:]}")
        done = json.loads(r.stdout)
        FORMAT_CACHE.mkdir(parents=True, exist_ok=True)
        for key, text in done.items():
            tmp = FORMAT_CACHE / f"{key}.py.{os.getpid()}"
            tmp.write_text(text)
            tmp.replace(FORMAT_CACHE / f"{key}.py")
        _FORMATTED.update(done)
    return {path: _FORMATTED[keys[path]] for path in files}


def misspellings(files: dict[str, str], base: str = SGLANG_VERSION) -> list[str]:
    """What SGLang ``base``'s codespell hook reports in ``files`` ({path: text}; JSON and text
    files are skipped as its configuration skips them), one ``path:line: word ==> fix`` each."""
    files = {p: t for p, t in files.items() if not p.endswith((".json", ".jsonl", ".txt"))}
    with tempfile.TemporaryDirectory(prefix="ddtree-codespell-") as tmp:
        for path, text in files.items():
            _write(Path(tmp), path, text.encode())
        r = subprocess.run(
            [formatter_python(base), "-m", "codespell_lib", *CODESPELL_ARGS, *sorted(files)],
            cwd=tmp, capture_output=True, text=True,
        )  # fmt: skip
    if r.returncode not in (0, 65):  # 65: misspellings found
        raise SystemExit(f"generate.py: codespell failed:\n{r.stderr[-2000:]}")
    return r.stdout.splitlines()


# SGLang's clang-format hook (``--style=file``): the CUDA sources the patch adds are as that
# version leaves them under the nearest ``.clang-format`` of the base, its JIT kernels' one.
CLANG_FORMAT = "18.1.8"
CLANG_FORMAT_STYLE = "python/sglang/kernels/jit/.clang-format"


@functools.cache
def clang_format_binary() -> str:
    """``clang-format`` ``CLANG_FORMAT`` from a virtual environment under ``.upstream-cache/``
    (made with pip on first use, unless ``FORMAT_DOWNLOAD`` is off)."""
    venv = CACHE_DIR / f"clang-format-{CLANG_FORMAT}"
    exe = venv / "bin" / "clang-format"
    if not exe.exists():
        if not FORMAT_DOWNLOAD:
            raise RuntimeError(f"no clang-format {CLANG_FORMAT} in {venv}")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                       capture_output=True)  # fmt: skip
        r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                            f"clang-format=={CLANG_FORMAT}"], capture_output=True, text=True)  # fmt: skip
        if r.returncode != 0 or not exe.exists():
            raise RuntimeError(f"could not install clang-format into {venv}:\n{r.stderr[-2000:]}")
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout
    if f"version {CLANG_FORMAT}" not in version:
        raise RuntimeError(f"{exe} is not clang-format {CLANG_FORMAT}: {version}")
    return str(exe)


def clang_formatted(files: dict[str, str], src: Source) -> dict[str, str]:
    """``files`` ({repository path: CUDA source}) as SGLang's clang-format hook leaves them on
    ``src``'s base: each file at its path in a tree holding the base's ``CLANG_FORMAT_STYLE``."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="ddtree-clang-format-") as tmp:
        _write(Path(tmp), CLANG_FORMAT_STYLE, src.read(CLANG_FORMAT_STYLE))
        for path, text in files.items():
            assert path.startswith(str(Path(CLANG_FORMAT_STYLE).parent) + "/"), path
            _write(Path(tmp), path, text.encode())
            r = subprocess.run([clang_format_binary(), "--style=file", path], cwd=tmp,
                               capture_output=True, text=True, check=True)  # fmt: skip
            out[path] = r.stdout
    return out


def new_files(base: str = SGLANG_VERSION, formatted: bool = True) -> dict[str, str]:
    """``{path: text}`` of every file the patch adds on ``base``, its Python files formatted as
    SGLang ``base`` formats its own (`format_python`; ``formatted=False``: as rewritten)."""
    check_bases()
    files, targets = {}, {}
    for mod, target in sorted(MODULE_MAP.items()):
        path = _module_file(mod)
        text = path.read_text()
        if mod in IN_TREE_CUTS:
            at = text.find("\n\n\n" + IN_TREE_CUTS[mod])
            if at < 0:
                raise SystemExit(f"generate.py: IN_TREE_CUTS: {mod} has no {IN_TREE_CUTS[mod]!r}")
            text = text[: at + 1]
        for name, old, new in IN_TREE_REWRITES:
            if name == mod:
                if text.count(old) != 1:
                    raise SystemExit(
                        f"generate.py: IN_TREE_REWRITES: {mod} holds {text.count(old)} times "
                        f"(need exactly 1):\n{old}"
                    )
                text = text.replace(old, new)
        text = dflash_calls(mod, text)
        files[target] = rewrite(text, str(path.relative_to(REPO)))
        targets[mod] = target
    for template, target in TEMPLATE_FILES:
        files[target] = render_template(template, base)
        targets[template] = target
    for source, target, _ in KERNEL_FILES:
        files[target] = (REPO / source).read_text()
        targets[source] = target
    for name, old, new in BASE_REWRITES.get(base, ()):
        text = files[targets[name]]
        if text.count(old) != 1:
            raise SystemExit(
                f"generate.py: BASE_REWRITES[{base}]: {name} holds {text.count(old)} times "
                f"(need exactly 1):\n{old}"
            )
        files[targets[name]] = text.replace(old, new)
    if formatted:
        python = {path: text for path, text in files.items() if path.endswith(".py")}
        files.update(format_python(python, base))
        typos = misspellings(files, base)
        if typos:
            raise SystemExit(
                "generate.py: misspellings (SGLang's codespell hook):\n" + "\n".join(typos)
            )
    return files


def edited_files(
    src: Source, check_hashes: bool = True, edit_names: set[str] | None = None
) -> dict[str, tuple[bytes, str]]:
    """``{path: (pristine bytes, edited text)}`` for the files the patch edits on ``src.base``;
    with ``edit_names``, only those edits are made (in ``EDITS`` order)."""
    base = src.base
    made = edits(base)
    paths = sorted({e.path for e in made})
    pins = PRISTINE_SHA256.get(base, {})
    if check_hashes and sorted(pins) != paths:
        raise SystemExit(f"generate.py: PRISTINE_SHA256[{base!r}] must list exactly {paths}")
    out = {}
    for path in paths:
        data = src.read(path)
        digest = hashlib.sha256(data).hexdigest()
        if check_hashes and digest != pins[path]:
            raise SystemExit(
                f"generate.py: {path} from {src.label} is not pristine SGLang {base} "
                f"(sha256 {digest}, want {pins[path]})."
            )
        text = data.decode()
        for e in made:
            if e.path == path and (edit_names is None or e.name in edit_names):
                text = e.apply(text)
        out[path] = (data, text)
    return out


# --- git --------------------------------------------------------------------------------------
def _git_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="generate",
        GIT_AUTHOR_EMAIL="generate@localhost",
        GIT_COMMITTER_NAME="generate",
        GIT_COMMITTER_EMAIL="generate@localhost",
        GIT_AUTHOR_DATE="2000-01-01T00:00:00Z",
        GIT_COMMITTER_DATE="2000-01-01T00:00:00Z",
        LC_ALL="C",
    )
    return env


def git(cwd: Path, *args: str) -> bytes:
    r = subprocess.run(["git", *args], cwd=cwd, env=_git_env(), capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed:\n{r.stderr.decode()}")
    return r.stdout


def _write(root: Path, rel: str, data: bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    p.chmod(0o644)


DIFF_ARGS = (
    "-c", "core.autocrlf=false", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
    "-c", "diff.renames=false", "-c", "diff.algorithm=myers", "-c", "core.quotePath=true",
)  # fmt: skip


def final_tree(src: Source) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """``(pristine, patched)``: every file the patch touches, ``{path: bytes}``, before (the
    edited files only) and after it."""
    check_coverage()
    check_imports()
    edited = edited_files(src)
    added = new_files(src.base)
    clash = sorted(set(added) & set(edited))
    if clash:
        raise SystemExit(f"generate.py: paths both added and edited: {clash}")
    pristine = {path: data for path, (data, _) in edited.items()}
    patched = {path: text.encode() for path, (_, text) in edited.items()}
    patched.update((path, text.encode()) for path, text in added.items())
    return pristine, patched


def diffs(
    pristine: dict[str, bytes], states: list[dict[str, bytes]]
) -> list[tuple[bytes, list[tuple[int, int, str]]]]:
    """``git diff`` from ``pristine`` to ``states[0]``, from that to ``states[1]``, ..., each
    with its ``(added, deleted, path)`` line counts, in one temporary repository. Every state
    lists every path of the one before (files are added or edited, never removed)."""
    out = []
    with tempfile.TemporaryDirectory(prefix="ddtree-upstream-") as tmp:
        root = Path(tmp)
        git(root, "init", "-q")
        for path, data in sorted(pristine.items()):
            _write(root, path, data)
        git(root, "add", "-A")
        git(root, *DIFF_ARGS, "commit", "-q", "-m", "pristine sglang")
        for i, state in enumerate(states):
            for path, data in sorted(state.items()):
                _write(root, path, data)
            git(root, "add", "-A")
            diff = git(
                root, *DIFF_ARGS, "diff", "--cached", "--no-color", "--no-ext-diff",
                "--no-textconv", "--full-index", "-U3", "--src-prefix=a/", "--dst-prefix=b/",
            )  # fmt: skip
            numstat = git(root, *DIFF_ARGS, "diff", "--cached", "--numstat").decode()
            rows = [line.split("\t", 2) for line in numstat.splitlines()]
            out.append((diff, [(int(a), int(d), path) for a, d, path in rows]))
            git(root, *DIFF_ARGS, "commit", "-q", "--allow-empty", "-m", f"state {i + 1}")
    return out


def build_patch(src: Source) -> bytes:
    pristine, patched = final_tree(src)
    return diffs(pristine, [patched])[0][0]


# --- the series ---------------------------------------------------------------------------------
def check_series() -> None:
    """Every module, kernel, template and edit is in exactly one part; names are unique."""
    problems = []
    kinds = (
        ("module", "modules", list(MODULE_MAP)),
        ("kernel", "kernels", [source for source, _, _ in KERNEL_FILES]),
        ("template", "templates", [template for template, _ in TEMPLATE_FILES]),
        ("edit", "edits", [e.name for e in EDITS]),
    )
    for kind, attr, known in kinds:
        listed = [x for part in SERIES for x in getattr(part, attr)]
        problems += [f"  {kind} {x} is in {listed.count(x)} parts" for x in sorted(set(listed))
                     if listed.count(x) > 1]  # fmt: skip
        problems += [f"  unknown {kind} {x}" for x in sorted(set(listed) - set(known))]
        problems += [f"  {kind} {x} is in no part" for x in known if x not in listed]
    for what, names in (("part", [p.name for p in SERIES]), ("edit", [e.name for e in EDITS])):
        problems += [f"  {what} name {n} repeats" for n in sorted(set(names)) if names.count(n) > 1]
    serving = [p.serves for p in SERIES]
    if not any(serving) or serving != sorted(serving):
        problems.append("  DDTREE must serve from one part on, in every later part")
    first = {m: i for i, part in enumerate(SERIES) for m in part.modules}
    index = {part.name: i for i, part in enumerate(SERIES)}
    for name, items in LATER_ITEMS.items():
        for mod, qualname in items:
            if name not in index or first.get(mod, len(SERIES)) >= index[name]:
                problems.append(f"  LATER_ITEMS: {name} adds {mod}'s {qualname} not after it")
    preludes = [p.prelude for p in SERIES]
    if preludes != sorted(preludes, reverse=True) or any(p.prelude and p.serves for p in SERIES):
        problems.append("  preludes (part 00) come first and do not serve")
    if problems:
        raise SystemExit("generate.py: SERIES is out of date:\n" + "\n".join(problems))


def part_targets(part: Part) -> list[str]:
    """The paths of the files ``part`` adds."""
    kernels = {source: target for source, target, _ in KERNEL_FILES}
    templates = dict(TEMPLATE_FILES)
    return (
        [MODULE_MAP[m] for m in part.modules]
        + [kernels[k] for k in part.kernels]
        + [templates[t] for t in part.templates]
    )


def _item_node(tree: ast.Module, qualname: str):
    """The node of ``qualname`` (``f``, ``C``, ``C.m``) among ``tree``'s top-level definitions
    and their classes' methods, or None."""
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    *outer, name = qualname.split(".")
    body = tree.body
    if outer:
        klass = [n for n in body if isinstance(n, ast.ClassDef) and n.name == outer[0]]
        body = klass[0].body if len(outer) == 1 and len(klass) == 1 else []
    found = [n for n in body if isinstance(n, defs) and n.name == name]
    return found[0] if len(found) == 1 else None


def cut_items(text: str, qualnames, origin: str = "<text>") -> str:
    """``text`` (Python source) without the definitions ``qualnames`` (`_item_node`): each one's
    lines with its decorators and the comment lines right above it. The blank lines left over
    are the formatter's to settle. Refuses a qualname that is not exactly one definition."""
    tree = ast.parse(text, filename=origin)
    lines = text.splitlines(keepends=True)
    drop = set()
    for qualname in qualnames:
        node = _item_node(tree, qualname)
        if node is None:
            raise SystemExit(f"generate.py: LATER_ITEMS: {origin} defines no one {qualname}")
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        drop.update(range(start, node.end_lineno))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def _still_read(state: dict[str, str], cut: dict[str, set[str]]) -> list[str]:
    """Where a tree still reads a name ``cut`` ({path: qualnames cut there}) took away: the
    function or class by its name in its own module or imported from it, a method by any
    attribute of its name."""
    names = {path: {q.split(".")[-1] for q in qs if "." not in q} for path, qs in cut.items()}
    modules = {in_tree_name(path): path for path in cut}
    methods = {q.split(".")[-1] for qs in cut.values() for q in qs if "." in q}
    out = []
    for path, text in state.items():
        if not path.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(text, filename=path)):
            if isinstance(node, ast.Name) and node.id in names.get(path, ()):
                out.append(f"{path}:{node.lineno} reads {node.id}")
            elif isinstance(node, ast.Attribute) and node.attr in methods:
                out.append(f"{path}:{node.lineno} reads .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                taken = names.get(modules[node.module], set())
                out += [
                    f"{path}:{node.lineno} imports {a.name}" for a in node.names if a.name in taken
                ]
    return out


def series_states(src: Source) -> tuple[dict[str, bytes], list[dict[str, bytes]]]:
    """``(pristine, states)``: the files the patch edits, pristine, and after each part every
    file the series has touched so far, ``{path: bytes}`` (edited files stay pristine until their
    first edit). The last state is the single patch's tree; every state passes
    `check_series_imports`."""
    check_series()
    pristine, patched = final_tree(src)
    states, edit_names, added = [], set(), {}
    for i, part in enumerate(SERIES):
        edit_names |= set(part.edits)
        added.update((path, patched[path]) for path in part_targets(part))
        state = {
            path: text.encode()
            for path, (_, text) in edited_files(src, edit_names=edit_names).items()
        }
        state.update(added)
        cut: dict[str, set[str]] = {}
        for later in SERIES[i + 1 :]:
            for mod, qualname in LATER_ITEMS.get(later.name, ()):
                if MODULE_MAP[mod] in state:  # its module is in the tree already
                    cut.setdefault(MODULE_MAP[mod], set()).add(qualname)
        if cut:
            texts = {path: cut_items(state[path].decode(), qs, path) for path, qs in cut.items()}
            state.update((p, t.encode()) for p, t in format_python(texts, src.base).items())
            reads = _still_read({p: d.decode() for p, d in state.items()}, cut)
            if reads:
                raise SystemExit(
                    f"generate.py: LATER_ITEMS: part {part.name}'s tree still reads what a later "
                    "part adds:\n  " + "\n  ".join(reads)
                )
        states.append(state)
    if states[-1] != patched:
        raise SystemExit("generate.py: the series does not end at the single patch's tree")
    check_series_imports(states)
    return pristine, states


def in_tree_imports(text: str, origin: str = "<text>") -> list[tuple[int, str]]:
    """``(line, module)`` of every import of an in-tree DDTREE module (``IN_TREE_PREFIX``) in
    Python source ``text``, nested ones too. ``from P import N`` imports module ``P.N`` where
    that is a mapped module's in-tree name, else ``P``."""
    modules = {in_tree_name(target) for target in MODULE_MAP.values()}
    out = []
    for node in ast.walk(ast.parse(text, filename=origin)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            names = [n if n in modules else node.module for n in names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n.startswith(IN_TREE_PREFIX)]
    return sorted(set(out))


def module_path(name: str, files) -> str | None:
    """The path of module ``name`` among ``files`` (repository paths), or None."""
    base = "python/" + name.replace(".", "/")
    return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in files), None)


def envs_reads(text: str, origin: str = "<text>") -> list[tuple[int, str]]:
    """``(line, name)`` of every read of a DDTREE field of SGLang's ``envs``
    (``envs.SGLANG_DDTREE_<NAME>``) in Python source ``text``."""
    return sorted({
        (node.lineno, node.attr)
        for node in ast.walk(ast.parse(text, filename=origin))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == "envs" and node.attr.startswith("SGLANG_DDTREE_")
    })  # fmt: skip


def missing_imports(files: dict[str, bytes]) -> list[str]:
    """What a tree of ``files`` lacks: every in-tree DDTREE module imported by one of its Python
    files (its packages too) but absent, every kernel source whose loading module is present
    but which is absent, and every DDTREE field of ``envs`` read but not declared in its
    ``environ.py``; one line each."""
    modules = {in_tree_name(target) for target in MODULE_MAP.values()}
    environ = files.get(ENVIRON, b"").decode()
    declared = set(re.findall(r"^    (SGLANG_DDTREE_\w+) = Env\w+\(", environ, re.M))
    out = []
    for path in sorted(p for p in files if p.endswith(".py")):
        text = files[path].decode()
        if "ddtree" not in text:  # pristine SGLang files the series has not edited yet
            continue
        out += [(path, line, f"reads envs.{name}, which {ENVIRON} does not declare")
                for line, name in envs_reads(text, path) if name not in declared]  # fmt: skip
        for line, name in in_tree_imports(text, path):
            parts = name.split(".")
            needed = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
            needed = [n for n in needed if n in modules] or [name]
            out += [(path, line, f"imports {n}") for n in needed if module_path(n, files) is None]
    for _, target, loader in KERNEL_FILES:
        path = module_path(in_tree_name(MODULE_MAP[loader]), files)
        if path is not None and target not in files:
            out.append((path, 0, f"loads the kernel source {target}"))
    return [
        f"{path}:{line} {what}" if line else f"{path} {what}"
        for path, line, what in sorted(set(out))
    ]


def check_series_imports(states: list[dict[str, bytes]]) -> None:
    """Fail loudly, listing them, where a part's tree imports or loads what a later part adds."""
    problems = [
        f"  part {part_number(i)} ({part.name}): {line}"
        for i, (part, state) in enumerate(zip(SERIES, states), 1)
        for line in missing_imports(state)
    ]
    if problems:
        raise SystemExit(
            "generate.py: a part needs what only a later part adds (move the module to an "
            "earlier part, or the importing one later):\n" + "\n".join(problems)
        )


def build_series(src: Source) -> list[tuple[Part, bytes, list[tuple[int, int, str]]]]:
    """Each part's patch (the diff from the tree after the part before) and its line counts."""
    pristine, states = series_states(src)
    return [(part, *d) for part, d in zip(SERIES, diffs(pristine, states))]


def part_number(index: int) -> int:
    """The number of the ``index``-th part of ``SERIES`` (from 1): the preludes are 00."""
    preludes = sum(p.prelude for p in SERIES)
    return 0 if SERIES[index - 1].prelude else index - preludes


def part_file_name(index: int, part: Part) -> str:
    return f"{part_number(index):02d}-{part.name}"


# SGLang's pull-request template (``.github/pull_request_template.md`` on its main branch): its
# sections, in order. A part's template (``templates/series/<name>.md``) holds the first four;
# the generator puts the part's place in the series at the top of Motivation and its files at
# the end of Modifications, and writes the checklist (the template's items, ``CHECKLIST``) and
# the merge order. ``upstream/fixes/*.md`` and ``upstream/PR.md`` use the same sections (checked
# by the tests).
PR_SECTIONS = (
    "## Motivation",
    "## Modifications",
    "## Accuracy Tests",
    "## Speed Tests and Profiling",
    "## Checklist",
    "## Review and Merge Process",
)
MAX_PART_TEXT_LINES = 150  # a part's pull-request text, head to end
_GUIDE = "https://docs.sglang.io/developer_guide/contribution_guide.html"
# The template's checklist items: (text, the part's note when it holds, when it does not).
CHECKLIST = (
    (
        f"Format your code according to the [Format code with pre-commit]({_GUIDE}"
        "#format-code-with-pre-commit).",
        None,
        "Not yet run on the applied tree (the modules are wrapped at 100 columns).",
    ),
    (
        f"Add unit tests according to the [Run and add unit tests]({_GUIDE}"
        "#run-and-add-unit-tests).",
        "Under `test/registered/spec/ddtree/` (above).",
        None,
    ),
    (
        f"Update documentation according to [Write documentations]({_GUIDE}#write-documentations).",
        "`docs/advanced_features/ddtree.md`.",
        "The user docs come with part 9, where DDTREE serves.",
    ),
    (
        f"Provide accuracy and speed benchmark results according to [Test the accuracy]({_GUIDE}"
        f"#test-the-accuracy) and [Benchmark the speed]({_GUIDE}#benchmark-the-speed).",
        "Above, on the hardware each names: these modules measured as a plugin of SGLang 0.5.17.",
        None,
    ),
    (
        f"Follow the SGLang code style [guidance]({_GUIDE}#code-style-guidance).",
        None,
        "For review.",
    ),
)


def _split_sections(text: str, name: str) -> dict[str, str]:
    """``{heading: body}`` of a part template whose ``## `` headings are exactly the template's
    first four sections in order (and nothing before the first)."""
    want = list(PR_SECTIONS[:4])
    found = [line for line in text.splitlines() if line.startswith("## ")]
    if found != want or not text.startswith(want[0]):
        raise SystemExit(
            f"generate.py: template {name}: sections {found}, want exactly {want} in order"
        )
    out = {}
    for heading, after in zip(want, [*want[1:], None]):
        start = text.index(heading) + len(heading)
        end = text.index(after) if after else len(text)
        out[heading] = text[start:end].strip()
    return out


def part_text(
    index: int, part: Part, numstat: list[tuple[int, int, str]], base: str = SGLANG_VERSION
) -> str:
    """The pull request's text in the sections of SGLang's template (``PR_SECTIONS``): the title
    and the part's place in the series (base, what it adds, whether a server runs it), the
    sections of ``templates/series/<name>.md`` with the part's files and their line counts at the
    end of Modifications, and the merge order; the words of ``BASE_TEXT[base]`` replaced
    (`series_files` checks each is used)."""
    total, version = sum(not p.prelude for p in SERIES), base
    number, preludes = part_number(index), sum(p.prelude for p in SERIES)
    first_serving = next(i for i, p in enumerate(SERIES, 1) if p.serves)
    serving = part_number(first_serving)
    earlier = ["part 00"] if preludes and not part.prelude else []
    earlier += [] if number <= 1 else ["part 1" if number == 2 else f"parts 1-{number - 1}"]
    if not earlier:
        applies_on = f"pristine SGLang {version}"
    else:
        applies_on = f"SGLang {version} with {' and '.join(earlier)} of the series applied"
    if part.prelude:
        place = (
            f"Part 00 of DDTREE's series, tree verification over the DFLASH drafter: a change "
            f"to SGLang's own DFLASH worker that parts 1-{total} build on, as its own pull "
            f"request ahead of them. It applies with `git apply` on {applies_on}, and adds "
            f"{part.summary}."
        )
    else:
        place = (
            f"Part {number} of {total} of DDTREE, tree verification over the DFLASH drafter. "
            f"It applies with `git apply` on {applies_on}, and adds {part.summary}."
        )
    if index < first_serving and not part.prelude:
        place += (
            f" The series is cut in import order: parts 1-{serving - 1} add code that "
            f"no server runs until part {serving} registers DDTREE; until then only "
            "this part's own tests exercise it, and nothing existing changes behaviour."
        )
    elif index == first_serving and base == BASES[0]:
        place += " With this part `--speculative-algorithm DDTREE` serves."
    elif index == first_serving:
        place += (
            " With this part DDTREE registers and SGLang's parser takes its flags; on SGLang "
            f"{base} it does not serve yet (the port it needs is listed in the cover text)."
        )
    if base != BASES[0]:
        place += (
            f" On SGLang {base} the series is checked on the CPU only (each part applies, "
            "imports and passes its unit tests; nothing of it has run on a GPU): every "
            f"measurement below was made on SGLang {BASES[0]}."
        )
    sections = _split_sections(render_template(f"series/{part.name}.md", base), part.name)
    added, deleted = sum(a for a, _, _ in numstat), sum(d for _, d, _ in numstat)
    files = ["Files (`git diff --numstat`):", "", "| file | added | deleted |", "|---|---:|---:|"]
    files += [f"| `{path}` | {a} | {d} |" for a, d, path in numstat]
    files.append(f"| total | {added} | {deleted} |")
    order = [
        ("The first part. " if index == 1 else f"Merge after {' and '.join(earlier)}. ")
        + "SGLang's three fixes go first as their own pull requests (the series does not "
        "depend on them); then the parts merge in order, each one a tree that imports cleanly "
        "and passes its own tests."
    ]
    if index < total:
        after = SERIES[index]
        order += ["", f"Next: part {part_number(index + 1)}, {after.title}: {after.summary}."]
    else:
        order += ["", "The last part: after it the tree equals the single patch's."]
    holds = (
        False,
        any(t.startswith("test_") for t in part.templates),
        "ddtree.md" in part.templates,
        not part.prelude,
        False,
    )
    checklist = []
    for (item, yes, no), held in zip(CHECKLIST, holds):
        note = yes if held else no
        checklist.append(f"- [{'x' if held else ' '}] {item}" + (f" {note}" if note else ""))
    sections[PR_SECTIONS[4]] = "\n".join(checklist)
    sections[PR_SECTIONS[0]] = place + "\n\n" + sections[PR_SECTIONS[0]]
    sections[PR_SECTIONS[1]] += "\n\n" + "\n".join(files)
    sections[PR_SECTIONS[-1]] = "\n".join(order)
    text = (
        f"# [Spec] DFLASH: {part.title}\n"
        if part.prelude
        else f"# [Spec] DDTREE {number}/{total}: {part.title}\n"
    )
    for heading in PR_SECTIONS:
        text += f"\n{heading}\n\n{sections[heading]}\n"
    for old, new in BASE_TEXT.get(base, ()):
        text = text.replace(old, new)
    return text


def series_files(src: Source) -> dict[str, bytes]:
    """``{file name: bytes}`` of ``upstream/series/``: each part's patch and text. Fails when a
    part changes more than ``MAX_PART_LINES`` lines or its text has more than
    ``MAX_PART_TEXT_LINES``."""
    out, big, texts = {}, [], []
    for i, (part, patch, numstat) in enumerate(build_series(src), 1):
        lines = sum(a + d for a, d, _ in numstat)
        if lines > MAX_PART_LINES:
            big.append(f"  part {part_number(i)} ({part.name}): {lines} lines")
        name = part_file_name(i, part)
        out[f"{name}.patch"] = patch
        text = part_text(i, part, numstat, src.base)
        out[f"{name}.md"] = text.encode()
        texts.append(part_text(i, part, numstat))
        if (n := len(text.splitlines())) > MAX_PART_TEXT_LINES:
            big.append(f"  part {part_number(i)} ({part.name}): its text has {n} lines")
    unused = [old for old, _ in BASE_TEXT.get(src.base, ()) if not any(old in t for t in texts)]
    if unused:
        raise SystemExit(f"generate.py: BASE_TEXT[{src.base!r}] words no part text holds: {unused}")
    if big:
        raise SystemExit(
            f"generate.py: parts over {MAX_PART_LINES} changed lines or texts over "
            f"{MAX_PART_TEXT_LINES} lines (split or shorten them):\n" + "\n".join(big)
        )
    return out


def write_series(src: Source, out_dir: Path | None = None) -> dict[str, bytes]:
    """Write `series_files` into ``out_dir`` (default: ``series_dir(src.base)``), removing part
    files of an earlier series."""
    files = series_files(src)
    out_dir = series_dir(src.base) if out_dir is None else out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in sorted(out_dir.glob("[0-9][0-9]-*")):
        if old.name not in files and old.suffix in (".patch", ".md"):
            old.unlink()
    for name, data in files.items():
        (out_dir / name).write_bytes(data)
    return files


def apply_check(patch: Path, src: Source) -> tuple[bool, str]:
    """``git apply --check`` of ``patch`` against ``src``'s versions of the files it edits."""
    text = patch.read_text()
    edited = sorted(
        set(re.findall(r"^--- a/(\S+)$", text, re.M))
        & set(re.findall(r"^\+\+\+ b/(\S+)$", text, re.M))
    )
    with tempfile.TemporaryDirectory(prefix="ddtree-apply-") as tmp:
        root = Path(tmp)
        missing = []
        for path in edited:
            try:
                _write(root, path, src.read(path))
            except (KeyError, FileNotFoundError):
                missing.append(path)
        r = subprocess.run(
            ["git", "apply", "--check", "-v", str(patch.resolve())],
            cwd=root,
            env=_git_env(),
            capture_output=True,
            text=True,
        )
        report = (r.stdout + r.stderr).strip()
        if missing:
            report += "\nmissing in this version: " + ", ".join(missing)
        return r.returncode == 0, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--base",
        choices=BASES,
        default=SGLANG_VERSION,
        help="the SGLang release to generate for (outputs of another than the first go into "
        "upstream/<base>/)",
    )
    ap.add_argument("--out", type=Path, default=None, help="the single patch (default: its place)")
    ap.add_argument("--sglang-src", help="pristine SGLang: DIR/sglang, the sglang dir, or a .whl")
    ap.add_argument("--no-download", action="store_true", help="never run pip download")
    ap.add_argument(
        "--apply-check",
        metavar="VERSION",
        help="instead of generating: git apply --check the committed patch of --base against "
        "that version",
    )
    ap.add_argument("--print-hashes", action="store_true", help="sha256 of the pristine files")
    ap.add_argument(
        "--series",
        action="store_true",
        help="instead of the single patch: the series of parts into series/ beside it",
    )
    args = ap.parse_args(argv)
    base = args.base
    global FORMAT_DOWNLOAD
    FORMAT_DOWNLOAD = not args.no_download

    if args.apply_check:
        src = find_source(args.sglang_src, version=args.apply_check, download=not args.no_download)
        ok, report = apply_check(patch_path(base), src)
        print(f"{patch_path(base).relative_to(REPO)} against sglang {args.apply_check} "
              f"({src.label}):")  # fmt: skip
        print(report)
        print("APPLIES" if ok else "DOES NOT APPLY")
        return 0 if ok else 1

    src = find_source(args.sglang_src, version=base, download=not args.no_download)
    if args.print_hashes:
        for path in sorted({e.path for e in edits(base)}):
            print(f'    "{path}": "{hashlib.sha256(src.read(path)).hexdigest()}",')
        return 0
    if args.series:
        files = write_series(src)
        where = series_dir(base).relative_to(REPO)
        for name, data in files.items():
            if name.endswith(".patch"):
                counts = subprocess.run(
                    ["git", "apply", "--numstat", "-"], input=data, capture_output=True, check=True
                ).stdout.decode()
                lines = sum(
                    int(a) + int(d) for a, d, _ in (r.split("\t", 2) for r in counts.splitlines())
                )
                print(f"{lines:6d} lines  {where}/{name}", file=sys.stderr)
        print(f"wrote {len(files)} files into {where} from {src.label}", file=sys.stderr)
        return 0
    patch = build_patch(src)
    out = args.out or patch_path(base)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(patch)
    print(f"wrote {out} ({len(patch)} bytes) from {src.label}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
