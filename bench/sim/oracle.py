"""Hindsight choices computed from the true workload and the true step cost.

Candidates are ranked under the policy's own closed-loop batch model (:mod:`specctl_vllm.controller.core.model.batch`),
fed with what the policy can only estimate: the true per-category E_c,m(k) (over a category its steps-weighted
mean is the harmonic mean E_c = 1 / mean_r(1 / E_r), estimated from sampled per-request profiles), the true
demand (arrival share x output length: committed tokens per step), prompt tokens per committed token
(``prompt_tokens`` per request over its output length) and the truth cost. So the oracle and the policy
rank configurations by one formula, and what separates specctl from the oracle is learning, not a different
model. The oracle reported is the best of the top candidates *simulated* with the same engine as every
other strategy.
"""

from __future__ import annotations

import itertools

import numpy as np

from bench.sim.profiles import Trace
from specctl_vllm.controller.core.model.batch import BatchModel, Options, Prefill
from specctl_vllm.controller.core.model.search import search
from specctl_vllm.kernel.cost import CostCoefficients


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


def option_index(trace: Trace, choice: np.ndarray) -> np.ndarray:
    """(..., 2) of (k, drafter index) -> position in :func:`options` (off for k = 0)."""
    k, m = choice[..., 0].astype(int), choice[..., 1].astype(int)
    return np.where(k > 0, 1 + m * trace.k_max + k - 1, 0)


def batch_model(trace: Trace, exp: np.ndarray, cost: CostCoefficients, batch: int) -> BatchModel:
    """The trace at batch ``batch`` as the policy's batch model, every option of :func:`options` per category."""
    share = np.array([c.share for c in trace.categories], dtype=float)
    share = share / share.sum()
    length = np.array([c.output_tokens for c in trace.categories], dtype=float)
    opts = options(trace)
    rows = [Options.of([(k, float(exp[ci, m, k]), float(k), m > 0, trace.methods[m]) for k, m in opts])
            for ci in range(len(trace.categories))]
    rate = trace.prompt_tokens / float(share @ length)
    return BatchModel([c.name for c in trace.categories], batch * share, rows, [True] * len(rows),
                      Prefill.steady(rate=rate), cost, trace.k_max, demand=share * length)


def goodput(trace: Trace, exp: np.ndarray, cost: CostCoefficients, batch: int, choice: np.ndarray) -> np.ndarray:
    """Modelled goodput of choices; ``choice`` is (..., categories, 2) of (k, drafter index)."""
    choice = np.asarray(choice)
    g, _ = batch_model(trace, exp, cost, batch).goodput_many(option_index(trace, choice))
    return g.reshape(choice.shape[:-2])


def best_static(trace: Trace, exp: np.ndarray, cost: CostCoefficients, batch: int, top: int = 3,
                limit: int = 2_000_000) -> list[tuple[float, list[tuple[int, int]]]]:
    """The ``top`` per-category static configurations by modelled goodput (exhaustive when small, else the
    policy's search)."""
    opts = np.array(options(trace))
    n_cat = len(trace.categories)
    model = batch_model(trace, exp, cost, batch)
    if len(opts) ** n_cat <= limit:
        idx = np.array(list(itertools.product(range(len(opts)), repeat=n_cat)))
        g, _ = model.goodput_many(idx)
        order = np.argsort(-g)[:top]
        return [(float(g[i]), [tuple(map(int, opts[j])) for j in idx[i]]) for i in order]
    cur = search(model, trace.k_max)
    g, _ = model.goodput(cur)
    return [(float(g), [tuple(map(int, opts[j])) for j in cur])]


def best_common_k(trace: Trace, exp: np.ndarray, cost: CostCoefficients, batch: int, ks: list[int]) -> int:
    """The single engine-drafter k (or 0) with the best modelled goodput at this batch size."""
    n_cat = len(trace.categories)
    cand = np.array([[(k, 0)] * n_cat for k in [0, *ks]])
    return [0, *ks][int(np.argmax(goodput(trace, exp, cost, batch, cand)))]
