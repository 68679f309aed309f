"""Acceptance profiles a synthetic-acceptance engine replays per category and per draft position; the trace model
itself lives in the product (``specctl_vllm.controller.traces``) so that ``specctl bench --trace`` reads the same
files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from specctl_vllm.controller.traces import (  # noqa: F401 - the trace model, one place
    NAME_CHARS,
    Phase,
    Trace,
    TraceError,
    _number,
    load_trace,
    parse_trace,
)

# -- acceptance profiles ------------------------------------------------------------------------------------------
#: Positions a profile gives (draft positions 0 .. POSITIONS-1); a shorter list repeats its last value.
POSITIONS = 7


@dataclass(frozen=True)
class Profile:
    """Per category, the conditional acceptance of draft position i given positions < i accepted."""

    name: str
    rates: tuple[tuple[str, tuple[float, ...]], ...]
    source: str = ""

    def of(self, category: str) -> tuple[float, ...] | None:
        return dict(self.rates).get(category)

    def envelope(self) -> tuple[float, ...]:
        """Per position the highest rate of any category: what the engine's synthetic sampler must draft at
        (the acceptance plugin can only lower a request's rate from there)."""
        return tuple(max(r[i] for _, r in self.rates) for i in range(POSITIONS))

    def to_json(self) -> dict:
        return {"name": self.name, "source": self.source, "categories": {c: list(r) for c, r in self.rates}}


def _rates(raw, what: str, errors: list[str]) -> tuple[float, ...] | None:
    values = [raw] if isinstance(raw, int | float) and not isinstance(raw, bool) else raw
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        errors.append(f"{what}: expected a rate or a list of per-position rates")
        return None
    n0 = len(errors)
    out = [_number(v, f"{what}[{i}]", errors, lo=0.0, hi=1.0) for i, v in enumerate(values[:POSITIONS])]
    if len(errors) > n0:
        return None
    out += [out[-1]] * (POSITIONS - len(out))
    return tuple(out)


def parse_profiles(data) -> dict[str, Profile]:
    """``{"profiles": {name: {"categories": {cat: rate | [rates]}, "source": ...}}}`` -> name -> Profile."""
    errors: list[str] = []
    raw = data.get("profiles") if isinstance(data, Mapping) else None
    if not isinstance(raw, Mapping) or not raw:
        raise TraceError("a profile file is a JSON object with a non-empty 'profiles' object")
    out = {}
    for name, body in raw.items():
        cats = body.get("categories") if isinstance(body, Mapping) else None
        if not isinstance(cats, Mapping) or not cats:
            errors.append(f"profiles.{name}.categories: expected a non-empty object")
            continue
        rates = {}
        for cat, r in cats.items():
            if not isinstance(cat, str) or not set(cat) <= NAME_CHARS or not cat:
                errors.append(f"profiles.{name}: category {cat!r} must be lower-case letters, digits and _")
                continue
            parsed = _rates(r, f"profiles.{name}.categories.{cat}", errors)
            if parsed is not None:
                rates[cat] = parsed
        source = body.get("source") or body.get("derivation") or ""
        out[name] = Profile(name, tuple(sorted(rates.items())),
                            source if isinstance(source, str) else json.dumps(source))
    if errors:
        raise TraceError("; ".join(errors))
    return out


def load_profiles(path: str | Path) -> dict[str, Profile]:
    try:
        return parse_profiles(json.loads(Path(path).read_text()))
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"{path} is not JSON: {exc}") from None


def unconditional(conditional: Sequence[float]) -> list[float]:
    """Per-position unconditional acceptance (what vLLM's synthetic sampler takes) from conditional rates."""
    out, p = [], 1.0
    for r in conditional:
        p *= r
        out.append(round(p, 6))
    return out
