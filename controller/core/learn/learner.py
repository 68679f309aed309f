"""Learned state of one model: acceptance per (category, method), counters, batch mix, step cost.

Merging a batch is two passes: first the batch's histograms are summed per (category, method,
counterfactual, k) in plain integers, then each touched estimator is decayed to ``now`` once and gets one
vector add per array (its proposal lengths summed in integers first). That keeps the per-step work to
integer additions and the numpy calls per batch to a few per touched estimator.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import mul

from specctl_vllm.controller.core.config import LearnerSettings
from specctl_vllm.controller.core.learn.cost_fit import OnlineCostModel
from specctl_vllm.controller.core.learn.engines import COUNTER_CAP
from specctl_vllm.controller.core.learn.estimator import AcceptanceEstimator
from specctl_vllm.controller.core.learn.mix import Mix
from specctl_vllm.kernel.cost import CostCoefficients, step_kind, step_shape
from specctl_vllm.kernel.drafters import resolve
from specctl_vllm.kernel.model.budget import BudgetMeter, budget_sample, verified_width
from specctl_vllm.kernel.model.cells import CellTable
from specctl_vllm.kernel.protocol import (
    MAX_K,
    MAX_METHODS,
    METHOD_OFF,
    OVERFLOW_CATEGORY,
    StepRecord,
    TelemetryBatch,
)


@dataclass
class CategoryState:
    methods: dict[str, AcceptanceEstimator] = field(default_factory=dict)
    request_steps: int = 0
    committed_tokens: int = 0
    spec_off_request_steps: int = 0
    last_seen: float | None = None  # controller time of the last batch that carried this category

    def to_dict(self) -> dict:
        return {"methods": {m: e.to_dict() for m, e in self.methods.items()}, "request_steps": self.request_steps,
                "committed_tokens": self.committed_tokens, "spec_off_request_steps": self.spec_off_request_steps,
                "last_seen": self.last_seen}

    @classmethod
    def from_dict(cls, d: dict) -> CategoryState:
        methods = d.get("methods", {})
        if len(methods) > MAX_METHODS:
            raise ValueError("too many methods")
        last_seen = d.get("last_seen")
        st = cls({str(m): AcceptanceEstimator.from_dict(e) for m, e in methods.items()},
                 _count(d.get("request_steps", 0)), _count(d.get("committed_tokens", 0)),
                 _count(d.get("spec_off_request_steps", 0)), None if last_seen is None else float(last_seen))
        if st.last_seen is not None and not math.isfinite(st.last_seen):
            raise ValueError("last_seen not finite")
        return st


#: Shortest step time the cost model learns from, seconds. No engine step (schedule, forward pass, sampling)
#: takes less than a microsecond; a report below it is a clock artefact or an attack, and learning from it
#: drove the fitted step cost to zero (every decision then divided by zero). Such steps still count as steps.
MIN_STEP_S = 1e-6
#: ... nor verifies a token in less than a nanosecond (an H200 spends about 10 us per decode token, prefill
#: well above 0.1 us): a step reporting less time for its tokens is not learned from either.
MIN_TOKEN_S = 1e-9
#: Token-budget meters one model keeps (engines of one model with different max_num_batched_tokens).
MAX_BUDGET_METERS = 4
#: Engines whose last decode step's cell sample is held at once (one per engine of the model; past that the
#: oldest is dropped, which loses one step's sample)
MAX_HELD_CELL_TAILS = 256


def _count(value: object) -> int:
    return min(COUNTER_CAP, max(0, int(value)))  # type: ignore[call-overload]


@dataclass
class BatchDigest:
    """What one batch adds, summed per key; built without touching any state."""

    hists: dict[tuple[str, str, bool], dict[int, list[int]]]
    #: (category, method, counterfactual) -> [asks of the drafter, asks that drafted]: the match rate
    asks: dict[tuple[str, str, bool], list[int]]
    requests: dict[str, int]
    committed: dict[str, int]
    spec_off: dict[str, int]
    per_category_mix: dict[str, int]
    shapes: list[tuple[float, float, float, float, float, int]]  # n, tokens, depth, free, wall_s, kind
    busy_steps: int
    busy_requests: int
    extra_tokens: int
    extra_values: list[int]
    steps: int
    step_seconds: float
    new_categories: list[str]
    overflowed: int
    dropped_methods: int
    #: graph-shaped decode steps: (batch size, width, seconds) for the step-cost cell table (:func:`cell_samples`)
    cell_samples: list[tuple[int, int, float]] = field(default_factory=list)
    #: graph-shaped engines that report their token budget: (budget, [(scheduled, prompt, committed,
    #: interval_s) per step]) for the steady-step model's meter
    budget_samples: tuple[int, list[tuple[int, int, int, float | None, int]]] | None = None
    #: graph-shaped engines: steps per width the step verified (its own width, else its drafts per request)
    width_steps: dict[int, int] = field(default_factory=dict)
    #: the engine the batch came from, its last step's cell sample (held until its next step is seen) and
    #: whether the batch's first step carries prompt tokens (then the held sample is dropped)
    engine: str = ""
    cell_tail: tuple[int, int, float] | None = None
    head_prompt: bool = False



def cell_samples(steps: Sequence[StepRecord]) -> tuple[list[tuple[int, int, float]], tuple[int, int, float] | None]:
    """The cell samples of consecutive steps of one engine: each decode step's :func:`cell_sample` if the step
    after it carries no prompt tokens, and, apart, the last step's (its next step is in the engine's next
    batch). Why: a decode step followed by a prompt step is charged for part of it. On the H200 (sessions 7
    and 8, c = 16 and 64, every profile and width) such steps measured 2-3x the others (16-20 ms against 6-8
    ms at 64 requests), so a width measured by a few steps, more of them before a prompt, looked dear: at 64
    requests on low K = 1's 17 steps priced it at 15 ms, against 7.6 for those before a decode step."""
    out = []
    for step, after in itertools.pairwise(steps):
        sample = cell_sample(step)
        if sample is not None and after.prefill_tokens == 0:
            out.append(sample)
    return out, (cell_sample(steps[-1]) if steps else None)


