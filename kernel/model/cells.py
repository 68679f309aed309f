"""Step cost per (batch bucket, width) cell: measured, with a cold-start prior and monotone smoothing.

A GPU step's cost depends on which captured graph it replays, i.e. on its batch size and its uniform width K
(1 + K tokens per request), not on a smooth function of tokens. So the step model is a table: for each batch
bucket (upper edges :data:`BATCH_EDGES`) and each width of the engine's width set, the decayed sum of measured
step seconds and the decayed number of steps. A cell's estimate is the measurements shrunk toward the prior,
``prior_steps`` steps strong; then, per width, the estimates are made non-decreasing in batch size (a larger
batch never costs less), and the confidence of a cell is its decayed step count.

The prior is the preset's parametric step time at the bucket's representative batch, *calibrated* by what the
measured cells say about the preset on this machine: it is multiplied by the weighted geometric mean of
measured / preset over the measured cells, near ones (same width, neighbouring buckets) weighing most. The
preset alone is 25-35 % off on a real GPU; without the calibration a bucket the load has not reached yet (c = 4
to 16, or 64 to 256) is judged on the uncalibrated preset until its own steps arrive, and the width rule picks
from a wrong ranking for the first seconds of every load change. The calibration only rescales the prior: a
cell's own steps still outweigh it after ``prior_steps`` steps.

Only decode steps (no prompt tokens in the step) of graph-shaped engines, which report the step's width,
enter the table: they are the steps the width rule chooses between.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.decay import Decayed

#: Upper edges of the batch buckets (requests per step). Powers of two and their midpoints up to 512: vLLM's
#: capture sizes are multiples of 8 above 8, so a bucket's steps replay few distinct graphs.
BATCH_EDGES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: Steps of evidence the prior counts for in a cell; a few steps of a steady load override it.
PRIOR_STEPS = 5.0
#: Cells whose measured seconds per step are outside these bounds are not physical step times.
MIN_STEP_S, MAX_STEP_S = 1e-5, 60.0
#: Weight of a measured cell of another drafting width in the calibration of a prior (same width: 1). Drafting
#: widths share most of a step's cost (the weights, the KV reads, the draft pass); what they do not share is the
#: extra tokens. Width 0 and the drafting widths do not calibrate each other: a K = 0 step of a speculative
#: engine carries the drafter's catch-up pass the preset does not model, so its ratio says nothing about a
#: drafting step's (on the H200, K = 0 at 16 requests measured 1.26x the preset while K = 2 measured 0.85x).
OTHER_WIDTH_WEIGHT = 0.25
#: Bounds of the calibration factor: a preset can be off by a few times, not by orders of magnitude; beyond these
#: the measurements are of a different machine and the cells' own steps must speak.
CALIBRATION_BOUNDS = (0.25, 4.0)


def bucket_of(n: int, edges: Sequence[int] = BATCH_EDGES) -> int:
    for i, edge in enumerate(edges):
        if n <= edge:
            return i
    return len(edges) - 1


def representative_batch(i: int, edges: Sequence[int] = BATCH_EDGES) -> float:
    low = edges[i - 1] + 1 if i > 0 else 1
    return math.sqrt(low * edges[i])


def prior_step_s(cost: CostCoefficients, n: float, width: int) -> float:
    return cost.step_time(n, n * (1 + width), depth=width)


def monotone(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted isotonic (non-decreasing) fit, pool-adjacent-violators: a cell measured over many steps moves
    little, a prior-only neighbour that contradicts it moves to it."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, w2, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += w2
            blocks[-1][2] += c
    out: list[float] = []
    for s, w, c in blocks:
        out.extend([s / w] * int(c))
    return out


@dataclass(frozen=True, kw_only=True)
class CellView:
    """The table as the policy and the engine see it: per bucket, per width, seconds and steps."""

    batch_edges: tuple[int, ...]
    widths: tuple[int, ...]
    step_s: tuple[tuple[float, ...], ...]
    steps: tuple[tuple[float, ...], ...]

    def row(self, n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        i = bucket_of(n, self.batch_edges)
        return self.step_s[i], self.steps[i]


class CellTable(Decayed):
    """Decayed sums per (bucket, width); :meth:`view` gives the smoothed, prior-shrunk estimates."""

    _decayed = ("sums",)

    def __init__(self, edges: Sequence[int] = BATCH_EDGES) -> None:
        self.edges = tuple(edges)
        self.sums: dict[tuple[int, int], list[float]] = {}  # (bucket, width) -> [seconds, steps]
        self.t_last: float | None = None

    @property
    def t(self) -> float | None:
        """The time the sums were last aged to (the snapshot's field name)."""
        return self.t_last

    def add(self, n: int, width: int, seconds: float) -> None:
        if n <= 0 or width < 0 or not (MIN_STEP_S <= seconds <= MAX_STEP_S):
            return
        cell = self.sums.setdefault((bucket_of(n, self.edges), width), [0.0, 0.0])
        cell[0] += seconds
        cell[1] += 1.0

    def calibration(self, widths: Sequence[int], cost: CostCoefficients) -> dict[tuple[int, int], float]:
        """(bucket, width) -> factor on the preset's step time, from the measured cells (1.0 where none is)."""
        logs = []  # (bucket, width, steps, log(measured / preset))
        for (i, w), (s, c) in self.sums.items():
            if c <= 0 or i >= len(self.edges):
                continue
            preset = prior_step_s(cost, representative_batch(i, self.edges), w)
            if preset > 0 and math.isfinite(preset) and s > 0:
                logs.append((i, w, c, math.log(s / c / preset)))
        low, high = CALIBRATION_BOUNDS
        out = {}
        for i in range(len(self.edges)):
            for w in widths:
                num = den = 0.0
                for j, v, c, lr in logs:
                    if (v == 0) != (w == 0):
                        continue
                    weight = c * (1.0 if v == w else OTHER_WIDTH_WEIGHT) / (1.0 + abs(i - j)) ** 2
                    num += weight * lr
                    den += weight
                out[(i, w)] = min(max(math.exp(num / den), low), high) if den > 0 else 1.0
        return out

    def view(self, widths: Sequence[int], cost: CostCoefficients, prior_steps: float = PRIOR_STEPS) -> CellView:
        step_s, steps = [], []
        factor = self.calibration(widths, cost)
        for i in range(len(self.edges)):
            n = representative_batch(i, self.edges)
            row_s, row_n = [], []
            for w in widths:
                s, c = self.sums.get((i, w), (0.0, 0.0))
                prior = prior_step_s(cost, n, w) * factor[(i, w)]
                row_s.append((s + prior_steps * prior) / (c + prior_steps))
                row_n.append(c)
            step_s.append(row_s)
            steps.append(row_n)
        for j in range(len(widths)):  # a larger batch never costs less at the same width
            column = monotone([row[j] for row in step_s], [row[j] + prior_steps for row in steps])
            for i, value in enumerate(column):
                step_s[i][j] = value
        return CellView(batch_edges=self.edges, widths=tuple(widths),
                        step_s=tuple(tuple(r) for r in step_s), steps=tuple(tuple(r) for r in steps))

    def to_dict(self) -> dict:
        return {"edges": list(self.edges), "t": self.t_last,
                "cells": [[b, w, s, c] for (b, w), (s, c) in sorted(self.sums.items())]}

    @classmethod
    def from_dict(cls, d: dict) -> CellTable:
        table = cls(tuple(int(e) for e in d.get("edges", BATCH_EDGES)))
        t = d.get("t")
        table.t_last = float(t) if t is not None and math.isfinite(float(t)) else None
        for b, w, s, c in d.get("cells", []):
            b, w, s, c = int(b), int(w), float(s), float(c)
            if 0 <= b < len(table.edges) and 0 <= w and math.isfinite(s) and math.isfinite(c) and s >= 0 and c >= 0:
                table.sums[(b, w)] = [s, c]
        return table
