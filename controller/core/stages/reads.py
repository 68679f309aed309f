"""The views and metric rows the service shows, computed from learned state at ``now``.

Reads only: acceptance and mix figures are aged to ``now`` on copies, so reading a category, an engine or the
metrics, however often, changes neither what was learned nor the policy an engine is served. A view's
decision is the one held for the model's most recently seen engine (:class:`Effective`), with the operator
overrides active at ``now`` applied as the engine gets them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.controller.core.learn.engines import EngineBook
from specctl_vllm.controller.core.learn.entropy import classify
from specctl_vllm.controller.core.learn.estimator import AcceptanceEstimator, expected_committed, wilson_interval
from specctl_vllm.controller.core.learn.learner import CategoryState, ModelState
from specctl_vllm.controller.core.overrides import Override
from specctl_vllm.controller.core.policy.types import Decision
from specctl_vllm.controller.core.views import (
    CategoryMetrics,
    CategoryView,
    DecisionView,
    EngineMetrics,
    EngineView,
    MethodCounters,
    MethodView,
    MetricsSnapshot,
    PositionView,
)
from specctl_vllm.kernel.drafters import is_model_free
from specctl_vllm.kernel.protocol import MAX_K, METHOD_OFF, CategoryPolicy, SpecConfig


@dataclass(frozen=True, kw_only=True)
class Effective:
    """The decision a view shows, and the category policies an engine of that shape is served for it."""

    decision: Decision
    default: CategoryPolicy
    categories: Mapping[str, CategoryPolicy]
    spec: SpecConfig

    @property
    def shape(self) -> str:
        return f"{self.spec.method}/{self.spec.k_max}"


def viewed_engine(engines: Mapping[str, EngineBook], model: str) -> tuple[EngineBook, SpecConfig] | None:
    """The engine whose decision a model's views show: its most recently seen one, and that engine's shape."""
    books = [b for b in engines.values() if b.model == model and b.last_seen is not None]
    if not books:
        return None
    b = max(books, key=lambda x: x.last_seen or 0.0)
    return b, SpecConfig(method=b.spec_method or METHOD_OFF, k_max=b.spec_k_max,
                         model_free_methods=list(b.model_free_methods), full_cuda_graphs=b.spec_full_cuda_graphs,
                         graph_widths=list(b.spec_graph_widths))


def aged_methods(st: CategoryState, now: float, half_life_s: float) -> dict[str, AcceptanceEstimator]:
    return {m: e.aged(now, half_life_s) for m, e in st.methods.items()}


def primary(methods: Mapping[str, AcceptanceEstimator]) -> tuple[str, AcceptanceEstimator] | None:
    """The drafter whose profile a category's top-level numbers describe: the most run, then the most scored."""
    if not methods:
        return None
    name = max(methods, key=lambda m: (methods[m].real_drafts, methods[m].cf_drafts))
    return name, methods[name]


def entropy(methods: Mapping[str, AcceptanceEstimator], cfg: BrainConfig) -> dict:
    """Entropy class from the drafter that predicts the category best (lowest surprise bits).

    A drafter can only be worse than the target's own distribution, so the best-accepted drafter with
    enough evidence is the closest view of how predictable the category is.
    """
    ls, need_ever = cfg.learner, cfg.policy.min_evidence
    best = None
    for method, est in methods.items():
        top = max(est.max_k, 1)
        ever = est.cum.drafts + est.cf_cum.drafts  # like the policy: evidence ever seen makes it known
        need = 0.0 if ever >= need_ever else need_ever
        c = classify(est.betas(top, ls.prior_mean, ls.prior_strength), [float(x) for x in est.reached[:top]], need)
        if best is None or (c.bits is not None and (best[1].bits is None or c.bits < best[1].bits)):
            best = (method, c)
    if best is None:
        return {**classify([], [], need_ever).to_dict(), "method": None}
    return {**best[1].to_dict(), "method": best[0] if best[1].bits is not None else None}


def method_view(method: str, est: AcceptanceEstimator, k: int, cfg: BrainConfig, z: float) -> MethodView:
    ls = cfg.learner
    top = max(k, est.max_k, 1)
    betas = est.betas(top, ls.prior_mean, ls.prior_strength)
    positions = []
    for i in range(top):
        r, a = float(est.reached[i]), float(est.accepted[i])
        lo, hi = wilson_interval(a, r, z)
        positions.append(PositionView(position=i + 1, beta=round(betas[i], 6), ci_low=round(lo, 6),
                                      ci_high=round(hi, 6), reached=round(r, 3), accepted=round(a, 3)))
    mal = est.mean_acceptance_length()
    free = is_model_free(method)
    return MethodView(
        method=method, counterfactual=est.cf_drafts > est.real_drafts, model_free=free,
        evidence=round(est.evidence, 3), real_drafts=round(est.real_drafts, 3),
        counterfactual_drafts=round(est.cf_drafts, 3), positions=tuple(positions),
        mean_acceptance_length=None if mal is None else round(mal, 6),
        acceptance_length_distribution=tuple(round(x, 6) for x in est.length_distribution()),
        expected_committed=tuple(round(x, 6) for x in expected_committed(betas[:k])), drafts_total=est.cum.drafts,
        accepted_tokens_total=est.cum.accepted_tokens,
        match_rate=round(est.match_rate(ls.prior_strength), 6) if free else 1.0, asks=round(est.attempts, 3))


