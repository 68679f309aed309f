"""Version-gated fixes to vLLM's model runner V2, applied by the ``vllm.general_plugins`` entry point.

Graph-shaped speculation (one proposal width per step, every step on a captured full CUDA graph) needs three
things vLLM 0.26.0's model runner V2 lacks. Each is a small wrapper around one vLLM function, applied only when
the installed vLLM is exactly a release listed in :data:`CHECKED` and the wrapped function's source still holds
the lines the wrapper relies on (read at start-up with :mod:`inspect`). Anything else turns every backport off
with one log line; the engine then runs its static speculative config, as without the patch.

Releases (:data:`RELEASES`): 0.26.0, the four below; 0.34.0, where two are upstream and two rewritten
(:mod:`specctl_vllm.engine_patch.backports_v034` says which and why, with the lines read). 0.27-0.33 get none:
never read against their runners. With vLLM's adaptive verification on (0.34), the engine is not graph-shaped
and no backport changes it (:func:`graph_shaped`).

The four, as written against 0.26.0:

``drafter_graphs`` (upstream PR #48329)
    With a batch-size K table, the drafter's decode-graph manager (one token per request) applies the table's
    K values to its own query length (1 + K - k_max: 1, -1, -3 ...) and capture asserts. The drafter's decode
    manager must ignore the table.
``graph_widths``
    The target and the drafter's prefill manager capture full decode graphs for every width K of the engine's
    width set (``1 + K`` tokens per request), not only for ``1 + k_max``. vLLM captures such a family only for
    the K values of a batch-size table; the wrapper lends it the width set while the candidates are built.
    Only for engines run with the patch's scheduler (the width set is the patch's).
``full_graph_dispatch`` (upstream issue #56136)
    vLLM stages candidates per token count, so a uniform batch whose next captured size belongs to another
    width falls back to piecewise. The wrapper puts, for every token count, the smallest full graph of every
    captured width ahead of the piecewise entry; and where vLLM staged a token count with decode graphs only
    (the off-grid counts ``round_up(size, 1 + K)`` of a width set), it adds the smallest mixed-batch graph
    behind them, so a batch with prompt chunks there runs piecewise, as on a plain engine, not eager.
``honour_width`` (upstream PR #57053)
    The autoregressive drafter (EAGLE, EAGLE-3, MTP) runs ``k_max`` draft passes whatever width was scheduled.
    The wrapper runs ``K - 1`` decode passes after the first, ``K`` being the step's
    ``num_spec_tokens_to_schedule``. At K = 0 the first pass still runs: it writes the drafter's KV cache for the
    step's tokens, without which later drafts would attend to holes (the failure TensorRT-LLM #16888 shows).

    Measured on the H200 (bench/gpu/README.md): that pass makes a K = 0 step of an EAGLE-3 engine 6-10 % dearer
    than a plain engine's step. ``SPECCTL_DRAFT_AT_ZERO=skip`` skips the drafter entirely on K = 0 steps, and the
    drafter's KV cache misses the positions decoded at K = 0, which lowers later acceptance of the requests that
    lived through them (the learned acceptance prices that in). The step is still not plain's: with the drafter
    skipped the H200 measured 1.11x plain's step time at 64 requests and 1.03x at 256 (session 14), on the same
    graphs; what is left is not the drafter.

``SPECCTL_BACKPORTS``: ``auto`` (default: every backport that applies), ``off``, or a comma list of names.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specctl_vllm.engine_patch import backports_v034, versions
from specctl_vllm.engine_patch.backports_v026 import full_graphs_first
from specctl_vllm.engine_patch.settings import load_graph_settings

logger = logging.getLogger("vllm.specctl.backports")

ENV = "SPECCTL_BACKPORTS"
WIDTHS_ENV = "SPECCTL_GRAPH_WIDTHS"
DRAFT_AT_ZERO_ENV = "SPECCTL_DRAFT_AT_ZERO"
NAMES = ("drafter_graphs", "graph_widths", "full_graph_dispatch", "honour_width")
#: Default width set: plain decoding, the short widths where speculation still pays at large batches, and k_max.
DEFAULT_WIDTHS = (0, 1, 2, 4)
SPECCTL_SCHEDULER_PREFIX = "specctl_vllm.engine_patch.scheduler"
#: Drafters of model runner V2's autoregressive speculator, the one ``honour_width`` and the width set cover.
AUTOREGRESSIVE_METHODS = ("eagle", "eagle3", "mtp")

#: (module, qualified name, lines its source must contain) per backport.
_TARGETS: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    "drafter_graphs": (
        ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager._init_candidates",
         ("uses_dynamic_speculative_decoding()", "self.decode_query_len - self.vllm_config.num_speculative_tokens")),
    ),
    "graph_widths": (
        ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager._init_candidates",
         ("x[2] + num_new_sampled_tokens_per_step for x in num_spec_per_batch_size",)),
    ),
    "full_graph_dispatch": (
        ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager.dispatch",
         ("self._candidates[key]", "_is_compatible(")),
    ),
    "honour_width": (
        ("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator", "AutoRegressiveSpeculator._multi_step_decode",
         ("for step in range(1, self.num_speculative_steps):",)),
        ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
         ("scheduler_output: SchedulerOutput", "dummy_run: bool = False")),
        ("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator", "AutoRegressiveSpeculator.propose",
         ("num_reqs = input_batch.num_reqs", "return self.draft_tokens[:num_reqs]")),
    ),
}


@dataclass(frozen=True, kw_only=True)
class Release:
    """One checked vLLM release: the wrappers' targets as read in its sources, and what it has upstream."""

    targets: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]]
    upstream: dict[str, str]


