"""The budget schedule: the verify width W (tree nodes per request, root included; W = budget
+ 1) as a function of the running batch size. No torch; unit-tested on CPU.

Terms:

- ``bs``: requests in one decode step (``len(batch.seq_lens)``, a host int).
- ``W``: tree nodes verified per request, root included (tree budget = W - 1). A fixed W is what
  ``--speculative-num-draft-tokens`` sets.
- ``B``: drafter block size. Every W must be >= B (``ddtree_args.check_shape``): SGLang's KV reservation
  of ``2 * W`` slots per request must cover one drafter block plus one commit. W = B verifies
  as many tokens as the DFLASH chain does (B - 1 draft nodes, arranged as a tree).
- bucket: a maximal range of bs with one W. A schedule ``"1:65,8:33,32:17"`` has thresholds
  ``1 < 8 < 32``: bs 1..7 verify W=65, bs 8..31 W=33, bs >= 32 W=17.
- capture sizes: SGLang's list of batch sizes with a captured decode CUDA graph
  (``get_batch_sizes_to_capture``); a step of ``bs`` requests replays the graph of the smallest
  capture size >= bs (padding), or runs eagerly when bs exceeds the largest.

``--speculative-ddtree-budget-schedule`` (or ``SGLANG_DDTREE_BUDGET_SCHEDULE``) sets a schedule;
a refusal names the one the value came from. ``--speculative-num-draft-tokens W`` alone
fixes W (a one-bucket schedule); both together are refused as ambiguous; neither gives
``default_schedule(B, moe)`` (``1:2B,4:B``, or ``1:B`` for a mixture-of-experts target).
SGLang's ``speculative_num_draft_tokens`` is then set to the schedule's largest W, because the
KV reservation, the verify buffers and ``out_cache_loc`` are sized from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sglang_ddtree.srt.ddtree_envs import envs

SCHEDULE_ENV = envs.SGLANG_DDTREE_BUDGET_SCHEDULE.name
SCHEDULE_FLAG = "--speculative-ddtree-budget-schedule"
EXAMPLE = "1:65,8:33,32:17"

logger = logging.getLogger(__name__)


def _set_like(source: str, schedule: str) -> str:
    """How a refusal tells the user to give ``schedule``, in the form they used (``source``:
    the flag or the env var)."""
    if source == SCHEDULE_FLAG:
        return f"pass e.g. {SCHEDULE_FLAG} {schedule}"
    return f"set e.g. {SCHEDULE_ENV}={schedule!r}"


def _form_problem(thresholds: tuple, num_nodes: tuple, source: str) -> str | None:
    """Why these pairs are no schedule (None when they are one); ``source`` names where they
    came from."""
    fix = _set_like(source, EXAMPLE)
    if not thresholds or len(thresholds) != len(num_nodes):
        return f"{source}: a budget schedule needs one W per threshold; {fix}."
    if thresholds[0] != 1:
        return (
            f"{source}: the first budget-schedule threshold must be 1 (got {thresholds[0]}) so "
            f"every batch size has a W; {fix}."
        )
    for lo, hi in zip(thresholds, thresholds[1:]):
        if hi <= lo:
            return (
                f"{source}: budget-schedule thresholds must increase (got {lo} then {hi}); {fix}."
            )
    for w in num_nodes:
        if w < 1:
            return f"{source}: every W in a budget schedule must be >= 1 (got {w}); {fix}."
    return None


def default_schedule(block_size: int, moe: bool = False) -> BudgetSchedule:
    """The schedule used when neither the env var nor ``--speculative-num-draft-tokens`` is given.

    Dense targets: bs 1..3 -> 2B, bs >= 4 -> B (the chain's own verify width, its B - 1 draft
    nodes arranged as a tree). The verify forward's work grows with bs x W while a tree's accept
    gain over the chain does not, so a wider tree pays only at the smallest batches. W stays a
    multiple of the block rather than one over it: cuBLAS opens a further row tile for
    bs x (W + 1) rows, which costs more step time than the last node of a best-first tree adds
    in accept length (measured on an H200 with the Qwen3-8B shape and the trained pair).

    Mixture-of-experts targets (``moe``): B at every batch size. There every verified token routes
    to its own experts, so W = 2B touches up to twice the experts of the chain's step even at bs 1,
    where a dense target's wider verify is nearly free; and on FlashMLA the prefix part of a TP-8
    rank of an MLA target (8 query heads) is one 64-row tile at W = 8 and two at W = 16, each
    reading the whole latent prefix (measured on one TP-8 rank of Kimi K2.6 on an H200: W = 16 costs
    1.12-1.17x the chain's step at bs 1, W = 8 0.98-1.08x).
    """
    b = int(block_size)
    if moe:
        return BudgetSchedule.fixed(b)
    return BudgetSchedule(thresholds=(1, 4), num_nodes=(2 * b, b))


# Config fields that name a positive routed-expert count (DeepSeek-V3 / Kimi, Qwen-MoE, Mixtral).
_EXPERT_COUNT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts")


def _field(cfg, name: str):
    return cfg.get(name) if isinstance(cfg, dict) else getattr(cfg, name, None)


def is_moe_target(hf_config) -> bool:
    """Whether a target's Hugging Face config (or its ``text_config``, where multimodal wrappers
    such as Kimi K2.5 / K2.6 hold the language model's; an object or a dict) has routed experts."""
    for cfg in (hf_config, _field(hf_config, "text_config")):
        if cfg is None:
            continue
        if any((_field(cfg, name) or 0) > 0 for name in _EXPERT_COUNT_FIELDS):
            return True
    return False


@dataclass(frozen=True)
class BudgetSchedule:
    """W per bucket of batch sizes: bucket i covers ``thresholds[i] <= bs < thresholds[i + 1]``
    (the last bucket has no upper end) and verifies ``num_nodes[i]`` nodes per request."""

    thresholds: tuple[int, ...]
    num_nodes: tuple[int, ...]

    def __post_init__(self) -> None:
        problem = _form_problem(self.thresholds, self.num_nodes, SCHEDULE_ENV)
        if problem is not None:
            raise ValueError(problem)

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str, source: str = SCHEDULE_ENV) -> BudgetSchedule:
        """Parse ``"T0:W0,T1:W1,..."`` (whitespace allowed); ValueError names ``source`` (the
        flag or the env var the text came from) and says what to pass."""
        items = [p.strip() for p in str(text).split(",") if p.strip()]
        if not items:
            undo = "drop it" if source == SCHEDULE_FLAG else "unset it"
            raise ValueError(f"{source} is empty; {_set_like(source, EXAMPLE)}, or {undo}.")
        pairs = []
        for item in items:
            parts = item.split(":")
            try:
                if len(parts) != 2:
                    raise ValueError
                pairs.append((int(parts[0]), int(parts[1])))
            except ValueError:
                raise ValueError(
                    f"{source}: {item!r} is not 'min_batch_size:num_nodes' (two integers); "
                    f"{_set_like(source, EXAMPLE)}."
                ) from None
        thresholds, num_nodes = tuple(t for t, _ in pairs), tuple(w for _, w in pairs)
        problem = _form_problem(thresholds, num_nodes, source)
        if problem is not None:
            raise ValueError(problem)
        return cls(thresholds=thresholds, num_nodes=num_nodes)

    @classmethod
    def fixed(cls, num_nodes: int) -> BudgetSchedule:
        """One bucket: W for every batch size."""
        return cls(thresholds=(1,), num_nodes=(int(num_nodes),))

    def __str__(self) -> str:
        return ",".join(f"{t}:{w}" for t, w in zip(self.thresholds, self.num_nodes))

    # --- queries -----------------------------------------------------------------------------
    @property
    def is_fixed(self) -> bool:
        return len(self.num_nodes) == 1

    @property
    def max_num_nodes(self) -> int:
        return max(self.num_nodes)

    def bucket_index(self, bs: int) -> int:
        """Index of the bucket holding ``bs`` (>= 1)."""
        if bs < 1:
            raise ValueError(f"batch size must be >= 1 (got {bs})")
        i = 0
        while i + 1 < len(self.thresholds) and self.thresholds[i + 1] <= bs:
            i += 1
        return i

    def num_nodes_for(self, bs: int) -> int:
        """W for a decode step of ``bs`` requests."""
        return self.num_nodes[self.bucket_index(bs)]

    def bucket_range(self, i: int) -> tuple[int, int | None]:
        """``(lo, hi)`` batch sizes of bucket i, inclusive; hi is None for the last bucket."""
        hi = self.thresholds[i + 1] - 1 if i + 1 < len(self.thresholds) else None
        return self.thresholds[i], hi

    def buckets(self, capture_bs: Iterable[int]) -> list[tuple[int, list[int]]]:
        """Per bucket, ``(W, batch sizes to capture at W)``, given SGLang's capture sizes.

        A bucket captures SGLang's sizes inside it plus its top ``min(hi, max(capture_bs))``,
        so padding a bs up to the next captured size never leaves its bucket: the graph replayed
        for bs has bs's W. The size lists are disjoint and ascending; a bucket entirely above the
        largest capture size gets an empty list (its steps run eagerly, as SGLang runs any
        bs > max). Inserted tops are not filtered by SGLang's attention-TP alignment rule, which
        is vacuous at TP 1 (the only TP DDTREE supports).
        """
        sizes = sorted({int(c) for c in capture_bs if int(c) >= 1})
        if not sizes:
            raise ValueError("SGLang gave no CUDA-graph batch sizes to capture.")
        max_bs = sizes[-1]
        out = []
        for i, w in enumerate(self.num_nodes):
            lo, hi = self.bucket_range(i)
            top = max_bs if hi is None else min(hi, max_bs)
            if lo > top:
                out.append((w, []))
                continue
            inside = {c for c in sizes if lo <= c <= top}
            out.append((w, sorted(inside | {top})))
        return out

    def check(self, block_size: int, source: str = SCHEDULE_ENV) -> list[str]:
        """Problems with this schedule for drafter block ``block_size`` (empty when fine), each
        naming ``source``, the flag or env var the schedule came from."""
        b = int(block_size)
        errors = []
        for i, w in enumerate(self.num_nodes):
            if w < b:
                lo, hi = self.bucket_range(i)
                where = f"bs >= {lo}" if hi is None else f"bs {lo}..{hi}"
                errors.append(
                    f"{source}: W={w} for {where} is below the drafter block size {b}; "
                    f"every W must be >= {b}: {_set_like(source, str(default_schedule(b)))}."
                )
        return errors


