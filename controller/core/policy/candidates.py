"""The goodput policy's candidates: per category, the options the batch model may pick from, built from what
the snapshot knows of each drafter (posterior acceptance, match rate, evidence).

An option at k commits ``E(k) = 1 + m * sum_{i<=k} prod_{j<=i} beta_j`` tokens per request step and verifies
``m * k`` drafts (``m`` the drafter's match rate: a model-free drafter proposes only on a match). A drafter is
a candidate once it has ``min_evidence`` drafts ever seen, and only on an engine that can run it.
"""

from __future__ import annotations

import numpy as np

from specctl_vllm.controller.core.config import PolicySettings
from specctl_vllm.controller.core.learn.estimator import expected_committed
from specctl_vllm.controller.core.model.batch import Options, Prefill
from specctl_vllm.controller.core.policy.types import Choice, MethodProfile, PolicySnapshot
from specctl_vllm.kernel.drafters import is_model_free
from specctl_vllm.kernel.protocol import METHOD_OFF


def options(profiles: list[MethodProfile], k_max: int) -> Options:
    ks, es, model, free, methods = [np.zeros(1)], [np.ones(1)], [np.zeros(1, bool)], [np.zeros(1, bool)], [METHOD_OFF]
    drafted = [np.zeros(1)]
    for p in profiles:
        kk = min(k_max, len(p.betas))
        if kk <= 0:
            continue
        k = np.arange(1, kk + 1, dtype=float)
        m = match(p)
        ks.append(k)
        es.append(1.0 + m * np.cumsum(np.cumprod(np.asarray(p.betas[:kk], dtype=float))))
        drafted.append(m * k)
        model.append(np.full(kk, not p.model_free))
        free.append(np.full(kk, p.model_free))
        methods.extend([p.method] * kk)
    return Options(np.concatenate(ks), np.concatenate(es), np.concatenate(model), np.concatenate(free),
                    tuple(methods), np.concatenate(drafted))


def match(p: MethodProfile | None) -> float:
    """Share of a model-free drafter's request steps that draft (it proposes only on a match); 1 otherwise."""
    if p is None or not p.model_free:
        return 1.0
    return min(max(p.match_rate, 0.0), 1.0)


def fixed_option(choice: Choice, profile: MethodProfile | None) -> Options:
    """A category pinned at ``choice``: E from its own posterior, else the pool's, else 0.5 per position."""
    k = choice.k
    if k == 0:
        return Options(np.zeros(1), np.ones(1), np.zeros(1, bool), np.zeros(1, bool), (METHOD_OFF,))
    betas = tuple(profile.betas) if profile is not None else ()
    betas = (betas + (betas[-1] if betas else 0.5,) * k)[:k]
    free = profile.model_free if profile is not None else is_model_free(choice.method)
    m = match(profile)
    return Options(np.array([float(k)]), np.array([1.0 + m * (expected_committed(betas)[-1] - 1.0)]),
                    np.array([not free]), np.array([free]), (choice.method,), np.array([m * k]))


# --- building ------------------------------------------------------------------------------------------------------
def usable(p: MethodProfile, snap: PolicySnapshot, cfg: PolicySettings) -> bool:
    """Evidence ever seen counts: a drafter not run keeps its (decayed, prior-shrunk) estimate usable."""
    return p.method in snap.methods and p.eligible_evidence >= cfg.min_evidence


def profile_for(profiles: tuple[MethodProfile, ...], method: str) -> MethodProfile | None:
    return next((p for p in profiles if p.method == method), None)


def static_choice(snap: PolicySnapshot) -> Choice:
    if snap.k_max <= 0 or snap.engine_method == METHOD_OFF:
        return Choice.off()
    return Choice(snap.k_max, snap.engine_method)


def extra(snap: PolicySnapshot) -> Prefill:
    dist = [(float(v), float(w)) for v, w in snap.extra_tokens_dist if w > 0]
    vals = np.array([v for v, _ in dist] or [1.0])
    w = np.array([w for _, w in dist] or [1.0])
    w = w / w.sum()
    mean = float(vals @ w)
    rel = vals / mean if mean > 0 else np.ones_like(vals)
    if snap.extra_per_committed > 0:
        return Prefill(0.0, float(snap.extra_per_committed), rel, w)
    return Prefill(float(snap.extra_tokens), 0.0, rel, w)


def index(options: Options, choice: Choice | None) -> int:
    if choice is None:
        return -1
    for j in range(len(options)):
        if int(options.k[j]) == choice.k and (options.methods[j] == choice.method or choice.k == 0):
            return j
    return -1


def engine_drafter(snap: PolicySnapshot) -> str | None:
    """The engine's own drafter, if it has one it can run."""
    return snap.engine_method if snap.engine_method in snap.methods and snap.k_max > 0 else None
