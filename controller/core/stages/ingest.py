"""A telemetry batch checked, charged against the learned-state budget, then learned from.

:func:`admit` runs every check: :func:`validate` raises :class:`IngestRejected` for a batch that passed the
schema but makes no sense (or does not fit the engine/model caps), the engine's book classifies its sequence
number (a duplicate is answered without learning), and :func:`charge` says how many series its digest would add.
Up to there nothing learned is touched (only the engine's own counters of conflicts, suspects and duplicates),
so a rejection leaves the learned state as it was; :func:`apply` then learns from the admitted batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from specctl_vllm.controller.core.config import BrainConfig, BudgetSettings
from specctl_vllm.controller.core.learn.budget import (
    MODEL_SERIES,
    category_series,
    engine_series,
    label_weight,
    width_series,
)
from specctl_vllm.controller.core.learn.engines import COUNTER_CAP, EngineBook, record_width_steps
from specctl_vllm.controller.core.learn.learner import BatchDigest, ModelState
from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.protocol import METHOD_ENGINE, METHOD_OFF, TelemetryBatch


class IngestRejected(Exception):
    """A batch that passed the schema but makes no sense; the service answers ``status`` (422, or 409 for an
    engine id shared by two live engines, 429 for a full budget) with ``reason``."""

    def __init__(self, reason: str, status: int = 422, needed: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.needed = needed  # at a full budget: the series the batch needs beyond it


@dataclass(frozen=True)
class IngestResult:
    outcome: Literal["accepted", "duplicate"]
    gaps: int


@dataclass(frozen=True, kw_only=True)
class Admission:
    """A batch that passed every check, not applied yet: its engine's book and model state (new ones not yet
    stored), its digest, the gap its sequence number opened and the series it adds to the budget."""

    book: EngineBook
    state: ModelState
    digest: BatchDigest
    gap_delta: int
    cost: int
    #: the proposal length the model is charged at after this batch (:func:`charged_k`)
    k: int
    #: a graph-shaped engine's steps-per-width series are charged with this batch (they fit the budget)
    charge_widths: bool = False


def validate(batch: TelemetryBatch, book: EngineBook | None, engines: int, models: Mapping[str, ModelState],
             budget: BudgetSettings) -> None:
    if book is None and engines >= budget.max_engines:
        raise IngestRejected(f"too many engines (limit {budget.max_engines}; an engine idle for "
                             f"{budget.engine_idle_s:g} s is forgotten)", status=429)
    if batch.model_name not in models and len(models) >= budget.max_models:
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


def charged_k(digest: BatchDigest, k_max: int) -> int:
    """The proposal length a batch must be charged at: the engine's k_max, or the largest k of its histograms
    if larger (counterfactual ones are scored at the patch's own k, which the protocol does not bound by k_max,
    and the metrics export a position for each k an estimator learned)."""
    return max(k_max, max((k for per_k in digest.hists.values() for k in per_k), default=0))


def charge(ms: ModelState, digest: BatchDigest, k_max: int) -> int:
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


def known_only(batch: TelemetryBatch, ms: ModelState) -> tuple[TelemetryBatch, int]:
    """``batch`` with only what ``ms`` already holds series for (known categories and drafters, k up to the
    charged one), and how many category reports were dropped."""
    dropped = 0
    steps = []
    for step in batch.steps:
        cats = []
        for cs in step.categories:
            st = ms.categories.get(cs.category)
            if st is None or (cs.method not in st.methods and cs.hists):
                dropped += 1
                continue
            cf = {m: [h for h in hs if h.k <= ms.charged_k] for m, hs in cs.counterfactual.items() if m in st.methods}
            hists = [h for h in cs.hists if h.k <= ms.charged_k]
            cats.append(cs.model_copy(update={"hists": hists, "counterfactual": cf}))
        steps.append(step.model_copy(update={"categories": cats}))
    return batch.model_copy(update={"steps": steps}), dropped


def admit(batch: TelemetryBatch, engines: Mapping[str, EngineBook], models: Mapping[str, ModelState], series: int,
          config: BrainConfig, preset: CostCoefficients, now: float, *, continued: bool = False
          ) -> Admission | IngestResult:
    """Check ``batch`` against the learned state (``series`` charged so far): an :class:`Admission`, or the
    answer to a duplicate; raises :class:`IngestRejected` (429 when a cap or the budget is full).

    ``continued``: ``batch`` holds further steps of a batch whose first part was admitted already (a large
    batch is merged in slices); its sequence number was classified and recorded with that first part."""
    book = engines.get(batch.engine_id)
    if continued and (book is None or book.boot_id != batch.boot_id or batch.model_name not in models):
        raise IngestRejected(f"engine {batch.engine_id!r} was forgotten while its batch was merged", status=409)
    validate(batch, book, len(engines), models, config.budget)
    if book is None:
        book = EngineBook(batch.engine_id)
    outcome, gap_delta = ("accepted", 0) if continued else book.classify(batch.boot_id, batch.seq)
    if outcome == "conflict":
        book.record_conflict(batch.boot_id, batch.seq, now)
        raise IngestRejected(f"engine id {batch.engine_id!r} is used by two running engines (boot "
                             f"{batch.boot_id!r} and boot {book.boot_id!r}): give each engine its own "
                             "SPECCTL_ENGINE_ID", status=409)
    if outcome == "suspect":
        book.record_suspect(batch.boot_id, batch.seq)
    if outcome != "accepted":
        if batch.engine_id in engines:
            book.outcomes["duplicate"] += 1
        return IngestResult("duplicate", book.gaps)
    ms = models.get(batch.model_name)
    new_model = ms is None
    if ms is None:
        ms = ModelState(batch.model_name, preset, config.learner)
    cap = config.learner.max_categories_per_model
    digest = ms.digest(batch, cap)
    extra = (0 if batch.engine_id in engines else engine_series(batch.engine_id, batch.model_name)) + (
        math.ceil(MODEL_SERIES * label_weight(batch.model_name)) if new_model else 0)
    k = charged_k(digest, batch.spec.k_max)
    cost = extra + charge(ms, digest, k)
    limit = config.budget.max_series
    if cost and series + cost > limit:
        # the budget is full: new category names pool into the overflow category, as beyond the cap
        digest = ms.digest(batch, min(cap, len(ms.categories)))
        k = charged_k(digest, batch.spec.k_max)
        cost = extra + charge(ms, digest, k)
        if series + cost > limit and batch.engine_id in engines and not new_model:
            # a known engine is never refused whole: what needs new series (a new drafter, a larger k, a
            # category beyond those learned) is dropped, counted in the model's dropped methods
            kept, dropped = known_only(batch, ms)
            ms.dropped_methods += dropped
            digest = ms.digest(kept, min(cap, len(ms.categories)))
            k = charged_k(digest, min(batch.spec.k_max, ms.charged_k))
            cost = extra + charge(ms, digest, k)
        if series + cost > limit:
            raise IngestRejected(
                f"learned-state budget full ({series} of {limit} series, this batch needs {cost} more): state "
                "idle for longer than the SPECCTL_BUDGET_*_IDLE_S settings is forgotten, or an operator can "
                "forget it (POST /v1/forget)", status=429, needed=series + cost - limit)
    # steps per width: optional telemetry, charged when a graph-shaped engine first reports, where it fits
    widths = bool(batch.spec.graph_widths) and not book.widths_charged
    if widths and series + cost + width_series(batch.engine_id) <= limit:
        cost += width_series(batch.engine_id)
    else:
        widths = False
    return Admission(book=book, state=ms, digest=digest, gap_delta=gap_delta, cost=cost, k=k,
                     charge_widths=widths)


def apply(batch: TelemetryBatch, admitted: Admission, now: float, config: BrainConfig, *,
          continued: bool = False) -> IngestResult:
    """Learn from an admitted batch: the model's state and the engine's bookkeeping (the caller stores a new
    book or model state and charges the series). ``continued``: a further slice (see :func:`admit`), whose
    sequence number and outcome were recorded with the first."""
    ms, book, digest = admitted.state, admitted.book, admitted.digest
    ms.charged_k = max(ms.charged_k, admitted.k)
    ms.apply(digest, now, config.learner, book.mix)
    if not continued:
        book.record(batch.boot_id, batch.seq, admitted.gap_delta, batch.dropped_steps)
    book.model = batch.model_name
    book.spec_method, book.spec_k_max = batch.spec.method, batch.spec.k_max
    book.spec_full_cuda_graphs = batch.spec.full_cuda_graphs
    book.spec_graph_widths = tuple(batch.spec.graph_widths)
    book.model_free_methods = tuple(batch.spec.model_free_methods)
    book.steps = min(COUNTER_CAP, book.steps + digest.steps)
    book.step_seconds += digest.step_seconds
    book.widths_charged = book.widths_charged or admitted.charge_widths
    if book.widths_charged:
        record_width_steps(book, digest.width_steps)
    book.last_seen = now
    if batch.policy_version is not None:
        book.policy_version_reported = batch.policy_version
    if not continued:
        book.outcomes["accepted"] += 1
    return IngestResult("accepted", book.gaps)
