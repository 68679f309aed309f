"""What-if pricing for graph-shaped engines (one width per step): the recording's decode steps in the cell
table, and the goodput of the recorded mix at each width as the engine's width rule prices it.

The non-graph what-if (per-request k, the batch model) is :mod:`.whatif`; the two share its
:class:`~.whatif.Workload` and :class:`~.whatif.Estimate`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from specctl_vllm.controller.core.learn.learner import cell_sample, cell_samples
from specctl_vllm.controller.core.offline.token_traces import Profile
from specctl_vllm.controller.core.offline.whatif import Estimate, Workload
from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.model.cells import CellTable, CellView
from specctl_vllm.kernel.model.widths import TokenBudget, WidthPlan, plan_widths, steady_regime
from specctl_vllm.kernel.protocol import TelemetryBatch


def cell_view(batches: Sequence[TelemetryBatch], widths: Sequence[int], preset: CostCoefficients) -> CellView:
    """The cell table of the recording's decode steps (undecayed; each engine's steps in the order they ran,
    those before a prompt step left out as the controller leaves them, :func:`cell_samples`), with the
    controller's prior from ``preset``."""
    table = CellTable()
    per_engine: dict[tuple[str, str], list] = defaultdict(list)
    for b in batches:
        per_engine[(b.engine_id, b.boot_id)].extend(b.steps)
    for steps in per_engine.values():
        samples, _last = cell_samples(steps)
        for sample in samples:
            table.add(*sample)
    return table.view(widths, preset)


def graph_mix(work: Workload, batch_size: float | None = None) -> dict[str, float]:
    """Requests per category of a step at batch B, in the recorded proportion of request steps (what the
    controller's mix reports; a width does not move requests between categories' slots in this model)."""
    b = float(batch_size or work.batch_size or 1.0)
    steps = {c: work.committed[c] / max(p.e, 1e-9) for c, p in work.recorded.items() if work.committed.get(c, 0) > 0}
    total = sum(steps.values())
    return {c: b * r / total for c, r in steps.items()} if total > 0 else {}


def graph_curves(work: Workload, profiles: Mapping[str, Mapping[tuple[str, int], Profile]], method: str,
                 k_top: int) -> dict[str, tuple[float, ...]]:
    """E_c(K) for K = 0..k_top from the profiles at the engine's drafter (a missing K: 1, counted off as
    :func:`uniform` counts it)."""
    out = {}
    for c in work.categories:
        per = profiles.get(c, {})
        out[c] = (1.0, *(per[(method, k)].e if (method, k) in per else 1.0 for k in range(1, k_top + 1)))
    return out


def graph_plan(work: Workload, curves: Mapping[str, Sequence[float]], view: CellView,
               batch_size: float | None = None, budget: TokenBudget | None = None) -> WidthPlan:
    """The width rule on the recorded mix at batch B: the cells, or the steady-step model of ``budget`` where
    the widest width could fill it (as the engine decides)."""
    b = float(batch_size or work.batch_size or 1.0)
    steady = budget if budget is not None and steady_regime(round(b), view.widths[-1], budget) else None
    return plan_widths(view, curves, graph_mix(work, b), round(b), budget=steady)


def graph_estimate(work: Workload, curves: Mapping[str, Sequence[float]], view: CellView, width: int,
                   batch_size: float | None = None, budget: TokenBudget | None = None) -> Estimate:
    """Goodput of the recorded mix with every step at ``width``, priced as :func:`graph_plan` prices it."""
    row = graph_plan(work, curves, view, batch_size, budget).row(width)
    if row.step_s <= 0:
        return Estimate(0.0, 0.0, {})
    per = {c: curves[c][min(width, len(curves[c]) - 1)] / row.step_s for c in curves}
    return Estimate(row.goodput, row.step_s * 1e3, per)


def graph_recorded(batches: Sequence[TelemetryBatch], view: CellView) -> Estimate:
    """The recorded decode steps at the widths they ran, each priced by its cell: committed tokens over the
    cells' seconds (the ``recorded`` row of a graph-shaped engine; its gap to the measured goodput says how far
    the cells describe the recording)."""
    seconds = tokens = 0.0
    per_t: dict[str, float] = defaultdict(float)
    per_n: dict[str, float] = defaultdict(float)
    for b in batches:
        for st in b.steps:
            if cell_sample(st) is None or st.width not in view.widths:
                continue
            t = view.row(st.batch_size)[0][view.widths.index(st.width)]
            seconds += t
            for cs in st.categories:
                committed = cs.requests + sum(h.accepted_tokens for h in cs.hists)
                tokens += committed
                per_t[cs.category] += committed
                per_n[cs.category] += cs.requests * t
    if seconds <= 0:
        return Estimate(0.0, 0.0, {})
    steps = sum(1 for b in batches for st in b.steps if cell_sample(st) is not None and st.width in view.widths)
    return Estimate(tokens / seconds, seconds / steps * 1e3,
                    {c: per_t[c] / per_n[c] for c in per_t if per_n[c] > 0})