#: Releases whose sources the wrappers were read against (exact versions: a patch release may move code).
RELEASES = {
    "0.26.0": Release(targets=_TARGETS, upstream={}),
    backports_v034.RELEASE: Release(targets=backports_v034.TARGETS, upstream=backports_v034.UPSTREAM),
}
CHECKED = tuple(RELEASES)


@dataclass(frozen=True, kw_only=True)
class BackportStatus:
    """What the plugin applied in this process, what the release has upstream, and why the rest was not."""

    applied: tuple[str, ...]
    problem: str | None = None
    upstream: tuple[str, ...] = ()
    release: str | None = None

    def has(self, name: str) -> bool:
        """Applied by the patch in this process."""
        return name in self.applied

    def provides(self, name: str) -> bool:
        """The engine has it: applied here, or vLLM's own."""
        return name in self.applied or name in self.upstream


def requested(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    raw = load_graph_settings(environ).backports.strip().lower()
    if raw in ("", "auto", "1", "on", "all", "true"):
        return NAMES
    if raw in ("0", "off", "none", "false"):
        return ()
    return tuple(n for n in NAMES if n in {p.strip() for p in raw.split(",")})


def graph_widths(k_max: int, environ: dict[str, str] | None = None) -> tuple[int, ...]:
    """The width set, sorted: ``SPECCTL_GRAPH_WIDTHS`` (comma list) or the default; always holds 0 and k_max."""
    raw = load_graph_settings(environ).graph_widths
    widths = set(DEFAULT_WIDTHS)
    if raw.strip():
        try:
            widths = {int(p) for p in raw.split(",") if p.strip()}
        except ValueError:
            logger.warning("specctl: %s=%r is not a comma list of integers; using the default", WIDTHS_ENV, raw)
    return tuple(sorted({w for w in widths if 0 <= w <= k_max} | {0, k_max}))


def _resolve(module: str, qualname: str) -> tuple[Any, str, Callable]:
    import importlib

    owner: Any = importlib.import_module(module)
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1], getattr(owner, parts[-1])


def source_problem(name: str, targets: dict | None = None) -> str | None:
    """None when every function the backport wraps exists and still holds the lines it relies on (``targets``:
    the release's table, default 0.26.0's)."""
    for module, qualname, needles in (_TARGETS if targets is None else targets)[name]:
        try:
            _, _, fn = _resolve(module, qualname)
            text = inspect.getsource(inspect.unwrap(fn))
        except Exception as exc:  # noqa: BLE001 - any failure to read the code means "differs"
            return f"{module}.{qualname}: {type(exc).__name__}: {exc}"
        for needle in needles:
            if needle not in text:
                return f"{module}.{qualname} no longer contains {needle!r}"
    return None


@functools.cache
def status() -> BackportStatus:
    """Checked once per process; the scheduler's process and the workers reach the same answer."""
    wanted = requested()
    if not wanted:
        return BackportStatus(applied=(), problem=f"{ENV}=off")
    version = versions.installed_version()
    release = RELEASES.get(version or "")
    if release is None:
        return BackportStatus(applied=(), problem=f"vLLM {version} is not a release the backports were checked "
                                                   f"against ({', '.join(CHECKED)})")
    upstream = tuple(n for n in NAMES if n in release.upstream)
    here = tuple(n for n in wanted if n in release.targets)
    for name in here:
        problem = source_problem(name, release.targets)
        if problem:
            return BackportStatus(applied=(), problem=problem, release=version)
    return BackportStatus(applied=here, upstream=upstream, release=version)


