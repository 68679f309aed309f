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
