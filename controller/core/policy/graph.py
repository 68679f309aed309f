"""Graph-shaped engines: the controller sends the width rule's inputs; the engine owns each step's width.

Such an engine verifies one width K for every request of a step, chosen per step by its own width rule
(:class:`specctl_vllm.engine_patch.widths.WidthChooser`, which calls
:func:`specctl_vllm.kernel.model.widths.choose_width`): it sees each step's exact batch and the last few
dozen steps' acceptance, where the controller is seconds behind. So this policy decides no width. Per category
it sends the cap the rule may run up to -- the engine's k_max, with the drafter the engine was started with --
beside the inputs the wire adds (:mod:`..stages.wire`: the cell table and each category's E_c(K) curve; an
operator override caps or pins a category on top). The cap is constant, so a mean-mix width moving between two
refreshes makes no new rules version at the engine (which would re-resolve every request and force a batch pass).

What it does compute is the figures the controller reports, at the width the engine's rule is forecast to pick
at the mean mix (:attr:`Decision.width`), through the rule's own table
(:func:`~specctl_vllm.kernel.model.widths.plan_widths`):

    n_c = the category's mean requests per step (the snapshot's mix), requests it does not attribute at the
          cold-start curve;  b = round(batch size);  K* = choose_width(n, E, W, T(b, .), steps(b, .))
    goodput(K) = sum_c n_c E_c(K) / T(b, K);  a category's speedup = E_c(K*) T(b, 0) / T(b, K*)

Pure, no I/O, O(categories x widths).
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
    """Every category (and the default) capped at the engine's k_max with its drafter; the figures at the
    forecast width. ``budget``: what the engine's steps measured about its token budget, where the
    steady-step model prices this batch (:func:`~specctl_vllm.kernel.model.widths.steady_regime`);
    None: the cells."""
    mix = mix_of(snap)
    plan = plan_widths(view, curves, mix, round(snap.batch_size), default_curve, budget)
    width, method = plan.width, snap.engine_method
    cap = snap.k_max if method != METHOD_OFF else 0
    on = method if cap else METHOD_OFF
    chosen, plain = plan.chosen, plan.plain
    ratio = chosen.goodput / plain.goodput if plain.goodput > 0 else 1.0
    source = "the cell table" if budget is None else "the steady-step model of the token budget"
    reason = (f"graph-shaped engine: its width rule picks each step's width, up to {cap}; at batch {plan.batch} "
              f"it is forecast to pick {width} from {source} ({ratio:.2f}x plain)")
    out = []
    for c in snap.categories:
        curve = curves.get(c.name, default_curve)
        # alone, a batch of this category would run the width that maximises its own E(K) / T(b, K)
        alone = max(plan.rows, key=lambda r: _own_speedup(plan, curve, r.width))
        out.append(CategoryDecision(
            name=c.name, k=cap, method=on, source="policy", reason=reason,
            expected_committed=round(_at(curve, width), 4), speedup=round(_own_speedup(plan, curve, width), 4),
            adapt_k_min=cap, adapt_k_max=cap, best_method=method if alone.width else METHOD_OFF,
            best_method_speedup=round(_own_speedup(plan, curve, alone.width), 4),
            table=_rows(plan, curve, method)))
    default = CategoryDecision(
        name="_default", k=cap, method=on, source="default",
        reason=f"{reason}; a category without a curve of its own is credited E(K) at acceptance of the cold start",
        expected_committed=round(_at(default_curve, width), 4),
        speedup=round(_own_speedup(plan, default_curve, width), 4), adapt_k_min=cap, adapt_k_max=cap)
    return Decision(categories=tuple(out), default=default, batch_size=snap.batch_size, goodput=chosen.goodput,
                    plain_goodput=plain.goodput, step_ms=chosen.step_s * 1e3, plain_step_ms=plain.step_s * 1e3,
                    width=width)