@functools.cache
def apply() -> BackportStatus:
    """Apply what :func:`status` allows, once per process; never raises."""
    st = status()
    if st.problem:
        logger.info("specctl: model-runner backports off: %s; engines run their static speculative config", st.problem)
        return st
    try:
        if st.release == backports_v034.RELEASE:
            _install_v034(st)
        else:
            _install(st)
    except Exception as exc:  # noqa: BLE001 - a plugin must never break the process that loads it
        logger.warning("specctl: model-runner backports off: %s: %s", type(exc).__name__, exc)
        return BackportStatus(applied=(), problem=f"install failed: {type(exc).__name__}: {exc}")
    upstream = f"; in vLLM {st.release} itself: {', '.join(st.upstream)}" if st.upstream else ""
    logger.info("specctl: model-runner backports applied: %s%s", ", ".join(st.applied) or "none", upstream)
    if st.release == backports_v034.RELEASE and skip_draft_at_zero():
        logger.warning("specctl: %s=skip has no effect on vLLM %s: a K=0 step runs vLLM's own first drafter pass",
                       DRAFT_AT_ZERO_ENV, st.release)
    return st


def _install_v034(st: BackportStatus) -> None:
    import importlib

    if st.has("graph_widths"):
        owner, attr, original = _resolve(*backports_v034.WRAPPED["graph_widths"])
        setattr(owner, attr, backports_v034.wrap_query_lens(original, engine_widths))
    if st.has("honour_width"):
        module, name = backports_v034.DESCRIPTOR
        descriptor = getattr(importlib.import_module(module), name)
        owner, attr, original = _resolve(*backports_v034.WRAPPED["honour_width"])
        setattr(owner, attr, backports_v034.wrap_speculator_capture(original, engine_widths, descriptor))


def engine_widths(vllm_config: Any) -> tuple[int, ...] | None:
    """The width set of an engine the width backports serve (0.34), else None: an autoregressive drafter under the
    patch's scheduler, with no batch-size table (vLLM's to apply) and no adaptive verification (vLLM's graphs)."""
    spec = getattr(vllm_config, "speculative_config", None)
    k_max = int(getattr(vllm_config, "num_speculative_tokens", 0) or 0)
    if spec is None or k_max <= 0 or not uses_patch_scheduler(vllm_config):
        return None
    if getattr(spec, "num_speculative_tokens_per_batch_size", None) is not None \
            or getattr(spec, "enable_adaptive_verification", False):
        return None
    if not autoregressive(spec):
        return None
    return graph_widths(k_max)


def autoregressive(spec: Any) -> bool:
    """An autoregressive drafter the width set covers: by method, and from 0.34 (which names each drafter's
    class) by the class too, as ``method="mtp"`` also names multi-module MTP there."""
    if str(getattr(spec, "method", "") or "") not in AUTOREGRESSIVE_METHODS:
        return False
    try:
        cls = getattr(getattr(spec, "speculator_config", None), "speculator_class", None)
    except Exception:  # noqa: BLE001 - a property of vLLM's config that cannot resolve: not one we know
        return False
    return cls is None or cls in backports_v034.AUTOREGRESSIVE_SPECULATORS


def _install(st: BackportStatus) -> None:
    if st.has("drafter_graphs") or st.has("graph_widths") or st.has("full_graph_dispatch"):
        owner, attr, original = _resolve("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager._init_candidates")
        setattr(owner, attr, _wrap_init_candidates(original, st))
    if st.has("honour_width"):
        owner, attr, original = _resolve("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator",
                                         "AutoRegressiveSpeculator._multi_step_decode")
        setattr(owner, attr, _wrap_multi_step_decode(original))
        owner, attr, original = _resolve("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model")
        setattr(owner, attr, _wrap_execute_model(original))
        if skip_draft_at_zero():
            owner, attr, original = _resolve("vllm.v1.worker.gpu.spec_decode.autoregressive.speculator",
                                             "AutoRegressiveSpeculator.propose")
            setattr(owner, attr, _wrap_propose(original))


def skip_draft_at_zero(environ: dict[str, str] | None = None) -> bool:
    return load_graph_settings(environ).draft_at_zero == "skip"


