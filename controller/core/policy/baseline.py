"""Baseline policy: every category runs the engine's static speculative config.

Formula: k_c = k_max and m_c = the engine's drafter for every category c (k = 0 if the engine has none).
Inputs: :class:`PolicySnapshot` (only ``k_max``, ``engine_method``, the categories' names); no evidence is
used. It is what an engine does without a controller, the reference the goodput policy must beat, and a
safe fallback: it cannot be worse than the operator's own configuration.
"""

from __future__ import annotations

from controller.core.config import PolicySettings
from controller.core.policy.types import CategoryDecision, Decision, PolicySnapshot
from controller.protocol import METHOD_OFF


def decide(snap: PolicySnapshot, cfg: PolicySettings) -> Decision:
    k = snap.k_max if snap.engine_method != METHOD_OFF else 0
    method = snap.engine_method if k else METHOD_OFF
    n = max(snap.batch_size, 1.0)
    t = snap.cost.step_time(n, snap.extra_tokens + n * (1 + k), k if method not in ("ngram", "suffix") else 0,
                            n * k if method in ("ngram", "suffix") else 0)
    t_plain = snap.cost.step_time(n, snap.extra_tokens + n)

    def one(name: str) -> CategoryDecision:
        return CategoryDecision(name, k, method, "default", "engine static config", 0.0, 0.0, k, k)

    return Decision(tuple(one(c.name) for c in snap.categories), one("_default"), n, 0.0, n / t_plain,
                    t * 1e3, t_plain * 1e3)
