"""The step-cost model learned online: coefficients of :class:`specctl_vllm.kernel.cost.CostCoefficients` fitted to
an engine's step timings, per-depth cell factors and the mixed-k penalty.

Learning: the coefficients are a ridge-regularised least-squares fit over step timings with exponential
forgetting, pulled toward a cold-start preset (``prior_strength`` pseudo-steps): directions the engine's
traffic never excites (a batch size never seen, a depth never used) keep the preset's value. The knee is
a preset constant (it is not identifiable from a steady workload). Coefficients are kept non-negative.
Each step's time is capped at 4x its batch's median ratio to the preset, so a GC pause cannot drag the
fit, and merging stays independent of the order batches arrive in. Steps that carry prompt tokens are left
out: with decode steps all at one depth they alone would set the per-token slope (and one-off compilations
of new shapes land in them); the policy prices prefill with the decode per-token cost.

Depth cells. A linear model cannot express what an engine does per *shape* of step: on a GPU, vLLM replays
a full CUDA graph only when every request drafts the depth the engine was started with, so a trimmed depth
can be slower than the full one; a draft-model engine still runs its drafter's catch-up pass at depth 0, so
"off" there costs more than plain decoding. So the model also keeps, per cell (batch size rounded to a power
of two, drafting depth), the decayed sums of measured step time and of the step features. A cell's factor is
measured time over what the current linear fit predicts for the same steps (a ratio of sums: order
independent, and always relative to the current fit), shrunk toward 1 by ``cell_prior`` pseudo-steps; the
policy multiplies its step-time estimate at each depth by the factor at the batch size it plans for
(interpolated between powers of two). Cells the engine never ran keep the linear fit.

Mixed-k penalty. On a GPU the same depth costs more when the requests of a decode step draft different
numbers of tokens (a non-uniform batch runs piecewise CUDA graphs): at batch 4 on an H200, 27.1 ms against
11.7 ms for uniform steps of the same depth. Decode steps that draft are split into uniform and mixed ones
(steps with prefill are neither, and stay out of the fit altogether); per batch cell the penalty is the mixed
steps' measured/fit ratio over the uniform steps', each ratio shrunk toward the engine-wide one and that
toward 1. The depth cells learn from non-mixed steps only, so the two effects stay apart. On a CPU (no
graphs) the penalty stays near 1.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specctl_vllm.kernel.cost import FULL_GRAPH_PENALTY, MIXED, PLAIN, PREFILL, UNIFORM, CostCoefficients
from specctl_vllm.kernel.decay import Decayed
from specctl_vllm.kernel.protocol import MAX_K

N_FEATURES = 9


#: Floor of the fitted per-step base cost, seconds (1 us: no engine step is shorter).
MIN_BASE_S = 1e-6


def features(n: float, tokens: float, knee: float, depth: float, free_tokens: float) -> np.ndarray:
    on = 1.0 if depth > 0 else 0.0
    return np.array([1.0, n, tokens, max(0.0, tokens - knee), on, on * n, depth, depth * n, free_tokens])


#: Typical magnitude of each feature, so the ridge pull is comparable across coefficients.
_SCALES = np.array([1.0, 32.0, 128.0, 128.0, 1.0, 32.0, 2.0, 64.0, 32.0])


#: Depth cells: batch sizes are rounded to a power of two up to 2**(BATCH_CELLS-1); depths 0..MAX_K.
BATCH_CELLS = 12


#: pseudo-steps at factor 1 in each cell: a cell speaks once it has seen a few dozen steps
CELL_PRIOR = 30.0


def _median(values: np.ndarray) -> float:
    """``float(np.median(values))`` of a 1-d array, the same value without np.median's overhead on the few rows
    of one batch (a tenth of a small post's merge); anything not finite is left to np.median."""
    ordered = np.sort(values)
    if ordered.size == 0 or not np.isfinite(ordered[0]) or not np.isfinite(ordered[-1]):
        return float(np.median(values))
    half = ordered.size // 2
    return float(ordered[half]) if ordered.size % 2 else float((ordered[half - 1] + ordered[half]) / 2.0)


def batch_cell(n: np.ndarray | float) -> np.ndarray:
    return np.clip(np.rint(np.log2(np.maximum(n, 1.0))), 0, BATCH_CELLS - 1).astype(int)


def _interpolate(values: np.ndarray, seen: np.ndarray, n: float) -> np.ndarray:
    """values[cell, ...] at batch ``n``: linear in log2(n) between the neighbouring cells that saw steps."""
    pos = float(np.clip(np.log2(max(n, 1.0)), 0, BATCH_CELLS - 1))
    lo = int(np.floor(pos))
    hi = min(lo + 1, BATCH_CELLS - 1)
    w_lo, w_hi = (1.0 - (pos - lo)) * seen[lo], (pos - lo) * seen[hi]
    total = w_lo + w_hi
    mixed = (w_lo * values[lo] + w_hi * values[hi]) / np.maximum(total, 1e-12)
    return np.where(total > 1e-12, mixed, 1.0)


class OnlineCostModel(Decayed):
    """Ridge-regularised, exponentially forgotten least squares toward a preset (see module docstring)."""

    _decayed = ("xtx", "xty", "weight", "cell_w", "cell_wall", "cell_x", "kind_w", "kind_wall", "kind_x")

    __slots__ = (
        "_cached",
        "cell_prior",
        "cell_w",
        "cell_wall",
        "cell_x",
        "kind_w",
        "kind_wall",
        "kind_x",
        "preset",
        "prior_strength",
        "seconds_total",
        "steps_total",
        "t_last",
        "weight",
        "xtx",
        "xty",
    )

    def __init__(self, preset: CostCoefficients, prior_strength: float = 10.0, cell_prior: float = CELL_PRIOR) -> None:
        self.preset = preset
        self.prior_strength = prior_strength
        self.cell_prior = cell_prior
        self.xtx = np.zeros((N_FEATURES, N_FEATURES))
        self.xty = np.zeros(N_FEATURES)
        self.cell_w = np.zeros((BATCH_CELLS, MAX_K + 1))  # decayed steps per (batch cell, depth)
        self.cell_wall = np.zeros((BATCH_CELLS, MAX_K + 1))  # decayed sum of (capped) step seconds
        self.cell_x = np.zeros((BATCH_CELLS, MAX_K + 1, N_FEATURES))  # decayed sum of scaled features
        # the same sums per (batch cell, UNIFORM | MIXED) for drafting decode steps (the mixed-k penalty)
        self.kind_w = np.zeros((BATCH_CELLS, 2))
        self.kind_wall = np.zeros((BATCH_CELLS, 2))
        self.kind_x = np.zeros((BATCH_CELLS, 2, N_FEATURES))
        self.weight = 0.0  # decayed number of steps
        self.t_last: float | None = None
        self._cached: CostCoefficients | None = None
        self.steps_total = 0
        self.seconds_total = 0.0

    def _decayed_changed(self) -> None:
        self._cached = None

    def add(self, n: float, tokens: float, depth: float, free: float, wall_s: float, kind: int = PLAIN) -> None:
        self.add_many([(n, tokens, depth, free, wall_s, kind)])

    def add_many(self, shapes: list[tuple[float, ...]]) -> None:
        """Add (n, tokens, depth, free, wall_s[, kind]) rows at once (one matrix product per batch)."""
        # Steps carrying prompt tokens are left out of the fit: their cost is dominated by the prompt (first
        # steps of a shape can also be one-off compilations) and, with the decode steps all at one depth, they
        # alone would set the per-token slope and drive the base to zero (measured on the H200 run: a fit
        # that priced a no-draft step at batch 3 at 1.5 ms against 9.4 ms measured, and chose k=0).
        rows = [(*r[:5], r[5] if len(r) > 5 else PLAIN) for r in shapes
                if r[0] > 0 and r[4] > 0 and (len(r) <= 5 or r[5] != PREFILL)]
        self.steps_total += len(shapes)
        self.seconds_total += sum(r[4] for r in shapes)
        if not rows:
            return
        arr = np.asarray(rows, dtype=float)
        n, tok, depth, free, wall, kind = arr.T
        on = (depth > 0).astype(float)
        x = np.column_stack([np.ones_like(n), n, tok, np.maximum(tok - self.preset.knee, 0.0), on, on * n, depth,
                             depth * n, free]) / _SCALES
        # A GC pause or a prefill burst must not drag the fit: cap each step at 4x the batch's median
        # ratio to the preset. The cap depends on the batch alone, so merging stays order-independent.
        pred = x @ (self.preset.vector() * _SCALES)
        typical = _median(wall / pred)
        y = np.minimum(wall, 4.0 * typical * pred + 1e-3)
        self.xtx += x.T @ x
        self.xty += x.T @ y
        self.weight += len(rows)
        kind = kind.astype(int)
        b = batch_cell(n)
        plain = kind != MIXED  # depth cells: what a uniform or unavoidable step costs
        cells = (b[plain], np.clip(np.rint(depth[plain]), 0, MAX_K).astype(int))
        np.add.at(self.cell_w, cells, 1.0)
        np.add.at(self.cell_wall, cells, y[plain])
        np.add.at(self.cell_x, cells, x[plain])
        timed = (kind == UNIFORM) | (kind == MIXED)
        kinds = (b[timed], kind[timed])
        np.add.at(self.kind_w, kinds, 1.0)
        np.add.at(self.kind_wall, kinds, y[timed])
        np.add.at(self.kind_x, kinds, x[timed])
        self._cached = None

    def mixed_penalty(self, n: float, prior: float = 1.0) -> float:
        """How much slower a mixed-k drafting step is than a uniform one at batch ``n`` (``prior``: no evidence)."""
        theta = self.coefficients().vector() * _SCALES
        pred = self.kind_x @ theta  # (cells, 2)
        w = self.kind_w
        # engine-wide ratios first (toward 1), then each cell's ratio toward the engine-wide one
        toward = {UNIFORM: 1.0, MIXED: prior}
        pooled = [_shrunk_ratio(self.kind_wall[:, j].sum(), pred[:, j].sum(), w[:, j].sum(), toward[j],
                                self.cell_prior) for j in (UNIFORM, MIXED)]
        cell = np.stack([_shrunk_ratio(self.kind_wall[:, j], pred[:, j], w[:, j], pooled[j], self.cell_prior)
                         for j in (UNIFORM, MIXED)], axis=1)
        penalty = cell[:, MIXED] / np.maximum(cell[:, UNIFORM], 1e-12)  # cells never seen: the pooled one
        return float(_interpolate(penalty, np.ones(BATCH_CELLS, dtype=bool), n))

    def depth_factors(self, n: float, k_max: int) -> np.ndarray:
        """Per drafting depth 0..k_max: measured over predicted step time at batch ``n`` (see docstring)."""
        theta = self.coefficients().vector() * _SCALES
        pred = self.cell_x[:, : k_max + 1] @ theta
        w = self.cell_w[:, : k_max + 1]
        seen = (w > 1e-9) & (pred > 1e-12)
        prior = self.cell_prior * np.where(seen, pred / np.maximum(w, 1e-9), 0.0)  # pseudo-steps at the fit
        factor = np.where(seen, (self.cell_wall[:, : k_max + 1] + prior) / np.maximum(pred + prior, 1e-12), 1.0)
        return _interpolate(factor, seen, n)

    def coefficients(self) -> CostCoefficients:
        if self._cached is None:
            if self.weight <= 0:
                self._cached = self.preset
            else:
                fit = CostCoefficients.from_vector(self._solve() / _SCALES, self.preset.knee)
                # a step costs something: without the floor, steps reported (validly) fast enough fit every
                # coefficient to 0 and each goodput divided by a zero step time
                self._cached = fit if fit.base >= MIN_BASE_S else replace(fit, base=MIN_BASE_S)
        return self._cached

    def _solve(self) -> np.ndarray:
        lam = self.prior_strength
        prior = self.preset.vector() * _SCALES
        free = np.ones(N_FEATURES, dtype=bool)
        phi = np.zeros(N_FEATURES)
        while free.any():
            idx = np.flatnonzero(free)
            a = self.xtx[np.ix_(idx, idx)] + lam * np.eye(len(idx))
            try:
                sol = np.linalg.solve(a, self.xty[idx] + lam * prior[idx])
            except np.linalg.LinAlgError:  # numerically singular (features at the edge of their range)
                sol = np.linalg.lstsq(a, self.xty[idx] + lam * prior[idx], rcond=None)[0]
            if not np.all(np.isfinite(sol)):
                return prior  # no usable fit: the preset
            if np.all(sol >= 0):
                phi[idx] = sol
                return phi
            free[idx[sol < 0]] = False  # clamp negative coefficients at zero and refit the rest
        return phi

    def to_dict(self) -> dict:
        return {"xtx": self.xtx.tolist(), "xty": self.xty.tolist(), "weight": self.weight, "t_last": self.t_last,
                "steps_total": self.steps_total, "seconds_total": self.seconds_total,
                "cells": {"w": self.cell_w.tolist(), "wall": self.cell_wall.tolist(), "x": self.cell_x.tolist()},
                "kinds": {"w": self.kind_w.tolist(), "wall": self.kind_wall.tolist(), "x": self.kind_x.tolist()}}

    @classmethod
    def from_dict(cls, d: dict, preset: CostCoefficients, prior_strength: float = 10.0) -> OnlineCostModel:
        m = cls(preset, prior_strength)
        xtx = np.asarray(d["xtx"], dtype=float)
        xty = np.asarray(d["xty"], dtype=float)
        if xtx.shape != (N_FEATURES, N_FEATURES) or xty.shape != (N_FEATURES,):
            raise ValueError("cost model shape mismatch")
        if not (np.all(np.isfinite(xtx)) and np.all(np.isfinite(xty))):
            raise ValueError("non-finite cost state")
        m.xtx, m.xty = xtx, xty
        m.weight = max(0.0, float(d["weight"]))
        m.t_last = None if d.get("t_last") is None else float(d["t_last"])
        m.steps_total = int(d.get("steps_total", 0))
        m.seconds_total = float(d.get("seconds_total", 0.0))
        # snapshots written before the cells existed restore without them
        if d.get("cells") is not None:
            m.cell_w, m.cell_wall, m.cell_x = _restore_sums(d["cells"], m.cell_w, m.cell_wall, m.cell_x)
        if d.get("kinds") is not None:
            m.kind_w, m.kind_wall, m.kind_x = _restore_sums(d["kinds"], m.kind_w, m.kind_wall, m.kind_x)
        return m


def _restore_sums(d: dict, *like: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w, wall, x = (np.asarray(d[k], dtype=float) for k in ("w", "wall", "x"))
    if (w.shape, wall.shape, x.shape) != tuple(a.shape for a in like):
        raise ValueError("cost cell shape mismatch")
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(wall)) and np.all(np.isfinite(x))):
        raise ValueError("non-finite cost cells")
    return np.maximum(w, 0.0), np.maximum(wall, 0.0), x


