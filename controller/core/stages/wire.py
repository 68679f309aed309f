"""A decision -> the :class:`Policy` an engine acts on.

Per category the decided k, drafter (named on the wire by :func:`specctl_vllm.kernel.drafters.to_wire`) and adaptation
band, clamped to the engine's k_max; active operator overrides applied on top; for graph-shaped engines the
step-cost cell table and each category's E_c(K) curve, rounded so that noise alone does not make a new policy
version at every refresh. Pure functions: :func:`serve` is given the version counter and the policy served
before, and bumps the version only when :func:`content`, what an engine acts on, changes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings
from specctl_vllm.controller.core.learn.learner import ModelState
from specctl_vllm.controller.core.overrides import Override
from specctl_vllm.controller.core.policy.types import CategoryDecision, Decision
from specctl_vllm.controller.core.stages.snapshot import engine_methods
from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.drafters import to_wire
from specctl_vllm.kernel.model.widths import expected_lengths
from specctl_vllm.kernel.protocol import (
    CATEGORY_PATTERN,
    METHOD_ENGINE,
    METHOD_OFF,
    AdaptRule,
    CategoryPolicy,
    Policy,
    SpecConfig,
    StepCells,
)

WIRE_NAME = re.compile(CATEGORY_PATTERN)
MAX_POLICY_CATEGORIES = 1024


@dataclass(frozen=True)
class Served:
    content: tuple
    policy: Policy
    basis: tuple = ()  # what the policy was last wired from, see same_basis


def same_basis(held: tuple, basis: tuple) -> bool:
    """Whether a policy was wired from this very decision, these active overrides and this engine shape.

    The wire form is a function of exactly these (the key holds the rest of the engine shape), so it would
    come out the same: rebuilding and comparing it on every post cost more than the rest of the answer.
    Decisions are compared by identity: a cached decision stays the same object until it is recomputed.
    """
    return bool(held) and held[0] is basis[0] and held[1:] == basis[1:]


def serve(held: Served | None, decision: Decision, spec: SpecConfig, now: float, active: dict[str, Override],
          ms: ModelState | None, preset: CostCoefficients, config: BrainConfig, version: int) -> tuple[Served, int]:
    """The policy an engine gets for ``decision`` and the version counter after it: ``held`` (the policy served
    before) while it was wired from the same basis or says the same, else a new policy at ``version + 1``."""
    cells, curves = graph_inputs(ms, spec, preset, config.learner)
    graph_basis = (cells.model_dump_json() if cells is not None else None, tuple(sorted(
        (n, tuple(c)) for n, c in curves.items())))
    basis = (decision, tuple(active.values()), tuple(spec.model_free_methods), graph_basis)
    if held is not None and same_basis(held.basis, basis):
        return held, version
    default, cats = category_policies(decision, spec, active, curves)
    ttl_s = config.policy.ttl_s
    wired = (ttl_s, content(default), tuple(sorted((n, content(p)) for n, p in cats.items())), graph_basis)
    if held is not None and held.content == wired:
        return Served(wired, held.policy, basis), version
    policy = Policy(version=version + 1, issued_at=now, ttl_s=ttl_s, default=default, categories=cats,
                    step_cells=cells)
    return Served(wired, policy, basis), version + 1


def graph_inputs(ms: ModelState | None, spec: SpecConfig, preset: CostCoefficients, ls: LearnerSettings
                 ) -> tuple[StepCells | None, dict[str, list[float]]]:
    """Graph-shaped engines: the cell table and E_c(K) per category (rounded). Reads only."""
    if ms is None or not spec.graph_widths:
        return None, {}
    try:
        view = ms.cells.view(spec.graph_widths, preset)
        cells = StepCells(batch_edges=list(view.batch_edges), widths=list(view.widths),
                          step_s=[[_round_sig(x) for x in row] for row in view.step_s],
                          steps=[[_quantize_steps(c) for c in row] for row in view.steps])
        curves: dict[str, list[float]] = {}
        for name, st in ms.categories.items():
            est = st.methods.get(spec.method)
            if est is not None and WIRE_NAME.match(name):
                betas = est.betas(max(spec.k_max, 1), ls.prior_mean, ls.prior_strength)
                curves[name] = [round(e, 2) for e in expected_lengths(betas, spec.k_max)]
        return cells, curves
    except (ValueError, ArithmeticError):  # validated inputs cannot get here; the engine then runs its own k
        return None, {}


def category_policy(d: CategoryDecision, spec: SpecConfig) -> CategoryPolicy:
    k = min(d.k, spec.k_max)
    if k == 0:
        method = to_wire(d.probe_method, spec.method) if d.probe_rate > 0 else METHOD_OFF
        adapt = AdaptRule(k_min=0, k_max=0)
    else:
        method = to_wire(d.method, spec.method)
        lo, hi = min(d.adapt_k_min, k), min(max(d.adapt_k_max, k), spec.k_max)
        adapt = AdaptRule(k_min=lo, k_max=hi)
    probe_rate = min(d.probe_rate, 0.25) if k == 0 else 0.0
    return CategoryPolicy(k=k, method=method, adapt=adapt, probe_rate=probe_rate,
                          probe_k=min(d.probe_k, spec.k_max) if probe_rate > 0 else 0,
                          source=d.source if d.source in ("policy", "probe", "default") else "policy",
                          reason=d.reason[:512])


def category_policies(decision: Decision, spec: SpecConfig, active: dict[str, Override],
                      curves: dict[str, list[float]]) -> tuple[CategoryPolicy, dict[str, CategoryPolicy]]:
    """(default, per category) as the engine gets them, overrides applied."""
    default = category_policy(decision.default, spec)
    cats: dict[str, CategoryPolicy] = {}
    for d in decision.categories:
        if WIRE_NAME.match(d.name):  # the overflow bucket is no engine's category: those use the default
            cats[d.name] = category_policy(d, spec)
            if d.name in curves:
                cats[d.name] = cats[d.name].model_copy(update={"expected": curves[d.name]})
    for name, ov in active.items():
        if name in cats or len(cats) < MAX_POLICY_CATEGORIES:
            cats[name] = apply_override(cats.get(name, default), ov, spec)
    return default, cats


def content(p: CategoryPolicy) -> tuple:
    """What an engine acts on (the reason text is not part of the version)."""
    return (p.k, p.method, p.adapt.k_min, p.adapt.k_max, p.adapt.drop_after, p.adapt.climb_after, p.probe_rate,
            p.probe_k, p.source)


def apply_override(base: CategoryPolicy, ov: Override, spec: SpecConfig) -> CategoryPolicy:
    who = f" by {ov.actor}" if ov.actor else ""
    why = f": {ov.reason}" if ov.reason else ""
    if ov.off or spec.k_max == 0:
        reason = f"override{who}: speculation off{why}" if ov.off else f"override{who}: engine has k_max=0{why}"
        return CategoryPolicy(k=0, method=METHOD_OFF, adapt=AdaptRule(k_min=0, k_max=0), source="override",
                              reason=reason[:512], expected=base.expected)
    available = set(engine_methods(spec)) | {METHOD_ENGINE}
    method = base.method
    note = ""
    if ov.method is not None:
        pinned = to_wire(ov.method, spec.method)
        if pinned in available:
            method = pinned
        else:
            note = f" (pinned method {ov.method!r} not available on this engine; kept {method!r})"
    if method == METHOD_OFF:
        method = METHOD_ENGINE if spec.method != METHOD_OFF else next(iter(engine_methods(spec)), METHOD_OFF)
    if ov.k is not None:
        k = min(ov.k, spec.k_max)
        adapt = AdaptRule(k_min=k, k_max=k)
        what = f"k={k}"
    else:
        k = base.k if base.k > 0 else 1
        adapt = base.adapt if base.k > 0 and base.method == method else AdaptRule(k_min=k, k_max=k)
        what = f"method={method}"
    if k == 0:
        method = METHOD_OFF
    reason = f"override{who}: {what}{why}{note}"
    return CategoryPolicy(k=k, method=method, adapt=adapt, source="override", reason=reason[:512],
                          expected=base.expected)


def _round_sig(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}")


def _quantize_steps(c: float) -> float:
    """Measured steps rounded down to a power of two: the width rule's margin changes little between them."""
    return 0.0 if c < 1 else float(2 ** int(math.log2(c)))
