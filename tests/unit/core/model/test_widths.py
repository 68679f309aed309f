"""The width rule: argmax of modelled goodput over the width set, K > 0 only by a measured margin over plain."""

from __future__ import annotations

import pytest

from specctl_vllm.controller.core.model.cells import CellView
from specctl_vllm.controller.core.model.widths import (
    TokenBudget,
    budget_binds,
    budget_goodput,
    choose_width,
    expected_lengths,
    geometric_lengths,
    margin,
    plan_widths,
)

WIDTHS = (0, 1, 2, 4, 7)
HIGH = geometric_lengths(0.85, 7)
LOW = geometric_lengths(0.45, 7)


def test_expected_lengths_is_one_plus_survival_sums() -> None:
    assert expected_lengths((0.5, 0.5), 3) == pytest.approx((1.0, 1.5, 1.75, 1.875))
    assert expected_lengths((), 2) == (1.0, 1.0, 1.0)
    assert HIGH[4] == pytest.approx(1 + 0.85 + 0.85**2 + 0.85**3 + 0.85**4)


@pytest.mark.parametrize(
    ("mix", "step_ms", "steps", "want"),
    [
        # batch 1 on an H200-like cell row: every width pays, K=4 is best for beta 0.85
        ({"json": 1}, (5.0, 5.6, 6.2, 7.2, 9.5), (1e3,) * 5, 4),
        # the same row for a prose-like category: E(2) = 1.65 in 1.24x the time pays
        ({"prose": 1}, (5.0, 5.6, 6.2, 7.2, 9.5), (1e3,) * 5, 2),
        # a dearer drafter (draft-model-like cells): K=1 gains under 1 %, below the margin, so plain
        ({"prose": 1}, (5.0, 7.2, 9.0, 13.0, 19.0), (1e3,) * 5, 0),
        # a large batch: verifying costs almost proportionally to tokens, nothing beats plain
        ({"json": 256}, (23.0, 45.0, 60.0, 95.0, 160.0), (1e3,) * 5, 0),
        # half and half at batch 16: K=2 wins on the mix
        ({"json": 8, "prose": 8}, (5.9, 6.6, 7.4, 9.8, 14.0), (1e3,) * 5, 2),
    ],
)
def test_choice_table(mix, step_ms, steps, want) -> None:
    curves = {"json": HIGH, "prose": LOW}
    got = choose_width(mix, curves, WIDTHS, [t / 1e3 for t in step_ms], steps)
    assert got.width == want


# The H200 controller's cell row for 193-256 requests at the end of session 5 (ms; steps), where every step of
# the 256-request points carried a prompt: K > 0 had 1-3 decode steps, so the row is mostly the prior.
C256_MS, C256_STEPS = (21.5, 28.3, 34.9, 44.8, 62.9), (142.0, 2.0, 2.0, 3.0, 1.0)
# what the engine measured there: 2048-token full steps at 36631 tokens/s, 2 prompt tokens per committed token
H200_BUDGET = TokenBudget(tokens=2048, capacity=36631.0, rho=2.0)


@pytest.mark.parametrize(
    ("mix", "budget", "want"),
    [
        # mixed c = 256: the cells rank K4 1 % above K2; K4 fills the budget (209 * (5 + 2 * 2.75) = 2193
        # tokens) and is capped at 9588, K2 does not (1510 tokens): K2 (static engines: K2 10351, K4 9382)
        ({"json": 105, "prose": 104}, None, 4),
        ({"json": 105, "prose": 104}, H200_BUDGET, 2),
        # high c = 256 (226 requests a step in session 5): K4 and K7 fill the budget, K2 (1841 tokens) does not
        ({"json": 226}, None, 4),
        ({"json": 226}, H200_BUDGET, 2),
        # a budget no step fills changes nothing
        ({"json": 105, "prose": 104}, TokenBudget(tokens=10**6, capacity=36631.0, rho=2.0), 4),
    ],
)
def test_the_token_budget_caps_widths_that_fill_it(mix, budget, want) -> None:
    curves = {"json": HIGH, "prose": LOW}
    got = choose_width(mix, curves, WIDTHS, [t / 1e3 for t in C256_MS], C256_STEPS, budget=budget)
    assert got.width == want


def test_budget_goodput_is_capacity_over_tokens_per_committed_token() -> None:
    mix, curves = {"json": 100, "prose": 100}, {"json": HIGH, "prose": LOW}
    e4 = (HIGH[4] + LOW[4]) / 2
    assert budget_goodput(mix, curves, 4, H200_BUDGET) == pytest.approx(36631.0 / (5 / e4 + 2.0))
    assert budget_goodput(mix, curves, 0, H200_BUDGET) == pytest.approx(36631.0 / 3.0)  # plain: 1 + rho tokens
    assert budget_goodput({}, curves, 4, H200_BUDGET) == 0.0
    assert budget_binds({"json": 256}, curves, 2, H200_BUDGET)  # 256 * (3 + 2 * 2.57) = 2085
    assert not budget_binds({"json": 64}, curves, 7, H200_BUDGET)  # 64 * (8 + 2 * 4.84) = 1131
    # the cap only lowers a value: plan_widths shows the capped goodput in its rows
    view = CellView(batch_edges=(256,), widths=WIDTHS, step_s=(tuple(t / 1e3 for t in C256_MS),), steps=(C256_STEPS,))
    capped = plan_widths(view, curves, {"json": 105, "prose": 104}, 209, budget=H200_BUDGET)
    free = plan_widths(view, curves, {"json": 105, "prose": 104}, 209)
    assert capped.width == 2 and free.width == 4
    assert all(c.goodput <= f.goodput for c, f in zip(capped.rows, free.rows))
    assert capped.row(4).goodput == pytest.approx(budget_goodput({"json": 105, "prose": 104}, curves, 4, H200_BUDGET))