def _shrunk_ratio(wall, pred, w, toward, prior: float):
    """Measured over fitted seconds, with ``prior`` pseudo-steps at ratio ``toward`` (sums may be arrays)."""
    seen = (w > 1e-9) & (pred > 1e-12)
    mean_pred = np.where(seen, pred / np.maximum(w, 1e-9), 0.0)
    return np.where(seen, (wall + prior * mean_pred * toward) / np.maximum(pred + prior * mean_pred, 1e-12), toward)


@dataclass(frozen=True, kw_only=True)
class Corrections:
    """What a step is priced with beyond the fitted coefficients, at one batch size: per model-drafting depth
    the measured over the modelled step time, and how much dearer a step is whose requests draft different k.
    The policy's snapshot and ``specctl replay`` both take them from :func:`corrections`, so the batch model
    prices a configuration the same way in both."""

    depth_factor: tuple[float, ...] = ()
    mixed_penalty: float = 1.0


#: No measured correction: the coefficients alone (an immutable value, the default of the what-if's calls).
NO_CORRECTIONS = Corrections()


def corrections(fit: OnlineCostModel, batch_size: float, k_max: int, full_cuda_graphs: bool) -> Corrections:
    """The fit's corrections at ``batch_size``; an engine on full CUDA graphs starts from a mixed-k penalty of
    :data:`FULL_GRAPH_PENALTY` (a mixed step leaves the graph) until it measured its own."""
    return Corrections(depth_factor=tuple(float(f) for f in fit.depth_factors(batch_size, k_max)),
                       mixed_penalty=fit.mixed_penalty(batch_size, FULL_GRAPH_PENALTY if full_cuda_graphs else 1.0))
