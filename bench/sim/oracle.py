"""Hindsight choices computed from the true workload and the true step cost.

Closed-loop model of one batch size B (each finished request is replaced at once). A request of
category c with drafter m at k commits E_r(k) tokens per decode step; over a category its steps-weighted
mean is the harmonic mean E_c = 1 / mean_r(1 / E_r) (estimated from sampled per-request profiles). It
lives S_c = L_c / E_c + 1 steps (one prefill step), so the slots it holds are n_c = B * s_c S_c / sum s S
(s_c: arrival share). Per step: committed = sum n_c L_c / S_c, tokens = sum n_c((1 - 1/S_c)(1 + k_c)
+ P / S_c), drafting depth distribution as in the goodput policy, time = the truth cost model.
Used to rank candidate static configurations; the oracle reported is the best of the top candidates
*simulated* with the same engine as every other strategy.
"""

from __future__ import annotations

import itertools

import numpy as np

from bench.sim.profiles import Trace
from controller.core.cost import CostCoefficients


def category_expectations(trace: Trace, samples: int = 4000, seed: int = 7) -> np.ndarray:
    """E_c,m(k) (harmonic over requests): shape (categories, methods, k_max + 1)."""
    rng = np.random.default_rng(seed)
    out = np.ones((len(trace.categories), len(trace.methods), trace.k_max + 1))
    for ci, c in enumerate(trace.categories):
        shifts = rng.normal(0.0, c.heterogeneity, samples) if c.heterogeneity > 0 else np.zeros(samples)
        for mi, m in enumerate(trace.methods):
            p = np.clip(c.betas[m], 1e-4, 1 - 1e-4)
            beta = 1 / (1 + np.exp(-(np.log(p / (1 - p))[None, :] + shifts[:, None])))
            e = np.concatenate([np.ones((samples, 1)), 1 + np.cumsum(np.cumprod(beta, axis=1), axis=1)], axis=1)
            out[ci, mi] = 1.0 / np.mean(1.0 / e, axis=0)
    return out


def options(trace: Trace) -> list[tuple[int, int]]:
    """(k, drafter index) options per category: off, then every k for every drafter."""
    return [(0, 0)] + [(k, m) for m in range(len(trace.methods)) for k in range(1, trace.k_max + 1)]


def goodput(trace: Trace, exp: np.ndarray, cost: CostCoefficients, batch: int, choice: np.ndarray) -> np.ndarray:
    """Analytic goodput of choices; ``choice`` is (..., categories, 2) of (k, drafter index)."""
    k = choice[..., 0].astype(float)
    m = choice[..., 1]
    cats = np.arange(len(trace.categories))
    e = exp[cats, m, k.astype(int)]
    share = np.array([c.share for c in trace.categories])
    length = np.array([c.output_tokens for c in trace.categories], dtype=float)
    steps = length / e + 1.0
    w = share * steps
    n = batch * w / w.sum(axis=-1, keepdims=True)
    decode = n * (1 - 1 / steps)
    committed = (n * length / steps).sum(axis=-1)
    tokens = (decode * (1 + k) + n / steps * trace.prompt_tokens).sum(axis=-1)
    free = (decode * np.where(m > 0, k, 0)).sum(axis=-1)
    depth = np.where(m == 0, k, 0)
    levels = np.arange(trace.k_max + 1, dtype=float)
    p = decode / batch
    prefill_share = 1 - p.sum(axis=-1, keepdims=True)
    le = (p[..., None] * (depth[..., None] <= levels)).sum(axis=-2) + prefill_share
    above = 1 - np.clip(le, 0, 1) ** batch
    c = cost
    t = c.base + c.per_request * batch + c.per_token * tokens + c.per_token_above_knee * np.maximum(tokens - c.knee, 0)
    t = t + above[..., 0] * (c.draft_fixed + c.draft_fixed_per_request * batch)
    t = t + above[..., :-1].sum(axis=-1) * (c.draft_pass + c.draft_pass_per_request * batch)
    t = t + c.free_draft_token * free
    return committed / t


def best_static(trace: Trace, exp: np.ndarray, cost: CostCoefficients, batch: int, top: int = 3,
                limit: int = 2_000_000) -> list[tuple[float, list[tuple[int, int]]]]:
    """The ``top`` per-category static configurations by analytic goodput (exhaustive when small)."""
    opts = np.array(options(trace))
    n_cat = len(trace.categories)
    if len(opts) ** n_cat <= limit:
        idx = np.array(list(itertools.product(range(len(opts)), repeat=n_cat)))
        g = goodput(trace, exp, cost, batch, opts[idx])
        order = np.argsort(-g)[:top]
        return [(float(g[i]), [tuple(map(int, opts[j])) for j in idx[i]]) for i in order]
    cur = np.zeros(n_cat, dtype=int)  # coordinate ascent for many categories
    for _ in range(20):
        moved = False
        for c in range(n_cat):
            cand = np.repeat(cur[None, :], len(opts), axis=0)
            cand[:, c] = np.arange(len(opts))
            g = goodput(trace, exp, cost, batch, opts[cand])
            if g.max() > g[cur[c]] * (1 + 1e-12):
                cur[c] = int(np.argmax(g))
                moved = True
        if not moved:
            break
    g = float(goodput(trace, exp, cost, batch, opts[cur][None])[0])
    return [(g, [tuple(map(int, opts[j])) for j in cur])]


def best_common_k(trace: Trace, exp: np.ndarray, cost: CostCoefficients, batch: int, ks: list[int]) -> int:
    """The single engine-drafter k (or 0) with the best analytic goodput at this batch size."""
    n_cat = len(trace.categories)
    cand = np.array([[(k, 0)] * n_cat for k in [0, *ks]])
    return [0, *ks][int(np.argmax(goodput(trace, exp, cost, batch, cand)))]
