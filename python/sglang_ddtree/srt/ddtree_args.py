"""DDTREE options and startup checks, in plain Python (no torch; of SGLang only ``envs``, the
environment variables; unit-testable on CPU).

How DDTREE is configured (CLI and ``sgl.Engine(...)`` alike):

- ``--speculative-algorithm DDTREE`` and ``--speculative-draft-model-path <DFlash drafter>``
  (refused at start without a drafter, in DDTREE's words).
- ``--speculative-num-draft-tokens W``: a FIXED W: tree nodes verified per request, root
  included (budget = W - 1), at every batch size. Must be >= the drafter block size.
- ``--speculative-ddtree-budget-schedule`` (or the env var ``SGLANG_DDTREE_BUDGET_SCHEDULE``,
  for ``sgl.Engine``): an ADAPTIVE W per running batch size, as
  ``min_bs:W`` pairs, e.g. ``1:65,8:33,32:17`` (bs 1..7 -> W=65, 8..31 -> 33, >= 32 -> 17).
  Thresholds start at 1 and increase; every W >= the drafter block size. Setting it together
  with ``--speculative-num-draft-tokens`` is refused (ambiguous). With neither,
  ``budget.default_schedule(B, moe)`` applies (``1:2B,4:B``; ``1:B`` for a mixture-of-experts
  target). SGLang's
  ``speculative_num_draft_tokens`` becomes the schedule's largest W (it sizes KV reservations and
  the verify buffers); each bucket gets its own target-verify CUDA graphs (``ddtree_cuda_graph_runner``).
- ``--speculative-dflash-block-size B``: optional; read from the drafter config otherwise.
- ``--speculative-ddtree-topk`` (or the env var ``SGLANG_DDTREE_TOPK``): candidates per depth K
  (default 8); the worker uses ``min(K, W - 1, vocab)``. A flag and its env var both set to
  different values are refused (ambiguous).
- The per-depth top-K: `sglang_ddtree.core.topk_triton` where it measured faster, else
  ``torch.topk`` (`draft_topk_backend`).
- ``--attention-backend triton`` (or ``flashinfer``): the target verify must apply the tree mask.
- ``--speculative-ddtree-verify-attention``: the verify attention (``ddtree_attention``), by
  name; default: the attention backend's own (triton's: DDTREE's split). ``triton_extend``:
  triton's custom-mask extend kernel, the reference the split is tested against.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sglang_ddtree.core.tree import MAX_BUDGET, MAX_DEPTH
from sglang_ddtree.srt.ddtree_attention.attention_registry import (
    VERIFY_BACKENDS,
    default_backends,
    target_verify_backend,
    verify_backend,
)
from sglang_ddtree.srt.ddtree_attention.verify_backend import (
    VERIFY_FLAG,
    VerifyAttentionBackend,
)
from sglang_ddtree.srt.ddtree_envs import envs

ALGORITHM_NAME = "DDTREE"
TOPK_ENV = envs.SGLANG_DDTREE_TOPK.name
DEFAULT_TOPK = envs.SGLANG_DDTREE_TOPK.default
# The Triton top-K where the H200 measured it faster (V = 151,936): K <= 32 at a large
# vocabulary. Small vocabularies and K = 64 keep torch.topk.
TRITON_TOPK_MAX_K = 32
TRITON_TOPK_MIN_VOCAB = 65536


@dataclass(frozen=True)
class DDTreeShape:
    """Per-request sizes of one DDTREE step.

    num_nodes (W): verified nodes per request, root included (budget + 1).
    block_size (B): drafter block (root + B - 1 masked slots), so depth <= B - 1.
    topk (K): requested candidates per depth (before capping by budget and vocab).
    """

    num_nodes: int
    block_size: int
    topk: int

    @property
    def budget(self) -> int:
        return self.num_nodes - 1

    @property
    def max_depth(self) -> int:
        return min(self.block_size - 1, self.budget)

    @property
    def accept_width(self) -> int:
        """S: width of accept_index / out_tokens rows (root + deepest path)."""
        return self.max_depth + 1

    def candidates_per_depth(self, vocab_size: int) -> int:
        return max(1, min(self.topk, self.budget, vocab_size))


def req_to_token_headroom(max_num_nodes: int, block_size: int) -> int:
    """Columns a ``req_to_token`` row needs past the context length under DDTREE.

    Each decode step reserves KV up to ``committed + 2 * W`` (DFLASH v2's double buffer for the
    overlap lag) and the verify writes W nodes after a prefix that may lead the host's committed
    length by one accepted path; a running request's committed length is below the context length.
    SGLang's default headroom (``4 + W``) is smaller, so near the context limit the reservation
    would land in the next request's row. A block of slack covers the lag.
    """
    return 2 * int(max_num_nodes) + int(block_size) + 4


def default_num_nodes(block_size: int) -> int:
    """The fixed W a refusal suggests: the default schedule's widest (``1:2B,4:B``)."""
    return 2 * int(block_size)