def read_schedule_env() -> BudgetSchedule | None:
    """The schedule set by ``SGLANG_DDTREE_BUDGET_SCHEDULE``, or None when unset or blank."""
    raw = envs.SGLANG_DDTREE_BUDGET_SCHEDULE.get()
    return BudgetSchedule.parse(raw.strip()) if raw and raw.strip() else None


def schedule_from_args(server_args) -> BudgetSchedule:
    """The schedule resolved by ``DDTreeSpecAlgo.handle_server_args`` in the launcher process.

    It travels as the private ``_ddtree_budget_schedule`` of the pickled args; if that was lost,
    the env var (inherited by the scheduler process) or else the fixed W is used."""
    text = getattr(server_args, "_ddtree_budget_schedule", None)
    nodes = int(server_args.speculative_num_draft_tokens)
    if text:
        schedule = BudgetSchedule.parse(text)
    else:
        schedule = read_schedule_env() or BudgetSchedule.fixed(nodes)
        logger.warning("DDTREE: no resolved budget schedule on the server args; using %s", schedule)
    if schedule.max_num_nodes != nodes:
        raise RuntimeError(
            f"DDTREE: budget schedule {schedule} has largest W {schedule.max_num_nodes} but "
            f"speculative_num_draft_tokens is {nodes}; they must agree."
        )
    return schedule


