"""What-if estimates for ``specctl replay``: the goodput recorded work would get under another policy.

Pure functions on plain data (no I/O, no clock). Inputs are recorded telemetry (``TelemetryBatch``) and,
where available, request token traces (prompt and output token ids of finished requests).

Work model (closed loop, the recording's batch size ``B``). Greedy outputs do not depend on the
speculative policy, so the work is fixed: category ``c`` committed ``C_c`` tokens and the engine
prefilled ``P`` tokens. A policy gives each category a proposal length ``k_c`` and drafter ``m_c``, which
fix two per-request-step figures:

    E_c = committed tokens per request step,     D_c = draft tokens verified per request step

Then the request steps are ``R_c = C_c / E_c``, the engine steps ``S = sum_c R_c / B``, and one mean step
schedules ``N = (P + sum_c R_c (1 + D_c)) / S`` tokens and ``F = sum_{c on a model-free drafter} R_c D_c / S``
model-free draft tokens (:func:`step_load`). The goodput is the policy's own closed-loop batch model
(:class:`specctl_vllm.controller.core.model.batch.BatchModel`): category c holds ``n_c = B R_c / sum R`` of the slots,
prefill rides along at ``P / sum C`` tokens per committed token, the model-drafting depth of a step is
distributed as the policy assumes (``P(d <= x) = (share of requests at depth <= x) ** B``), and ``T`` is the
step-cost model (:mod:`specctl_vllm.kernel.cost`, fitted to the recorded step timings, pulled toward a preset):

    goodput = sum_c C_c / (S * E[T(B, N, d, F)])          per category: E_c / E[T]  (tokens/s of one request)

so a row of ``specctl replay`` is what the policy itself would have predicted for it; the hindsight oracle
is the policy's search (:mod:`specctl_vllm.controller.core.model.search`) over the same model.

Where ``E`` and ``D`` come from:
  * request token traces (:mod:`specctl_vllm.controller.core.offline.token_traces`, exact for model-free drafters): the
    speculative loop is re-run on each request's real tokens -- propose with the drafter, accept the common
    prefix with what the target produced, commit accepted + 1 -- so steps and drafted tokens are counted,
    not modelled (prefix-consistent proposers: n-gram prompt lookup, suffix matching);
  * telemetry alone: ``E(k) = 1 + rho * sum_{i<=k} prod_{j<=i} beta_j`` and ``D(k) = rho * k`` with the
    per-position conditional acceptance ``beta`` of :mod:`specctl_vllm.controller.core.learn.estimator` (real and
    counterfactual histograms pooled) and ``rho`` the drafter's match rate, its asks that drafted, pooled
    over real runs and counterfactual tries as the policy's learner pools them (:func:`acceptance`; 1 only
    for a recording that does not report counterfactual tries: optimistic).

Graph-shaped engines (the recording's ``spec.graph_widths`` non-empty) verify one width K for every request of a
step, and a step costs its (batch bucket, K) cell: for them the rows are priced in :mod:`.whatif_graph` by the
cell table learned from the recording, through the width rule's own table
(:func:`specctl_vllm.kernel.model.widths.plan_widths`), with the recorded request mix:
``goodput(K) = sum_c n_c E_c(K) / T(B, K)``. Prefill steps are not in the cells and not in that figure.

Trade-offs: one mean step stands for all (exact when the cost is linear in tokens, as on a CPU; an
approximation around a GPU's knee); per-request adaptation inside the engine is not modelled (a policy's
starting k stands for its requests); probing is ignored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from specctl_vllm.controller.core.learn.cost_fit import NO_CORRECTIONS, Corrections, OnlineCostModel
from specctl_vllm.controller.core.learn.estimator import AcceptanceEstimator
from specctl_vllm.controller.core.model.batch import BatchModel, Options, Prefill
from specctl_vllm.controller.core.model.search import search
from specctl_vllm.controller.core.offline.token_traces import OFF, Profile
from specctl_vllm.kernel.cost import CostCoefficients, step_kind, step_shape
from specctl_vllm.kernel.drafters import is_model_free, resolve
from specctl_vllm.kernel.protocol import METHOD_OFF, TelemetryBatch


@dataclass(frozen=True)
class Workload:
    """What the recording did, independent of the policy."""

    committed: Mapping[str, float]  # C_c: tokens committed per category
    prefill_tokens: float  # P
    batch_size: float  # B: mean requests per busy step
    steps: int  # busy steps recorded
    step_seconds: float  # their summed wall time
    recorded: Mapping[str, Profile] = field(default_factory=dict)  # E, D as they ran

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(sorted(self.committed))

    @property
    def measured_goodput(self) -> float:
        """Committed tokens per second of engine step time, as recorded."""
        return sum(self.committed.values()) / self.step_seconds if self.step_seconds > 0 else 0.0


@dataclass(frozen=True)
class Estimate:
    goodput: float  # committed tokens / s, whole batch
    step_ms: float  # mean step time
    per_category: Mapping[str, float]  # E_c / T: tokens / s of one request of the category while it decodes


# --- telemetry ---------------------------------------------------------------------------------------------
def _engine_method(batches: Sequence[TelemetryBatch]) -> str:
    return batches[-1].spec.method if batches else METHOD_OFF


def workload_from_telemetry(batches: Sequence[TelemetryBatch]) -> Workload:
    """Committed tokens per category, prefill tokens, batch size and the E/D each category ran with."""
    engine = _engine_method(batches)
    committed: dict[str, float] = defaultdict(float)
    req_steps: dict[str, float] = defaultdict(float)
    drafted: dict[str, float] = defaultdict(float)
    methods: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    prefill = seconds = 0.0
    busy = requests = 0
    for b in batches:
        for st in b.steps:
            if st.batch_size <= 0:
                continue
            busy += 1
            requests += st.batch_size
            seconds += st.wall_s
            prefill += max(0, st.scheduled_tokens - st.batch_size - st.draft_tokens)
            for cs in st.categories:
                acc = sum(h.accepted_tokens for h in cs.hists)
                committed[cs.category] += cs.requests + acc
                req_steps[cs.category] += cs.requests
                drafted[cs.category] += sum(h.draft_tokens for h in cs.hists)
                methods[cs.category][resolve(cs.method, engine)] += cs.requests
    recorded = {}
    for c, r in req_steps.items():
        if r > 0:
            top = max(methods[c].items(), key=lambda kv: kv[1])[0]
            recorded[c] = Profile(top, 0, committed[c] / r, drafted[c] / r, "recorded")
    return Workload(dict(committed), prefill, requests / busy if busy else 1.0, busy, seconds, recorded)


def acceptance(batches: Sequence[TelemetryBatch]) -> tuple[dict[str, dict[str, AcceptanceEstimator]],
                                                           dict[str, dict[str, float]]]:
    """Undecayed per-(category, method) estimators (real + counterfactual) and match rates.

    The match rate pools asks and hits as the controller's learner does: a real run asks the drafter once per
    request step and hits on the requests that drafted; a counterfactual score asks it
    ``counterfactual_attempts`` times and hits on the drafts scored. A drafter never asked (a recording
    without ``counterfactual_attempts``) has no rate: priced as drafting on every ask (optimistic)."""
    engine = _engine_method(batches)
    est: dict[str, dict[str, AcceptanceEstimator]] = defaultdict(dict)
    asks: dict[tuple[str, str], float] = defaultdict(float)
    hits: dict[tuple[str, str], float] = defaultdict(float)
    for b in batches:
        for st in b.steps:
            for cs in st.categories:
                m = resolve(cs.method, engine)
                entries = [(m, False, cs.hists) if m != METHOD_OFF else None]
                entries += [(cm, True, hs) for cm, hs in cs.counterfactual.items()]
                if m != METHOD_OFF:
                    asks[(cs.category, m)] += cs.requests
                    hits[(cs.category, m)] += sum(h.drafts for h in cs.hists)
                for cm, tried in cs.counterfactual_attempts.items():
                    asks[(cs.category, cm)] += tried
                    hits[(cs.category, cm)] += sum(h.drafts for h in cs.counterfactual.get(cm, ()))
                for entry in entries:
                    if entry is None or not entry[2]:
                        continue
                    method, cf, hs = entry
                    e = est[cs.category].get(method)
                    if e is None:
                        e = est[cs.category][method] = AcceptanceEstimator()
                    for h in hs:
                        e.add(h.k, list(h.accepted), cf)
    rates: dict[str, dict[str, float]] = defaultdict(dict)
    for (c, m), a in asks.items():
        if a > 0:
            rates[c][m] = min(1.0, hits[(c, m)] / a)
    return dict(est), dict(rates)


def telemetry_profiles(batches: Sequence[TelemetryBatch], ks: Sequence[int], prior_mean: float = 0.5,
                       prior_strength: float = 4.0) -> dict[str, dict[tuple[str, int], Profile]]:
    est, rates = acceptance(batches)
    k_cap = max(ks, default=0)
    out: dict[str, dict[tuple[str, int], Profile]] = {}
    for c, per in est.items():
        out[c] = {}
        for m, e in per.items():
            if e.evidence <= 0:
                continue
            betas = np.asarray(e.betas(k_cap, prior_mean, prior_strength))
            rho = rates.get(c, {}).get(m, 1.0)
            cum = np.concatenate([[0.0], np.cumsum(np.cumprod(betas))])
            for k in ks:
                out[c][(m, k)] = Profile(m, k, 1.0 + rho * float(cum[k]), rho * k, "telemetry")
    return out


def fit_cost_model(batches: Sequence[TelemetryBatch], preset: CostCoefficients, prior_strength: float = 10.0
                   ) -> OnlineCostModel:
    """The controller's online step-cost fit over every recorded step (no forgetting), pulled toward ``preset``:
    its coefficients and its :func:`~specctl_vllm.controller.core.learn.cost_fit.corrections`."""
    model = OnlineCostModel(preset, prior_strength)
    for b in batches:
        model.add_many([(*step_shape(st, b.spec.method), st.wall_s, step_kind(st)) for st in b.steps
                        if st.batch_size > 0])
    return model


def fit_cost(batches: Sequence[TelemetryBatch], preset: CostCoefficients, prior_strength: float = 10.0
             ) -> CostCoefficients:
    """The coefficients of :func:`fit_cost_model`."""
    return fit_cost_model(batches, preset, prior_strength).coefficients()


def merge_profiles(primary: Mapping[str, Mapping[tuple[str, int], Profile]],
                   fallback: Mapping[str, Mapping[tuple[str, int], Profile]]) -> dict[str, dict[tuple[str, int], Profile]]:
    """Per category, ``primary`` (token traces) where it has the (method, k), else ``fallback`` (telemetry)."""
    out: dict[str, dict[tuple[str, int], Profile]] = {}
    for c in set(primary) | set(fallback):
        merged = dict(fallback.get(c, {}))
        merged.update(primary.get(c, {}))
        out[c] = merged
    return out


# --- the estimate ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepLoad:
    """The mean engine step of the recorded work under one choice (the work's accounting, e.g. to fit a cost)."""

    steps: float  # S: engine steps for the whole work
    batch_size: float  # B
    tokens: float  # N: scheduled tokens per step
    free: float  # F: model-free draft tokens per step
    request_steps: Mapping[str, float]  # R_c


def step_load(work: Workload, choice: Mapping[str, Profile], batch_size: float | None = None) -> StepLoad:
    """S, N, F of the work model (see the module docstring); categories missing from ``choice`` are off."""
    b = float(batch_size or work.batch_size or 1.0)
    cats = [c for c, v in work.committed.items() if v > 0]
    prof = [choice.get(c, OFF) for c in cats]
    r = {c: work.committed[c] / max(p.e, 1e-9) for c, p in zip(cats, prof)}
    steps = max(sum(r.values()) / b, 1e-12)
    n_tok = (work.prefill_tokens + sum(r[c] * (1.0 + p.d) for c, p in zip(cats, prof))) / steps
    free = sum(r[c] * p.d for c, p in zip(cats, prof) if is_model_free(p.method)) / steps
    return StepLoad(steps, b, n_tok, free, r)


def _option_rows(profiles: Sequence[Profile]) -> Options:
    return Options.of([(p.k, max(p.e, 1e-9), p.d, is_model_free(p.method), p.method) for p in profiles])


def batch_model(work: Workload, options: Mapping[str, Sequence[Profile]], cost: CostCoefficients,
                batch_size: float | None = None, corrections: Corrections = NO_CORRECTIONS) -> BatchModel:
    """The recorded work as the policy's batch model: category c holds slots in proportion to C_c / E_c, prefill
    rides along at P / sum C tokens per committed token; ``options[c]`` the profiles a search may pick from."""
    b = float(batch_size or work.batch_size or 1.0)
    cats = [c for c in work.categories if work.committed[c] > 0]
    total = sum(work.committed[c] for c in cats)
    opts = [_option_rows(options[c]) for c in cats]
    k_max = max((int(o.k.max()) for o in opts), default=0)
    return BatchModel(cats, [b * work.committed[c] / total for c in cats], opts, [True] * len(cats),
                      Prefill.steady(rate=work.prefill_tokens / total), cost, k_max,
                      demand=[work.committed[c] for c in cats], depth_factors=corrections.depth_factor,
                      mixed_penalty=corrections.mixed_penalty)


def estimate(work: Workload, choice: Mapping[str, Profile], cost: CostCoefficients,
             batch_size: float | None = None, corrections: Corrections = NO_CORRECTIONS) -> Estimate:
    """Goodput of the recorded work with each category at ``choice[c]`` (missing categories: off)."""
    if not any(v > 0 for v in work.committed.values()):
        return Estimate(0.0, 0.0, {})
    model = batch_model(work, {c: [choice.get(c, OFF)] for c in work.categories}, cost, batch_size, corrections)
    g, t = model.goodput(np.zeros(len(model.names), dtype=int))
    return Estimate(g, t * 1e3, {c: max(choice.get(c, OFF).e, 1e-9) / t for c in model.names})


def profile_for(profiles: Mapping[str, Mapping[tuple[str, int], Profile]], category: str, method: str,
                k: int) -> Profile | None:
    if k <= 0 or method == METHOD_OFF:
        return OFF
    return profiles.get(category, {}).get((method, k))


def uniform(work: Workload, profiles: Mapping[str, Mapping[tuple[str, int], Profile]], method: str,
            k: int) -> dict[str, Profile]:
    """Every category at (method, k); categories without a profile for it stay off (and are reported)."""
    out = {}
    for c in work.categories:
        p = profile_for(profiles, c, method, k)
        out[c] = p if p is not None else OFF
    return out


def options(profiles: Mapping[tuple[str, int], Profile]) -> list[Profile]:
    return [OFF, *sorted(profiles.values(), key=lambda p: (p.method, p.k))]


def best_static(work: Workload, profiles: Mapping[str, Mapping[tuple[str, int], Profile]], cost: CostCoefficients,
                batch_size: float | None = None, starts: Iterable[Mapping[str, Profile]] = (),
                corrections: Corrections = NO_CORRECTIONS) -> dict[str, Profile]:
    """Hindsight oracle: the per-category (method, k) with the best estimated goodput of the whole batch, found
    by the policy's own search (:mod:`specctl_vllm.controller.core.model.search`), also restarted from ``starts`` (e.g. every
    uniform k)."""
    if not any(v > 0 for v in work.committed.values()):
        return {c: OFF for c in work.categories}
    opts = {c: options(profiles.get(c, {})) for c in work.categories}
    model = batch_model(work, opts, cost, batch_size, corrections)
    points = [np.array([_position(opts[c], s.get(c, OFF)) for c in model.names]) for s in starts]
    cfg = search(model, int(model.levels[-1]), None, points)
    best = {c: opts[c][int(j)] for c, j in zip(model.names, cfg)}
    return {c: best.get(c, OFF) for c in work.categories}


def _position(opts: Sequence[Profile], p: Profile) -> int:
    return next((i for i, q in enumerate(opts) if (q.method, q.k) == (p.method, p.k) or (q.k == 0 and p.k == 0)), 0)


def mixed_estimate(parts: Sequence[tuple[float, Estimate]]) -> Estimate:
    """Work split over regimes: ``(share of committed tokens, estimate)`` -> one estimate (time adds up)."""
    total = sum(w for w, _ in parts)
    if total <= 0:
        return Estimate(0.0, 0.0, {})
    inv = sum(w / total / est.goodput for w, est in parts if est.goodput > 0)
    cats = set().union(*(est.per_category for _, est in parts))
    per = {}
    for c in cats:
        denom = sum(w / total / est.per_category[c] for w, est in parts if est.per_category.get(c))
        per[c] = 1.0 / denom if denom else 0.0
    step = sum(w / total * est.step_ms for w, est in parts)
    return Estimate(1.0 / inv if inv else 0.0, step, per)


