"""DDTREE's server arguments and widths: what SGLang asks of a speculative algorithm, answered
for DDTREE.

DDTREE is a member of the DFlash family (same drafter, same aux-hidden capture, same draft KV
pool), so ``is_dflash_family()`` is True; it is not DFLASH, so ``is_dflash()`` is False (every
SGLang branch on either, audited: docs/integration.md). ``handle_ddtree`` is its argument
handling (as ``_handle_dflash`` is DFLASH's): the early refusals, DFLASH's server-arg defaults
(SGLang's ``_handle_dflash``), and the tree budget schedule (``sglang_ddtree.srt.ddtree_budget``);
``draft_block_size`` gives the drafter's B tokens per request in the target verify's mode, where
the target verifies the schedule's largest W.

``DDTreeSpecAlgo`` (at the end) answers the same for SGLang 0.5.17's registry of speculative
algorithms: the predicates, and the three methods the runtime calls but ``CustomSpecAlgo`` lacks
(``carries_draft_hidden_states``, ``create_future_map``, ``need_topk``).
"""

from __future__ import annotations

import logging

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_ddtree.srt import ddtree_args as dargs
from sglang_ddtree.srt import ddtree_budget as budget
from sglang_ddtree.srt.ddtree_attention.attention_registry import verify_backend

logger = logging.getLogger(__name__)


def validate_server_args(server_args) -> None:
    """Early refusals, before any default is resolved (``handle_ddtree``)."""
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(server_args)
    errors = dargs.check_server_args(view)  # the SGLANG_DDTREE_* values first
    verify = verify_backend(view)
    unavailable = verify.unavailable_error() if verify is not None else None
    if unavailable is not None and unavailable not in errors:
        errors.append(unavailable)
    if errors:
        raise ValueError(dargs.format_errors(errors))


def handle_ddtree(server_args) -> None:
    """DDTREE's server arguments, as ``_handle_dflash`` is DFLASH's: refusals, then defaults."""
    validate_server_args(server_args)
    resolve_server_args(server_args)


def draft_block_size() -> int:
    """B, the drafter's tokens per request in TARGET_VERIFY mode, from the published spec bag
    (both runners are handed W, the scheduler's ``speculative_num_draft_tokens``)."""
    from sglang.srt.runtime_context import get_spec

    block = get_spec().speculative_dflash_block_size
    if block is None:
        raise RuntimeError(
            "DDTREE: speculative_dflash_block_size is not resolved in this process; "
            "were DDTREE's server arguments (resolve_server_args) skipped?"
        )
    return int(block)


def resolve_server_args(server_args) -> None:
    """Resolve DFLASH defaults for the drafter, then the budget schedule, W and B.

    ``_handle_dflash`` sets B into ``speculative_num_draft_tokens``; DDTREE keeps the
    schedule's largest W there (what every generic sizing path reads) and B in
    ``speculative_dflash_block_size``. The schedule travels to the scheduler processes as
    ``_ddtree_budget_schedule`` of the pickled args.
    """
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash

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
    server_args._ddtree_budget_schedule = str(schedule)
    topk = dargs.read_topk(flag=getattr(server_args, dargs.TOPK_FLAG, None))
    shape = dargs.DDTreeShape(num_nodes=nodes, block_size=block, topk=topk)
    errors = dargs.check_shape(shape)
    if errors:
        raise ValueError(dargs.format_errors(errors))
    logger.info(
        "DDTREE: budget schedule %s (bs:W, W = nodes per request incl. root; %s), "
        "drafter block %d, top-K %d, S=%d",
        schedule,
        "fixed" if schedule.is_fixed else "adaptive",
        shape.block_size,
        shape.topk,
        shape.accept_width,
    )


# --- the plugin's registration: in-tree, DDTREE is a member of ``SpeculativeAlgorithm`` whose
# predicates, worker and argument handling are written there beside DFLASH's.
class DDTreeSpecAlgo(CustomSpecAlgo):
    """Spec class registered for ``DDTREE`` (see ``sglang_ddtree.plugin``)."""

    # --- predicates -------------------------------------------------------------------------
    def is_ddtree(self) -> bool:
        return True

    def is_dflash(self) -> bool:
        # SGLang reads it for DFLASH's own argument handling and worker, which this class
        # replaces, and for Ascend graphs; every drafter branch keys on the family.
        return False

    def is_dflash_family(self) -> bool:
        # Aux hidden capture, draft KV sizing, draft input_embeds in graphs, DFLASH dummy
        # verify inputs and request validation all key on this.
        return True

    def supports_target_verify_for_draft(self) -> bool:
        # The drafter runs (and is graph-captured) in TARGET_VERIFY mode, as in DFLASH.
        return True

    def supports_grammar_overlap(self) -> bool:
        # As DFLASH's: the worker builds the grammar mask over the tree during the target
        # verify, after the scheduler's barrier has advanced the matchers.
        return True

    def supports_ragged_verify(self) -> bool:
        return False

    def has_draft_kv(self) -> bool:
        return True

    # --- methods the runtime calls that CustomSpecAlgo lacks ---------------------------------
    def carries_draft_hidden_states(self) -> bool:
        return False

    def need_topk(self) -> bool:
        return False

    def create_future_map(
        self,
        device,
        req_to_token_pool,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(
            device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
        )

    # --- widths -----------------------------------------------------------------------------
    def get_num_tokens_per_req_for_target_verify(
        self, num_draft_tokens: int, is_draft_worker: bool
    ) -> int:
        """W for the target verify graphs, B for the drafter's block graphs."""
        return draft_block_size() if is_draft_worker else int(num_draft_tokens)

    # --- server args ------------------------------------------------------------------------
    def handle_server_args(self, server_args) -> None:
        resolve_server_args(server_args)
