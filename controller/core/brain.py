"""The composition root of the pure controller logic: one :class:`Brain` per application.

The service calls, with an injected ``now`` (unix seconds):
  * :meth:`Brain.ingest` for each validated :class:`TelemetryBatch` (dedup, gaps, learning);
  * :meth:`Brain.policy_for` to answer an engine (decision cached for ``interval_s``, overrides applied
    fresh on every call, version bumped only when what the engine acts on changes);
  * :meth:`Brain.categories` / :meth:`Brain.engines` / :meth:`Brain.metrics` for reads;
  * :meth:`Brain.dump` / :meth:`Brain.load` to snapshot and restore everything learned.

Learned state is per (model, category, method), pooled over engines; bookkeeping (seq, gaps, policy age,
batch mix) is per engine; a policy is tailored to the asking engine's k_max, drafter and batch. Nothing
here does I/O or reads a clock; the service serialises calls (one lock) so no internal locking is done.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from controller.core.budget import (
    GLOBAL_SERIES,
    MODEL_SERIES,
    category_series,
    engine_series,
    label_weight,
    model_series,
)
from controller.core.config import BrainConfig
from controller.core.cost import FULL_GRAPH_PENALTY, PRESETS, is_model_free
from controller.core.engines import COUNTER_CAP, EngineBook
from controller.core.entropy import classify
from controller.core.estimator import AcceptanceEstimator, expected_committed, wilson_interval, z_for
from controller.core.learner import ModelState
from controller.core.model.widths import expected_lengths
from controller.core.overrides import Override, active_overrides
from controller.core.policy import goodput
from controller.core.policy.types import (
    CategoryDecision,
    CategoryInput,
    Choice,
    Decision,
    MethodProfile,
    PolicySnapshot,
)
from controller.core.views import (
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
from controller.protocol import (
    CATEGORY_PATTERN,
    MAX_K,
    MAX_SEQ,
    METHOD_ENGINE,
    METHOD_OFF,
    OVERFLOW_CATEGORY,
    AdaptRule,
    CategoryPolicy,
    Policy,
    SpecConfig,
    StepCells,
    TelemetryBatch,
)

_WIRE_NAME = re.compile(CATEGORY_PATTERN)
DUMP_FORMAT = "specctl-brain"
DUMP_VERSION = 1
#: Bounds on state that clients can grow (models, engines, cached policies).
MAX_MODELS = 64
MAX_ENGINES = 4096
MAX_CACHED_POLICIES = 512
MAX_POLICY_CATEGORIES = 1024


class IngestRejected(Exception):
    """A batch that passed the schema but makes no sense; the service answers ``status`` (422, or 409 for an
    engine id shared by two live engines) with ``reason``."""

    def __init__(self, reason: str, status: int = 422) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class IngestResult:
    outcome: Literal["accepted", "duplicate"]
    gaps: int


_Key = tuple[str, str, int, tuple[str, ...], str, bool, tuple[int, ...]]


@dataclass
class _Cached:
    computed_at: float
    decision: Decision
    signature: tuple[int, int]


@dataclass
class _Served:
    content: tuple
    policy: Policy
    basis: tuple = ()  # what the policy was last wired from, see _same_basis


def _same_basis(held: tuple, basis: tuple) -> bool:
    """Whether a policy was wired from this very decision, these active overrides and this engine shape.

    The wire form is a function of exactly these (the key holds the rest of the engine shape), so it would
    come out the same: rebuilding and comparing it on every post cost more than the rest of the answer.
    Decisions are compared by identity: a cached decision stays the same object until it is recomputed.
    """
    return bool(held) and held[0] is basis[0] and held[1:] == basis[1:]


def refresh_interval(key: _Key, interval_s: float) -> float:
    """This engine's decision period: ``interval_s`` times a fixed factor in [0.75, 1.25) drawn from its key.

    Engines started together would otherwise have their decisions fall due in the same instant, every
    interval, and posts queue behind them (load benchmark: p99 89 ms with 64 engines); with periods that
    differ per engine the refreshes drift apart and spread over the interval.
    """
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return interval_s * (0.75 + 0.5 * int.from_bytes(digest, "big") / 2.0**64)


def _key(model: str, spec: SpecConfig, engine_id: str | None) -> _Key:
    return (model, spec.method, spec.k_max, tuple(sorted(set(spec.model_free_methods))), engine_id or "",
            spec.full_cuda_graphs, tuple(spec.graph_widths))


def _engine_methods(spec: SpecConfig) -> tuple[str, ...]:
    out: list[str] = []
    if spec.method != METHOD_OFF and spec.k_max > 0:
        out.append(spec.method)
    for m in spec.model_free_methods:
        if m not in out and m not in (METHOD_OFF, METHOD_ENGINE):
            out.append(m)
    return tuple(out)


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def _unsound(decision: Decision, spec: SpecConfig) -> str | None:
    """Why a computed decision cannot be served (a non-finite number, a policy the wire refuses), else None."""
    if not _finite(decision.batch_size, decision.goodput, decision.plain_goodput, decision.step_ms,
                   decision.plain_step_ms):
        return "non-finite batch figures"
    for d in (*decision.categories, decision.default):
        if not _finite(d.expected_committed, d.speedup, d.probe_rate, d.best_method_speedup) or not all(
                _finite(r.expected_committed, r.step_ms, r.goodput, r.speedup) for r in d.table):
            return f"non-finite figures for category {d.name!r}"
        try:
            Brain._category_policy(d, spec)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            return f"category {d.name!r}: {str(exc)[:200]}"
    return None


def _cost_ratio(coef, method: str) -> float | None:
    """The drafter's cost ratio for the metrics, None where the fitted plain step costs nothing (no ratio)."""
    try:
        ratio = coef.draft_cost_ratio(method)
    except ZeroDivisionError:
        return None
    return round(ratio, 6) if math.isfinite(ratio) else None


