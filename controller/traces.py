"""The trace file: phases of load, each with a duration, a load (requests in flight or an arrival rate), a category
mix and an output-length range (``specctl bench --trace``, ``python -m bench trace``).

A trace is JSON::

    {"name": "day", "sources": [...], "categories": {"chat": "prose chat", ...},
     "phases": [{"name": "night", "duration_s": 60, "concurrency": 4,
                 "mix": {"chat": 0.6, "json": 0.2, "tool_call": 0.1, "code_edit": 0.1},
                 "output_tokens": {"min": 16, "max": 256}}, ...]}

A phase gives ``concurrency`` (closed loop: that many requests in flight, each finished one replaced) or
``rate_rps`` (open loop: Poisson arrivals at that rate, at most ``max_in_flight`` in flight). ``mix`` weights are
normalised. Everything here is pure: parsing, validation (every error at once), scaling and lookups.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Category names travel in request ids (``f"{category}-{n}"``) that the acceptance plugin splits at the first
#: "-": a name is lower-case letters, digits and "_".
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")
MAX_CONCURRENCY = 4096
MAX_OUTPUT_TOKENS = 32768


class TraceError(ValueError):
    """A trace or profile file that cannot be run; the message lists every problem found."""


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float
    mix: tuple[tuple[str, float], ...]  # normalised weights, sorted by name
    output_min: int
    output_max: int
    concurrency: int | None = None
    rate_rps: float | None = None
    max_in_flight: int | None = None

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(name for name, w in self.mix if w > 0)

    @property
    def in_flight_cap(self) -> int:
        return self.concurrency if self.concurrency is not None else (self.max_in_flight or MAX_CONCURRENCY)

    def to_json(self) -> dict:
        out = {"name": self.name, "duration_s": self.duration_s, "mix": dict(self.mix),
               "output_tokens": {"min": self.output_min, "max": self.output_max}}
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        else:
            out["rate_rps"] = self.rate_rps
            if self.max_in_flight is not None:
                out["max_in_flight"] = self.max_in_flight
        return out


@dataclass(frozen=True)
class Trace:
    name: str
    phases: tuple[Phase, ...]
    sources: tuple[dict, ...] = field(default=())

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    @property
    def categories(self) -> tuple[str, ...]:
        return tuple(sorted({c for p in self.phases for c in p.categories}))

    @property
    def starts(self) -> tuple[float, ...]:
        out, t = [], 0.0
        for p in self.phases:
            out.append(t)
            t += p.duration_s
        return tuple(out)

    def phase_at(self, t: float) -> int | None:
        """Index of the phase running at ``t`` seconds after the start; None once the trace is over."""
        for i, (start, p) in enumerate(zip(self.starts, self.phases, strict=True)):
            if t < start + p.duration_s:
                return i if t >= start else None
        return None

    def scaled(self, total_s: float) -> Trace:
        """The same phases with every duration scaled so that they sum to ``total_s``."""
        if total_s <= 0:
            raise TraceError(f"scaled duration must be > 0 s, got {total_s}")
        f = total_s / self.duration_s
        return Trace(self.name, tuple(_replace_duration(p, p.duration_s * f) for p in self.phases), self.sources)

    def max_concurrency(self) -> int:
        return max(p.in_flight_cap for p in self.phases)

    def to_json(self) -> dict:
        return {"name": self.name, "sources": list(self.sources), "phases": [p.to_json() for p in self.phases]}


def _replace_duration(p: Phase, seconds: float) -> Phase:
    return Phase(p.name, seconds, p.mix, p.output_min, p.output_max, p.concurrency, p.rate_rps, p.max_in_flight)


def _number(raw, what: str, errors: list[str], *, lo: float, hi: float, integer: bool = False):
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        errors.append(f"{what}: expected a number, got {raw!r}")
        return None
    if integer and int(raw) != raw:
        errors.append(f"{what}: expected an integer, got {raw!r}")
        return None
    if not lo <= raw <= hi:
        errors.append(f"{what}: {raw} is outside [{lo:g}, {hi:g}]")
        return None
    return int(raw) if integer else float(raw)


def parse_phase(raw, index: int, errors: list[str]) -> Phase | None:
    where = f"phases[{index}]"
    if not isinstance(raw, Mapping):
        errors.append(f"{where}: expected an object")
        return None
    name = raw.get("name", f"phase{index}")
    if not isinstance(name, str) or not name:
        errors.append(f"{where}.name: expected a non-empty string")
        name = f"phase{index}"
    n0 = len(errors)
    duration = _number(raw.get("duration_s"), f"{where}.duration_s", errors, lo=0.001, hi=86400.0 * 7)
    has_c, has_r = "concurrency" in raw, "rate_rps" in raw
    concurrency = rate = cap = None
    if has_c == has_r:
        errors.append(f"{where}: give exactly one of concurrency (requests in flight) or rate_rps (arrivals/s)")
    elif has_c:
        concurrency = _number(raw["concurrency"], f"{where}.concurrency", errors, lo=1, hi=MAX_CONCURRENCY,
                              integer=True)
    else:
        rate = _number(raw["rate_rps"], f"{where}.rate_rps", errors, lo=1e-6, hi=1e5)
        if "max_in_flight" in raw:
            cap = _number(raw["max_in_flight"], f"{where}.max_in_flight", errors, lo=1, hi=MAX_CONCURRENCY,
                          integer=True)
    mix = raw.get("mix")
    weights: dict[str, float] = {}
    if not isinstance(mix, Mapping) or not mix:
        errors.append(f"{where}.mix: expected a non-empty object of category -> weight")
    else:
        for cat, w in mix.items():
            if not isinstance(cat, str) or not cat or not set(cat) <= NAME_CHARS:
                errors.append(f"{where}.mix: category {cat!r} must be lower-case letters, digits and _")
                continue
            value = _number(w, f"{where}.mix.{cat}", errors, lo=0.0, hi=1e9)
            if value is not None:
                weights[cat] = value
        if weights and sum(weights.values()) <= 0:
            errors.append(f"{where}.mix: the weights sum to 0")
    lengths = raw.get("output_tokens", {})
    lo_n = hi_n = None
    if not isinstance(lengths, Mapping):
        errors.append(f"{where}.output_tokens: expected {{\"min\": N, \"max\": M}}")
    else:
        lo_n = _number(lengths.get("min", 128), f"{where}.output_tokens.min", errors, lo=1, hi=MAX_OUTPUT_TOKENS,
                       integer=True)
        hi_n = _number(lengths.get("max", lengths.get("min", 128)), f"{where}.output_tokens.max", errors, lo=1,
                       hi=MAX_OUTPUT_TOKENS, integer=True)
        if lo_n is not None and hi_n is not None and lo_n > hi_n:
            errors.append(f"{where}.output_tokens: min {lo_n} > max {hi_n}")
    if len(errors) > n0:
        return None
    total = sum(weights.values())
    norm = tuple(sorted((c, w / total) for c, w in weights.items()))
    return Phase(name, duration, norm, lo_n, hi_n, concurrency, rate, cap)


def parse_trace(data) -> Trace:
    errors: list[str] = []
    if not isinstance(data, Mapping):
        raise TraceError("a trace is a JSON object with a 'phases' list")
    phases_raw = data.get("phases")
    if not isinstance(phases_raw, Sequence) or isinstance(phases_raw, str) or not phases_raw:
        raise TraceError("'phases' must be a non-empty list")
    phases = [parse_phase(p, i, errors) for i, p in enumerate(phases_raw)]
    names = [p.name for p in phases if p is not None]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        errors.append(f"phase names must be unique: {', '.join(dupes)}")
    if errors:
        raise TraceError("; ".join(errors))
    sources = data.get("sources", ())
    return Trace(str(data.get("name", "trace")), tuple(phases),
                 tuple(s for s in sources if isinstance(s, Mapping)) if isinstance(sources, Sequence) else ())


def load_trace(path: str | Path) -> Trace:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise TraceError(f"{path} is not JSON: {exc}") from None
    return parse_trace(data)


def pick(mix: tuple[tuple[str, float], ...], u: float) -> str:
    """The category at cumulative weight ``u`` in [0, 1)."""
    acc = 0.0
    for name, w in mix:
        acc += w
        if u < acc:
            return name
    return mix[-1][0]


def request_plan(phase: Phase, phase_index: int, n: int, seed: int) -> tuple[str, int, random.Random]:
    """Category, output length and the prompt's generator of the n-th request of a phase (pure, seeded): the same
    under every configuration."""
    rng = random.Random(f"{seed}/{phase_index}/{n}")
    category = pick(phase.mix, rng.random())
    length = rng.randint(phase.output_min, phase.output_max)
    return category, length, rng
