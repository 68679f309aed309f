"""Per-round records of the steady-load benchmark and their aggregation (pure: no vLLM, no CUDA).

A round's goodput is the committed output tokens during the round over its wall seconds. A point's row keeps
every round and their median, min, max and spread = (max - min) / median, overall and per category.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bench.gpu.accept_plugin import MODEL_MANAGER, parse_dispatch_key
from bench.gpu.steady_plan import PROFILE_CATEGORIES


@dataclass(frozen=True, kw_only=True)
class Spread:
    median: float
    min: float
    max: float
    spread: float
    n: int


def spread_of(values: Iterable[float]) -> Spread | None:
    vals = [float(v) for v in values]
    if not vals:
        return None
    med = statistics.median(vals)
    lo, hi = min(vals), max(vals)
    return Spread(median=med, min=lo, max=hi, spread=(hi - lo) / med if med > 0 else float("inf"), n=len(vals))


@dataclass(frozen=True, kw_only=True)
class Round:
    """One timed round. ``window_s`` is the time between the two dispatch snapshots that bracket the round
    (the worker's clock), ``model_steps`` the target forward steps between them."""

    seconds: float
    tokens: int
    tokens_by_category: dict[str, int]
    driver_steps: int
    model_steps: int | None
    window_s: float | None
    spec: dict
    dispatch: dict[str, int]

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_step_ms(self) -> float | None:
        if not self.model_steps:
            return None
        span = self.window_s if self.window_s else self.seconds
        return 1000.0 * span / self.model_steps

    def record(self) -> dict:
        return {
            "seconds": self.seconds,
            "tokens": self.tokens,
            "tok_per_s": self.tok_per_s,
            "tokens_by_category": dict(self.tokens_by_category),
            "tok_per_s_by_category": {c: n / self.seconds for c, n in self.tokens_by_category.items()}
            if self.seconds > 0 else {},
            "driver_steps": self.driver_steps,
            "model_steps": self.model_steps,
            "window_s": self.window_s,
            "mean_step_ms": self.mean_step_ms,
            "spec": self.spec,
            "dispatch": self.dispatch,
        }


def summarise(rounds: list[dict]) -> dict:
    """Row fields from the rounds' records: goodput spread overall and per category, median step time, summed
    counters and dispatches."""
    out: dict = {}
    overall = spread_of(r["tok_per_s"] for r in rounds)
    for field in ("median", "min", "max", "spread"):
        out[f"tok_per_s_{field}"] = getattr(overall, field) if overall else None
    cats = sorted({c for r in rounds for c in r.get("tok_per_s_by_category", {})})
    by_cat = {}
    for cat in cats:
        s = spread_of(r["tok_per_s_by_category"].get(cat, 0.0) for r in rounds)
        by_cat[cat] = {"median": s.median, "min": s.min, "max": s.max, "spread": s.spread} if s else None
    out["tok_per_s_by_category"] = by_cat
    steps = spread_of(r["mean_step_ms"] for r in rounds if r.get("mean_step_ms") is not None)
    out["mean_step_ms_median"] = steps.median if steps else None
    out["spec"] = sum_counters(r["spec"] for r in rounds)
    out["dispatch"] = sum_counters(r["dispatch"] for r in rounds)
    return out


# -- counters -----------------------------------------------------------------------------------------------------
def spec_counters(metrics: Iterable) -> dict:
    """vLLM's spec-decode counters from ``get_metrics()`` (summed over label sets; per-position vectors as lists)."""
    out: dict = {}
    for metric in metrics:
        name = getattr(metric, "name", "")
        if not name.startswith("vllm:spec_decode"):
            continue
        if hasattr(metric, "values"):
            vals = list(metric.values)
            prev = out.get(name, [])
            width = max(len(vals), len(prev))
            out[name] = [a + b for a, b in zip(_pad(vals, width), _pad(prev, width))]
        elif hasattr(metric, "value"):
            out[name] = out.get(name, 0) + metric.value
    return out


def _pad(values: list, width: int) -> list:
    return list(values) + [0] * (width - len(values))


def counter_delta(after: Mapping, before: Mapping) -> dict:
    delta: dict = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old or []
            width = max(len(value), len(old))
            delta[name] = [a - b for a, b in zip(_pad(value, width), _pad(old, width))]
        else:
            delta[name] = value - (old or 0)
    return delta


def sum_counters(items: Iterable[Mapping]) -> dict:
    total: dict = {}
    for item in items:
        for name, value in item.items():
            if isinstance(value, list):
                old = total.get(name, [])
                width = max(len(value), len(old))
                total[name] = [a + b for a, b in zip(_pad(value, width), _pad(old, width))]
            else:
                total[name] = total.get(name, 0) + value
    return total


def model_steps(dispatch_delta: Mapping[str, int]) -> int:
    """Target forward steps: every dispatch of the target's graph manager, whatever mode it got."""
    return sum(n for key, n in dispatch_delta.items() if parse_dispatch_key(key)[0] == MODEL_MANAGER)


def target_modes(dispatch: Mapping[str, int]) -> dict[str, int]:
    """The target's dispatches by graph mode and uniform token count (``FULL|u=5``), for tables and checks."""
    out: dict[str, int] = {}
    for key, n in dispatch.items():
        cls, _, mode, uniform = parse_dispatch_key(key)
        if cls == MODEL_MANAGER and n:
            name = f"{mode}|u={uniform}"
            out[name] = out.get(name, 0) + n
    return out


def full_share(dispatch: Mapping[str, int]) -> float | None:
    """Share of target steps that replayed a full CUDA graph."""
    modes = target_modes(dispatch)
    total = sum(modes.values())
    if not total:
        return None
    return sum(n for name, n in modes.items() if name.startswith("FULL")) / total


# -- requests -----------------------------------------------------------------------------------------------------
def slot_category(profile: str, slot: int, generation: int, concurrency: int) -> str:
    """Category of the generation-th request of a slot. A replacement keeps its slot's category, so with an
    even concurrency exactly half of the in-flight requests are each category; with an odd one (c=1) a slot
    alternates between requests."""
    cats = PROFILE_CATEGORIES[profile]
    if len(cats) == 1:
        return cats[0]
    return cats[(slot + generation * (concurrency % 2)) % len(cats)]


def category_of(request_id: str) -> str:
    """The category a request id starts with (ids are ``f"{category}-{n}"``)."""
    return request_id.split("-", 1)[0]