def _static_decision(spec: SpecConfig, problem: str) -> Decision:
    """What the engine would run without a controller (its own drafter at its k_max), as a decision."""
    k = spec.k_max if spec.method != METHOD_OFF else 0
    method = spec.method if k else METHOD_OFF
    default = CategoryDecision("default", k, method, "default",
                               f"decision could not be computed ({problem[:200]}): the engine's static config",
                               1.0, 1.0, k, k)
    return Decision((), default, 1.0, 0.0, 0.0, 0.0, 0.0)


class Brain:
    def __init__(self, config: BrainConfig) -> None:
        self.config = config
        self._preset = PRESETS[config.policy.cost_preset]
        self._models: dict[str, ModelState] = {}
        self._engines: dict[str, EngineBook] = {}
        self._overrides: tuple[Override, ...] = ()
        self._decisions: dict[_Key, _Cached] = {}
        self._served: dict[_Key, _Served] = {}
        self._version = 0
        self._rejected_unknown = 0
        self._decision_errors: dict[str, int] = {}
        self._series = GLOBAL_SERIES
        self.budget_refusals = 0
        self.evictions = 0
        self.last_decision_error: tuple[str, str] | None = None  # (model, why), for the service to log
        self.load_problems: list[str] = []  # what load() left out of a snapshot
        self._z = z_for(config.learner.confidence)

    # -- ingest -----------------------------------------------------------------------------------------------
    def ingest(self, batch: TelemetryBatch, now: float) -> IngestResult:
        book = self._engines.get(batch.engine_id)
        self._validate(batch, book)
        if book is None:
            book = EngineBook(batch.engine_id)
        outcome, gap_delta = book.classify(batch.boot_id, batch.seq)
        if outcome == "conflict":
            book.record_conflict(batch.boot_id, batch.seq, now)
            raise IngestRejected(f"engine id {batch.engine_id!r} is used by two running engines (boot "
                                 f"{batch.boot_id!r} and boot {book.boot_id!r}): give each engine its own "
                                 "SPECCTL_ENGINE_ID", status=409)
        if outcome == "suspect":
            book.record_suspect(batch.boot_id, batch.seq)
        if outcome != "accepted":
            if batch.engine_id in self._engines:
                book.outcomes["duplicate"] += 1
            return IngestResult("duplicate", book.gaps)
        ms = self._models.get(batch.model_name)
        new_model = ms is None
        if ms is None:
            ms = ModelState(batch.model_name, self._preset, self.config.learner)
        digest = ms.digest(batch, self.config.learner.max_categories_per_model)
        extra = (0 if batch.engine_id in self._engines else engine_series(batch.engine_id, batch.model_name)) + (
            math.ceil(MODEL_SERIES * label_weight(batch.model_name)) if new_model else 0)
        charge = extra + self._charge(ms, digest, batch.spec.k_max)
        if charge and self._series + charge > self.config.budget.max_series:
            # the budget is full: new category names pool into the overflow category, as beyond the cap
            digest = ms.digest(batch, min(self.config.learner.max_categories_per_model, len(ms.categories)))
            charge = extra + self._charge(ms, digest, batch.spec.k_max)
            if self._series + charge > self.config.budget.max_series:
                self.budget_refusals += 1
                raise IngestRejected(
                    f"learned-state budget full ({self._series} of {self.config.budget.max_series} series, this "
                    f"batch needs {charge} more): state idle for longer than the SPECCTL_BUDGET_*_IDLE_S settings "
                    "is forgotten, or an operator can forget it (POST /v1/forget)", status=429)
        # nothing above mutated state: a rejection leaves everything as it was
        self._models.setdefault(batch.model_name, ms)
        self._engines.setdefault(batch.engine_id, book)
        self._series += charge
        ms.charged_k = max(ms.charged_k, batch.spec.k_max)
        ms.apply(digest, now, self.config.learner, book.mix)
        book.record(batch.boot_id, batch.seq, gap_delta, batch.dropped_steps)
        book.model = batch.model_name
        book.spec_method, book.spec_k_max = batch.spec.method, batch.spec.k_max
        book.spec_full_cuda_graphs = batch.spec.full_cuda_graphs
        book.model_free_methods = tuple(batch.spec.model_free_methods)
        book.steps = min(COUNTER_CAP, book.steps + digest.steps)
        book.step_seconds += digest.step_seconds
        book.last_seen = now
        if batch.policy_version is not None:
            book.policy_version_reported = batch.policy_version
        book.outcomes["accepted"] += 1
        return IngestResult("accepted", book.gaps)

    def _validate(self, batch: TelemetryBatch, book: EngineBook | None) -> None:
        budget = self.config.budget
        if book is None and len(self._engines) >= budget.max_engines:
            self.budget_refusals += 1
            raise IngestRejected(f"too many engines (limit {budget.max_engines}; an engine idle for "
                                 f"{budget.engine_idle_s:g} s is forgotten)", status=429)
        if batch.model_name not in self._models and len(self._models) >= budget.max_models:
            self.budget_refusals += 1
            raise IngestRejected(f"too many models (limit {budget.max_models}; a model idle for "
                                 f"{budget.model_idle_s:g} s is forgotten)", status=429)
        if book is not None and book.boot_id == batch.boot_id and book.model and book.model != batch.model_name:
            raise IngestRejected(f"engine {batch.engine_id} reports model {book.model!r} in this boot, "
                                 f"not {batch.model_name!r}")
        k_max = batch.spec.k_max
        for i, step in enumerate(batch.steps):
            seen: set[tuple[str, str]] = set()
            requests = 0
            for cs in step.categories:
                key = (cs.category, cs.method)
                if key in seen:
                    raise IngestRejected(f"step {i}: category {cs.category!r} method {cs.method!r} reported twice")
                seen.add(key)
                requests += cs.requests
                if cs.method == METHOD_OFF and cs.hists:
                    raise IngestRejected(f"step {i}: category {cs.category!r} has drafts under method 'off'")
                for h in cs.hists:
                    if h.k > k_max:
                        raise IngestRejected(f"step {i}: category {cs.category!r} drafted k={h.k} above the "
                                             f"engine's k_max={k_max}")
                if METHOD_OFF in cs.counterfactual or METHOD_ENGINE in cs.counterfactual:
                    raise IngestRejected(f"step {i}: counterfactual method must name a drafter")
                for m, hs in cs.counterfactual.items():
                    if len({h.k for h in hs}) != len(hs):
                        raise IngestRejected(f"step {i}: counterfactual {m!r}: one histogram per proposal length")
            if requests > step.batch_size:
                raise IngestRejected(f"step {i}: categories hold {requests} requests, batch_size is "
                                     f"{step.batch_size}")

    # -- the budget ------------------------------------------------------------------------------------------
    def _charge(self, ms: ModelState, digest, k_max: int) -> int:
        """Series the digest would add to ``ms`` (new categories, new methods, a larger k); 0 for most batches."""
        k = max(ms.charged_k, k_max)
        methods: dict[str, set[str]] = {}
        for cat, method, _cf in (*digest.hists, *digest.asks):
            st = ms.categories.get(cat)
            if st is None or method not in st.methods:
                methods.setdefault(cat, set(st.methods) if st is not None else set()).add(method)
        for cat in digest.new_categories:
            methods.setdefault(cat, set())
        if not methods and k <= ms.charged_k:
            return 0
        before = sum(category_series(ms.charged_k, len(st.methods), label_weight(ms.name, c))
                     for c, st in ms.categories.items())
        after = sum(category_series(k, len(methods[c]) if c in methods else len(st.methods), label_weight(ms.name, c))
                    for c, st in ms.categories.items())
        after += sum(category_series(k, len(m), label_weight(ms.name, c)) for c, m in methods.items()
                     if c not in ms.categories)
        return after - before

    def _recount(self) -> None:
        self._series = GLOBAL_SERIES + sum(engine_series(e, b.model or "") for e, b in self._engines.items()) + sum(
            model_series(ms.name, ms.charged_k, {c: len(st.methods) for c, st in ms.categories.items()})
            for ms in self._models.values())

    @property
    def series(self) -> int:
        """Series the learned state is charged (an upper bound on what a scrape exports)."""
        return self._series

    def evict_idle(self, now: float) -> list[tuple[str, str]]:
        """Forget engines, categories and models not seen for their idle time; what was forgotten, as
        (kind, name) with kind engine | model | category (name ``json.dumps([model, category])``)."""
        b = self.config.budget
        out: list[tuple[str, str]] = []
        for book in self._engines.values():  # restored without a time: the idle clock starts now
            book.last_seen = now if book.last_seen is None else book.last_seen
        for ms in self._models.values():
            ms.last_seen = now if ms.last_seen is None else ms.last_seen
            for st in ms.categories.values():
                st.last_seen = now if st.last_seen is None else st.last_seen
        for eid, book in list(self._engines.items()):
            if book.last_seen is not None and now - book.last_seen > b.engine_idle_s:
                self._drop_engine(eid)
                out.append(("engine", eid))
        for model, ms in list(self._models.items()):
            if ms.last_seen is not None and now - ms.last_seen > b.model_idle_s:
                self._drop_model(model)
                out.append(("model", model))
                continue
            for cat, st in list(ms.categories.items()):
                if st.last_seen is not None and now - st.last_seen > b.category_idle_s:
                    self._drop_category(ms, cat)
                    out.append(("category", category_key(model, cat)))
        if out:
            self._recount()
            self.evictions += len(out)
        return out

    def forget(self, kind: str, name: str) -> bool:
        """An operator's eviction (same effect as the idle sweep); False when there was nothing to forget."""
        if kind == "engine" and name in self._engines:
            self._drop_engine(name)
        elif kind == "model" and name in self._models:
            self._drop_model(name)
        elif kind == "category":
            model, cat = json.loads(name)
            ms = self._models.get(model)
            if ms is None or cat not in ms.categories:
                return False
            self._drop_category(ms, cat)
        else:
            return False
        self._recount()
        return True

    def apply_forgotten(self, items: Iterable[tuple[str, str, float]], snapshot_ts: float | None) -> int:
        """Forget again what was evicted after the snapshot this Brain was loaded from (a restart never
        brings it back); returns how many were dropped."""
        dropped = 0
        for kind, name, ts in items:
            if snapshot_ts is None or ts >= snapshot_ts:
                try:
                    dropped += self.forget(kind, name)
                except (ValueError, TypeError):
                    continue
        return dropped

    def _drop_engine(self, engine_id: str) -> None:
        self._engines.pop(engine_id, None)
        for cache in (self._decisions, self._served):
            for key in [k for k in cache if k[4] == engine_id]:
                cache.pop(key, None)

    def _drop_model(self, model: str) -> None:
        self._models.pop(model, None)
        self._decision_errors.pop(model, None)
        for cache in (self._decisions, self._served):
            for key in [k for k in cache if k[0] == model]:
                cache.pop(key, None)

    def _drop_category(self, ms: ModelState, category: str) -> None:
        ms.categories.pop(category, None)
        mixes = [ms.mix] + [b.mix for b in self._engines.values() if b.model == ms.name]
        for mix in mixes:
            mix.per_category.pop(category, None)
            mix.committed_per_category.pop(category, None)

    def record_rejected(self, engine_id: str | None) -> None:
        book = self._engines.get(engine_id) if engine_id else None
        if book is not None:
            book.outcomes["rejected"] += 1
        else:
            self._rejected_unknown += 1  # unknown ids are not given state: a client could invent many

    # -- overrides ----------------------------------------------------------------------------------------------
    def set_overrides(self, overrides: Iterable[Override]) -> None:
        self._overrides = tuple(overrides)

    # -- policy -------------------------------------------------------------------------------------------------
    def policy_for(self, model: str, spec: SpecConfig, now: float, engine_id: str | None = None) -> Policy:
        key = _key(model, spec, engine_id)
        decision = self._decision(key, spec, now)
        try:
            policy = self._wire(key, decision, spec, now)
        except Exception as exc:  # noqa: BLE001 -- an ingested batch is acknowledged whatever the decision
            self._count_error(model, exc)
            self._served.pop(key, None)
            policy = self._wire(key, _static_decision(spec, f"{type(exc).__name__}: {exc}"), spec, now)
        book = self._engines.get(engine_id) if engine_id else None
        if book is not None:
            book.policy_served_at = now
            book.policy_version_served = policy.version
        return policy

    def _signature(self, model: str) -> tuple[int, int]:
        """(categories, drafters with enough evidence): when it changes the cached decision is stale at once
        (a new category, or a drafter that just became usable, should not wait for the interval)."""
        ms = self._models.get(model)
        if ms is None:
            return (0, 0)
        need = self.config.policy.min_evidence
        usable = sum(1 for st in ms.categories.values() for e in st.methods.values()
                     if e.cum.drafts + e.cf_cum.drafts >= need)
        return (len(ms.categories), usable)

    def decision_work(self, model: str, spec: SpecConfig, now: float, engine_id: str | None = None) -> int:
        """0 when :meth:`policy_for` would serve the cached decision, else the size of the decision it would
        compute: (category, drafter) pairs x max(k_max, 4), what its CPU time grows with (the service computes
        large ones off its event loop)."""
        key = _key(model, spec, engine_id)
        if self._fresh(key, self._decisions.get(key), self._signature(model), now):
            return 0
        ms = self._models.get(model)
        return 0 if ms is None else sum(len(st.methods) for st in ms.categories.values()) * max(spec.k_max, 4)

    def _fresh(self, key: _Key, cached: _Cached | None, signature: tuple[int, int], now: float) -> bool:
        return cached is not None and 0 <= now - cached.computed_at < refresh_interval(
            key, self.config.policy.interval_s) and cached.signature == signature

    def _decision(self, key: _Key, spec: SpecConfig, now: float) -> Decision:
        cached = self._decisions.get(key)
        signature = self._signature(key[0])
        if self._fresh(key, cached, signature, now):
            return cached.decision
        try:
            snap = self._snapshot(key, spec, now, cached.decision if cached else None)
            decision = goodput.decide(snap, self.config.policy)
            problem = _unsound(decision, spec)
        except Exception as exc:  # noqa: BLE001 -- no learned state may make a later request fail
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            # the last good decision keeps being served (else the engine's static config), retried next interval
            model = key[0]
            self._decision_errors[model] = self._decision_errors.get(model, 0) + 1
            self.last_decision_error = (model, problem[:300])
            decision = cached.decision if cached is not None else _static_decision(spec, problem)
        self._decisions.pop(key, None)
        self._decisions[key] = _Cached(now, decision, signature)
        while len(self._decisions) > MAX_CACHED_POLICIES:
            self._decisions.pop(next(iter(self._decisions)))
        return decision

    def _profiles(self, ms: ModelState, category: str, k: int, now: float) -> tuple[MethodProfile, ...]:
        ls = self.config.learner
        out = []
        for method, est in ms.categories[category].methods.items():
            est.decay_to(now, ls.half_life_s)
            out.append(self._profile(method, est, k))
        return tuple(out)

    def _profile(self, method: str, est: AcceptanceEstimator, k: int) -> MethodProfile:
        ls = self.config.learner
        free = is_model_free(method)
        return MethodProfile(method, tuple(est.betas(max(k, 1), ls.prior_mean, ls.prior_strength)), est.evidence,
                             est.cf_drafts > est.real_drafts, free, float(est.cum.drafts + est.cf_cum.drafts),
                             est.match_rate(ls.prior_strength) if free else 1.0)

    def _snapshot(self, key: _Key, spec: SpecConfig, now: float, previous: Decision | None) -> PolicySnapshot:
        model, engine_id = key[0], key[4]
        ms = self._models.get(model)
        methods = _engine_methods(spec)
        cost = (ms.cost.coefficients() if ms else self._preset)
        if ms is None:
            return PolicySnapshot((), (), 1.0, 0.0, cost, spec.k_max, spec.method, methods)
        ls = self.config.learner
        book = self._engines.get(engine_id) if engine_id else None
        mix = book.mix if book is not None and book.mix.batch_size else ms.mix
        mix.decay_to(now, ls.mix_half_life_s)
        batch_size = mix.batch_size or 1.0
        shares = mix.shares()
        committed = mix.committed_shares()
        prev = previous.by_name() if previous else {}
        cats = []
        for name in ms.categories:
            p = prev.get(name)
            choice = Choice(p.k, p.method) if p is not None and p.source in ("policy", "probe") else None
            cats.append(CategoryInput(name, shares.get(name, 0.0), self._profiles(ms, name, spec.k_max, now), choice,
                                      committed.get(name, 0.0)))
        pooled = tuple(self._profile(m, ms.pooled(m, now, ls.half_life_s), spec.k_max) for m in ms.methods())
        prev_default = None
        if previous is not None and previous.default.source == "default":
            prev_default = Choice(previous.default.k, previous.default.method)
        factors = tuple(float(f) for f in ms.cost.depth_factors(batch_size, spec.k_max))
        return PolicySnapshot(tuple(cats), pooled, batch_size, mix.extra_per_step, cost, spec.k_max, spec.method,
                              methods, prev_default, mix.extra_distribution(), mix.extra_per_committed, factors,
                              ms.cost.mixed_penalty(batch_size, FULL_GRAPH_PENALTY if spec.full_cuda_graphs else 1.0))

    def _graph_inputs(self, model: str, spec: SpecConfig) -> tuple[StepCells | None, dict[str, list[float]]]:
        """Graph-shaped engines: the cell table and E_c(K) per category, rounded so that noise does not make a
        new policy version at every refresh. Reads only."""
        ms = self._models.get(model)
        if ms is None or not spec.graph_widths:
            return None, {}
        try:
            return self._graph_inputs_of(ms, spec)
        except (ValueError, ArithmeticError):  # validated inputs cannot get here; the engine then runs its own k
            return None, {}

    def _graph_inputs_of(self, ms: ModelState, spec: SpecConfig) -> tuple[StepCells | None, dict[str, list[float]]]:
        view = ms.cells.view(spec.graph_widths, self._preset)
        cells = StepCells(batch_edges=list(view.batch_edges), widths=list(view.widths),
                          step_s=[[_round_sig(x) for x in row] for row in view.step_s],
                          steps=[[_quantize_steps(c) for c in row] for row in view.steps])
        ls = self.config.learner
        curves: dict[str, list[float]] = {}
        for name, st in ms.categories.items():
            est = st.methods.get(spec.method)
            if est is not None and _WIRE_NAME.match(name):
                betas = est.betas(max(spec.k_max, 1), ls.prior_mean, ls.prior_strength)
                curves[name] = [round(e, 2) for e in expected_lengths(betas, spec.k_max)]
        return cells, curves

    def _wire(self, key: _Key, decision: Decision, spec: SpecConfig, now: float) -> Policy:
        active = active_overrides(self._overrides, now)
        cells, curves = self._graph_inputs(key[0], spec)
        graph_basis = (cells.model_dump_json() if cells is not None else None, tuple(sorted(
            (n, tuple(c)) for n, c in curves.items())))
        basis = (decision, tuple(active.values()), tuple(spec.model_free_methods), graph_basis)
        served = self._served.get(key)
        if served is not None and _same_basis(served.basis, basis):
            return served.policy
        default = self._category_policy(decision.default, spec)
        cats: dict[str, CategoryPolicy] = {}
        for d in decision.categories:
            if _WIRE_NAME.match(d.name):  # the overflow bucket is no engine's category: those use the default
                cats[d.name] = self._category_policy(d, spec)
                if d.name in curves:
                    cats[d.name] = cats[d.name].model_copy(update={"expected": curves[d.name]})
        for name, ov in active.items():
            if name in cats or len(cats) < MAX_POLICY_CATEGORIES:
                cats[name] = _apply_override(cats.get(name, default), ov, spec)
        content = (self.config.policy.ttl_s, _content(default),
                   tuple(sorted((n, _content(p)) for n, p in cats.items())), graph_basis)
        if served is not None and served.content == content:
            served.basis = basis
            return served.policy
        self._version += 1
        policy = Policy(version=self._version, issued_at=now, ttl_s=self.config.policy.ttl_s, default=default,
                        categories=cats, step_cells=cells)
        self._served.pop(key, None)
        self._served[key] = _Served(content, policy, basis)
        while len(self._served) > MAX_CACHED_POLICIES:
            self._served.pop(next(iter(self._served)))
        return policy

    @staticmethod
    def _category_policy(d: CategoryDecision, spec: SpecConfig) -> CategoryPolicy:
        def wire(m: str) -> str:
            return METHOD_ENGINE if m == spec.method else m

        k = min(d.k, spec.k_max)
        if k == 0:
            method = wire(d.probe_method) if d.probe_rate > 0 else METHOD_OFF
            adapt = AdaptRule(k_min=0, k_max=0)
        else:
            method = wire(d.method)
            lo, hi = min(d.adapt_k_min, k), min(max(d.adapt_k_max, k), spec.k_max)
            adapt = AdaptRule(k_min=lo, k_max=hi)
        probe_rate = min(d.probe_rate, 0.25) if k == 0 else 0.0
        return CategoryPolicy(k=k, method=method, adapt=adapt, probe_rate=probe_rate,
                              probe_k=min(d.probe_k, spec.k_max) if probe_rate > 0 else 0,
                              source=d.source if d.source in ("policy", "probe", "default") else "policy",
                              reason=d.reason[:512])

    # -- reads --------------------------------------------------------------------------------------------------
    def _view_key(self, model: str) -> tuple[_Key, SpecConfig] | None:
        """The engine shape whose decision a category view shows: the model's most recently seen engine."""
        books = [b for b in self._engines.values() if b.model == model and b.last_seen is not None]
        if not books:
            return None
        b = max(books, key=lambda x: x.last_seen or 0.0)
        spec = SpecConfig(method=b.spec_method or METHOD_OFF, k_max=b.spec_k_max,
                          model_free_methods=list(b.model_free_methods), full_cuda_graphs=b.spec_full_cuda_graphs)
        return _key(model, spec, b.engine_id), spec

    def categories(self, now: float) -> list[CategoryView]:
        out: list[CategoryView] = []
        for model in self._models:
            try:
                out.extend(self._model_views(model, now))
            except Exception as exc:  # noqa: BLE001 -- one model's unreadable state must not fail every read
                self._count_error(model, exc)
        return out

    def _count_error(self, model: str, exc: Exception) -> None:
        self._decision_errors[model] = self._decision_errors.get(model, 0) + 1
        self.last_decision_error = (model, f"{type(exc).__name__}: {exc}"[:300])

    def category(self, name: str, now: float, model: str | None = None) -> CategoryView | None:
        models = [model] if model is not None else list(self._models)
        for m in models:
            ms = self._models.get(m)
            if ms is not None and name in ms.categories:
                try:
                    return self._category_view(m, name, now, self._effective(m, now))
                except Exception as exc:  # noqa: BLE001 -- as in categories()
                    self._count_error(m, exc)
                    return None
        return None

    def _effective(self, model: str, now: float, cached_only: bool = False
                   ) -> tuple[Decision, Policy, SpecConfig, str] | None:
        """The decision a view shows; ``cached_only``: the one last computed, however old (a scrape reads what
        the engines are being served and pays for a decision only when none was ever computed)."""
        vk = self._view_key(model)
        if vk is None:
            return None
        key, spec = vk
        held = self._decisions.get(key) if cached_only else None
        if held is not None:
            decision = held.decision
        else:
            decision = self._decision(key, spec, now)
        return decision, self._wire(key, decision, spec, now), spec, f"{spec.method}/{spec.k_max}"

    def _model_views(self, model: str, now: float) -> list[CategoryView]:
        eff = self._effective(model, now)
        return [self._category_view(model, c, now, eff) for c in self._models[model].categories]

    def _primary(self, ms: ModelState, category: str) -> tuple[str, AcceptanceEstimator] | None:
        methods = ms.categories[category].methods
        if not methods:
            return None
        name = max(methods, key=lambda m: (methods[m].real_drafts, methods[m].cf_drafts))
        return name, methods[name]

    def _method_view(self, method: str, est: AcceptanceEstimator, k: int) -> MethodView:
        ls = self.config.learner
        top = max(k, est.max_k, 1)
        betas = est.betas(top, ls.prior_mean, ls.prior_strength)
        positions = []
        for i in range(top):
            r, a = float(est.reached[i]), float(est.accepted[i])
            lo, hi = wilson_interval(a, r, self._z)
            positions.append(PositionView(i + 1, round(betas[i], 6), round(lo, 6), round(hi, 6), round(r, 3),
                                          round(a, 3)))
        mal = est.mean_acceptance_length()
        return MethodView(method, est.cf_drafts > est.real_drafts, is_model_free(method), round(est.evidence, 3),
                          round(est.real_drafts, 3), round(est.cf_drafts, 3), tuple(positions),
                          None if mal is None else round(mal, 6),
                          tuple(round(x, 6) for x in est.length_distribution()),
                          tuple(round(x, 6) for x in expected_committed(betas[:k])), est.cum.drafts,
                          est.cum.accepted_tokens,
                          round(est.match_rate(ls.prior_strength), 6) if is_model_free(method) else 1.0,
                          round(est.attempts, 3))

    def _category_view(self, model: str, category: str, now: float,
                       eff: tuple[Decision, Policy, SpecConfig, str] | None) -> CategoryView:
        ls = self.config.learner
        ms = self._models[model]
        st = ms.categories[category]
        k = eff[2].k_max if eff else max((e.max_k for e in st.methods.values()), default=0)
        for est in st.methods.values():
            est.decay_to(now, ls.half_life_s)
        methods = tuple(self._method_view(m, e, k) for m, e in st.methods.items())
        primary = self._primary(ms, category)
        top_view = next((v for v in methods if primary and v.method == primary[0]), None)
        entropy = self._entropy(st)
        ms.mix.decay_to(now, ls.mix_half_life_s)
        share = ms.mix.shares().get(category, 0.0)
        return CategoryView(
            model, category, primary[0] if primary else None, top_view.positions if top_view else (),
            top_view.mean_acceptance_length if top_view else None,
            top_view.acceptance_length_distribution if top_view else (), entropy, round(share, 6),
            st.request_steps, st.committed_tokens, st.spec_off_request_steps, methods,
            self._decision_view(category, eff, now))

    def _entropy(self, st) -> dict:
        """Entropy class from the drafter that predicts the category best (lowest surprise bits).

        A drafter can only be worse than the target's own distribution, so the best-accepted drafter with
        enough evidence is the closest view of how predictable the category is.
        """
        ls = self.config.learner
        best = None
        for method, est in st.methods.items():
            top = max(est.max_k, 1)
            ever = est.cum.drafts + est.cf_cum.drafts  # like the policy: evidence ever seen makes it known
            need = 0.0 if ever >= self.config.policy.min_evidence else self.config.policy.min_evidence
            c = classify(est.betas(top, ls.prior_mean, ls.prior_strength), [float(x) for x in est.reached[:top]],
                         need)
            if best is None or (c.bits is not None and (best[1].bits is None or c.bits < best[1].bits)):
                best = (method, c)
        if best is None:
            return {**classify([], [], self.config.policy.min_evidence).to_dict(), "method": None}
        return {**best[1].to_dict(), "method": best[0] if best[1].bits is not None else None}

    def _decision_view(self, category: str, eff, now: float) -> DecisionView | None:
        if eff is None:
            return None
        decision, policy, _spec, shape = eff
        d = decision.by_name().get(category, decision.default)
        cp = policy.categories.get(category, policy.default)
        ov = active_overrides(self._overrides, now).get(category)
        method = d.method if cp.source != "override" else cp.method
        if cp.source != "override" and cp.k == 0:
            method = METHOD_OFF
        return DecisionView(
            cp.k, method, cp.source, cp.reason, d.speedup, d.expected_committed, cp.adapt.k_min, cp.adapt.k_max,
            cp.probe_rate, cp.probe_k, d.best_method, d.best_method_speedup, round(decision.batch_size, 4), shape,
            tuple({"k": r.k, "method": r.method, "expected_committed": r.expected_committed, "step_ms": r.step_ms,
                   "goodput_tokens_per_s": r.goodput, "speedup": r.speedup} for r in d.table),
            ov.to_dict() if ov else None)

    def engines(self, now: float) -> list[EngineView]:
        out = []
        for b in self._engines.values():
            b.mix.decay_to(now, self.config.learner.mix_half_life_s)
            bs = b.mix.batch_size
            out.append(EngineView(
                b.engine_id, b.model, b.boot_id, b.spec_method, b.spec_k_max, b.model_free_methods, b.max_seq,
                dict(b.outcomes), b.gaps, b.dropped_steps, b.steps, round(b.step_seconds, 6),
                None if b.last_seen is None else max(0.0, now - b.last_seen), b.policy_version_served,
                b.policy_version_reported, None if b.policy_served_at is None else max(0.0, now - b.policy_served_at),
                None if bs is None else round(bs, 4), {c: round(v, 6) for c, v in b.mix.shares().items()},
                b.id_conflicts, b.conflict_boot or None,
                None if b.conflict_at is None else max(0.0, now - b.conflict_at)))
        return out

    def model_names(self) -> list[str]:
        return list(self._models)

    def model_metrics(self, model: str, now: float) -> tuple[list, list, list, list] | None:
        """One model's part of :meth:`metrics` (None if unknown or unreadable: counted as a decision error).

        The service builds a scrape's snapshot model by model, letting go of the Brain between models, so an
        ingest never waits for a whole scrape."""
        ms = self._models.get(model)
        if ms is None:
            return None
        try:
            return self._model_metrics(model, ms, now)
        except Exception as exc:  # noqa: BLE001 -- one model's unreadable state must not fail the scrape
            self._count_error(model, exc)
            return None

    def metrics(self, now: float, parts: list[tuple[list, list, list, list] | None] | None = None) -> MetricsSnapshot:
        """Everything a scrape exports; ``parts``: the models' rows built before (see :meth:`model_metrics`)."""
        methods: list[MethodCounters] = []
        cats: list[CategoryMetrics] = []
        ratios: list[tuple[str, str, float]] = []
        matches: list[tuple[str, str, str, float]] = []
        if parts is None:
            parts = [self.model_metrics(model, now) for model in self._models]
        for model_rows in parts:
            if model_rows is None:
                continue
            methods.extend(model_rows[0])
            cats.extend(model_rows[1])
            ratios.extend(model_rows[2])
            matches.extend(model_rows[3])
        engines = tuple(
            EngineMetrics(b.engine_id, b.model, dict(b.outcomes), b.gaps, b.dropped_steps,
                          None if b.policy_served_at is None else max(0.0, now - b.policy_served_at), b.steps,
                          b.step_seconds, b.id_conflicts)
            for b in self._engines.values())
        ovs = tuple((c, kind) for c, ov in sorted(active_overrides(self._overrides, now).items()) for kind in ov.kinds)
        overflow = tuple((m, ms.overflow_steps) for m, ms in self._models.items())
        # every known model has a sample, zero included, so "errors in range" reads 0 rather than no data
        decision_errors = tuple(sorted({**{m: 0 for m in self._models}, **self._decision_errors}.items()))
        return MetricsSnapshot(tuple(methods), tuple(cats), engines, tuple(ratios), ovs, overflow,
                               self._rejected_unknown, tuple(matches), decision_errors,
                               self._series, self.config.budget.max_series, self.evictions, self.budget_refusals)

    def _model_metrics(self, model: str, ms: ModelState, now: float) -> tuple[list, list, list, list]:
        ls = self.config.learner
        methods: list[MethodCounters] = []
        cats: list[CategoryMetrics] = []
        ratios: list[tuple[str, str, float]] = []
        matches: list[tuple[str, str, str, float]] = []
        eff = self._effective(model, now, cached_only=True)
        for name, st in ms.categories.items():
            lengths = [0] * (MAX_K + 1)
            accepted = 0
            for m, est in st.methods.items():
                est.decay_to(now, ls.half_life_s)
                if est.attempts > 0 and is_model_free(m):
                    matches.append((model, name, m, round(est.match_rate(ls.prior_strength), 6)))
                for cf, cum in ((False, est.cum), (True, est.cf_cum)):
                    if cum.drafts == 0:
                        continue
                    top = max(i for i, v in enumerate(cum.lengths) if v) if any(cum.lengths) else 0
                    methods.append(MethodCounters(model, name, m, cf, cum.drafts, cum.draft_tokens,
                                                  cum.accepted_tokens, tuple(cum.per_pos[: max(top, 1)]),
                                                  tuple(cum.lengths[: top + 1])))
                    if not cf:
                        for j, v in enumerate(cum.lengths):
                            lengths[j] += v
                        accepted += cum.accepted_tokens
            cats.append(self._category_metrics(model, ms, name, st, lengths, accepted, eff, now))
        known = set(ms.methods()) | {b.spec_method for b in self._engines.values()
                                     if b.model == model and b.spec_method not in ("", METHOD_OFF)}
        coef = ms.cost.coefficients()
        ratios.extend((model, m, r) for m in sorted(known) if (r := _cost_ratio(coef, m)) is not None)
        return methods, cats, ratios, matches

    def _category_metrics(self, model, ms, name, st, lengths, accepted, eff, now) -> CategoryMetrics:
        top = max((i for i, v in enumerate(lengths) if v), default=0)
        k_view = eff[2].k_max if eff else 0
        top = max(top, k_view)
        primary = self._primary(ms, name)
        entropy = self._entropy(st)
        ls = self.config.learner
        betas: tuple[float, ...] = ()
        mal = None
        if primary is not None:
            est = primary[1]
            betas = tuple(round(b, 6) for b in est.betas(max(k_view, est.max_k, 1), ls.prior_mean,
                                                          ls.prior_strength))
            mal = est.mean_acceptance_length()
        k = method = source = speedup = best = None
        if eff is not None:
            dv = self._decision_view(name, eff, now)
            k, method, source, speedup, best = dv.k, dv.method, dv.source, dv.estimated_speedup, dv.best_method
        return CategoryMetrics(model, name, st.request_steps, st.committed_tokens, st.spec_off_request_steps,
                               tuple(lengths[: top + 1]), accepted, k, method, source, entropy["class"],
                               entropy["bits"],
                               mal, betas, speedup, best)

    # -- persistence --------------------------------------------------------------------------------------------
    def dump(self, models: dict | None = None) -> dict:
        """Everything learned; ``models``: the models' parts when the caller dumped them one by one
        (:meth:`dump_model`, so that a snapshot need not hold the service's lock for all of them at once)."""
        return {
            "format": DUMP_FORMAT, "version": DUMP_VERSION, "policy_version": self._version,
            "cost_preset": self.config.policy.cost_preset,
            "models": {m: ms.to_dict() for m, ms in self._models.items()} if models is None else models,
            "engines": {e: b.to_dict() for e, b in self._engines.items()},
            "rejected_unknown": self._rejected_unknown,
        }

    def dump_model(self, model: str) -> dict | None:
        ms = self._models.get(model)
        return None if ms is None else ms.to_dict()

    @classmethod
    def load(cls, data: dict, config: BrainConfig) -> Brain:
        """Restore a :meth:`dump`; parts that do not validate are left out and named in ``load_problems``."""
        brain = cls(config)
        if not isinstance(data, dict) or data.get("format") != DUMP_FORMAT or data.get("version") != DUMP_VERSION:
            brain.load_problems.append("unknown snapshot format")
            return brain  # unknown or old layout: start fresh rather than misread it
        try:
            brain._version = min(MAX_SEQ, max(0, int(data.get("policy_version", 0))))
            brain._rejected_unknown = min(MAX_SEQ, max(0, int(data.get("rejected_unknown", 0))))
        except (TypeError, ValueError, OverflowError):
            brain.load_problems.append("bad counters")
        for name, md in _items(data.get("models")):
            if len(brain._models) >= config.budget.max_models:
                brain.load_problems.append("too many models")
                break
            try:
                ms = ModelState.from_dict(str(name), md, brain._preset, config.learner)
                brain._check_model(ms)
                brain._models[str(name)] = ms
                brain.load_problems.extend(f"model {str(name)[:64]!r}: category {c!r} does not validate"
                                           for c in ms.load_skipped)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError) as exc:
                brain.load_problems.append(f"model {str(name)[:64]!r}: {type(exc).__name__}: {str(exc)[:120]}")
        for eid, ed in _items(data.get("engines")):
            if len(brain._engines) >= config.budget.max_engines:
                brain.load_problems.append("too many engines")
                break
            try:
                brain._engines[str(eid)] = EngineBook.from_dict(ed)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                brain.load_problems.append(f"engine {str(eid)[:64]!r}: {type(exc).__name__}: {str(exc)[:120]}")
        brain._recount()
        if brain._series > config.budget.max_series:  # a smaller budget than the snapshot was taken under
            brain.load_problems.append(f"{brain._series} series over the budget of {config.budget.max_series}")
            brain._shrink_to_budget()
        return brain

    def _shrink_to_budget(self) -> None:
        """Forget the least recently seen categories, then engines, until the state fits the budget."""
        cats = sorted(((st.last_seen or 0.0, m, c) for m, ms in self._models.items() for c, st in ms.categories.items()))
        for _seen, model, cat in cats:
            if self._series <= self.config.budget.max_series:
                return
            self._drop_category(self._models[model], cat)
            self._recount()
        for eid in sorted(self._engines, key=lambda e: self._engines[e].last_seen or 0.0):
            if self._series <= self.config.budget.max_series:
                return
            self._drop_engine(eid)
            self._recount()

    def _check_model(self, ms: ModelState) -> None:
        """Raise ValueError when restored state holds a number outside what ingest can produce."""
        for c, st in ms.categories.items():
            if not _WIRE_NAME.match(c) and c != OVERFLOW_CATEGORY:
                raise ValueError(f"category name {c[:64]!r}")
            for est in st.methods.values():
                for v in (est.real_drafts, est.cf_drafts, est.attempts, est.hits, *(est.t_last or 0.0,)):
                    if not math.isfinite(v):
                        raise ValueError("non-finite estimator state")
        coef = ms.cost.coefficients().vector()
        if not all(math.isfinite(float(v)) and v >= 0 for v in coef):
            raise ValueError("cost model does not fit")
        for v in (ms.mix.steps, ms.mix.requests, ms.mix.extra_tokens, ms.mix.committed,
                  *ms.mix.per_category.values(), *ms.mix.committed_per_category.values()):
            if not math.isfinite(v):
                raise ValueError("non-finite batch mix")