def resolve_schedule(
    explicit_num_nodes: int | None,
    block_size: int,
    flag: str | None = None,
    moe: bool = False,
) -> BudgetSchedule:
    """The schedule from ``--speculative-ddtree-budget-schedule`` (``flag``) or the env var, an
    explicit ``--speculative-num-draft-tokens``, or the default for the target (``moe``: a
    mixture-of-experts target, `default_schedule`); ValueError (saying what to pass) when two
    disagree or W < B somewhere.

    The W >= B check of a fixed W is ``ddtree_args.check_shape``'s (the caller runs it); this function
    checks given and default schedules.
    """
    env_schedule = read_schedule_env()
    given, source = env_schedule, SCHEDULE_ENV
    given_as, undo = f"{SCHEDULE_ENV}={str(given)!r}", f"unset {SCHEDULE_ENV}"
    if flag is not None and flag.strip():
        given, source = BudgetSchedule.parse(flag.strip(), SCHEDULE_FLAG), SCHEDULE_FLAG
        given_as, undo = f"{SCHEDULE_FLAG} {given}", f"drop {SCHEDULE_FLAG}"
        if env_schedule is not None and str(env_schedule) != str(given):
            raise ValueError(
                f"{SCHEDULE_FLAG} {str(given)!r} and {SCHEDULE_ENV}={str(env_schedule)!r} "
                f"disagree; unset {SCHEDULE_ENV}."
            )
    if given is not None and explicit_num_nodes is not None:
        raise ValueError(
            f"DDTREE budget is ambiguous: --speculative-num-draft-tokens {explicit_num_nodes} "
            f"fixes W, {given_as} makes it adaptive. Pass only one: "
            f"drop --speculative-num-draft-tokens, or {undo}."
        )
    if explicit_num_nodes is not None:
        return BudgetSchedule.fixed(int(explicit_num_nodes))
    schedule = given if given is not None else default_schedule(block_size, moe)
    errors = schedule.check(block_size, source)
    if errors:
        raise ValueError("Invalid DDTREE budget schedule:\n  - " + "\n  - ".join(errors))
    return schedule


def capture_union(plan: Sequence[tuple[int, list[int]]]) -> list[int]:
    """All batch sizes of a ``buckets()`` plan, ascending (what the graph runner pads to)."""
    return sorted({bs for _, sizes in plan for bs in sizes})
