"""Guardrails applied on top of the goodput policy's best configuration (see :mod:`.goodput`): hysteresis,
the per-request adaptation band, and probing of categories left at k = 0. Each is priced by the same batch
model (:class:`specctl_vllm.controller.core.model.batch.BatchModel`) the configuration was found with.
"""

from __future__ import annotations

import numpy as np

from specctl_vllm.controller.core.config import PolicySettings
from specctl_vllm.controller.core.learn.estimator import expected_committed
from specctl_vllm.controller.core.model.batch import BatchModel
from specctl_vllm.controller.core.policy import candidates as cand
from specctl_vllm.controller.core.policy.types import CategoryInput, MethodProfile, PolicySnapshot
from specctl_vllm.kernel.drafters import is_model_free


# --- guardrails on a found configuration ------------------------------------------------------------------------
def hysteresis(pb: BatchModel, cfg: np.ndarray, previous: np.ndarray | None, h: float) -> tuple[np.ndarray, dict]:
    """Keep the previous decision unless moving gains more than ``h`` of the movers' own goodput.

    First per category (the others at the new decision), then for the movers together: categories share
    the drafting pass, so several can each look worth moving while the batch as a whole gains next to
    nothing, and two such configurations would alternate.
    """
    notes: dict[int, str] = {}
    if previous is None:
        return cfg, notes
    cfg = cfg.copy()
    known = pb.movable & (previous >= 0)
    for u in np.flatnonzero(known & (previous != cfg)):
        g_new, _ = pb.goodput(cfg)
        old = cfg.copy()
        old[u] = previous[u]
        g_old, t_old = pb.goodput(old)
        own = pb.shares_at(old)[u] * pb.e[u, previous[u]] / t_old
        gain = (g_new - g_old) / own if own > 0 else 0.0
        if gain < h:
            cfg = old
            notes[int(u)] = f"kept previous (gain {gain:.1%} of own goodput < hysteresis {h:.0%})"
    movers = np.flatnonzero(known & (previous != cfg))
    if len(movers) > 1:
        old = cfg.copy()
        old[movers] = previous[movers]
        g_new, _ = pb.goodput(cfg)
        g_old, t_old = pb.goodput(old)
        own = float(np.sum(pb.shares_at(old)[movers] * pb.e[movers, previous[movers]])) / t_old
        gain = (g_new - g_old) / own if own > 0 else 0.0
        if gain < h:
            cfg = old
            for u in movers:
                notes[int(u)] = (f"kept previous ({len(movers)} categories would move together for "
                                 f"{gain:.1%} of their goodput < hysteresis {h:.0%})")
    return cfg, notes


def bands(pb: BatchModel, cfg: np.ndarray, g: np.ndarray, t: np.ndarray, tol: float) -> list[tuple[int, int]]:
    out = []
    shares = pb.shares_at(cfg)
    for u in pb.rows:
        c = cfg[u]
        k0 = int(pb.k[u, c])
        if k0 == 0:
            out.append((0, 0))
            continue
        own = shares[u] * pb.e[u, c] / t[u, c]
        opts = pb.options[u]
        method = opts.methods[c]
        ok = {int(opts.k[j]) for j in range(len(opts)) if (opts.methods[j] == method or opts.k[j] == 0)
              and g[u, c] - g[u, j] <= tol * own}
        lo = hi = k0
        while lo - 1 in ok:
            lo -= 1
        while hi + 1 in ok:
            hi += 1
        out.append((lo, hi))
    return out


#: Probe rates tried (as fractions of probe_rate): 1 and 63 geometric steps down to 1e-4 of it.
PROBE_GRID = np.concatenate([[1.0], np.geomspace(1.0, 1e-4, 64)[1:]])