def decision_view(category: str, eff: Effective | None, active: Mapping[str, Override]) -> DecisionView | None:
    if eff is None:
        return None
    decision = eff.decision
    d = decision.by_name().get(category, decision.default)
    cp = eff.categories.get(category, eff.default)
    ov = active.get(category)
    method = d.method if cp.source != "override" else cp.method
    if cp.source != "override" and cp.k == 0:
        method = METHOD_OFF
    return DecisionView(
        k=cp.k, method=method, source=cp.source, reason=cp.reason, estimated_speedup=d.speedup,
        expected_committed=d.expected_committed, adapt_k_min=cp.adapt.k_min, adapt_k_max=cp.adapt.k_max,
        probe_rate=cp.probe_rate, probe_k=cp.probe_k, best_method=d.best_method,
        best_method_speedup=d.best_method_speedup, batch_size=round(decision.batch_size, 4), engine_shape=eff.shape,
        goodput_table=tuple({"k": r.k, "method": r.method, "expected_committed": r.expected_committed,
                             "step_ms": r.step_ms, "goodput_tokens_per_s": r.goodput, "speedup": r.speedup}
                            for r in d.table),
        override=ov.to_dict() if ov else None, width=decision.width)


def category_view(ms: ModelState, category: str, now: float, eff: Effective | None, active: Mapping[str, Override],
                  cfg: BrainConfig, z: float) -> CategoryView:
    ls = cfg.learner
    st = ms.categories[category]
    k = eff.spec.k_max if eff else max((e.max_k for e in st.methods.values()), default=0)
    ests = aged_methods(st, now, ls.half_life_s)
    methods = tuple(method_view(m, e, k, cfg, z) for m, e in ests.items())
    top = primary(ests)
    top_view = next((v for v in methods if top and v.method == top[0]), None)
    share = ms.mix.aged(now, ls.mix_half_life_s).shares().get(category, 0.0)
    return CategoryView(
        model=ms.name, category=category, primary_method=top[0] if top else None,
        positions=top_view.positions if top_view else (),
        mean_acceptance_length=top_view.mean_acceptance_length if top_view else None,
        acceptance_length_distribution=top_view.acceptance_length_distribution if top_view else (),
        entropy=entropy(ests, cfg), requests_per_step=round(share, 6), request_steps=st.request_steps,
        committed_tokens=st.committed_tokens, spec_off_request_steps=st.spec_off_request_steps, methods=methods,
        decision=decision_view(category, eff, active))


def engine_view(b: EngineBook, now: float, mix_half_life_s: float) -> EngineView:
    mix = b.mix.aged(now, mix_half_life_s)
    bs = mix.batch_size
    return EngineView(
        engine_id=b.engine_id, model=b.model, boot_id=b.boot_id, spec_method=b.spec_method,
        spec_k_max=b.spec_k_max, model_free_methods=b.model_free_methods, last_seq=b.max_seq,
        batches=dict(b.outcomes), gaps=b.gaps, dropped_steps=b.dropped_steps, steps=b.steps,
        step_seconds=round(b.step_seconds, 6),
        last_seen_age_s=None if b.last_seen is None else max(0.0, now - b.last_seen),
        policy_version_served=b.policy_version_served, policy_version_reported=b.policy_version_reported,
        policy_age_s=None if b.policy_served_at is None else max(0.0, now - b.policy_served_at),
        batch_size=None if bs is None else round(bs, 4),
        category_mix={c: round(v, 6) for c, v in mix.shares().items()}, id_conflicts=b.id_conflicts,
        conflict_boot=b.conflict_boot or None,
        last_conflict_age_s=None if b.conflict_at is None else max(0.0, now - b.conflict_at),
        graph_widths=b.spec_graph_widths, width_steps={str(w): n for w, n in sorted(b.width_steps.items())})


def engine_metrics(b: EngineBook, now: float) -> EngineMetrics:
    return EngineMetrics(engine=b.engine_id, model=b.model, batches=dict(b.outcomes), gaps=b.gaps,
                         dropped_steps=b.dropped_steps,
                         policy_age_s=None if b.policy_served_at is None else max(0.0, now - b.policy_served_at),
                         steps=b.steps, step_seconds=b.step_seconds, id_conflicts=b.id_conflicts,
                         width_steps=tuple(sorted(b.width_steps.items())))