def _wrap_propose(original: Callable) -> Callable:
    @functools.wraps(original)
    def propose(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, WIDTH_ATTR, None) == 0 and not kwargs.get("dummy_run", False):
            # the next step verifies no draft: leave the drafter idle (its KV cache misses these positions)
            return self.draft_tokens[: input_batch.num_reqs]
        return original(self, input_batch, *args, **kwargs)

    return propose


# -- candidates: drafter decode graphs, the width set, full graphs first -----------------------------------------
def uses_patch_scheduler(vllm_config: Any) -> bool:
    cls = getattr(getattr(vllm_config, "scheduler_config", None), "scheduler_cls", None)
    name = cls if isinstance(cls, str) else f"{getattr(cls, '__module__', '')}.{getattr(cls, '__name__', '')}"
    return bool(name) and name.startswith(SPECCTL_SCHEDULER_PREFIX)


def _table_for(manager: Any, st: BackportStatus) -> tuple[bool, Any]:
    """(replace the table during the build, the table to lend)."""
    spec = getattr(manager.vllm_config, "speculative_config", None)
    k_max = int(getattr(manager.vllm_config, "num_speculative_tokens", 0) or 0)
    if spec is None or k_max <= 0:
        return False, None
    table = getattr(spec, "num_speculative_tokens_per_batch_size", None)
    if manager.decode_query_len == 1 and k_max > 0:
        # the drafter's one-token decode manager: the table's K values are not its query lengths
        return (st.has("drafter_graphs") and table is not None), None
    if table is None and st.has("graph_widths") and uses_patch_scheduler(manager.vllm_config) \
            and str(getattr(spec, "method", "")) in AUTOREGRESSIVE_METHODS:
        return True, [(1, 1, w) for w in graph_widths(k_max)]
    return False, None


def _wrap_init_candidates(original: Callable, st: BackportStatus) -> Callable:
    @functools.wraps(original)
    def _init_candidates(self: Any) -> None:
        swap, lent = _table_for(self, st)
        spec = getattr(self.vllm_config, "speculative_config", None)
        if swap:
            held = spec.num_speculative_tokens_per_batch_size
            spec.num_speculative_tokens_per_batch_size = lent
            try:
                original(self)
            finally:
                spec.num_speculative_tokens_per_batch_size = held
        else:
            original(self)
        if st.has("full_graph_dispatch"):
            full_graphs_first(self._candidates, self._capture_descs)

    return _init_candidates


# -- the drafter honours the scheduled width ----------------------------------------------------------------------
WIDTH_ATTR = "_specctl_width"


def _wrap_execute_model(original: Callable) -> Callable:
    @functools.wraps(original)
    def execute_model(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        speculator = getattr(self, "speculator", None)
        if speculator is not None:
            dummy = kwargs.get("dummy_run", args[1] if len(args) > 1 else False)
            width = None if dummy else getattr(scheduler_output, "num_spec_tokens_to_schedule", None)
            setattr(speculator, WIDTH_ATTR, width)
        return original(self, scheduler_output, *args, **kwargs)

    return execute_model


def decode_passes(k_max: int, width: int | None) -> int:
    """``num_speculative_steps`` the drafter's decode loop should see: the scheduled width, at least 1."""
    if width is None or width >= k_max:
        return k_max
    return max(int(width), 1)


def _wrap_multi_step_decode(original: Callable) -> Callable:
    @functools.wraps(original)
    def _multi_step_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        k_max = self.num_speculative_steps
        steps = decode_passes(k_max, getattr(self, WIDTH_ATTR, None))
        if steps == k_max:
            return original(self, *args, **kwargs)
        self.num_speculative_steps = steps
        try:
            return original(self, *args, **kwargs)
        finally:
            self.num_speculative_steps = k_max

    return _multi_step_decode


def graph_shaped(vllm_config: Any) -> bool:
    """Whether this engine runs one width per step on captured full graphs: model runner V2 with full CUDA
    graphs, an autoregressive drafter, and the width backports applied."""
    st = apply()
    if not (st.provides("graph_widths") and st.provides("full_graph_dispatch")):
        return False
    try:
        # 0.34 has no V1 GPU runner (and no flag): V2 is the runner there
        if not getattr(vllm_config, "use_v2_model_runner", st.release == backports_v034.RELEASE):
            return False
        spec = vllm_config.speculative_config
        if getattr(spec, "enable_adaptive_verification", False):
            return False  # vLLM sizes each request's verify budget on variable-length graphs; the patch caps
        return autoregressive(spec) and getattr(spec, "num_speculative_tokens_per_batch_size", None) is None
    except AttributeError:
        return False