def probe_rates(pb: BatchModel, cfg: np.ndarray, units: np.ndarray, e: np.ndarray, model: np.ndarray, pk: int,
                 cfg_: PolicySettings, budget: np.ndarray | float | None = None) -> np.ndarray:
    """Largest rate <= probe_rate per unit whose modelled cost stays within its budget (one evaluation)."""
    budget = cfg_.probe_budget if budget is None else budget
    num, tok, free, le = pb.totals(cfg)
    g0 = num / float(pb.time(tok, num, free, le))
    rate = cfg_.probe_rate * PROBE_GRID[None, :]  # (1, G)
    n_p = pb.shares_at(cfg)[units][:, None] * rate  # (U, G) probing requests per step
    below_pk = (pb.levels < pk).astype(float)
    le_r = le[None, None, :] - (np.where(model[:, None], n_p / pb.n, 0.0))[:, :, None] * below_pk
    num_r = num + n_p * (e[:, None] - 1.0)
    t = pb.time(tok + n_p * pk, num_r, free + np.where(model[:, None], 0.0, n_p * pk), le_r)
    loss = 1.0 - (num_r / t) / g0
    ok = loss <= np.reshape(budget, (-1, 1))
    first = np.argmax(ok, axis=1)  # the grid falls, so the first acceptable rate is the largest
    return np.where(ok.any(axis=1), np.round(rate[0, first], 6), 0.0)


def probe_method(profiles: tuple[MethodProfile, ...], snap: PolicySnapshot, cfg: PolicySettings) -> str | None:
    """The first drafter of this engine with no counterfactual signal (None: all are scored for free)."""
    for m in snap.methods:
        p = cand.profile_for(profiles, m)
        if not (p is not None and p.counterfactual and p.evidence >= cfg.min_evidence):
            return m
    return None


#: z of the optimistic bound that decides whether a probe can change anything (about 97.5 % one-sided).
PROBE_Z = 2.0


def optimistic_e(profile: MethodProfile | None, k_max: int) -> np.ndarray:
    """E(0..k_max) with every beta raised to an upper confidence bound (all 1 without a profile)."""
    if profile is None:
        return np.arange(k_max + 1, dtype=float) + 1.0
    b = np.asarray((tuple(profile.betas) + (profile.betas[-1],) * k_max)[:k_max], dtype=float)
    up = np.minimum(1.0, b + PROBE_Z * np.sqrt(b * (1 - b) / (profile.evidence + 1.0)))
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(up))])


def worth_probing(pb: BatchModel, cfg_best: np.ndarray, u: int, e_plus: np.ndarray, model: bool) -> bool:
    """Could the drafter pay for this category at some k even at the optimistic bound of its acceptance?
    If not, a probe cannot change the decision and costs goodput for nothing."""
    num, tok, free, le = pb.totals(cfg_best)
    g0 = num / float(pb.time(tok, num, free, le))
    ks = np.arange(1, len(e_plus), dtype=float)
    s = pb.shares_at(cfg_best)[u]
    num_k = num + s * (e_plus[1:] - 1.0)
    below = (pb.levels[None, :] < ks[:, None]).astype(float)
    le_k = le[None, :] - (s / pb.n * below if model else 0.0)
    t = pb.time(tok + s * ks, num_k, free + (0.0 if model else s * ks), le_k)
    return bool((num_k / t).max() > g0 * (1 + 1e-9))


def probes(pb: BatchModel, cfg_best: np.ndarray, inputs: list[CategoryInput], snap: PolicySnapshot,
            cfg: PolicySettings) -> dict[int, tuple[float, int, str]]:
    if cfg.probe_rate <= 0 or snap.k_max <= 0:
        return {}
    pk = min(cfg.probe_k, snap.k_max)
    units, es, models, methods, budgets = [], [], [], [], []
    for u, c in enumerate(inputs):
        if pb.k[u, cfg_best[u]] != 0:
            continue
        m = probe_method(c.profiles, snap, cfg)
        if m is None:
            continue
        prof = cand.profile_for(c.profiles, m)
        model = not is_model_free(m)
        worth = worth_probing(pb, cfg_best, u, optimistic_e(prof, snap.k_max), model)
        budgets.append(cfg.probe_budget if worth else cfg.probe_idle_budget)
        units.append(u)
        es.append(expected_committed((prof.betas if prof else (0.5,) * pk)[:pk])[-1])
        models.append(model)
        methods.append(m)
    if not units:
        return {}
    rates = probe_rates(pb, cfg_best, np.array(units), np.array(es), np.array(models), pk, cfg, np.array(budgets))
    return {u: (float(r), pk, m) for u, r, m in zip(units, rates, methods) if r > 0}
