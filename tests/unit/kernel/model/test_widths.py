"""The width rule: argmax of modelled goodput over the width set, K > 0 only by a measured margin over plain."""

from __future__ import annotations

import pytest

from specctl_vllm.kernel.model.cells import CellView
from specctl_vllm.kernel.model.widths import (
    LineSums,
    TokenBudget,
    budget_binds,
    budget_goodput,
    choose_width,
    could_fill,
    expected_lengths,
    fixed_step_costs,
    geometric_lengths,
    margin,
    nonnegative_solve,
    plan_widths,
    steady_regime,
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
# What the specctl engine's steps at 256 requests measured on the H200 (``python -m bench gpu.budget_model``):
# full 2048-token steps at C tokens/s, the fixed part a of a step's time, 2 prompt tokens per committed token;
# 200 steps behind the fit, the most the engine's decayed meter holds.
# Each session's fit: a_K = a_0 + p K ms, each width's line through the full step.
S5_BUDGET = TokenBudget(tokens=2048, capacity=36185.0, rho=2.0, fixed_s=10.0e-3, pass_s=2.15e-3, steps=200.0)
S6_BUDGET = TokenBudget(tokens=2048, capacity=37448.0, rho=2.0, fixed_s=17.0e-3, pass_s=9.84e-3, steps=200.0)
S7_BUDGET = TokenBudget(tokens=2048, capacity=36786.0, rho=2.0, fixed_s=14.7e-3, pass_s=6.71e-3, steps=200.0)
# Session 7's steps with one fixed cost for every width (the model it ran): a = 22.9 ms from K = 2's steps.
S7_ONE_LINE = TokenBudget(tokens=2048, capacity=36786.0, rho=2.0, fixed_s=22.9e-3, steps=200.0)


@pytest.mark.parametrize(
    ("mix", "budget", "want"),
    [
        # mixed c = 256: the cells (mostly the prior there) rank K4 1 % above K2; the static engines measured
        # K2 10351, K1 9314, K4 9300
        ({"json": 105, "prose": 104}, None, 4),
        ({"json": 105, "prose": 104}, S5_BUDGET, 2),
        ({"json": 125, "prose": 124}, S6_BUDGET, 2),
        ({"json": 125, "prose": 124}, S7_BUDGET, 2),  # session 7 ran K2: 1.07x plain
        # high c = 256: K2 11339, K4 10951, K1 10711. Session 6 ran K1 here: its cap priced K2 by the budget
        # and K1 by its decode-only cell, which leaves out the prompt tokens every step carried
        ({"json": 226}, None, 4),
        ({"json": 226}, S5_BUDGET, 2),
        ({"json": 249}, S6_BUDGET, 2),
        ({"json": 246}, S7_BUDGET, 2),  # session 7 ran K2: 1.11x plain
        # low c = 256: K1 9589, plain 9513-9545, K2 9022 and 8731 (K1 and plain a tie). Each fit puts K1 1-3 %
        # above K0, inside the margin of a fit of 200 decayed steps: plain. With one fixed cost for every width
        # (session 7's model) K0 was priced as a drafting step and K2 ran: 0.91x plain
        ({"prose": 252}, S5_BUDGET, 0),
        ({"prose": 252}, S6_BUDGET, 0),
        ({"prose": 251}, S7_BUDGET, 0),
        ({"prose": 251}, S7_ONE_LINE, 2),
        # no fixed cost: every token costs 1 / C, so verifying drafts only spends the budget
        ({"json": 226}, TokenBudget(tokens=2048, capacity=36185.0, rho=2.0), 0),
    ],
)
def test_the_steady_step_model_prices_the_widths_where_the_budget_binds(mix, budget, want) -> None:
    curves = {"json": HIGH, "prose": LOW}
    got = choose_width(mix, curves, WIDTHS, [t / 1e3 for t in C256_MS], C256_STEPS, budget=budget)
    assert got.width == want


def test_steady_goodput_is_the_budget_split_where_a_width_fills_it() -> None:
    mix, curves = {"json": 100, "prose": 100}, {"json": HIGH, "prose": LOW}
    e4 = (HIGH[4] + LOW[4]) / 2
    for budget in (S5_BUDGET, S6_BUDGET, TokenBudget(tokens=2048, capacity=36185.0, rho=2.0)):
        # K4 fills 2048 tokens (200 * (5 + 2 * 2.75) = 2100): a full step whatever a is
        assert budget_binds(mix, curves, 4, budget)
        assert budget_goodput(mix, curves, 4, budget) == pytest.approx(budget.capacity / (5 / e4 + 2.0))
    # plain does not fill it (200 * 3 = 600 tokens): K = 0's fixed cost a_0 for 200 committed tokens
    b = S6_BUDGET.per_token_for(0)
    assert b == pytest.approx((2048 / 37448.0 - 17.0e-3) / 2048)
    assert budget_goodput(mix, curves, 0, S6_BUDGET) == pytest.approx(200 / (17.0e-3 + b * 600))
    # K = 1 does not fill it either (200 * (2 + 2 * 1.65) = 1060): its own, dearer fixed cost
    e1 = (HIGH[1] + LOW[1]) / 2
    a1 = 17.0e-3 + 9.84e-3
    want = 200 * e1 / (a1 + (2048 / 37448.0 - a1) / 2048 * 200 * (2 + 2 * e1))
    assert budget_goodput(mix, curves, 1, S6_BUDGET) == pytest.approx(want)
    assert budget_goodput({}, curves, 4, S6_BUDGET) == 0.0
    assert budget_binds({"json": 256}, curves, 2, S6_BUDGET)  # 256 * (3 + 2 * 2.57) = 2085
    assert not budget_binds({"json": 64}, curves, 7, S6_BUDGET)  # 64 * (8 + 2 * 4.84) = 1131
    # the goodput table shows what the rule priced: the model's values, not the cells'
    view = CellView(batch_edges=(256,), widths=WIDTHS, step_s=(tuple(t / 1e3 for t in C256_MS),), steps=(C256_STEPS,))
    modelled = plan_widths(view, curves, {"json": 105, "prose": 104}, 209, budget=S5_BUDGET)
    cells = plan_widths(view, curves, {"json": 105, "prose": 104}, 209)
    assert modelled.width == 2 and cells.width == 4
    for k in WIDTHS:
        assert modelled.row(k).goodput == pytest.approx(budget_goodput({"json": 105, "prose": 104}, curves, k, S5_BUDGET))


def line_sums(points) -> LineSums:
    """The sums of fixed_step_costs over (tokens, width, seconds) steps under a 2048-token budget."""
    out = dict.fromkeys(("uu", "ku", "kk", "u", "k", "us", "ks", "duu", "du", "dus"), 0.0)
    for tokens, k, seconds in points:
        u = (2048 - tokens) / 2048
        d = 1.0 if k > 0 else 0.0
        for name, value in (("uu", u * u), ("ku", k * u * u), ("kk", k * k * u * u), ("u", u), ("k", k * u),
                            ("us", u * seconds), ("ks", k * u * seconds), ("duu", d * u * u), ("du", d * u),
                            ("dus", d * u * seconds)):
            out[name] += value
    return LineSums(**out)


def on_width_line(tokens: int, k: int, a0: float = 0.012, p: float = 0.005, full_s: float = 0.056,
                  s: float = 0.0) -> float:
    a = a0 + (s + p * k if k else 0.0)
    return a + (full_s - a) * tokens / 2048


@pytest.mark.parametrize(
    ("points", "want_a0_ms", "want_s_ms", "want_p_ms"),
    [
        # steps on the lines of K = 0, 1, 2 and 4 (a_0 12 ms, 5 ms per drafted position, no jump): the fit
        # recovers each (the priors weigh little against 80 steps)
        ([(t, k, on_width_line(t, k)) for t in (512, 768, 1024, 1280) for k in (0, 1, 2, 4) for _ in range(5)],
         12.0, 0.0, 5.0),
        # the H200 at 256 requests (session 9): a_0 6 ms, a jump of 12 ms once a step drafts, 1 ms a pass
        ([(t, k, on_width_line(t, k, a0=0.006, p=0.001, s=0.012)) for t in (512, 768, 1024, 1280)
          for k in (0, 1, 2, 4) for _ in range(5)], 6.0, 12.0, 1.0),
        # every step at one width (K = 2 at a_2 = 22 ms): p is the prior, no jump, a_0 what is left of a_2
        ([(t, 2, on_width_line(t, 2, a0=0.016, p=0.003)) for t in (768, 1024, 1280)], 16.0, 0.0, 3.0),
        # nothing but full steps: nothing to fit
        ([(2048, 2, 0.056)] * 5, 0.0, 0.0, 0.0),
        # steps cheaper than tokens / C: no fixed part at all (a_0 held at 0), p what the prior leaves
        ([(1024, 0, 0.010), (1024, 0, 0.012)], 0.0, 0.0, 3.0),
    ],
)
def test_each_width_s_fixed_step_cost_is_fitted_through_the_full_step(points, want_a0_ms, want_s_ms,
                                                                      want_p_ms) -> None:
    a0, s, p = fixed_step_costs(0.056, line_sums(points))
    assert a0 * 1e3 == pytest.approx(want_a0_ms, abs=0.3)
    # the prior on p (3 ms) pulls p up and s down a little against 80 steps
    assert s * 1e3 == pytest.approx(want_s_ms, abs=0.5)
    assert p * 1e3 == pytest.approx(want_p_ms, abs=0.3)


def test_the_jump_at_the_first_drafted_position_prices_k_0_below_every_drafting_width() -> None:
    """Session 9 at 256 requests on low: a line a_0 + p K through steps of K = 0 at 6 ms and K = 1, 2 at
    18 ms priced K = 0 as a drafting step; with the jump the rule picks K = 0 there and keeps K = 2 on high."""
    points = [(t, k, on_width_line(t, k, a0=0.006, p=0.0005, s=0.012, full_s=0.0537))
              for t in (760, 1010, 1270) for k in (0, 1, 2) for _ in range(10)]
    a0, s, p = fixed_step_costs(0.0537, line_sums(points))
    budget = TokenBudget(tokens=2048, capacity=2048 / 0.0537, rho=2.04, fixed_s=a0, draft_s=s, pass_s=p,
                         steps=200.0)
    low = {"prose": 251}
    assert choose_width(low, {"prose": geometric_lengths(0.45, 7)}, WIDTHS, [1.0] * 5, [200.0] * 5,
                        budget=budget).width == 0
    assert choose_width(low, {"prose": geometric_lengths(0.85, 7)}, WIDTHS, [1.0] * 5, [200.0] * 5,
                        budget=budget).width == 2


@pytest.mark.parametrize(("matrix", "rhs", "want"), [
    (((2.0, 0.0), (0.0, 1.0)), (2.0, 3.0), (1.0, 3.0)),  # unconstrained solution nonnegative: itself
    (((1.0, 0.9), (0.9, 1.0)), (1.0, -0.5), (1.0, 0.0)),  # the second component held at 0, the first refitted
    (((1.0, 0.0), (0.0, 1.0)), (-1.0, -2.0), (0.0, 0.0)),  # both negative: nothing
    (((0.0, 0.0), (0.0, 0.0)), (1.0, 1.0), (0.0, 0.0)),  # singular everywhere: nothing
])
def test_nonnegative_solve_holds_each_component_to_zero_or_more(matrix, rhs, want) -> None:
    assert nonnegative_solve(matrix, rhs) == pytest.approx(want)


def test_a_step_never_costs_more_than_a_full_one_whatever_its_width() -> None:
    budget = TokenBudget(tokens=2048, capacity=2048 / 0.056, rho=2.0, fixed_s=0.030, pass_s=0.010)
    assert budget.fixed_for(0) == pytest.approx(0.030) and budget.fixed_for(2) == pytest.approx(0.050)
    assert budget.fixed_for(7) == pytest.approx(0.056) and budget.per_token_for(7) == 0.0
    assert budget.per_token_for(2) == pytest.approx(0.006 / 2048)
    assert TokenBudget(tokens=2048, capacity=0.0, rho=2.0).fixed_for(3) == 0.0


def test_the_steady_regime_starts_where_the_widest_width_could_fill_the_budget() -> None:
    assert steady_regime(256, 7, S6_BUDGET)  # 256 * 8 * 3 = 6144 tokens
    assert not steady_regime(64, 7, S6_BUDGET)  # 1536
    assert steady_regime(64, 7, TokenBudget(tokens=1024, capacity=1.0, rho=2.0))
    for batch in (1, 64, 85, 86, 256):  # the pre-fit check is the same formula: 86 * 8 * 3 = 2064 >= 2048
        assert could_fill(batch, 7, 2048, 2.0) == steady_regime(batch, 7, S6_BUDGET) == (batch >= 86)


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


def test_a_width_the_cells_do_not_price_is_not_run_under_the_steady_step_model_either() -> None:
    inf = float("inf")
    row = [t / 1e3 for t in C256_MS]
    row[2] = inf  # K = 2 missing from the controller's width set
    got = choose_width({"json": 226}, {"json": HIGH}, WIDTHS, row, C256_STEPS, budget=S5_BUDGET)
    assert got.width == 4  # the width the model ranks next after K = 2