def model_metrics(ms: ModelState, engines: Mapping[str, EngineBook], eff: Effective | None,
                  active: Mapping[str, Override], now: float, cfg: BrainConfig) -> tuple[list, list, list, list]:
    """(method counters, category rows, draft cost ratios, match rates) of one model."""
    ls = cfg.learner
    methods: list[MethodCounters] = []
    cats: list[CategoryMetrics] = []
    matches: list[tuple[str, str, str, float]] = []
    model = ms.name
    for name, st in ms.categories.items():
        lengths = [0] * (MAX_K + 1)
        accepted = 0
        ests = aged_methods(st, now, ls.half_life_s)
        for m, est in ests.items():
            if est.attempts > 0 and is_model_free(m):
                matches.append((model, name, m, round(est.match_rate(ls.prior_strength), 6)))
            for cf, cum in ((False, est.cum), (True, est.cf_cum)):
                if cum.drafts == 0:
                    continue
                top = max(i for i, v in enumerate(cum.lengths) if v) if any(cum.lengths) else 0
                methods.append(MethodCounters(
                    model=model, category=name, method=m, counterfactual=cf, drafts=cum.drafts,
                    draft_tokens=cum.draft_tokens, accepted_tokens=cum.accepted_tokens,
                    accepted_per_pos=tuple(cum.per_pos[: max(top, 1)]), accepted_length_counts=tuple(cum.lengths[: top + 1])))
                if not cf:
                    for j, v in enumerate(cum.lengths):
                        lengths[j] += v
                    accepted += cum.accepted_tokens
        cats.append(category_metrics(ms, name, st, ests, lengths, accepted, eff, active, cfg))
    known = set(ms.methods()) | {b.spec_method for b in engines.values()
                                 if b.model == model and b.spec_method not in ("", METHOD_OFF)}
    coef = ms.cost.coefficients()
    ratios = [(model, m, r) for m in sorted(known) if (r := cost_ratio(coef, m)) is not None]
    return methods, cats, ratios, matches


def category_metrics(ms: ModelState, name: str, st: CategoryState, ests: Mapping[str, AcceptanceEstimator],
                     lengths: list[int], accepted: int, eff: Effective | None, active: Mapping[str, Override],
                     cfg: BrainConfig) -> CategoryMetrics:
    # the viewed engine's k_max, but never above the K the model is charged at: that engine may have posted
    # to a model state since forgotten (the new one charged only at its own engines' k_max), or come from a
    # snapshot written while it raised its k_max; its positions would export series nothing paid for
    k_view = min(eff.spec.k_max, ms.charged_k) if eff else 0
    top = max(max((i for i, v in enumerate(lengths) if v), default=0), k_view)
    first = primary(ests)
    ent = entropy(ests, cfg)
    ls = cfg.learner
    betas: tuple[float, ...] = ()
    mal = None
    if first is not None:
        est = first[1]
        betas = tuple(round(b, 6) for b in est.betas(max(k_view, est.max_k, 1), ls.prior_mean, ls.prior_strength))
        mal = est.mean_acceptance_length()
    dv = decision_view(name, eff, active)
    return CategoryMetrics(
        model=ms.name, category=name, request_steps=st.request_steps, committed_tokens=st.committed_tokens,
        spec_off_request_steps=st.spec_off_request_steps, accepted_length_counts=tuple(lengths[: top + 1]),
        accepted_tokens=accepted, current_k=dv.k if dv else None, method=dv.method if dv else None,
        source=dv.source if dv else None, entropy_class=ent["class"], entropy_bits=ent["bits"],
        mean_acceptance_length=mal, conditional_acceptance=betas,
        estimated_speedup=dv.estimated_speedup if dv else None, best_method=dv.best_method if dv else None)


def metrics_snapshot(rows: list[tuple[list, list, list, list]], engines: Mapping[str, EngineBook],
                     active: Mapping[str, Override], now: float, **counters) -> MetricsSnapshot:
    """A scrape's snapshot from the models' rows (:func:`model_metrics`), the engines and the Brain's counters."""
    return MetricsSnapshot(
        methods=tuple(x for r in rows for x in r[0]), categories=tuple(x for r in rows for x in r[1]),
        engines=tuple(engine_metrics(b, now) for b in engines.values()),
        draft_cost_ratio=tuple(x for r in rows for x in r[2]),
        overrides=tuple((c, kind) for c, ov in sorted(active.items()) for kind in ov.kinds),
        match_rates=tuple(x for r in rows for x in r[3]), **counters)


def cost_ratio(coef, method: str) -> float | None:
    """The drafter's cost ratio for the metrics, None where the fitted plain step costs nothing (no ratio)."""
    try:
        ratio = coef.draft_cost_ratio(method)
    except ZeroDivisionError:
        return None
    return round(ratio, 6) if math.isfinite(ratio) else None
