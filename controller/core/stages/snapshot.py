"""Learned state -> the policy's input: one :class:`PolicySnapshot` per (model, engine shape), at ``now``.

A read: acceptance and mix figures are aged to ``now`` on copies (:meth:`Decayed.aged`), so building a
snapshot, however often, leaves what was learned as it was. The snapshot is tailored to the asking engine:
its k_max, its drafters, its own batch mix when it has reported one (else the model's), the cost model's
depth factors and mixed-k penalty at that engine's batch size.
"""

from __future__ import annotations

from specctl_vllm.controller.core.config import LearnerSettings
from specctl_vllm.controller.core.learn.cost_fit import corrections
from specctl_vllm.controller.core.learn.engines import EngineBook
from specctl_vllm.controller.core.learn.estimator import AcceptanceEstimator
from specctl_vllm.controller.core.learn.learner import ModelState
from specctl_vllm.controller.core.policy.types import CategoryInput, Choice, Decision, MethodProfile, PolicySnapshot
from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.drafters import is_model_free
from specctl_vllm.kernel.protocol import METHOD_ENGINE, METHOD_OFF, SpecConfig


def engine_methods(spec: SpecConfig) -> tuple[str, ...]:
    """The drafters an engine can run: its own (with k_max > 0), then the model-free ones it computes."""
    out: list[str] = []
    if spec.method != METHOD_OFF and spec.k_max > 0:
        out.append(spec.method)
    for m in spec.model_free_methods:
        if m not in out and m not in (METHOD_OFF, METHOD_ENGINE):
            out.append(m)
    return tuple(out)


def method_profile(method: str, est: AcceptanceEstimator, k: int, ls: LearnerSettings) -> MethodProfile:
    free = is_model_free(method)
    return MethodProfile(method, tuple(est.betas(max(k, 1), ls.prior_mean, ls.prior_strength)), est.evidence,
                         est.cf_drafts > est.real_drafts, free, float(est.cum.drafts + est.cf_cum.drafts),
                         est.match_rate(ls.prior_strength) if free else 1.0)


def category_profiles(ms: ModelState, category: str, k: int, now: float, ls: LearnerSettings
                      ) -> tuple[MethodProfile, ...]:
    return tuple(method_profile(method, est.aged(now, ls.half_life_s), k, ls)
                 for method, est in ms.categories[category].methods.items())


def policy_snapshot(ms: ModelState | None, book: EngineBook | None, spec: SpecConfig, now: float,
                    previous: Decision | None, ls: LearnerSettings, preset: CostCoefficients) -> PolicySnapshot:
    methods = engine_methods(spec)
    cost = ms.cost.coefficients() if ms else preset
    if ms is None:
        return PolicySnapshot((), (), 1.0, 0.0, cost, spec.k_max, spec.method, methods, prior_acceptance=ls.prior_mean)
    mix = (book.mix if book is not None and book.mix.batch_size else ms.mix).aged(now, ls.mix_half_life_s)
    batch_size = mix.batch_size or 1.0
    shares = mix.shares()
    committed = mix.committed_shares()
    prev = previous.by_name() if previous else {}
    cats = []
    for name in ms.categories:
        p = prev.get(name)
        choice = Choice(p.k, p.method) if p is not None and p.source in ("policy", "probe") else None
        cats.append(CategoryInput(name, shares.get(name, 0.0), category_profiles(ms, name, spec.k_max, now, ls),
                                  choice, committed.get(name, 0.0)))
    pooled = tuple(method_profile(m, ms.pooled(m, now, ls.half_life_s), spec.k_max, ls) for m in ms.methods())
    prev_default = None
    if previous is not None and previous.default.source == "default":
        prev_default = Choice(previous.default.k, previous.default.method)
    corr = corrections(ms.cost, batch_size, spec.k_max, spec.full_cuda_graphs)
    return PolicySnapshot(tuple(cats), pooled, batch_size, mix.extra_per_step, cost, spec.k_max, spec.method,
                          methods, prev_default, mix.extra_distribution(), mix.extra_per_committed, corr.depth_factor,
                          corr.mixed_penalty, ls.prior_mean)