def category_key(model: str, category: str) -> str:
    """The name of a (model, category) in eviction records: ``json.dumps([model, category])``."""
    return json.dumps([model, category])


def _round_sig(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}")


def _quantize_steps(c: float) -> float:
    """Measured steps rounded down to a power of two: the width rule's margin changes little between them."""
    return 0.0 if c < 1 else float(2 ** int(math.log2(c)))


def _items(d) -> list:
    return list(d.items()) if isinstance(d, dict) else []


def _content(p: CategoryPolicy) -> tuple:
    """What an engine acts on (the reason text is not part of the version)."""
    return (p.k, p.method, p.adapt.k_min, p.adapt.k_max, p.adapt.drop_after, p.adapt.climb_after, p.probe_rate,
            p.probe_k, p.source)


def _apply_override(base: CategoryPolicy, ov: Override, spec: SpecConfig) -> CategoryPolicy:
    who = f" by {ov.actor}" if ov.actor else ""
    why = f": {ov.reason}" if ov.reason else ""
    if ov.off or spec.k_max == 0:
        reason = f"override{who}: speculation off{why}" if ov.off else f"override{who}: engine has k_max=0{why}"
        return CategoryPolicy(k=0, method=METHOD_OFF, adapt=AdaptRule(k_min=0, k_max=0), source="override",
                              reason=reason[:512], expected=base.expected)
    available = set(_engine_methods(spec)) | {METHOD_ENGINE}
    method = base.method
    note = ""
    if ov.method is not None:
        pinned = METHOD_ENGINE if ov.method == spec.method else ov.method
        if pinned in available:
            method = pinned
        else:
            note = f" (pinned method {ov.method!r} not available on this engine; kept {method!r})"
    if method == METHOD_OFF:
        method = METHOD_ENGINE if spec.method != METHOD_OFF else next(iter(_engine_methods(spec)), METHOD_OFF)
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