def cell_sample(step: StepRecord) -> tuple[int, int, float] | None:
    """(batch size, width, cost seconds) of a step the cell table learns from: decode steps (no prompt tokens)
    of a graph-shaped engine, which report their width. The cost is ``min(wall_s, interval_s)``: under async
    scheduling the interval since the previous step ended is the step's cost, the wall time overlaps it."""
    if step.width is None or step.batch_size <= 0 or step.prefill_tokens != 0:
        return None
    return step.batch_size, step.width, step.wall_s if step.interval_s is None else min(step.wall_s, step.interval_s)

class ModelState:
    def __init__(self, name: str, preset: CostCoefficients, settings: LearnerSettings) -> None:
        self.name = name
        self.categories: dict[str, CategoryState] = {}
        self.overflow_steps = 0
        self.dropped_methods = 0
        #: largest k_max (or histogram k, if larger) of a batch of this model: what the series budget was charged
        #: at, and the most positions its metrics export
        self.charged_k = 0
        self.last_seen: float | None = None
        self.load_skipped: list[str] = []  # categories a snapshot held that did not validate
        self.mix = Mix()
        self.cost = OnlineCostModel(preset, settings.cost_prior_strength)
        self.cells = CellTable()
        #: engine id -> its last decode step's cell sample, until that engine's next batch says what followed
        self.cell_tails: dict[str, tuple[int, int, float]] = {}
        #: step token budget -> the steady-step model's meter, fed from the steps as the engine feeds its own;
        #: not persisted (full steps re-measure it within seconds of a budget-bound load)
        self.budgets: dict[int, BudgetMeter] = {}

    # -- ingest ---------------------------------------------------------------------------------------------
    def digest(self, batch: TelemetryBatch, cap: int) -> BatchDigest:
        # the histograms' rows, kept by reference and summed per column once at the end (zip does that in C)
        rows_by_key: dict[tuple[str, str, bool], dict[int, list[list[int]]]] = defaultdict(lambda: defaultdict(list))
        asks: dict[tuple[str, str, bool], list[int]] = defaultdict(lambda: [0, 0])
        requests: dict[str, int] = defaultdict(int)
        spec_off: dict[str, int] = defaultdict(int)
        shapes = []
        known = set(self.categories)
        new: list[str] = []
        methods_per_cat: dict[str, set[str]] = {}  # filled for the categories this batch touches only
        overflowed = dropped = busy = busy_req = extra = 0
        extra_values: list[int] = []
        budget = batch.spec.token_budget if batch.spec.graph_widths else None
        budget_samples: list[tuple[int, int, int, float | None, int]] = []
        seconds = 0.0
        cells_in, cell_tail = cell_samples(batch.steps)
        graph_shaped = bool(batch.spec.graph_widths)
        width_steps: dict[int, int] = {}
        for step in batch.steps:
            seconds += step.wall_s
            if graph_shaped and step.batch_size > 0:
                # a step with prompt chunks reports no width of its own: its drafts per request are the width
                w = step.width if step.width is not None else min(verified_width(step.draft_tokens,
                                                                                 step.batch_size), MAX_K)
                width_steps[w] = width_steps.get(w, 0) + 1
            if budget is not None and step.scheduled_tokens > 0:
                budget_samples.append(budget_sample(step))
            if step.batch_size > 0:
                busy += 1
                busy_req += step.batch_size
                e = max(0, step.scheduled_tokens - step.batch_size - step.draft_tokens)
                extra += e
                extra_values.append(e)
                if step.wall_s >= max(MIN_STEP_S, MIN_TOKEN_S * step.scheduled_tokens):  # below: not a timing
                    n, tok, depth, free = step_shape(step, batch.spec.method)
                    shapes.append((n, tok, depth, free, step.wall_s, step_kind(step)))
            for cs in step.categories:
                cat = cs.category
                if cat not in known:
                    if len(known) >= cap and cat != OVERFLOW_CATEGORY:
                        cat = OVERFLOW_CATEGORY
                        overflowed += 1
                    if cat not in known:
                        known.add(cat)
                        new.append(cat)
                requests[cat] += cs.requests
                drafted = 0
                mset = methods_per_cat.get(cat)
                if mset is None:
                    held = self.categories.get(cat)
                    mset = methods_per_cat[cat] = set(held.methods) if held is not None else set()
                real = resolve(cs.method, batch.spec.method)
                # (method, counterfactual, histograms, asks): every request of a drafting method asked it
                entries = [(real, False, cs.hists, cs.requests)] if real != METHOD_OFF else []
                tried = cs.counterfactual_attempts
                entries += [(m, True, cs.counterfactual.get(m, ()), tried.get(m, 0))
                            for m in {**cs.counterfactual, **tried}]
                for method, cf, hs, asked in entries:
                    if not hs and not asked:
                        continue
                    if method not in mset:
                        if len(mset) >= MAX_METHODS:
                            dropped += 1
                            continue
                        mset.add(method)
                    key = (cat, method, cf)
                    hit = 0
                    if hs:
                        rows = rows_by_key[key]
                        for h in hs:
                            rows[h.k].append(h.accepted)
                            hit += sum(h.accepted)
                    if not cf:
                        drafted += hit
                    if asked:
                        pair = asks[key]
                        pair[0] += asked
                        pair[1] += hit
                spec_off[cat] += max(0, cs.requests - drafted)
        hists = {key: {k: _column_sums(counts) for k, counts in per_k.items()} for key, per_k in rows_by_key.items()}
        committed = _committed_tokens(requests, hists)
        return BatchDigest(hists, dict(asks), dict(requests), committed, dict(spec_off), dict(requests), shapes, busy,
                           busy_req, extra, extra_values, len(batch.steps), seconds, new, overflowed, dropped,
                           cells_in, (budget, budget_samples) if budget is not None else None,
                           engine=f"{batch.engine_id}/{batch.boot_id}", cell_tail=cell_tail,
                           head_prompt=bool(batch.steps) and batch.steps[0].prefill_tokens > 0,
                           width_steps=width_steps)

    def apply(self, d: BatchDigest, now: float, s: LearnerSettings, engine_mix: Mix) -> None:
        for cat in d.new_categories:
            self.categories.setdefault(cat, CategoryState())
        touched: set[int] = set()

        def estimator(cat: str, method: str) -> AcceptanceEstimator:
            """The category's estimator of ``method`` (created on first evidence), decayed to now once a batch."""
            est = self.categories[cat].methods.get(method)
            if est is None:
                est = self.categories[cat].methods[method] = AcceptanceEstimator()
            if id(est) not in touched:
                est.decay_to(now, s.half_life_s)
                touched.add(id(est))
            return est

        for (cat, method, cf), per_k in d.hists.items():
            estimator(cat, method).add_many(per_k, cf)
        for (cat, method, _cf), (asked, hit) in d.asks.items():
            estimator(cat, method).add_attempts(asked, hit)
        self.last_seen = now
        for cat, n in d.requests.items():
            st = self.categories[cat]
            st.last_seen = now
            st.request_steps = min(COUNTER_CAP, st.request_steps + n)
            st.committed_tokens = min(COUNTER_CAP, st.committed_tokens + d.committed.get(cat, 0))
            st.spec_off_request_steps = min(COUNTER_CAP, st.spec_off_request_steps + d.spec_off.get(cat, 0))
        self.overflow_steps = min(COUNTER_CAP, self.overflow_steps + d.overflowed)
        self.dropped_methods = min(COUNTER_CAP, self.dropped_methods + d.dropped_methods)
        for mix in (self.mix, engine_mix):
            mix.decay_to(now, s.mix_half_life_s)
            mix.add(d.busy_steps, d.busy_requests, d.extra_tokens, d.per_category_mix, d.extra_values, d.committed)
        self.cost.decay_to(now, s.cost_half_life_s)
        self.cost.add_many(d.shapes)
        held = self.cell_tails.pop(d.engine, None)
        samples = d.cell_samples if held is None or d.head_prompt else [held, *d.cell_samples]
        if samples:
            self.cells.decay_to(now, s.cost_half_life_s)
            for n, width, seconds in samples:
                self.cells.add(n, width, seconds)
        if d.cell_tail is not None:
            if len(self.cell_tails) >= MAX_HELD_CELL_TAILS:
                del self.cell_tails[next(iter(self.cell_tails))]
            self.cell_tails[d.engine] = d.cell_tail
        if d.budget_samples is not None:
            meter = self.budget_meter(d.budget_samples[0], create=True)
            for sample in d.budget_samples[1]:
                meter.observe(*sample)

    def budget_meter(self, tokens: int, create: bool = False) -> BudgetMeter | None:
        """The meter of the engines of this model with a ``tokens`` step budget (at most MAX_BUDGET_METERS:
        the least recently fed one goes; a meter re-measures within seconds of load)."""
        meter = self.budgets.get(tokens)
        if meter is None and create:
            if len(self.budgets) >= MAX_BUDGET_METERS:
                del self.budgets[next(iter(self.budgets))]
            meter = BudgetMeter(tokens)
        if meter is not None and create:
            self.budgets.pop(tokens, None)
            self.budgets[tokens] = meter  # most recently fed last
        return meter

    # -- reading --------------------------------------------------------------------------------------------
    def pooled(self, method: str, now: float, half_life_s: float) -> AcceptanceEstimator:
        """All categories' evidence for ``method`` pooled, aged to ``now`` (a read: the categories are left alone)."""
        pool = AcceptanceEstimator()
        for st in self.categories.values():
            est = st.methods.get(method)
            if est is not None:
                pool.merge_from(est.aged(now, half_life_s))
        return pool

    def methods(self) -> list[str]:
        seen: dict[str, None] = {}
        for st in self.categories.values():
            for m in st.methods:
                seen[m] = None
        return list(seen)

    def to_dict(self) -> dict:
        return {"categories": {c: s.to_dict() for c, s in self.categories.items()},
                "overflow_steps": self.overflow_steps, "dropped_methods": self.dropped_methods,
                "charged_k": self.charged_k, "last_seen": self.last_seen,
                "mix": self.mix.to_dict(), "cost": self.cost.to_dict(), "cells": self.cells.to_dict()}

    @classmethod
    def from_dict(cls, name: str, d: dict, preset: CostCoefficients, s: LearnerSettings) -> ModelState:
        m = cls(name, preset, s)
        for c, cd in d.get("categories", {}).items():
            try:
                m.categories[str(c)] = CategoryState.from_dict(cd)
            except (KeyError, TypeError, ValueError, OverflowError):
                m.load_skipped.append(str(c)[:64])
                continue  # one unreadable category starts fresh; the others keep what they learned
        m.overflow_steps = _count(d.get("overflow_steps", 0))
        m.dropped_methods = _count(d.get("dropped_methods", 0))
        m.charged_k = min(MAX_K, max(0, int(d.get("charged_k", 0))))
        m.last_seen = None if d.get("last_seen") is None else float(d["last_seen"])
        for st in m.categories.values():
            for est in st.methods.values():
                m.charged_k = max(m.charged_k, est.max_k)
        try:
            m.mix = Mix.from_dict(d["mix"])
        except (KeyError, TypeError, ValueError):
            pass
        try:
            m.cost = OnlineCostModel.from_dict(d["cost"], preset, s.cost_prior_strength)
        except (KeyError, TypeError, ValueError):
            pass
        try:
            m.cells = CellTable.from_dict(d["cells"])
        except (KeyError, TypeError, ValueError):
            pass
        return m


def _column_sums(rows: list[list[int]]) -> list[int]:
    return list(rows[0]) if len(rows) == 1 else [sum(column) for column in zip(*rows)]


def _committed_tokens(requests: dict[str, int], hists: dict[tuple[str, str, bool], dict[int, list[int]]]
                      ) -> dict[str, int]:
    """Tokens committed per category: one per request-step plus the accepted drafts really run.

    Summed from the batch's merged histograms rather than per step: the sum is linear, so the result is
    the same and the per-step loop stays short.
    """
    committed = dict(requests)
    for (cat, _method, cf), per_k in hists.items():
        if not cf:
            committed[cat] += sum(sum(map(mul, range(len(counts)), counts)) for counts in per_k.values())
    return committed
