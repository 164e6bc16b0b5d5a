"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``ddtree``).

SGLang calls ``register()`` in the launcher / Engine process and in every scheduler process.
It swallows plugin exceptions into a log line, after which ``--speculative-algorithm DDTREE``
would only fail later as "Unknown speculative algorithm name". So when the real registration
fails, ``register()`` logs loudly, registers a placeholder ``DDTREE`` whose argument validation
raises the original error, and re-raises.

Only the standard library is imported at module level: an import error here would be logged
by SGLang and lost the same way.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_registered = False
_register_error: BaseException | None = None

# The one SGLang release this plugin runs on: it subclasses and hooks that release's internals.
# pyproject's `serve` extra and the Dockerfile's base image pin the same (a test holds them).
SGLANG_VERSION = "0.5.17"


def sglang_version_error(found: str | None) -> str | None:
    """Why the installed SGLang (version ``found``) cannot run the plugin, or None."""
    if found == SGLANG_VERSION:
        return None
    return (
        f"sglang-ddtree runs on SGLang {SGLANG_VERSION} only; this environment has SGLang "
        f"{found or '(version unknown)'}. Install sglang=={SGLANG_VERSION} (pip install "
        f"'sglang-ddtree[serve]', or the image built from docker/Dockerfile)."
    )


def _worker_factory(server_args):
    from sglang_ddtree.srt.ddtree_worker_v2 import DDTreeWorkerV2

    return DDTreeWorkerV2


def _register_real() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("sglang")
    except PackageNotFoundError:
        found = None
    error = sglang_version_error(found)
    if error is not None:
        raise RuntimeError(error)
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_ddtree.srt.ddtree_args import ALGORITHM_NAME
    from sglang_ddtree.srt.ddtree_spec import DDTreeSpecAlgo, validate_server_args

    SpeculativeAlgorithm.register(
        ALGORITHM_NAME,
        supports_overlap=True,
        validate_server_args=validate_server_args,
        spec_class=DDTreeSpecAlgo,
    )(_worker_factory)
    _register_request_checks()
    _register_row_headroom()
    _register_server_flags()
    _register_logprob_placeholders()
    # The verify attention backends that replace SGLang's kernel (ddtree_attention).
    from sglang_ddtree.srt import ddtree_attention_hook

    ddtree_attention_hook.register_verify_hooks()


def _register_request_checks() -> None:
    """Wrap SGLang's per-request DFlash-family validation with DDTREE's refusals (HTTP 400)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.speculative.dflash_utils.validate_dflash_request",
        _validate_request_hook,
        HookType.AROUND,
    )


def _validate_request_hook(original_fn, req, *args, **kwargs):
    from sglang_ddtree.srt import ddtree_requests as requests

    # DDTREE's refusals first, so their messages name DDTREE (not DFLASH).
    if requests.ddtree_active():
        msg = requests.refuse_request(req)
        if msg is not None:
            return msg
        if getattr(req, "return_logprob", False):  # DDTREE serves them; DFLASH refuses them
            req.return_logprob = False
            try:
                return original_fn(req, *args, **kwargs)
            finally:
                req.return_logprob = True
    return original_fn(req, *args, **kwargs)


def _register_row_headroom() -> None:
    """Widen ``req_to_token`` rows for DDTREE (see ``ddtree_args.req_to_token_headroom``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
        _row_headroom_hook,
        HookType.AROUND,
    )


def _row_headroom_hook(original_fn, server_args, *args, **kwargs):
    extra = original_fn(server_args, *args, **kwargs)
    if server_args.speculative_algorithm != "DDTREE":
        return extra
    from sglang_ddtree.srt.ddtree_args import req_to_token_headroom

    block = server_args.speculative_dflash_block_size or server_args.speculative_num_draft_tokens
    return max(extra, req_to_token_headroom(server_args.speculative_num_draft_tokens, block))


