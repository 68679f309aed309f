"""The one search over configurations of a :class:`~specctl_vllm.controller.core.model.batch.BatchModel`.

Batched coordinate ascent: every category's best option given the others is found in one vectorised
evaluation (:meth:`BatchModel.all_options`); all improving moves are tried together and kept if that beats the
best single move, else the best single move is made, so goodput rises at every iteration. The batch couples
the categories (one model-drafted k sets the drafting depth of every request of the step), so one category
alone may not pay for a drafting pass that several together would: restarts put every category at its deepest
option under a model-drafter depth cap x for x in {k_max, k_max/2, 2, 1, 0}, all off, the previous
configuration and any caller's starts; the best end point wins. "All off" is a start, so the result is never
below plain decoding under the model.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from specctl_vllm.controller.core.model.batch import BatchModel

MAX_ITERS = 200


def ascend(model: BatchModel, cfg: np.ndarray) -> tuple[np.ndarray, float]:
    """Coordinate ascent from ``cfg``: the end point and its goodput."""
    cfg = cfg.copy()
    g_cur, _ = model.goodput(cfg)
    for _ in range(MAX_ITERS):
        g, _t = model.all_options(cfg)
        g = np.where(model.movable[:, None], g, -np.inf)
        best = np.argmax(g, axis=1)
        best_g = g[model.rows, best]
        improving = model.movable & (best_g > g_cur * (1 + 1e-9))
        if not improving.any():
            break
        joint = np.where(improving, best, cfg)
        g_joint, _ = model.goodput(joint)
        u = int(np.argmax(np.where(improving, best_g, -np.inf)))
        if g_joint >= best_g[u]:
            cfg, g_cur = joint, g_joint
        else:
            cfg[u] = best[u]
            g_cur = float(best_g[u])
    return cfg, g_cur


def search(model: BatchModel, k_max: int, previous: np.ndarray | None = None,
           starts: Iterable[np.ndarray] = ()) -> np.ndarray:
    """The best configuration found from the restarts above (option index per category)."""
    if len(model.rows) == 1:  # one category: every option scored at once is the whole search
        g, _ = model.all_options(np.zeros(1, dtype=int))
        return np.array([int(np.argmax(g[0]))])
    caps = sorted({k_max, (k_max + 1) // 2, min(2, k_max), min(1, k_max), 0}, reverse=True)
    if not (model.model_k[model.movable] > 0).any():
        caps = [k_max]
    points = []
    for cap in caps:
        e = np.where(model.valid & (model.model_k <= cap), model.e, -np.inf)
        points.append(np.where(model.movable, np.argmax(e, axis=1), 0))
    points.append(np.zeros(len(model.rows), dtype=int))
    points.extend(np.asarray(s, dtype=int) for s in starts)
    if previous is not None:
        points.append(previous)
    best_cfg, best_g, seen = points[-1], -1.0, set()
    for s in points:
        key = s.tobytes()
        if key in seen:
            continue
        seen.add(key)
        cfg, g = ascend(model, s)
        if g > best_g * (1 + 1e-12):
            best_cfg, best_g = cfg, g
    return best_cfg
