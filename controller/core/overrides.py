"""Operator overrides: pin k, pin the method, or force speculation off for one category.

An override beats the policy. It is plain data; the service stores it durably and hands the full current
list to the brain after each change. Expiry is evaluated against the injected ``now``, so an expired
override drops out by itself without anyone deleting it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Override:
    category: str
    k: int | None = None
    method: str | None = None
    off: bool = False
    expires_at: float | None = None
    reason: str = ""
    actor: str = ""
    created_at: float = 0.0

    def active(self, now: float) -> bool:
        return self.expires_at is None or now < self.expires_at

    @property
    def kinds(self) -> tuple[str, ...]:
        """What this override pins: 'off', 'k', 'method' (label values for the override metric)."""
        if self.off:
            return ("off",)
        return tuple(kind for kind, value in (("k", self.k), ("method", self.method)) if value is not None)

    def to_dict(self) -> dict:
        return asdict(self)


def active_overrides(overrides: Iterable[Override], now: float) -> dict[str, Override]:
    """Overrides in force at ``now`` by category; for duplicates the most recently created wins."""
    out: dict[str, Override] = {}
    for ov in overrides:
        if not ov.active(now):
            continue
        held = out.get(ov.category)
        if held is None or ov.created_at >= held.created_at:
            out[ov.category] = ov
    return out


def drafters_offered(engines: Iterable[dict], category: str) -> tuple[list[str], dict[str, list[str]]]:
    """The models an override of ``category`` reaches now (those whose engines serve the category, else every
    model with an engine) and, per such model, the drafters its engines offer (own drafter with k_max > 0, then
    the model-free ones). ``engines`` are the controller's engine views as plain dicts."""
    engines = list(engines)
    serving = {e["model"] for e in engines if category in (e.get("category_mix") or {})}
    models = sorted(serving or {e["model"] for e in engines})
    offered: dict[str, list[str]] = {m: [] for m in models}
    for e in engines:
        if e["model"] not in offered:
            continue
        own = [e["spec_method"]] if e.get("spec_method") not in (None, "", "off") and e.get("spec_k_max", 0) > 0 else []
        for method in [*own, *e.get("model_free_methods", ())]:
            if method not in offered[e["model"]] and method not in ("off", "engine"):
                offered[e["model"]].append(method)
    return models, offered


def unavailable_method(method: str | None, engines: Iterable[dict], category: str) -> str | None:
    """Why an override pinning ``method`` for ``category`` cannot run on any engine it reaches, or None when it
    can (or no engine is known yet: it is applied when one that offers the method reports)."""
    if method is None or method in ("engine", "off"):
        return None
    models, offered = drafters_offered(engines, category)
    if not models or any(method in methods for methods in offered.values()):
        return None
    have = "; ".join(f"{m}: {', '.join(methods) or 'none'}" for m, methods in offered.items())
    return (f"no engine of model {', '.join(models)} offers drafter {method!r} (their drafters: {have}); "
            "the override would run with another drafter")
