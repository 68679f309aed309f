"""Graph-shaped engines: the decision is the width the engine's own width rule picks, priced by the cell table.

Such an engine verifies one width K for every request of a step, chosen per step by
:func:`specctl_vllm.kernel.model.widths.choose_width` on the cell table the controller sends; a category's k
from the batch model (:mod:`.goodput`, which models per-request k) would not be what it runs. So the decision
gives every category (and the default) that width, with the drafter the engine was started with (off at K = 0),
and its goodput, step time and per-width table rows come from the same cells and E_c(K) curves through
:func:`~specctl_vllm.kernel.model.widths.plan_widths`.

    n_c = the category's mean requests per step (the snapshot's mix), requests it does not attribute at the
          cold-start curve;  b = round(batch size);  K = choose_width(n, E, W, T(b, .), steps(b, .))
    goodput(K) = sum_c n_c E_c(K) / T(b, K);  a category's speedup = E_c(K) T(b, 0) / T(b, K)

What the engine adds per step (its exact batch, exploration steps, the fast acceptance blend) the decision
cannot see: it is the engine's choice at the mean mix. Pure, no I/O, O(categories x widths).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specctl_vllm.controller.core.policy.types import CategoryDecision, Decision, KRow, PolicySnapshot
from specctl_vllm.kernel.model.cells import CellView
from specctl_vllm.kernel.model.widths import TokenBudget, WidthPlan, plan_widths
from specctl_vllm.kernel.protocol import METHOD_OFF

#: Name of the requests the mix does not attribute to a category (they run the step's width too).
REST = "_rest"


def mix_of(snap: PolicySnapshot) -> dict[str, float]:
    """Requests per category of a mean step; what the categories do not account for, at the default curve."""
    mix = {c.name: c.share for c in snap.categories if c.share > 0}
    rest = snap.batch_size - sum(mix.values())
    if rest > 1e-9 or not mix:
        mix[REST] = rest if mix else max(snap.batch_size, 1.0)
    return mix


def _at(curve: Sequence[float], k: int) -> float:
    return float(curve[min(k, len(curve) - 1)])


def _rows(plan: WidthPlan, curve: Sequence[float], method: str) -> tuple[KRow, ...]:
    plain = plan.plain.goodput
    return tuple(KRow(k=r.width, method=method if r.width else METHOD_OFF,
                      expected_committed=round(_at(curve, r.width), 4), step_ms=round(r.step_s * 1e3, 4),
                      goodput=round(r.goodput, 3), speedup=round(r.goodput / plain, 4) if plain > 0 else 1.0)
                 for r in plan.rows)


def _own_speedup(plan: WidthPlan, curve: Sequence[float], width: int) -> float:
    """A request's committed tokens per second at ``width`` over plain decoding (the same batch's cells)."""
    t = plan.row(width).step_s
    return _at(curve, width) * plan.plain.step_s / t if t > 0 else 1.0


def decide(snap: PolicySnapshot, view: CellView, curves: Mapping[str, Sequence[float]],
           default_curve: Sequence[float], budget: TokenBudget | None = None) -> Decision:
    """``budget``: what the engine's steps measured about its token budget, where the steady-step model
    prices this batch (:func:`~specctl_vllm.kernel.model.widths.steady_regime`); None: the cells."""
    mix = mix_of(snap)
    plan = plan_widths(view, curves, mix, round(snap.batch_size), default_curve, budget)
    k, method = plan.width, snap.engine_method
    on = method if k else METHOD_OFF
    chosen, plain = plan.chosen, plan.plain
    ratio = chosen.goodput / plain.goodput if plain.goodput > 0 else 1.0
    source = "the cell table" if budget is None else "the steady-step model of the token budget"
    reason = f"graph-shaped engine: width {k} from {source} at batch {plan.batch} ({ratio:.2f}x plain)"
    out = []
    for c in snap.categories:
        curve = curves.get(c.name, default_curve)
        # alone, a batch of this category would run the width that maximises its own E(K) / T(b, K)
        alone = max(plan.rows, key=lambda r: _own_speedup(plan, curve, r.width))
        out.append(CategoryDecision(
            name=c.name, k=k, method=on, source="policy", reason=reason, expected_committed=round(_at(curve, k), 4),
            speedup=round(_own_speedup(plan, curve, k), 4), adapt_k_min=k, adapt_k_max=k,
            best_method=method if alone.width else METHOD_OFF,
            best_method_speedup=round(_own_speedup(plan, curve, alone.width), 4),
            table=_rows(plan, curve, method)))
    default = CategoryDecision(
        name="_default", k=k, method=on, source="default",
        reason=f"{reason}; a category without a curve of its own is credited E(K) at acceptance of the cold start",
        expected_committed=round(_at(default_curve, k), 4), speedup=round(_own_speedup(plan, default_curve, k), 4),
        adapt_k_min=k, adapt_k_max=k)
    return Decision(categories=tuple(out), default=default, batch_size=snap.batch_size, goodput=chosen.goodput,
                    plain_goodput=plain.goodput, step_ms=chosen.step_s * 1e3, plain_step_ms=plain.step_s * 1e3)
