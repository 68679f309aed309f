"""The composition root of the pure controller logic: one :class:`Brain` per application.

The service calls, with an injected ``now`` (unix seconds):
  * :meth:`Brain.ingest` for each validated :class:`TelemetryBatch` (dedup, gaps, learning);
  * :meth:`Brain.policy_for` to answer an engine (decision cached for ``interval_s``, overrides applied
    fresh on every call, version bumped only when what the engine acts on changes);
  * :meth:`Brain.categories` / :meth:`Brain.engines` / :meth:`Brain.metrics` for reads;
  * :meth:`Brain.dump` / :meth:`Brain.load` to snapshot and restore everything learned.

Learned state is per (model, category, method), pooled over engines; bookkeeping (seq, gaps, policy age,
batch mix) is per engine; a policy is tailored to the asking engine's k_max, drafter and batch. The stages
are modules of :mod:`controller.core.stages` (ingest checks, snapshot, decide, wire, reads, persist); this
class holds the state they read and is the only place that writes it: :meth:`ingest` (learning, bookkeeping),
:meth:`policy_for` (the decision cache, the served policy and its version), eviction, overrides and load.
Reads (:meth:`categories`, :meth:`category`, :meth:`engines`, :meth:`metrics`) change nothing but the
decision-error counters: they age figures on copies, compute a due decision without caching it and never
bump a policy version. Nothing here does I/O or reads a clock; the service serialises calls (one lock) so no
internal locking is done.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable

from controller.core.budget import GLOBAL_SERIES, MODEL_SERIES, engine_series, label_weight, model_series
from controller.core.config import BrainConfig
from controller.core.cost import PRESETS
from controller.core.engines import COUNTER_CAP, EngineBook
from controller.core.estimator import z_for
from controller.core.learner import ModelState
from controller.core.overrides import Override, active_overrides
from controller.core.policy import goodput
from controller.core.policy.types import Decision
from controller.core.stages import decide, reads, wire
from controller.core.stages.decide import Cached, Key, static_decision
from controller.core.stages.evict import category_key, idle
from controller.core.stages.ingest import IngestRejected, IngestResult, charge, validate
from controller.core.stages.persist import DUMP_FORMAT, DUMP_VERSION, restore
from controller.core.stages.snapshot import policy_snapshot
from controller.core.views import CategoryView, EngineView, MetricsSnapshot
from controller.protocol import Policy, SpecConfig, TelemetryBatch

__all__ = ["DUMP_FORMAT", "DUMP_VERSION", "MAX_CACHED_POLICIES", "MAX_ENGINES", "MAX_MODELS", "Brain",
           "IngestRejected", "IngestResult", "category_key"]

#: Bounds on state that clients can grow (models, engines, cached policies).
MAX_MODELS = 64
MAX_ENGINES = 4096
MAX_CACHED_POLICIES = 512


class Brain:
    def __init__(self, config: BrainConfig) -> None:
        self.config = config
        self._preset = PRESETS[config.policy.cost_preset]
        self._models: dict[str, ModelState] = {}
        self._engines: dict[str, EngineBook] = {}
        self._overrides: tuple[Override, ...] = ()
        self._decisions: dict[Key, Cached] = {}
        self._served: dict[Key, wire.Served] = {}
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
        try:
            validate(batch, book, len(self._engines), self._models, self.config.budget)
        except IngestRejected as exc:
            if exc.status == 429:  # an engine or model cap is full
                self.budget_refusals += 1
            raise
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
        cost = extra + charge(ms, digest, batch.spec.k_max)
        if cost and self._series + cost > self.config.budget.max_series:
            # the budget is full: new category names pool into the overflow category, as beyond the cap
            digest = ms.digest(batch, min(self.config.learner.max_categories_per_model, len(ms.categories)))
            cost = extra + charge(ms, digest, batch.spec.k_max)
            if self._series + cost > self.config.budget.max_series:
                self.budget_refusals += 1
                raise IngestRejected(
                    f"learned-state budget full ({self._series} of {self.config.budget.max_series} series, this "
                    f"batch needs {cost} more): state idle for longer than the SPECCTL_BUDGET_*_IDLE_S settings "
                    "is forgotten, or an operator can forget it (POST /v1/forget)", status=429)
        # nothing above mutated state: a rejection leaves everything as it was
        self._models.setdefault(batch.model_name, ms)
        self._engines.setdefault(batch.engine_id, book)
        self._series += cost
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

    def record_rejected(self, engine_id: str | None) -> None:
        book = self._engines.get(engine_id) if engine_id else None
        if book is not None:
            book.outcomes["rejected"] += 1
        else:
            self._rejected_unknown += 1  # unknown ids are not given state: a client could invent many

    # -- the budget and forgetting ----------------------------------------------------------------------------
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
        for book in self._engines.values():  # restored without a time: the idle clock starts now
            book.last_seen = now if book.last_seen is None else book.last_seen
        for ms in self._models.values():
            ms.last_seen = now if ms.last_seen is None else ms.last_seen
            for st in ms.categories.values():
                st.last_seen = now if st.last_seen is None else st.last_seen
        out = idle(self._models, self._engines, self.config.budget, now)
        for kind, name in out:
            self._drop(kind, name)
        if out:
            self._recount()
            self.evictions += len(out)
        return out

    def forget(self, kind: str, name: str) -> bool:
        """An operator's eviction (same effect as the idle sweep); False when there was nothing to forget."""
        if not self._drop(kind, name):
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

    def _drop(self, kind: str, name: str) -> bool:
        if kind == "engine" and name in self._engines:
            self._engines.pop(name, None)
            self._drop_cached(lambda k: k[4] == name)
        elif kind == "model" and name in self._models:
            self._models.pop(name, None)
            self._decision_errors.pop(name, None)
            self._drop_cached(lambda k: k[0] == name)
        elif kind == "category":
            model, cat = json.loads(name)
            ms = self._models.get(model)
            if ms is None or cat not in ms.categories:
                return False
            ms.categories.pop(cat, None)
            for mix in [ms.mix] + [b.mix for b in self._engines.values() if b.model == ms.name]:
                mix.per_category.pop(cat, None)
                mix.committed_per_category.pop(cat, None)
        else:
            return False
        return True

    def _drop_cached(self, match) -> None:
        for cache in (self._decisions, self._served):
            for key in [k for k in cache if match(k)]:
                cache.pop(key, None)

    # -- overrides ----------------------------------------------------------------------------------------------
    def set_overrides(self, overrides: Iterable[Override]) -> None:
        self._overrides = tuple(overrides)

    # -- policy -------------------------------------------------------------------------------------------------
    def policy_for(self, model: str, spec: SpecConfig, now: float, engine_id: str | None = None) -> Policy:
        key = decide.key(model, spec, engine_id)
        decision = self._decision(key, spec, now)
        try:
            policy = self._wire(key, decision, spec, now)
        except Exception as exc:  # noqa: BLE001 -- an ingested batch is acknowledged whatever the decision
            self._count_error(model, exc)
            self._served.pop(key, None)
            policy = self._wire(key, static_decision(spec, f"{type(exc).__name__}: {exc}"), spec, now)
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
        key = decide.key(model, spec, engine_id)
        if decide.is_fresh(self._decisions.get(key), key, now, self.config.policy.interval_s, self._signature(model)):
            return 0
        ms = self._models.get(model)
        return 0 if ms is None else sum(len(st.methods) for st in ms.categories.values()) * max(spec.k_max, 4)

    def _decision(self, key: Key, spec: SpecConfig, now: float, store: bool = True) -> Decision:
        """The decision for this engine shape: the cached one while fresh, else computed (and cached when
        ``store``; a read passes False)."""
        cached = self._decisions.get(key)
        signature = self._signature(key[0])
        if decide.is_fresh(cached, key, now, self.config.policy.interval_s, signature):
            return cached.decision
        try:
            snap = policy_snapshot(self._models.get(key[0]), self._engines.get(key[4]) if key[4] else None, spec,
                                   now, cached.decision if cached else None, self.config.learner, self._preset)
            decision = goodput.decide(snap, self.config.policy)
            problem = decide.unsound(decision, spec)
        except Exception as exc:  # noqa: BLE001 -- no learned state may make a later request fail
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            # the last good decision keeps being served (else the engine's static config), retried next interval
            model = key[0]
            self._decision_errors[model] = self._decision_errors.get(model, 0) + 1
            self.last_decision_error = (model, problem[:300])
            decision = cached.decision if cached is not None else static_decision(spec, problem)
        if store:
            self._decisions.pop(key, None)
            self._decisions[key] = Cached(now, decision, signature)
            while len(self._decisions) > MAX_CACHED_POLICIES:
                self._decisions.pop(next(iter(self._decisions)))
        return decision

    def _wire(self, key: Key, decision: Decision, spec: SpecConfig, now: float) -> Policy:
        active = active_overrides(self._overrides, now)
        cells, curves = wire.graph_inputs(self._models.get(key[0]), spec, self._preset, self.config.learner)
        graph_basis = (cells.model_dump_json() if cells is not None else None, tuple(sorted(
            (n, tuple(c)) for n, c in curves.items())))
        basis = (decision, tuple(active.values()), tuple(spec.model_free_methods), graph_basis)
        served = self._served.get(key)
        if served is not None and wire.same_basis(served.basis, basis):
            return served.policy
        default, cats = wire.category_policies(decision, spec, active, curves)
        content = (self.config.policy.ttl_s, wire.content(default),
                   tuple(sorted((n, wire.content(p)) for n, p in cats.items())), graph_basis)
        if served is not None and served.content == content:
            served.basis = basis
            return served.policy
        self._version += 1
        policy = Policy(version=self._version, issued_at=now, ttl_s=self.config.policy.ttl_s, default=default,
                        categories=cats, step_cells=cells)
        self._served.pop(key, None)
        self._served[key] = wire.Served(content, policy, basis)
        while len(self._served) > MAX_CACHED_POLICIES:
            self._served.pop(next(iter(self._served)))
        return policy

    # -- reads --------------------------------------------------------------------------------------------------
    def _count_error(self, model: str, exc: Exception) -> None:
        self._decision_errors[model] = self._decision_errors.get(model, 0) + 1
        self.last_decision_error = (model, f"{type(exc).__name__}: {exc}"[:300])

    def _effective(self, model: str, now: float, cached_only: bool = False) -> reads.Effective | None:
        """The decision a view shows: that of the model's most recently seen engine; ``cached_only``: the one
        last computed, however old (a scrape reads what the engines are being served)."""
        viewed = reads.viewed_engine(self._engines, model)
        if viewed is None:
            return None
        b, spec = viewed
        key = decide.key(model, spec, b.engine_id)
        held = self._decisions.get(key) if cached_only else None
        decision = held.decision if held is not None else self._decision(key, spec, now, store=False)
        default, cats = wire.category_policies(decision, spec, active_overrides(self._overrides, now), {})
        return reads.Effective(decision=decision, default=default, categories=cats, spec=spec)

    def categories(self, now: float) -> list[CategoryView]:
        out: list[CategoryView] = []
        for model in self._models:
            try:
                out.extend(self._views(model, now, self._models[model].categories))
            except Exception as exc:  # noqa: BLE001 -- one model's unreadable state must not fail every read
                self._count_error(model, exc)
        return out

    def category(self, name: str, now: float, model: str | None = None) -> CategoryView | None:
        for m in [model] if model is not None else list(self._models):
            ms = self._models.get(m)
            if ms is not None and name in ms.categories:
                try:
                    return self._views(m, now, [name])[0]
                except Exception as exc:  # noqa: BLE001 -- as in categories()
                    self._count_error(m, exc)
                    return None
        return None

    def _views(self, model: str, now: float, names: Iterable[str]) -> list[CategoryView]:
        eff = self._effective(model, now)
        active = active_overrides(self._overrides, now)
        return [reads.category_view(self._models[model], c, now, eff, active, self.config, self._z) for c in names]

    def engines(self, now: float) -> list[EngineView]:
        return [reads.engine_view(b, now, self.config.learner.mix_half_life_s) for b in self._engines.values()]

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
            eff = self._effective(model, now, cached_only=True)
            return reads.model_metrics(ms, self._engines, eff, active_overrides(self._overrides, now), now,
                                       self.config)
        except Exception as exc:  # noqa: BLE001 -- one model's unreadable state must not fail the scrape
            self._count_error(model, exc)
            return None

    def metrics(self, now: float, parts: list[tuple[list, list, list, list] | None] | None = None) -> MetricsSnapshot:
        """Everything a scrape exports; ``parts``: the models' rows built before (see :meth:`model_metrics`)."""
        if parts is None:
            parts = [self.model_metrics(model, now) for model in self._models]
        # every known model has a sample, zero included, so "errors in range" reads 0 rather than no data
        errors = {**{m: 0 for m in self._models}, **self._decision_errors}
        return reads.metrics_snapshot(
            [p for p in parts if p is not None], self._engines, active_overrides(self._overrides, now), now,
            overflow_steps=tuple((m, ms.overflow_steps) for m, ms in self._models.items()),
            rejected_unknown_engine=self._rejected_unknown, decision_errors=tuple(sorted(errors.items())),
            series=self._series, series_budget=self.config.budget.max_series, evictions=self.evictions,
            budget_refusals=self.budget_refusals)

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
        restored = restore(data, config, brain._preset)
        brain._version, brain._rejected_unknown = restored.policy_version, restored.rejected_unknown
        brain._models, brain._engines = restored.models, restored.engines
        brain.load_problems = restored.problems
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
            self._drop("category", category_key(model, cat))
            self._recount()
        for eid in sorted(self._engines, key=lambda e: self._engines[e].last_seen or 0.0):
            if self._series <= self.config.budget.max_series:
                return
            self._drop("engine", eid)
            self._recount()