def _register_logprob_placeholders() -> None:
    """SGLang 0.5.17's decode ``get_token_ids_logprobs(..., no_copy_to_cpu=True)`` leaves ``[]``
    for a request without ``token_ids_logprob`` beside the other requests' tensors, and the
    scheduler's CPU copy calls ``.tolist()`` on every entry: a batch mixing a
    ``token_ids_logprob`` request with another logprob request kills the scheduler, with or
    without speculation. SGLang's later releases put an empty tensor there; so does this hook,
    in every server of this environment (the values served are unchanged)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.layers.logprob_processor.get_token_ids_logprobs",
        token_ids_logprobs_with_tensor_placeholders,
        HookType.AROUND,
    )


def token_ids_logprobs_with_tensor_placeholders(original_fn, logprobs, *args, **kwargs):
    vals, idxs = original_fn(logprobs, *args, **kwargs)
    no_copy = kwargs.get("no_copy_to_cpu", args[1] if len(args) > 1 else False)
    if no_copy:
        vals = [logprobs.new_empty((0,)) if isinstance(v, list) else v for v in vals]
    return vals, idxs


def _register_server_flags() -> None:
    """DDTREE's flags (``ddtree_args.FLAG_FIELDS``) on SGLang's command line (``launch_server``
    and ``sglang serve`` load plugins before parsing) and as ``sgl.Engine(...)`` keywords. The
    plugin API has no server-argument hook: an AROUND hook on ``ServerArgs.add_cli_args`` adds
    them to the parser, and ones on ``from_cli_args`` and ``__init__`` (which keep only
    dataclass fields) hand their values on: class attributes while ``__post_init__`` resolves
    the speculative arguments, instance attributes after (they travel with the pickled args to
    the scheduler processes). In SGLang's tree they are fields."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import ServerArgs

    from sglang_ddtree.srt.ddtree_args import FLAG_FIELDS

    for field in FLAG_FIELDS:
        if not hasattr(ServerArgs, field):
            setattr(ServerArgs, field, None)  # unset unless given (old pickles too)
    for method, hook in (
        ("add_cli_args", _add_cli_args_hook),
        ("from_cli_args", _from_cli_args_hook),
        ("__init__", _init_hook),
    ):
        HookRegistry.register(f"sglang.srt.server_args.ServerArgs.{method}", hook, HookType.AROUND)


def _add_cli_args_hook(original_fn, parser, *args, **kwargs):
    out = original_fn(parser, *args, **kwargs)
    from sglang_ddtree.srt.ddtree_args import add_cli_flags

    add_cli_flags(parser)
    return out


def _from_cli_args_hook(original_fn, cls, namespace, *args, **kwargs):
    from sglang_ddtree.srt.ddtree_args import FLAG_FIELDS

    values = {f: getattr(namespace, f, None) for f in FLAG_FIELDS}
    return _with_flags(cls, values, lambda: original_fn(cls, namespace, *args, **kwargs))


def _init_hook(original_fn, server_args, *args, **kwargs):
    from sglang_ddtree.srt.ddtree_args import FLAG_FIELDS

    values = {f: kwargs.pop(f) for f in FLAG_FIELDS if f in kwargs}  # sgl.Engine's keywords
    if not values:
        return original_fn(server_args, *args, **kwargs)

    def build():
        original_fn(server_args, *args, **kwargs)
        return server_args

    _with_flags(type(server_args), values, build)


def _with_flags(cls, values: dict, build):
    """``build()``'s ServerArgs, with the flags' ``values`` class attributes of ``cls`` while it
    runs and attributes of the ServerArgs after; a flag without DDTREE is refused."""
    for field, value in values.items():
        setattr(cls, field, value)
    try:
        server_args = build()
    finally:
        for field in values:
            setattr(cls, field, None)
    for field, value in values.items():
        # ServerArgs is read-only once resolved (a bare setattr raises); these are not its fields.
        object.__setattr__(server_args, field, value)
    given = [f"--{f.replace('_', '-')}" for f, v in values.items() if v is not None]
    if given and server_args.speculative_algorithm != "DDTREE":
        raise ValueError(f"{', '.join(given)} need --speculative-algorithm DDTREE.")
    return server_args


def _register_placeholder(error: BaseException) -> None:
    """Register DDTREE so that using it raises ``error`` instead of 'unknown algorithm'."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.spec_registry import get_spec
    except Exception:  # SGLang itself is unusable; nothing more to do.
        return
    if get_spec("DDTREE") is not None:
        return

    def _raise(_server_args):
        raise RuntimeError(
            f"The DDTREE plugin failed to load: {type(error).__name__}: {error}"
        ) from error

    SpeculativeAlgorithm.register("DDTREE", supports_overlap=True, validate_server_args=_raise)(
        _worker_factory
    )


def register() -> None:
    """Entry point: register ``DDTREE`` with SGLang (idempotent within a process)."""
    global _registered, _register_error
    if _registered:
        return
    try:
        _register_real()
    except ValueError as e:
        if "already registered" in str(e):
            _registered = True
            return
        _fail(e)
        raise
    except Exception as e:
        _fail(e)
        raise
    _registered = True
    logger.info("sglang-ddtree: registered speculative algorithm DDTREE")


def _fail(error: BaseException) -> None:
    global _register_error
    _register_error = error
    logger.error(
        "sglang-ddtree: FAILED to register speculative algorithm DDTREE: %s: %s",
        type(error).__name__,
        error,
        exc_info=error,
    )
    _register_placeholder(error)
