"""The decision per engine shape: when it is due, and what is served when it cannot be computed.

A decision is :func:`specctl_vllm.controller.core.policy.goodput.decide` on the engine's snapshot, or, for a
graph-shaped engine (``graph_widths``), :func:`specctl_vllm.controller.core.policy.graph.decide`: such an engine
picks each step's width itself, so its decision caps every category at the engine's k_max and reports the width
the engine's rule is forecast to pick from the cell table and curves it is sent. It is cached per engine
shape (:func:`key`) for the engine's own refresh period (:func:`refresh_interval`) unless the model's
signature changes (a new category, a drafter that just became usable). A decision that raises or comes out
unsound (a non-finite figure, a policy the wire refuses) is not served: the last good one is, else the
engine's static config (:func:`static_decision`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache

from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.controller.core.learn.engines import EngineBook
from specctl_vllm.controller.core.learn.learner import ModelState
from specctl_vllm.controller.core.policy import goodput, graph
from specctl_vllm.controller.core.policy.types import CategoryDecision, Decision, PolicySnapshot
from specctl_vllm.controller.core.stages.snapshot import policy_snapshot
from specctl_vllm.controller.core.stages.wire import category_policy, graph_inputs
from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.model.cells import CellView
from specctl_vllm.kernel.model.widths import COLD_BETA, TokenBudget, geometric_lengths, steady_regime
from specctl_vllm.kernel.protocol import METHOD_OFF, SpecConfig, StepCells

Key = tuple[str, str, int, tuple[str, ...], str, bool, tuple[int, ...]]


@dataclass
class Cached:
    computed_at: float
    decision: Decision
    signature: tuple[int, int]


def key(model: str, spec: SpecConfig, engine_id: str | None) -> Key:
    return (model, spec.method, spec.k_max, tuple(sorted(set(spec.model_free_methods))), engine_id or "",
            spec.full_cuda_graphs, tuple(spec.graph_widths))


@lru_cache(maxsize=8192)  # asked twice a post; a pure function of the engine's key
def refresh_interval(key: Key, interval_s: float) -> float:
    """This engine's decision period: ``interval_s`` times a fixed factor in [0.75, 1.25) drawn from its key.

    Engines started together would otherwise have their decisions fall due in the same instant, every
    interval, and posts queue behind them (load benchmark: p99 89 ms with 64 engines); with periods that
    differ per engine the refreshes drift apart and spread over the interval.
    """
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return interval_s * (0.75 + 0.5 * int.from_bytes(digest, "big") / 2.0**64)


def is_fresh(cached: Cached | None, key: Key, now: float, interval_s: float, signature: tuple[int, int]) -> bool:
    return cached is not None and 0 <= now - cached.computed_at < refresh_interval(key, interval_s) \
        and cached.signature == signature


def signature(ms: ModelState | None, min_evidence: float) -> tuple[int, int]:
    """(categories, drafters with enough evidence): when it changes the cached decision is stale at once
    (a new category, or a drafter that just became usable, should not wait for the interval)."""
    if ms is None:
        return (0, 0)
    usable = sum(1 for st in ms.categories.values() for e in st.methods.values()
                 if e.cum.drafts + e.cf_cum.drafts >= min_evidence)
    return (len(ms.categories), usable)


def compute(ms: ModelState | None, book: EngineBook | None, spec: SpecConfig, now: float,
            previous: Decision | None, config: BrainConfig, preset: CostCoefficients
            ) -> tuple[Decision | None, str | None]:
    """The policy's decision on this engine's snapshot, and why it cannot be served (None when it can)."""
    try:
        snap = policy_snapshot(ms, book, spec, now, previous, config.learner, preset)
        decision = _graph_decision(snap, ms, spec, config, preset) if spec.graph_widths else None
        if decision is None:
            decision = goodput.decide(snap, config.policy)
        return decision, unsound(decision, spec)
    except Exception as exc:  # noqa: BLE001 -- no learned state may make a later request fail
        return None, f"{type(exc).__name__}: {exc}"


def _graph_decision(snap: PolicySnapshot, ms: ModelState | None, spec: SpecConfig, config: BrainConfig,
                    preset: CostCoefficients) -> Decision | None:
    """The graph policy's decision, its forecast width computed from exactly what the engine is sent (rounded
    cells, quantised step counts, rounded curves: the margin depends on the counts); None where the engine gets
    no cells (it then runs its static width, and the batch model's decision is as good a description as any)."""
    cells, curves = graph_inputs(ms, spec, preset, config.learner)
    if cells is None:
        return None
    return graph.decide(snap, cell_view(cells), curves, geometric_lengths(COLD_BETA, spec.k_max),
                        measured_budget(ms, spec, round(snap.batch_size)))


def measured_budget(ms: ModelState | None, spec: SpecConfig, batch: int) -> TokenBudget | None:
    """What the engine's own width rule prices this batch with beside the cells: the steady-step model's
    reading of the steps this engine's budget saw, where the widest width could fill it. Reads only."""
    meter = ms.budget_meter(spec.token_budget) if ms is not None and spec.token_budget else None
    reading = meter.current() if meter is not None else None
    return reading if reading is not None and steady_regime(batch, spec.graph_widths[-1], reading) else None


def cell_view(cells: StepCells) -> CellView:
    return CellView(batch_edges=tuple(cells.batch_edges), widths=tuple(cells.widths),
                    step_s=tuple(tuple(r) for r in cells.step_s), steps=tuple(tuple(r) for r in cells.steps))


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def unsound(decision: Decision, spec: SpecConfig) -> str | None:
    """Why a computed decision cannot be served (a non-finite number, a policy the wire refuses), else None."""
    if not _finite(decision.batch_size, decision.goodput, decision.plain_goodput, decision.step_ms,
                   decision.plain_step_ms):
        return "non-finite batch figures"
    for d in (*decision.categories, decision.default):
        if not _finite(d.expected_committed, d.speedup, d.probe_rate, d.best_method_speedup) or not all(
                _finite(r.expected_committed, r.step_ms, r.goodput, r.speedup) for r in d.table):
            return f"non-finite figures for category {d.name!r}"
        try:
            category_policy(d, spec)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            return f"category {d.name!r}: {str(exc)[:200]}"
    return None


def static_decision(spec: SpecConfig, problem: str) -> Decision:
    """What the engine would run without a controller (its own drafter at its k_max), as a decision."""
    k = spec.k_max if spec.method != METHOD_OFF else 0
    method = spec.method if k else METHOD_OFF
    default = CategoryDecision(
        name="default", k=k, method=method, source="default",
        reason=f"decision could not be computed ({problem[:200]}): the engine's static config",
        expected_committed=1.0, speedup=1.0, adapt_k_min=k, adapt_k_max=k)
    return Decision(categories=(), default=default, batch_size=1.0, goodput=0.0, plain_goodput=0.0, step_ms=0.0,
                    plain_step_ms=0.0)
