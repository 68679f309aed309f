"""Baseline policy: every category runs the engine's static speculative config.

Formula: k_c = k_max and m_c = the engine's drafter for every category c (k = 0 if the engine has none).
Inputs: :class:`PolicySnapshot` (only ``k_max``, ``engine_method``, the categories' names); no evidence is
used. It is what an engine does without a controller, the reference the goodput policy must beat, and a
safe fallback: it cannot be worse than the operator's own configuration.
"""

from __future__ import annotations

from specctl_vllm.controller.core.config import PolicySettings
from specctl_vllm.controller.core.policy.types import CategoryDecision, Decision, PolicySnapshot
from specctl_vllm.kernel.protocol import METHOD_OFF


def decide(snap: PolicySnapshot, cfg: PolicySettings) -> Decision:
    k = snap.k_max if snap.engine_method != METHOD_OFF else 0
    method = snap.engine_method if k else METHOD_OFF
    n = max(snap.batch_size, 1.0)
    t = snap.cost.step_time(n, snap.extra_tokens + n * (1 + k), k if method not in ("ngram", "suffix") else 0,
                            n * k if method in ("ngram", "suffix") else 0)
    t_plain = snap.cost.step_time(n, snap.extra_tokens + n)

    def one(name: str) -> CategoryDecision:
        return CategoryDecision(name=name, k=k, method=method, source="default", reason="engine static config",
                                expected_committed=0.0, speedup=0.0, adapt_k_min=k, adapt_k_max=k)

    return Decision(categories=tuple(one(c.name) for c in snap.categories), default=one("_default"), batch_size=n,
                    goodput=0.0, plain_goodput=n / t_plain, step_ms=t * 1e3, plain_step_ms=t_plain * 1e3)