# Server flags: ServerArgs fields in SGLang's tree; added to SGLang's parser by the plugin.
BUDGET_FLAG = "speculative_ddtree_budget_schedule"
TOPK_FLAG = "speculative_ddtree_topk"
FLAG_FIELDS = (BUDGET_FLAG, TOPK_FLAG, VERIFY_FLAG)


def add_cli_flags(parser) -> None:
    """DDTREE's server flags, on an ``argparse`` parser (SGLang's ``ServerArgs.add_cli_args``)."""
    parser.add_argument(
        "--speculative-ddtree-budget-schedule",
        dest=BUDGET_FLAG,
        type=str,
        default=None,
        help="DDTREE: tree nodes verified per request (root included) by running batch size, "
        "as min_bs:W pairs, e.g. 1:33,4:17,32:16. Default: 1:2B,4:B for drafter block B (1:B "
        "for a mixture-of-experts target).",
    )
    parser.add_argument(
        "--speculative-ddtree-topk",
        dest=TOPK_FLAG,
        type=int,
        default=None,
        help=f"DDTREE: draft candidates per depth (default {DEFAULT_TOPK}).",
    )
    parser.add_argument(
        "--speculative-ddtree-verify-attention",
        dest=VERIFY_FLAG,
        choices=sorted(VERIFY_BACKENDS),
        default=None,
        help="DDTREE: the target verify's attention. Default: the attention backend's own "
        "(triton: DDTREE's split attention); triton_extend: triton's custom-mask extend kernel.",
    )


def invalid_env_settings() -> list[str]:
    """A refusal per DDTREE environment variable its field does not parse, naming it and what to
    set: where ``envs.<NAME>.get()`` would warn and use the default, a DDTREE server does not
    start. The schedule, a string, is checked by its reader (``ddtree_budget.resolve_schedule``)."""
    field = envs.SGLANG_DDTREE_TOPK
    value = os.environ.get(field.name)
    try:
        field.parse(value) if field.is_set() else None
    except ValueError:
        return [f"{field.name}={value!r} is not an integer; set it to e.g. {DEFAULT_TOPK}."]
    return []


def read_topk(flag: int | None = None) -> int:
    """K from ``--speculative-ddtree-topk`` (``flag``) or ``SGLANG_DDTREE_TOPK``; ValueError with
    the fix on a bad value or on both set differently."""
    field = envs.SGLANG_DDTREE_TOPK
    if flag is not None:
        if int(flag) < 1:
            raise ValueError(f"--speculative-ddtree-topk {flag} must be >= 1; pass e.g. 8.")
        if field.is_set() and field.get() != int(flag):
            raise ValueError(
                f"--speculative-ddtree-topk {flag} and {TOPK_ENV}={field.get()} disagree; "
                f"unset {TOPK_ENV}."
            )
        return int(flag)
    k = field.get()
    if k < 1:
        raise ValueError(f"{TOPK_ENV}={k} must be >= 1; set it to e.g. 8.")
    return k


def top_p_kernel_unavailable(error: BaseException) -> RuntimeError:
    """The error a worker raises when the radix top-p kernel (`core.topp_radix`) cannot be
    built or loaded at start: what failed, and what the build needs."""
    return RuntimeError(
        f"DDTREE: the radix top-p kernel could not be built or loaded "
        f"({type(error).__name__}: {error}); SGLang's JIT loader builds it at start and needs "
        "nvcc (a CUDA toolkit), as SGLang's own JIT kernels do."
    )


def draft_topk_backend(topk: int, vocab_size: int) -> str:
    """The `select_candidates` backend for K = ``topk`` candidates over ``vocab_size`` (see
    ``TRITON_TOPK_MAX_K``)."""
    fast = topk <= TRITON_TOPK_MAX_K and vocab_size >= TRITON_TOPK_MIN_VOCAB
    return "triton" if fast else "torch"


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    return getattr(cfg, name, default)