def test_unmeasured_cells_need_a_large_modelled_gain() -> None:
    row = [5.0e-3, 5.6e-3, 6.2e-3, 7.2e-3, 9.5e-3]
    curves = {"c": geometric_lengths(0.3, 7)}  # E(1)=1.3: +16 % at K=1, below the unmeasured margin
    assert choose_width({"c": 1}, curves, WIDTHS, row, (0, 0, 0, 0, 0)).width == 0
    assert choose_width({"c": 1}, curves, WIDTHS, row, (1e4,) * 5).width == 1
    assert margin(0, 0) > 0.3 > margin(100, 100) > margin(1e4, 1e4) >= 0.02


def test_degenerate_inputs_choose_plain() -> None:
    assert choose_width({}, {}, WIDTHS, [1.0] * 5, [1.0] * 5).width == 0
    assert choose_width({"a": 3}, {}, WIDTHS, [0.0] * 5, [1.0] * 5).width == 0
    inf = float("inf")
    assert choose_width({"a": 3}, {"a": HIGH}, WIDTHS, [1e-3, inf, inf, inf, inf], [9e3] * 5).width == 0


def test_category_without_curve_uses_the_default_curve() -> None:
    row = [5.0e-3, 5.6e-3, 6.2e-3, 7.2e-3, 9.5e-3]
    assert choose_width({"new": 1}, {}, WIDTHS, row, (1e3,) * 5, default_curve=HIGH).width == 4
    assert choose_width({"new": 1}, {}, WIDTHS, row, (1e3,) * 5).width == 0


# --- plan_widths: the goodput table behind the rule (what the policy and replay show) ------------------------
PLAN_VIEW = CellView(batch_edges=(1, 4, 16), widths=(0, 1, 2),
                     step_s=((0.005, 0.006, 0.007), (0.010, 0.012, 0.016), (0.020, 0.030, 0.045)),
                     steps=((1e3,) * 3, (1e3,) * 3, (1e3,) * 3))
A, B = (1.0, 1.8, 2.4), (1.0, 1.2, 1.3)


@pytest.mark.parametrize(
    ("mix", "curves", "batch", "want_width", "want_goodput"),
    [
        # bucket 4: K0 4/0.010 = 400; K1 (3*1.8 + 1.2)/0.012 = 550; K2 (3*2.4 + 1.3)/0.016 = 531.25
        ({"a": 3, "b": 1}, {"a": A, "b": B}, 4, 1, (400.0, 550.0, 531.25)),
        # a category without a curve counts E = 1 (the default curve): K1 (3*1.8 + 1)/0.012 = 533.3 over 400
        ({"a": 3, "x": 1}, {"a": A}, 4, 1, (400.0, 6.4 / 0.012, 8.2 / 0.016)),
        # batch 5 is in the bucket up to 16: K0 5/0.020 = 250; K1 (4*1.8 + 1.2)/0.030 = 280; K2 (9.6 + 1.3)/0.045
        ({"a": 4, "b": 1}, {"a": A, "b": B}, 5, 1, (250.0, 280.0, 10.9 / 0.045)),
        # little acceptance: nothing beats plain
        ({"b": 4}, {"b": (1.0, 1.02, 1.03)}, 4, 0, (400.0, 4.08 / 0.012, 4.12 / 0.016)),
        # fractional mean mix (the policy's shares): the same formula, K2 best at batch 1
        ({"a": 0.5, "b": 0.5}, {"a": A, "b": B}, 1, 2, (200.0, 1.5 / 0.006, 1.85 / 0.007)),
    ],
)
def test_plan_widths_is_the_rule_s_choice_and_its_goodput_table(mix, curves, batch, want_width, want_goodput) -> None:
    plan = plan_widths(PLAN_VIEW, curves, mix, batch)
    assert plan.width == want_width
    assert [r.width for r in plan.rows] == [0, 1, 2]
    assert [r.goodput for r in plan.rows] == pytest.approx(want_goodput, rel=1e-12)
    step_s, steps = PLAN_VIEW.row(batch)
    assert [r.step_s for r in plan.rows] == list(step_s) and [r.steps for r in plan.rows] == list(steps)
    assert plan.width == choose_width(mix, curves, PLAN_VIEW.widths, step_s, steps).width
    assert plan.chosen.goodput == max(r.goodput for r in plan.rows) or plan.width == 0


def test_plan_widths_keeps_the_margin_on_an_unmeasured_width() -> None:
    """K2 models 8.5/0.0145 = 586 > K1's 550, but unmeasured it must beat plain by 32 %: it does (586 > 528)."""
    view = CellView(batch_edges=(4,), widths=(0, 1, 2), step_s=((0.010, 0.012, 0.0145),), steps=((1e3, 1e3, 0.0),))
    assert plan_widths(view, {"a": A, "b": B}, {"a": 3, "b": 1}, 4).width == 2
    dear = CellView(batch_edges=(4,), widths=(0, 1, 2), step_s=((0.010, 0.0125, 0.0145),), steps=((1e3, 0.0, 0.0),))
    plan = plan_widths(dear, {"b": B}, {"b": 4}, 4)  # K1 4.8/0.0125 = 384 below plain's 400
    assert plan.width == 0 and plan.chosen is plan.plain
