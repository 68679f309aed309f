"""The composition root of the pure controller logic: one :class:`Brain` per application.

The service calls, with an injected ``now`` (unix seconds):
  * :meth:`Brain.ingest` for each validated :class:`TelemetryBatch` (dedup, gaps, learning);
  * :meth:`Brain.policy_for` to answer an engine (decision cached for ``interval_s``, overrides applied
    fresh on every call, version bumped only when what the engine acts on changes);
  * :meth:`Brain.categories` / :meth:`Brain.engines` / :meth:`Brain.metrics` for reads;
  * :meth:`Brain.dump` / :meth:`Brain.load` to snapshot and restore everything learned.

Learned state is per (model, category, method), pooled over engines; bookkeeping (seq, gaps, policy age,
batch mix) is per engine; a policy is tailored to the asking engine's k_max, drafter and batch. The stages
are modules of :mod:`specctl_vllm.controller.core.stages` (ingest, snapshot, decide, wire, reads, evict, persist); this
class holds the state they read and write and decides when each runs: :meth:`ingest` (learning, bookkeeping),
:meth:`policy_for` (the decision cache, the served policy and its version), eviction, overrides and load.
Reads (:meth:`categories`, :meth:`category`, :meth:`engines`, :meth:`metrics`) change nothing but the
decision-error counters: they age figures on copies, compute a due decision without caching it and never
bump a policy version. Nothing here does I/O or reads a clock; the service serialises calls (one lock) so no
internal locking is done.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.controller.core.learn.budget import GLOBAL_SERIES
from specctl_vllm.controller.core.learn.engines import EngineBook
from specctl_vllm.controller.core.learn.estimator import z_for
from specctl_vllm.controller.core.learn.learner import ModelState
from specctl_vllm.controller.core.overrides import Override, active_overrides
from specctl_vllm.controller.core.policy.types import Decision
from specctl_vllm.controller.core.stages import decide, evict, reads, wire
from specctl_vllm.controller.core.stages.decide import Cached, Key, static_decision
from specctl_vllm.controller.core.stages.evict import category_key
from specctl_vllm.controller.core.stages.ingest import Admission, IngestRejected, IngestResult, admit, apply
from specctl_vllm.controller.core.stages.persist import DUMP_FORMAT, DUMP_VERSION, restore
from specctl_vllm.controller.core.views import CategoryView, EngineView, MetricsSnapshot
from specctl_vllm.kernel.cost import PRESETS
from specctl_vllm.kernel.protocol import Policy, SpecConfig, TelemetryBatch

__all__ = ["DUMP_FORMAT", "DUMP_VERSION", "MAX_CACHED_POLICIES", "MAX_ENGINES", "MAX_MODELS", "Brain",
           "IngestRejected", "IngestResult", "category_key"]

#: Bounds on state that clients can grow (models, engines, cached policies).
MAX_MODELS = 64
MAX_ENGINES = 4096
MAX_CACHED_POLICIES = 512
#: Engines forgotten at most to make room in a full budget for one new engine (each frees at least 10 series).
MAX_ROOM_EVICTIONS = 64



def _last_seen(item: EngineBook | ModelState) -> float:
    """Recency order for making room: never seen sorts first."""
    return item.last_seen if item.last_seen is not None else -1.0


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
        self.cap_evictions = 0  # engines and models forgotten at a cap to make room for a new one
        self.evictions = 0
        self.last_decision_error: tuple[str, str] | None = None  # (model, why), for the service to log
        self.load_problems: list[str] = []  # what load() left out of a snapshot
        self._z = z_for(config.learner.confidence)

    # -- ingest -----------------------------------------------------------------------------------------------
    def _make_room(self, batch: TelemetryBatch) -> None:
        """At the engine or model cap, forget the least recently seen engine or model so that a new one is
        served on its first post (a flood of new ids evicts its own kind, never locks the living out)."""
        budget = self.config.budget
        if batch.engine_id not in self._engines and self._engines and len(self._engines) >= budget.max_engines:
            oldest = min(self._engines.values(), key=_last_seen)
            if self._drop("engine", oldest.engine_id):
                self.cap_evictions += 1
        if batch.model_name not in self._models and self._models and len(self._models) >= budget.max_models:
            model = min(self._models.values(), key=_last_seen)
            if self._drop("model", model.name):
                self.cap_evictions += 1
        self._recount()

    def ingest(self, batch: TelemetryBatch, now: float) -> IngestResult:
        budget = self.config.budget
        if (batch.engine_id not in self._engines and len(self._engines) >= budget.max_engines) or (
                batch.model_name not in self._models and len(self._models) >= budget.max_models):
            self._make_room(batch)
        try:
            admitted = self._admit_making_room(batch, now)
        except IngestRejected as exc:
            if exc.status == 429:  # an engine or model cap, or the learned-state budget, is full
                self.budget_refusals += 1
            raise
        if isinstance(admitted, IngestResult):  # a duplicate
            return admitted
        self._models.setdefault(batch.model_name, admitted.state)
        self._engines.setdefault(batch.engine_id, admitted.book)
        self._series += admitted.cost
        return apply(batch, admitted, now, self.config)

    def _admit_making_room(self, batch: TelemetryBatch, now: float) -> Admission | IngestResult:
        """:func:`admit`; a new engine refused for a full budget is admitted once the least recently seen
        engines that free enough are forgotten (at most :data:`MAX_ROOM_EVICTIONS`; none if they would not
        free enough): fresh engine ids fill the budget before the engine cap, and must not lock a new
        engine out until they idle out. A live engine posts every ~0.1 s, so thousands of others would have to
        post after it within that time for it to be the one forgotten."""
        try:
            return admit(batch, self._engines, self._models, self._series, self.config, self._preset, now)
        except IngestRejected as exc:
            if exc.needed is None or batch.engine_id in self._engines or not self._free_series(exc.needed):
                raise
        return admit(batch, self._engines, self._models, self._series, self.config, self._preset, now)

    def _free_series(self, needed: int) -> bool:
        oldest = heapq.nsmallest(MAX_ROOM_EVICTIONS, self._engines.values(), key=_last_seen)
        freed, count = 0, 0
        for book in oldest:
            if freed >= needed:
                break
            freed += evict.engine_charge(book)
            count += 1
        if freed < needed:
            return False
        for book in oldest[:count]:
            if self._drop("engine", book.engine_id):
                self.cap_evictions += 1
        self._recount()
        return True

    def ingest_continued(self, part: TelemetryBatch, now: float) -> IngestResult:
        """Learn from further steps of a batch :meth:`ingest` admitted (a large batch is merged in slices, the
        Brain's lock let go in between); raises :class:`IngestRejected` if its engine was forgotten meanwhile."""
        admitted = admit(part, self._engines, self._models, self._series, self.config, self._preset, now,
                         continued=True)
        assert not isinstance(admitted, IngestResult)
        self._series += admitted.cost
        return apply(part, admitted, now, self.config, continued=True)

    def record_rejected(self, engine_id: str | None) -> None:
        book = self._engines.get(engine_id) if engine_id else None
        if book is not None:
            book.outcomes["rejected"] += 1
        else:
            self._rejected_unknown += 1  # unknown ids are not given state: a client could invent many

    # -- the budget and forgetting ----------------------------------------------------------------------------
    def _recount(self) -> None:
        self._series = evict.series(self._models, self._engines)

    @property
    def series(self) -> int:
        """Series the learned state is charged (an upper bound on what a scrape exports)."""
        return self._series

    def evict_idle(self, now: float) -> list[tuple[str, str]]:
        """Forget engines, categories and models not seen for their idle time; what was forgotten, as
        (kind, name) with kind engine | model | category (name ``json.dumps([model, category])``)."""
        evict.stamp_unseen(self._models, self._engines, now)
        out = evict.idle(self._models, self._engines, self.config.budget, now)
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
        return evict.drop(kind, name, self._models, self._engines, (self._decisions, self._served),
                          self._decision_errors)

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
            problem = f"{type(exc).__name__}: {exc}"
            self._count_error(model, problem)
            self._served.pop(key, None)
            policy = self._wire(key, static_decision(spec, problem), spec, now)
        book = self._engines.get(engine_id) if engine_id else None
        if book is not None:
            book.policy_served_at = now
            book.policy_version_served = policy.version
        return policy

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
        decision, problem = decide.compute(self._models.get(key[0]), self._engines.get(key[4]) if key[4] else None,
                                           spec, now, cached.decision if cached else None, self.config, self._preset)
        if problem is not None:
            # the last good decision keeps being served (else the engine's static config), retried next interval
            self._count_error(key[0], problem)
            decision = cached.decision if cached is not None else static_decision(spec, problem)
        if store:
            _remember(self._decisions, key, Cached(now, decision, signature))
        return decision

    def _signature(self, model: str) -> tuple[int, int]:
        return decide.signature(self._models.get(model), self.config.policy.min_evidence)

    def _wire(self, key: Key, decision: Decision, spec: SpecConfig, now: float) -> Policy:
        held = self._served.get(key)
        served, self._version = wire.serve(held, decision, spec, now, active_overrides(self._overrides, now),
                                           self._models.get(key[0]), self._preset, self.config, self._version)
        if held is not None and served.policy is held.policy:
            self._served[key] = served  # the same policy, wired from a newer basis: it keeps its place
        else:
            _remember(self._served, key, served)
        return served.policy

    # -- reads --------------------------------------------------------------------------------------------------
    def _count_error(self, model: str, problem: str) -> None:
        self._decision_errors[model] = self._decision_errors.get(model, 0) + 1
        self.last_decision_error = (model, problem[:300])

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
                self._count_error(model, f"{type(exc).__name__}: {exc}")
        return out

    def category(self, name: str, now: float, model: str | None = None) -> CategoryView | None:
        for m in [model] if model is not None else list(self._models):
            ms = self._models.get(m)
            if ms is not None and name in ms.categories:
                try:
                    return self._views(m, now, [name])[0]
                except Exception as exc:  # noqa: BLE001 -- as in categories()
                    self._count_error(m, f"{type(exc).__name__}: {exc}")
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
            self._count_error(model, f"{type(exc).__name__}: {exc}")
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
    def dump(self, models: dict | None = None, engines: dict | None = None) -> dict:
        """Everything learned; ``models`` / ``engines``: those parts when the caller dumped them piece by piece
        (:meth:`dump_model`, :meth:`dump_engines`, so that a snapshot need not hold the service's lock for all
        of them at once)."""
        return {
            "format": DUMP_FORMAT, "version": DUMP_VERSION, "policy_version": self._version,
            "cost_preset": self.config.policy.cost_preset,
            "models": {m: ms.to_dict() for m, ms in self._models.items()} if models is None else models,
            "engines": self.dump_engines(self._engines) if engines is None else engines,
            "rejected_unknown": self._rejected_unknown,
        }

    def dump_model(self, model: str) -> dict | None:
        ms = self._models.get(model)
        return None if ms is None else ms.to_dict()

    def engine_ids(self) -> list[str]:
        return list(self._engines)

    def dump_engines(self, ids: Iterable[str]) -> dict[str, dict]:
        """The books of those of ``ids`` still known."""
        return {e: book.to_dict() for e in ids if (book := self._engines.get(e)) is not None}

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
        for kind, name in evict.over_budget(self._models, self._engines):
            if self._series <= self.config.budget.max_series:
                return
            self._drop(kind, name)
            self._recount()


def _remember(cache: dict, key: Key, value: object) -> None:
    """Store ``value`` as the newest entry of a bounded cache, dropping the oldest beyond the bound."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > MAX_CACHED_POLICIES:
        cache.pop(next(iter(cache)))
