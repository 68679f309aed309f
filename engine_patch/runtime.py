"""The patch's runtime inside one EngineCore, and the scheduler mixin that drives it (no vLLM import here).

:class:`SpecctlMixin` overrides four scheduler methods and calls the parent in each (graph-shaped engines also
wrap the instance's ``make_spec_decoding_stats``, :func:`install_counting_call`); the work sits in
:class:`specctl_vllm.engine_patch.hook.SpecHook`. Every hook call is guarded: an exception is logged once per hook,
counted, and that step runs exactly as vLLM would; after ``SPECCTL_ERROR_LIMIT`` failures the patch turns
itself off for the engine's lifetime. Nothing in the patch can raise into vLLM's loop.

:func:`build_runtime` also disables vLLM's placeholder-draft padding (a request admitted with exactly one new
token is padded to ``1 + num_spec_tokens`` drafts regardless of any cap): vLLM skips that padding when a
batch-size K table is set, so the runtime installs the constant table "K for every batch size", which changes
nothing else (the drafting depth it yields is the static ``num_spec_tokens``). A user's own batch-size table is
left in place and is what the engine falls back to.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from typing import Any

from specctl_vllm.engine_patch import backports
from specctl_vllm.engine_patch.hook import SpecHook, counting_call, counting_call_ns
from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
from specctl_vllm.engine_patch.reporter import Identity, Reporter
from specctl_vllm.engine_patch.settings import EngineSettings, default_engine_id, load_settings
from specctl_vllm.engine_patch.telemetry import StepQueue
from specctl_vllm.kernel import protocol

# Under "vllm.": in a vLLM process the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.specctl.engine")

MODEL_FREE_METHODS = (protocol.METHOD_NGRAM, protocol.METHOD_SUFFIX)


class SpecctlRuntime:
    """Everything the patch holds in one EngineCore: hook, policy holder, queue, reporter, failure count."""

    def __init__(self, hook: SpecHook, reporter: Reporter | None, error_limit: int) -> None:
        self.hook = hook
        self.reporter = reporter
        self.enabled = True
        self.errors: dict[str, int] = {}
        self.error_limit = error_limit

    def failed(self, section: str) -> None:
        count = self.errors.get(section, 0) + 1
        self.errors[section] = count
        if count == 1:
            logger.exception("specctl: %s failed; this step runs as plain vLLM (logged once per hook)", section)
        if sum(self.errors.values()) >= self.error_limit and self.enabled:
            self.enabled = False
            self.hook.spec_sink = None  # vLLM's loop stops handing the patch anything
            logger.error("specctl: %d hook failures %s; the patch is off for the rest of this engine's life",
                         sum(self.errors.values()), self.errors)

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.stop(flush=True)


def engine_spec(vllm_config: Any, num_spec_tokens: int, async_mode: bool) -> EngineSpec:
    spec = vllm_config.speculative_config
    method = str(getattr(spec, "method", "") or "").lower() if spec is not None else ""
    k_max = min(num_spec_tokens, protocol.MAX_K) if spec is not None else 0
    if k_max <= 0 or not method:
        return EngineSpec(method=protocol.METHOD_OFF, k_max=0)
    widths = backports.graph_widths(k_max) if full_cuda_graphs(vllm_config) and backports.graph_shaped(vllm_config) \
        else ()
    # model-free substitution changes a request's drafts on the host: not on graph-shaped (async) engines
    model_free = () if async_mode or widths else tuple(m for m in MODEL_FREE_METHODS if m != method)
    return EngineSpec(method=method[:32], k_max=k_max, model_free_methods=model_free,
                      full_cuda_graphs=full_cuda_graphs(vllm_config), graph_widths=widths)


def full_cuda_graphs(vllm_config: Any) -> bool:
    """Whether the engine replays full CUDA graphs for uniform decode batches only (not eager, not a CPU build)."""
    try:
        if getattr(vllm_config.model_config, "enforce_eager", False):
            return False
        if getattr(getattr(vllm_config, "speculative_config", None), "enable_adaptive_verification", False):
            return False  # vLLM 0.34 then replays variable-length decode graphs: mixed k keeps its full graph
        if str(getattr(getattr(vllm_config, "device_config", None), "device_type", "cuda")) not in ("cuda", "rocm"):
            return False
        mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
        if mode is None:
            return False
        has_full = getattr(mode, "has_full_cudagraphs", None)
        if callable(has_full):
            return bool(has_full())
        return "FULL" in str(getattr(mode, "name", mode)).upper()
    except (AttributeError, TypeError, ValueError):  # an unknown vLLM layout: assume none (the controller learns)
        return False


def served_model_name(vllm_config: Any) -> str:
    name = getattr(vllm_config.model_config, "served_model_name", None) or vllm_config.model_config.model
    if isinstance(name, (list, tuple)):
        name = name[0]
    return str(name)[:256]


#: vLLM's per-drafted-request call inside ``update_from_output`` (0.26-0.33), as the patch wraps it.
SPEC_STATS_PARAMS = ("self", "spec_decoding_stats", "num_draft_tokens", "num_accepted_tokens",
                     "num_invalid_spec_tokens", "request_id")


def engine_loop_counts_drafts(scheduler_cls: type) -> bool:
    """Whether the installed vLLM scheduler calls ``make_spec_decoding_stats`` (with the parameters the patch
    wraps) from its ``update_from_output``: checked against the installed code, not the version number."""
    for cls in scheduler_cls.__mro__:
        if not cls.__module__.startswith("vllm.") or "update_from_output" not in cls.__dict__:
            continue
        method = getattr(cls, "make_spec_decoding_stats", None)
        try:
            params = tuple(inspect.signature(method).parameters) if method is not None else ()
            source = inspect.getsource(cls.__dict__["update_from_output"])
        except (OSError, TypeError, ValueError):
            return False
        return params == SPEC_STATS_PARAMS and "self.make_spec_decoding_stats(" in source
    return False


def install_counting_call(scheduler: Any, rt: SpecctlRuntime) -> None:
    """Wrap this scheduler instance's ``make_spec_decoding_stats`` (vLLM's method, whose parameters
    :func:`engine_loop_counts_drafts` checked) in :func:`~specctl_vllm.engine_patch.hook.counting_call`: an
    instance attribute, so vLLM's ``self.make_spec_decoding_stats(...)`` finds it first, and the class is left
    as vLLM wrote it. Prices one call for the overhead line."""
    hook = rt.hook
    hook.spec_call_ns = counting_call_ns()
    scheduler.make_spec_decoding_stats = counting_call(hook, scheduler.make_spec_decoding_stats, rt.failed)


def token_budget_of(scheduler: Any) -> int | None:
    """Tokens one step may schedule: vLLM's scheduler keeps it as ``max_num_scheduled_tokens`` (0.26-0.33),
    from ``max_num_batched_tokens`` unless set apart; None where neither reads as a positive int."""
    for value in (getattr(scheduler, "max_num_scheduled_tokens", None),
                  getattr(getattr(getattr(scheduler, "vllm_config", None), "scheduler_config", None),
                          "max_num_batched_tokens", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def build_runtime(scheduler: Any, settings: EngineSettings | None = None) -> SpecctlRuntime:
    settings = settings or load_settings()
    config = scheduler.vllm_config
    async_mode = bool(getattr(scheduler, "specctl_async", False)) or bool(config.scheduler_config.async_scheduling)
    engine = engine_spec(config, int(getattr(scheduler, "num_spec_tokens", 0) or 0), async_mode)
    if engine.k_max > 0 and getattr(scheduler, "dynamic_sd_lookup", ...) is None:
        scheduler.dynamic_sd_lookup = [engine.k_max] * (config.scheduler_config.max_num_seqs + 1)
    holder = PolicyHolder(engine)
    queue = StepQueue(settings.queue_steps)
    manager = scheduler.structured_output_manager
    # 0.30-0.33 name it validate_tokens; 0.34 trim_spec_tokens (same arguments, as vLLM trims its own drafts)
    validator = getattr(manager, "validate_tokens", None) or getattr(manager, "trim_spec_tokens", None)
    hook = SpecHook(
        engine,
        holder,
        queue,
        async_mode=async_mode,
        max_categories=settings.max_categories,
        overhead_budget=settings.overhead_budget,
        min_draft_depth=settings.min_draft_depth,
        search_window=settings.search_window_tokens,
        num_sampled_per_step=getattr(scheduler, "num_sampled_tokens_per_step", 1),
        validate_drafts=validator,
        token_budget=token_budget_of(scheduler),
    )
    hook.drafts_from_engine_loop = bool(engine.graph_widths) and engine_loop_counts_drafts(type(scheduler))
    reporter = None
    if settings.reporting_enabled:
        rank = getattr(config.parallel_config, "data_parallel_rank", 0) or 0
        identity = Identity(
            engine_id=settings.engine_id or default_engine_id(rank),
            boot_id=uuid.uuid4().hex[:16],
            model_name=served_model_name(config),
            spec=engine.to_protocol(hook.widths.budget.tokens if hook.widths is not None and hook.widths.budget is not None
                                    else None),
        )
        reporter = Reporter(settings, queue, holder, identity)
        reporter.start()
    logger.info(
        "specctl: engine patch active (method=%s k_max=%d async=%s model-free=%s graph widths=%s, drafts counted "
        "in %s, steady-step model at token budget=%s, controller=%s)",
        engine.method, engine.k_max, async_mode, ",".join(engine.model_free_methods) or "-",
        ",".join(map(str, engine.graph_widths)) or "per-request k",
        "vLLM's update loop" if hook.drafts_from_engine_loop else "the patch's pass",
        hook.widths.budget.tokens if hook.widths is not None and hook.widths.budget is not None else "off",
        settings.controller_url if reporter else "off",
    )
    return SpecctlRuntime(hook, reporter, settings.error_limit)


class SpecctlMixin:
    """Hooks around vLLM's scheduler; see the module docstring."""

    _specctl: SpecctlRuntime | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._specctl = None
        try:
            self._specctl = build_runtime(self)
            if self._specctl.hook.drafts_from_engine_loop:
                install_counting_call(self, self._specctl)
        except Exception:  # a broken patch must leave a working vLLM
            logger.exception("specctl: engine patch failed to start; the engine runs as plain vLLM")

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        rt = self._specctl
        if rt is not None and rt.enabled:
            try:
                rt.hook.before_schedule(self.running)
            except Exception:  # noqa: BLE001 - nothing may raise into vLLM's loop (rt.failed logs it)
                rt.failed("before_schedule")
        return super().schedule(*args, **kwargs)

    def _update_after_schedule(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        rt = self._specctl
        if rt is not None and rt.enabled:
            try:
                rt.hook.after_schedule(scheduler_output, self.requests)
            except Exception:  # noqa: BLE001 - nothing may raise into vLLM's loop (rt.failed logs it)
                rt.failed("after_schedule")
        return super()._update_after_schedule(scheduler_output, *args, **kwargs)

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any, *args: Any, **kwargs: Any) -> Any:
        rt = self._specctl
        active = rt is not None and rt.enabled
        if active:
            try:
                rt.hook.observe(scheduler_output, model_runner_output, self.requests)
            except Exception:  # noqa: BLE001 - nothing may raise into vLLM's loop (rt.failed logs it)
                rt.failed("observe")
        outputs = super().update_from_output(scheduler_output, model_runner_output, *args, **kwargs)
        if active:
            try:
                rt.hook.finish(scheduler_output, self.requests)
            except Exception:  # noqa: BLE001 - nothing may raise into vLLM's loop (rt.failed logs it)
                rt.failed("finish")
        return outputs

    def shutdown(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().shutdown(*args, **kwargs)
        finally:
            rt = self._specctl
            if rt is not None:
                try:
                    rt.close()
                except Exception:
                    logger.exception("specctl: shutdown of the reporter failed")