def check_server_args(cfg: Any) -> list[str]:
    """Refusals that do not need the drafter block size; each message says what to pass.

    ``cfg`` is any object with ServerArgs field names (a ServerArgs, SGLang's resolved view,
    or a SimpleNamespace in tests). Returns the list of problems (empty when fine).
    """
    # The environment variables first: the readers below take their values as given.
    env_errors = invalid_env_settings()
    errors = list(env_errors)
    # Refused here, before SGLang's DFLASH handling would refuse it in DFLASH's name.
    if not _get(cfg, "speculative_draft_model_path"):
        errors.append(
            "DDTREE drafts with a DFlash drafter, and none was given; pass "
            "--speculative-draft-model-path <the target's DFlash drafter> (a local folder or "
            "hub id, e.g. z-lab/Kimi-K2.6-DFlash for moonshotai/Kimi-K2.6)."
        )
    device = _get(cfg, "device")
    if device is not None and not str(device).startswith("cuda"):
        errors.append(f"DDTREE runs on CUDA only (device={device!r}); pass --device cuda.")
    backend, chosen = target_verify_backend(cfg), _get(cfg, VERIFY_FLAG)
    verify = verify_backend(cfg)
    if chosen is not None and verify is None:
        errors.append(
            f"--speculative-ddtree-verify-attention {chosen!r} is none of DDTREE's verify "
            f"attention backends; pass one of {', '.join(sorted(VERIFY_BACKENDS))} (or omit it)."
        )
    elif verify is None:
        first, *others = default_backends()
        others = ", ".join(b.name + ("" if b.serves_mha else " for MLA targets") for b in others)
        errors.append(
            f"DDTREE needs a target-verify attention backend that applies the tree mask; "
            f"got {backend!r} (fa3 is the Hopper default and ignores it). "
            f"Pass --attention-backend {first.name} (or {others})."
        )
    elif verify.attention_backend != backend:
        errors.append(
            f"--speculative-ddtree-verify-attention {verify.name} verifies on --attention-backend "
            f"{verify.attention_backend} (got {backend!r}); pass --attention-backend "
            f"{verify.attention_backend}, or drop the flag for {backend}'s own verify."
        )
    page_size = _get(cfg, "page_size")
    sizes = verify.page_sizes if verify is not None else None
    if page_size is not None and sizes is not None and int(page_size) not in sizes:
        errors.append(
            f"DDTREE on the {backend} backend supports page_size {sizes[0]} (got {page_size}); "
            f"pass --page-size {sizes[0]} (triton serves any page size)."
        )
    kv_dtype = _get(cfg, "kv_cache_dtype")
    if kv_dtype not in (verify or VerifyAttentionBackend).kv_cache_dtypes:
        errors.append(
            f"DDTREE serves bfloat16 KV caches only (got --kv-cache-dtype {kv_dtype}): its "
            "tree-verify kernels read unscaled keys and values. Pass --kv-cache-dtype auto."
        )
    if int(_get(cfg, "pp_size", 1) or 1) != 1:
        errors.append("DDTREE does not support pipeline parallelism; pass --pp-size 1.")
    if _get(cfg, "enable_dp_attention", False):
        errors.append("DDTREE does not support DP attention; drop --enable-dp-attention.")
    if int(_get(cfg, "tokenizer_worker_num", 1) or 1) > 1:
        errors.append(
            "DDTREE does not support multiple tokenizer workers (they do not load plugins); "
            "pass --tokenizer-worker-num 1."
        )
    single = float(_get(cfg, "speculative_accept_threshold_single", 1.0))
    acc = float(_get(cfg, "speculative_accept_threshold_acc", 1.0))
    if single != 1.0 or acc != 1.0:
        errors.append(
            "DDTREE is exact only with acceptance thresholds 1.0 "
            f"(got single={single}, acc={acc}); pass --speculative-accept-threshold-single 1.0 "
            "--speculative-accept-threshold-acc 1.0 (or omit them)."
        )
    if _get(cfg, "speculative_use_rejection_sampling", False):
        errors.append(
            "DDTREE verifies with exact target-only tree sampling; "
            "drop --speculative-use-rejection-sampling."
        )
    if _get(cfg, "enable_deterministic_inference", False):
        errors.append(
            "DDTREE draws its verify coins from one device generator, so per-request seeds "
            "(deterministic inference) cannot be honoured; drop --enable-deterministic-inference."
        )
    sampling_backend = _get(cfg, "sampling_backend")
    if sampling_backend not in (None, "flashinfer"):
        errors.append(
            "DDTREE reproduces the law of SGLang's flashinfer sampler (top-k and top-p judged "
            f"jointly, tied tokens kept); --sampling-backend {sampling_backend} breaks ties "
            "differently. Pass --sampling-backend flashinfer (the CUDA default)."
        )
    if _get(cfg, "enable_two_batch_overlap", False):
        errors.append("DDTREE does not support two-batch overlap; drop --enable-two-batch-overlap.")
    if _get(cfg, "disaggregation_mode", "null") not in (None, "null"):
        errors.append("DDTREE does not support PD disaggregation; drop --disaggregation-mode.")
    if _get(cfg, "speculative_draft_window_size") is not None:
        errors.append(
            "DDTREE does not support a draft window; drop --speculative-draft-window-size."
        )
    if _get(cfg, "speculative_adaptive", False):
        errors.append("DDTREE does not support adaptive speculation; drop --speculative-adaptive.")
    topk = _get(cfg, "speculative_eagle_topk")
    if topk not in (None, 1):
        errors.append(
            f"--speculative-eagle-topk {topk} has no meaning for DDTREE; omit it and set "
            f"{TOPK_ENV} for candidates per depth."
        )
    if not env_errors:  # else SGLANG_DDTREE_TOPK is refused above
        try:
            read_topk(flag=_get(cfg, TOPK_FLAG))
        except ValueError as e:
            errors.append(str(e))
    return errors


