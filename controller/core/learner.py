"""Learned state of one model: acceptance per (category, method), counters, batch mix, step cost.

Merging a batch is two passes: first the batch's histograms are summed per (category, method,
counterfactual, k) in plain integers, then each touched estimator is decayed to ``now`` once and gets one
vector add per proposal length. That keeps the per-step work to integer additions.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from controller.core.config import LearnerSettings
from controller.core.cost import CostCoefficients, OnlineCostModel, step_kind, step_shape
from controller.core.estimator import AcceptanceEstimator
from controller.core.mix import Mix
from controller.protocol import MAX_METHODS, METHOD_ENGINE, METHOD_OFF, OVERFLOW_CATEGORY, TelemetryBatch


@dataclass
class CategoryState:
    methods: dict[str, AcceptanceEstimator] = field(default_factory=dict)
    request_steps: int = 0
    committed_tokens: int = 0
    spec_off_request_steps: int = 0

    def to_dict(self) -> dict:
        return {"methods": {m: e.to_dict() for m, e in self.methods.items()}, "request_steps": self.request_steps,
                "committed_tokens": self.committed_tokens, "spec_off_request_steps": self.spec_off_request_steps}

    @classmethod
    def from_dict(cls, d: dict) -> CategoryState:
        return cls({str(m): AcceptanceEstimator.from_dict(e) for m, e in d.get("methods", {}).items()},
                   max(0, int(d.get("request_steps", 0))), max(0, int(d.get("committed_tokens", 0))),
                   max(0, int(d.get("spec_off_request_steps", 0))))


@dataclass
class BatchDigest:
    """What one batch adds, summed per key; built without touching any state."""

    hists: dict[tuple[str, str, bool], dict[int, list[int]]]
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


class ModelState:
    def __init__(self, name: str, preset: CostCoefficients, settings: LearnerSettings) -> None:
        self.name = name
        self.categories: dict[str, CategoryState] = {}
        self.overflow_steps = 0
        self.dropped_methods = 0
        self.mix = Mix()
        self.cost = OnlineCostModel(preset, settings.cost_prior_strength)

    # -- ingest ---------------------------------------------------------------------------------------------
    def digest(self, batch: TelemetryBatch, cap: int) -> BatchDigest:
        hists: dict[tuple[str, str, bool], dict[int, list[int]]] = defaultdict(dict)
        requests: dict[str, int] = defaultdict(int)
        committed: dict[str, int] = defaultdict(int)
        spec_off: dict[str, int] = defaultdict(int)
        mix: dict[str, int] = defaultdict(int)
        shapes = []
        known = set(self.categories)
        new: list[str] = []
        methods_per_cat = {c: set(s.methods) for c, s in self.categories.items()}
        overflowed = dropped = busy = busy_req = extra = 0
        extra_values: list[int] = []
        seconds = 0.0
        for step in batch.steps:
            seconds += step.wall_s
            if step.batch_size > 0:
                busy += 1
                busy_req += step.batch_size
                e = max(0, step.scheduled_tokens - step.batch_size - step.draft_tokens)
                extra += e
                extra_values.append(e)
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
                mix[cat] += cs.requests
                drafted = accepted = 0
                mset = methods_per_cat.setdefault(cat, set())
                real = batch.spec.method if cs.method == METHOD_ENGINE else cs.method
                entries = [(real, False, cs.hists)] if real != METHOD_OFF else []
                entries += [(m, True, hs) for m, hs in cs.counterfactual.items()]
                for method, cf, hs in entries:
                    if not hs:
                        continue
                    if method not in mset:
                        if len(mset) >= MAX_METHODS:
                            dropped += 1
                            continue
                        mset.add(method)
                    slot = hists[(cat, method, cf)]
                    for h in hs:
                        acc = slot.get(h.k)
                        if acc is None:
                            slot[h.k] = list(h.accepted)
                        else:
                            for j, c in enumerate(h.accepted):
                                acc[j] += c
                        if not cf:
                            drafted += h.drafts
                            accepted += h.accepted_tokens
                committed[cat] += cs.requests + accepted
                spec_off[cat] += max(0, cs.requests - drafted)
        return BatchDigest(dict(hists), dict(requests), dict(committed), dict(spec_off), dict(mix), shapes, busy,
                           busy_req, extra, extra_values, len(batch.steps), seconds, new, overflowed, dropped)

    def apply(self, d: BatchDigest, now: float, s: LearnerSettings, engine_mix: Mix) -> None:
        for cat in d.new_categories:
            self.categories.setdefault(cat, CategoryState())
        touched: set[int] = set()
        for (cat, method, cf), per_k in d.hists.items():
            est = self.categories[cat].methods.get(method)
            if est is None:
                est = self.categories[cat].methods[method] = AcceptanceEstimator()
            if id(est) not in touched:
                est.decay_to(now, s.half_life_s)
                touched.add(id(est))
            for k, counts in per_k.items():
                est.add(k, counts, cf)
        for cat, n in d.requests.items():
            st = self.categories[cat]
            st.request_steps += n
            st.committed_tokens += d.committed.get(cat, 0)
            st.spec_off_request_steps += d.spec_off.get(cat, 0)
        self.overflow_steps += d.overflowed
        self.dropped_methods += d.dropped_methods
        for mix in (self.mix, engine_mix):
            mix.decay_to(now, s.mix_half_life_s)
            mix.add(d.busy_steps, d.busy_requests, d.extra_tokens, d.per_category_mix, d.extra_values, d.committed)
        self.cost.decay_to(now, s.cost_half_life_s)
        self.cost.add_many(d.shapes)

    # -- reading --------------------------------------------------------------------------------------------
    def pooled(self, method: str, now: float, half_life_s: float) -> AcceptanceEstimator:
        pool = AcceptanceEstimator()
        for st in self.categories.values():
            est = st.methods.get(method)
            if est is not None:
                est.decay_to(now, half_life_s)
                pool.merge_from(est)
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
                "mix": self.mix.to_dict(), "cost": self.cost.to_dict()}

    @classmethod
    def from_dict(cls, name: str, d: dict, preset: CostCoefficients, s: LearnerSettings) -> ModelState:
        m = cls(name, preset, s)
        for c, cd in d.get("categories", {}).items():
            try:
                m.categories[str(c)] = CategoryState.from_dict(cd)
            except (KeyError, TypeError, ValueError):
                continue  # one unreadable category starts fresh; the others keep what they learned
        m.overflow_steps = max(0, int(d.get("overflow_steps", 0)))
        m.dropped_methods = max(0, int(d.get("dropped_methods", 0)))
        try:
            m.mix = Mix.from_dict(d["mix"])
        except (KeyError, TypeError, ValueError):
            pass
        try:
            m.cost = OnlineCostModel.from_dict(d["cost"], preset, s.cost_prior_strength)
        except (KeyError, TypeError, ValueError):
            pass
        return m