def check_target(cfg: Any, is_mla: bool, kv_dtype: Any = None, backend: str | None = None):
    """Refusals that need the loaded target: its verify backend must serve MLA or MHA targets
    (``serves_mla`` / ``serves_mha``; flashinfer's MLA path, trtllm_mla and cutlass_mla apply
    no per-branch tree mask and return no log-sum-exp DDTREE's split could merge);
    ``kv_dtype``, the resolved KV cache dtype (a torch dtype), must be bfloat16 or another
    16-bit float (a checkpoint may turn ``auto`` into FP8). ``backend``: the attention
    backend's name where the caller knows it, else from ``cfg``."""
    verify = VERIFY_BACKENDS.get(backend) if backend else verify_backend(cfg)
    backend = backend or target_verify_backend(cfg)
    errors = []
    if is_mla and not (verify is not None and verify.serves_mla):
        mla = [b.name for b in default_backends() if b.serves_mla]
        errors.append(
            f"DDTREE on an MLA target needs the {' or '.join(mla)} attention backend for the "
            f"tree verify (got {backend!r}); pass "
            + " or ".join(f"--attention-backend {name}" for name in mla)
            + "."
        )
    if not is_mla and verify is not None and not verify.serves_mha:
        mha = " or ".join(b.name for b in default_backends() if b.serves_mha)
        errors.append(
            f"The {verify.name} backend serves MLA targets only; pass --attention-backend {mha}."
        )
    if kv_dtype is not None and getattr(kv_dtype, "itemsize", 2) != 2:
        errors.append(
            f"DDTREE serves 16-bit KV caches only (this target's resolves to {kv_dtype}); "
            "pass --kv-cache-dtype bfloat16."
        )
    return errors


def check_shape(shape: DDTreeShape) -> list[str]:
    """Refusals that need the resolved block size."""
    errors = []
    if shape.block_size < 2:
        errors.append(f"DDTREE needs a drafter block size >= 2 (got {shape.block_size}).")
    if shape.block_size > MAX_DEPTH + 1:
        errors.append(
            f"DDTREE takes a drafter block size of at most {MAX_DEPTH + 1} (its tree kernel "
            f"holds depths up to {MAX_DEPTH}); got {shape.block_size}: use a DFlash drafter of "
            f"block {MAX_DEPTH + 1} or less."
        )
    if shape.num_nodes > MAX_BUDGET + 1:
        errors.append(
            f"DDTREE verifies at most {MAX_BUDGET + 1} tree nodes per request (got "
            f"{shape.num_nodes}); pass --speculative-num-draft-tokens {MAX_BUDGET + 1} or less, "
            f"or a --speculative-ddtree-budget-schedule whose largest W is at most that."
        )
    if shape.num_nodes < shape.block_size:
        errors.append(
            f"DDTREE needs --speculative-num-draft-tokens (tree nodes incl. root) >= the drafter "
            f"block size {shape.block_size} (got {shape.num_nodes}); pass "
            f"--speculative-num-draft-tokens {default_num_nodes(shape.block_size)}."
        )
    return errors


def format_errors(errors: list[str]) -> str:
    return "Invalid DDTREE configuration:\n  - " + "\n  - ".join(errors)
