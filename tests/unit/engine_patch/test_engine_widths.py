"""The width rule of graph-shaped engines: the chooser's choice, exploration, the budget meter, the measured check."""

from __future__ import annotations

import functools
import itertools
from typing import ClassVar

import numpy as np
import pytest
from engine_rig import CP, EXPLORE_ROW, GRAPH, HIGH, LOW, Rig, cells, install, widths_seen

from specctl_vllm.engine_patch import widths as widths_module
from specctl_vllm.engine_patch.telemetry import new_entry
from specctl_vllm.engine_patch.widths import MIN_FULL_STEPS, BudgetMeter, WidthChooser, verified_width
from specctl_vllm.kernel import protocol
from specctl_vllm.kernel.model import measured as measured_module
from specctl_vllm.kernel.model.widths import PRIOR_PASS_S, geometric_lengths


def test_high_acceptance_cheap_cells_speculate_and_dear_cells_do_not() -> None:
    cheap = Rig(GRAPH, correct={"json": 7})
    install(cheap, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    cheap.add("a", "json")
    widths_seen(cheap, 20)  # the fast curve is re-blended every few steps
    assert cheap.sim.last_output.num_spec_tokens_to_schedule == 7  # E(7)=4.85 in 1.9x the time of plain

    dear = Rig(GRAPH, correct={"json": 7})
    install(dear, cells([23.0, 45.0, 60.0, 95.0, 160.0]), json=CP(k=4, expected=HIGH))
    dear.add("a", "json")
    widths_seen(dear, 6)
    assert dear.sim.last_output.num_spec_tokens_to_schedule == 0


def test_all_categories_pinned_by_overrides_fix_the_width() -> None:
    rig = Rig(GRAPH, correct={"json": 7})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=3, expected=HIGH, source="override"))
    rig.add("a", "json")
    widths_seen(rig, 4)
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 2  # k=3 rounded down to the width set


def _rule_width(**categories: CP) -> int:
    """The width the engine's rule picks for a step of 6 json and 2 prose requests under these rules."""
    rig = Rig(GRAPH)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), **categories)
    chooser = WidthChooser(GRAPH.graph_widths, GRAPH.k_max, explore_every=0)
    return chooser.choose({"json": 6, "prose": 2}, rig.holder.current(rig.clock()), 8)


CAPPED = {"json": CP(k=7, expected=HIGH), "prose": CP(k=7, expected=LOW)}  # what the controller sends: k_max


@pytest.mark.parametrize(("rules", "width"), [
    # the engine owns the width: a k the policy sends is no width, whatever it says
    (CAPPED, None),
    ({"json": CP(k=0, expected=HIGH), "prose": CP(k=2, expected=LOW)}, None),
    ({"json": CP(k=4, expected=HIGH), "prose": CP(k=0, expected=LOW)}, None),
    # an operator's k pins the width where it covers every category of the step (the largest, in the width set)
    ({"json": CP(k=7, expected=HIGH, source="override"), "prose": CP(k=1, expected=LOW, source="override")}, 7),
    ({"json": CP(k=3, expected=HIGH, source="override"), "prose": CP(k=0, expected=LOW, source="override")}, 2),
    ({"json": CP(k=0, expected=HIGH, source="override"), "prose": CP(k=0, expected=LOW, source="override")}, 0),
    # one category's override caps what it is credited: the rule still picks, here plain
    ({"json": CP(k=0, expected=HIGH, source="override"), "prose": CP(k=7, expected=LOW)}, 0),
])
def test_the_engine_s_rule_owns_the_width_and_only_an_operator_pins_it(rules, width) -> None:
    free = _rule_width(**CAPPED)
    assert free == 4  # cheap cells and mostly json: the rule drafts (a width none of the pins below runs)
    assert _rule_width(**rules) == (free if width is None else width)


@pytest.mark.parametrize(("curve", "model_width", "period"), [
    # the model rates K = 4 2.57x plain: an explored step gives up most of a step, so it comes once in 837
    (HIGH, 4, 837),
    # the model keeps plain (no gain to give up): exploration keeps its 1 step in 50
    (LOW, 0, 50),
])
def test_exploration_is_bounded_and_visits_the_least_measured_cell(curve, model_width, period) -> None:
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=50, explore_below=100.0)
    rig = Rig(GRAPH)
    install(rig, EXPLORE_ROW, json=CP(k=4, expected=curve))
    table = rig.holder.current(rig.clock())
    chosen = [chooser.choose({"json": 1}, table, 1) for _ in range(2000)]
    assert chooser._explore_period() == period
    assert chosen.count(2) == chooser.explored == 2000 // period  # on the unmeasured width, once a period
    assert set(chosen) == {model_width, 2}  # on HIGH E(4)/T(4) edges out E(7)/T(7) on this row
    gain = chooser._model_gain
    # the share of goodput exploration gives up: under PROBE_GAIN_UNIT / explore_every at any gain
    assert chooser.explored / len(chosen) * gain / (1 + gain) <= widths_module.PROBE_GAIN_UNIT / 50


def test_steps_that_cannot_be_measured_neither_explore_nor_count(monkeypatch) -> None:
    """A step carrying a prompt does not enter the cell table: exploring there costs a step and measures
    nothing, so only measurable steps count toward the 1-in-50 and explore (the period held at 50 whatever the
    model's gain)."""
    monkeypatch.setattr(widths_module, "PROBE_GAIN_UNIT", float("inf"))
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=50, explore_below=100.0)
    rig = Rig(GRAPH)
    install(rig, EXPLORE_ROW, json=CP(k=4, expected=HIGH))
    table = rig.holder.current(rig.clock())
    assert {chooser.choose({"json": 1}, table, 1, measurable=False) for _ in range(500)} == {4}
    assert chooser.explored == 0
    chosen = [chooser.choose({"json": 1}, table, 1) for _ in range(50)]
    assert chosen.count(2) == 1 == chooser.explored  # the 50th measurable step, not the 550th step


def test_budget_meter_measures_full_steps_and_prompt_tokens_per_committed_token() -> None:
    meter = BudgetMeter(2048)
    assert meter.current() is None and meter.prompt_ratio is None
    for _ in range(int(MIN_FULL_STEPS) + 10):
        meter.observe(2048, 1040, 520, 0.0567)  # a full step: 2 prompt tokens per committed token
        meter.observe(2048, 0, 0, None)  # full, but no interval (the engine was idle before it): not timed
    budget = meter.current()
    assert budget is not None and budget.tokens == 2048
    assert budget.capacity == pytest.approx(2048 / 0.0567)
    assert budget.rho == pytest.approx(1040 / 520, rel=0.01) and meter.prompt_ratio == budget.rho
    assert budget.fixed_s == 0.0  # only full steps: nothing to fit a line to
    few = BudgetMeter(2048)
    for _ in range(5):
        few.observe(2048, 1000, 500, 0.05)
    assert few.current() is None  # a handful of full steps is not evidence


def on_line(tokens: int, fixed_s: float = 0.010, full_s: float = 0.0567) -> float:
    return fixed_s + (full_s - fixed_s) * tokens / 2048


def test_budget_meter_fits_the_fixed_part_of_a_step_through_the_full_step() -> None:
    meter = BudgetMeter(2048)
    for _ in range(60):
        meter.observe(2048, 1040, 520, 0.0567)
        meter.observe(1024, 500, 300, on_line(1024))
        meter.observe(600, 300, 200, on_line(600))
    budget = meter.current()
    assert budget is not None
    assert budget.fixed_s == pytest.approx(0.010, rel=0.02)
    assert budget.per_token_for(0) == pytest.approx((0.0567 - 0.010) / 2048, rel=0.02)
    assert budget.pass_s == pytest.approx(PRIOR_PASS_S)  # every step at K = 0: nothing said about the passes
    assert budget.steps == pytest.approx(sum(0.995**i for i in range(180)), rel=0.01)  # decayed, every timed step


def test_budget_meter_fits_each_width_s_fixed_cost_from_steps_of_two_widths() -> None:
    meter = BudgetMeter(2048)
    for _ in range(60):  # a_K = 10 + 6 K ms: K = 2 steps cost 22 ms more than their tokens, K = 0 ones 10
        meter.observe(2048, 1040, 520, 0.0567, 2)
        meter.observe(1024, 500, 300, on_line(1024, fixed_s=0.022), 2)
        meter.observe(600, 300, 200, on_line(600), 0)  # the switch: not fitted
        meter.observe(600, 300, 200, on_line(600), 0)
    budget = meter.current()
    assert budget is not None
    assert budget.fixed_for(0) == pytest.approx(0.010, rel=0.03)
    assert budget.fixed_for(2) == pytest.approx(0.022, rel=0.03)
    assert verified_width(492, 256) == 2 and verified_width(0, 256) == 0 and verified_width(5, 0) == 0


def test_budget_meter_skips_the_first_step_at_a_new_width() -> None:
    """Session 9 on the H200 at 256 requests: a K = 0 step after a drafting step took 40 ms, after a K = 0 step
    23 ms (async scheduling: the switch holds the previous step's tail). A K = 0 step priced from switches
    only is priced as a drafting step."""
    meter = BudgetMeter(2048)
    for _ in range(80):  # a_0 = 6 ms on K = 0's runs; every switch into K = 0 costs what a K = 2 step costs
        meter.observe(2048, 1040, 520, 0.0567, 2)
        meter.observe(1500, 700, 400, on_line(1500, fixed_s=0.020), 2)
        meter.observe(760, 500, 250, on_line(760, fixed_s=0.020), 0)
        meter.observe(760, 500, 250, on_line(760, fixed_s=0.006), 0)
    budget = meter.current()
    assert budget is not None
    assert budget.fixed_for(0) == pytest.approx(0.006, rel=0.05)
    assert budget.fixed_for(2) == pytest.approx(0.020, rel=0.05)
    # one timed step of each width a cycle of four: the two switches are not counted
    assert meter.width_steps(0) == pytest.approx(meter.width_steps(2), rel=0.05)
    assert meter.timed_steps == pytest.approx(sum(0.995 ** i for i in range(0, 320, 2)), rel=0.02)


def test_budget_meter_counts_steps_per_width_in_a_bounded_table() -> None:
    """Telemetry is the engine's word: widths past any engine's set (a step's draft tokens over its requests)
    share one key, so a stream of distinct widths cannot grow the meter's per-step work."""
    meter = BudgetMeter(2048)
    for width in range(10_000):
        meter.observe(1024, 0, 10, 0.02, width)
        meter.observe(1024, 0, 10, 0.02, width)  # the second step at a width is the one timed
    assert len(meter._widths) == protocol.MAX_K + 1
    assert meter.width_steps(3) == pytest.approx(0.995 ** (2 * (10_000 - 4) - 1))
    assert meter.width_steps(protocol.MAX_K) > 100


def test_the_chooser_prices_widths_with_the_measured_step_cost_where_the_budget_binds() -> None:
    rig = Rig(GRAPH)
    row = protocol.StepCells(batch_edges=[512], widths=[0, 1, 2, 4, 7],
                             step_s=[[21.5e-3, 28.3e-3, 34.9e-3, 44.8e-3, 62.9e-3]], steps=[[142.0, 2.0, 2.0, 3.0, 1.0]])
    install(rig, row, json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=list(geometric_lengths(0.45, 7))))
    table = rig.holder.current(rig.clock())
    mix = {"json": 105, "prose": 104}
    free = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0)
    measured = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0, token_budget=2048)
    for _ in range(40):  # session 5 at 256 requests: full steps of 56.7 ms, a fixed 10 ms of every step
        measured.budget.observe(2048, 1040, 520, 0.0567)
        measured.budget.observe(1400, 700, 350, on_line(1400))
    assert free.choose(mix, table, 209) == 4  # the cells alone: K4 1 % above K2
    assert measured.choose(mix, table, 209) == 2  # as the static engines measured
    assert measured.choose({"json": 16}, table, 16) == free.choose({"json": 16}, table, 16)  # no width fills it


#: The H200 at 256 requests, session 8's undecayed fit of its own steps: full steps of 53.8 ms, a_K = 8.8 +
#: 9.45 K ms, 2 prompt tokens per committed token.
H200_FULL_S, H200_A0, H200_P, H200_RHO = 2048 / 38081, 8.8e-3, 9.45e-3, 2.0


PROSE_045 = list(geometric_lengths(0.45, 7))


class SteadyEngine:
    """That engine under steady load at 256 requests: each committed token brings ``rho`` prompt tokens into a
    queue (a finished request is replaced by one with a new prompt), and each step takes from the queue what its
    budget leaves after the verifying tokens; its time is its width's line, with 8 % noise."""

    def __init__(self, curve: list[float], rng: np.random.Generator, batch: int = 256,
                 fixed=lambda k: H200_A0 + H200_P * k, switch_tail: bool = False) -> None:
        self.curve, self.rng, self.batch = curve, rng, batch
        self.queued = 0.0
        self.fixed = fixed  # a_K, seconds
        self.switch_tail = switch_tail  # the first step at a new width costs the previous width's a_K
        self.last_k: int | None = None

    def step(self, k: int) -> tuple[int, int, int, float]:
        """(scheduled, prompt, committed, seconds) of one step at width ``k``."""
        committed = self.batch * self.curve[k]
        verify = self.batch * (1 + k)
        self.queued += float(self.rng.exponential(H200_RHO * committed))
        prompt = int(min(self.queued, max(2048 - verify, 0)))
        self.queued = min(self.queued - prompt, 4 * 2048.0)  # beyond that, requests wait outside the batch
        scheduled = verify + prompt
        paid = self.last_k if self.switch_tail and self.last_k is not None and self.last_k != k else k
        self.last_k = k
        a_k = min(max(self.fixed(k), self.fixed(paid)), H200_FULL_S)
        seconds = (a_k + (H200_FULL_S - a_k) * scheduled / 2048) * (1 + self.rng.normal(0, 0.08))
        return scheduled, prompt, round(committed), seconds


def run_steady(chooser: WidthChooser, table, steps: int, engine: SteadyEngine) -> list[int]:
    chosen = []
    for _ in range(steps):
        k = chooser.choose({"prose": 256}, table, 256, measurable=False)  # every step carries prompts
        chooser.budget.observe(*engine.step(k), k)
        chosen.append(k)
    return chosen


def test_the_budget_is_fitted_only_at_batches_where_a_width_could_fill_it(monkeypatch) -> None:
    """At a batch where even the widest width cannot fill the token budget the steady-step model prices
    nothing, so the rule fits no reading there, even with the full steps of a busier period in the meter; the
    first batch that could fill it gets a fresh fit, not one left from before, and reads it every
    BUDGET_REFRESH_STEPS steps after."""
    from specctl_vllm.engine_patch import widths as widths_module

    rig = Rig(GRAPH)
    install(rig, cells([10.0, 15.0, 17.0, 27.0, 29.0]), prose=CP(k=2, expected=HIGH))
    table = rig.holder.current(rig.clock())
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, token_budget=2048)
    engine = SteadyEngine(HIGH, np.random.default_rng(3))
    for _ in range(400):
        chooser.budget.observe(*engine.step(2), 2)
    fits = []
    current = chooser.budget.current
    monkeypatch.setattr(chooser.budget, "current", lambda: fits.append(1) or current())
    rho = chooser.budget.prompt_ratio
    small = int(2048 / (8 * (1 + rho))) - 1  # batch * (1 + 7) * (1 + rho) < 2048: no width fills it
    assert not widths_module.could_fill(small, 7, 2048, rho) and widths_module.could_fill(256, 7, 2048, rho)
    for _ in range(3 * widths_module.BUDGET_REFRESH_STEPS):
        chooser.choose({"prose": small}, table, small, measurable=False)
    assert fits == []
    chooser.choose({"prose": 256}, table, 256, measurable=False)
    assert len(fits) == 1  # at once, at the first batch that could fill it
    for _ in range(2 * widths_module.BUDGET_REFRESH_STEPS):
        chooser.choose({"prose": 256}, table, 256, measurable=False)
    assert len(fits) == 3


@pytest.mark.parametrize(("curve", "ran", "prior_pick", "explore_every", "settles_on"), [
    (PROSE_045, 1, 1, 0, 1), (PROSE_045, 1, 1, 50, 0),  # low: K = 0 commits the most (the undecayed fit's pick)
    (HIGH, 2, 2, 50, 2),  # high: exploring costs its share and keeps K = 2, the best static engine there
])
def test_steady_steps_explore_so_the_meter_learns_every_width_s_fixed_cost(
        curve: list[float], ran: int, prior_pick: int, explore_every: int, settles_on: int) -> None:
    """Session 8 at 256 requests on low: the meter had timed only K = 1 steps, fitted the other widths' fixed
    cost from its prior (3 ms a drafted position, the engine's is 9.45) and kept K = 1 (0.87x plain); on that
    engine K = 0 commits the most. Without exploration in the steady regime it stays there; with it, the fit
    finds the passes' cost and the rule moves to K = 0 by itself, exploring at most 1 step in 50 (and on
    high keeps K = 2)."""
    rig = Rig(GRAPH)
    install(rig, cells([10.0, 15.0, 17.0, 27.0, 29.0]), prose=CP(k=ran, expected=curve))
    table = rig.holder.current(rig.clock())
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=explore_every, token_budget=2048)
    engine = SteadyEngine(curve, np.random.default_rng(3))
    for _ in range(400):  # what it measured before: one width at every step
        chooser.budget.observe(*engine.step(ran), ran)
    assert chooser.choose({"prose": 256}, table, 256, measurable=False) == prior_pick  # the prior's verdict
    chosen = run_steady(chooser, table, 3000, engine)
    tail = chosen[-1000:]
    assert max(set(tail), key=tail.count) == settles_on
    assert chooser.explored <= len(chosen) // 50  # runs started: at most STEADY_EXPLORE_RUN steps each
    if explore_every and settles_on == 0:
        budget = chooser.budget.current()
        assert budget is not None and budget.fixed_for(0) == pytest.approx(H200_A0, rel=0.25)
        # off the prior (3 ms a pass), towards the engine's 9.45 ms a pass (the fit may put part of it in the
        # jump at K = 1: two widths' runs are few)
        assert budget.fixed_for(2) - budget.fixed_for(0) == pytest.approx(2 * H200_P, rel=0.35)
        assert budget.fixed_for(2) - budget.fixed_for(0) > 1.5 * 2 * PRIOR_PASS_S
    if explore_every:
        assert set(chosen) == set(GRAPH.graph_widths)  # each width the meter lacked was timed


def session9_fixed(k: int) -> float:
    """Session 9 at 256 requests: a K = 0 step's fixed part about 6 ms, a drafting step's 18 ms and more."""
    return 6e-3 if k == 0 else 18e-3 + 0.5e-3 * k


@pytest.mark.parametrize(("curve", "run", "settles_on"), [
    (PROSE_045, 2, 0), (HIGH, 2, 2),
    # one step per exploration: only switches timed, K = 0 looks like a drafting step and a drafting width stays
    (PROSE_045, 1, 1),
])
def test_steady_exploration_runs_time_a_width_past_the_switch(monkeypatch, curve: list[float], run: int,
                                                              settles_on: int) -> None:
    """An engine whose first step at a new width holds the previous width's tail (async scheduling) and whose
    K = 0 step is much cheaper than any drafting one (the drafter's first pass): the exploration's runs of two
    steps time K = 0 past the switch, so on low the rule moves from K = 2 to K = 0 by itself and keeps K = 2 on
    high; a lone exploration step would only ever time switches."""
    monkeypatch.setattr(widths_module, "STEADY_EXPLORE_RUN", run)
    rig = Rig(GRAPH)
    install(rig, cells([10.0, 15.0, 17.0, 27.0, 29.0]), prose=CP(k=2, expected=curve))
    table = rig.holder.current(rig.clock())
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=50, token_budget=2048)
    engine = SteadyEngine(curve, np.random.default_rng(5), fixed=session9_fixed, switch_tail=True)
    for _ in range(400):
        chooser.budget.observe(*engine.step(2), 2)
    chosen = run_steady(chooser, table, 3000, engine)
    tail = chosen[-1000:]
    assert max(set(tail), key=tail.count) == settles_on
    assert tail.count(settles_on) >= 0.9 * len(tail)
    assert sum(1 for a, b in itertools.pairwise(chosen) if a != b) <= 2 * run * len(chosen) // 50 + 2
    if settles_on == 0:
        budget = chooser.budget.current()
        assert budget is not None and budget.fixed_for(0) == pytest.approx(6e-3, abs=2e-3)


def test_fast_acceptance_moves_the_curve_within_its_weight_cap() -> None:
    chooser = WidthChooser((0, 1, 2, 4, 7), 7)
    rig = Rig(GRAPH)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    table = rig.holder.current(rig.clock())
    assert chooser.curve("json", table) == tuple(HIGH)
    for _ in range(200):  # this engine sees every draft rejected
        tally = new_entry()
        tally.requests, tally.hists = 1, {7: [1, 0, 0, 0, 0, 0, 0, 0]}
        chooser.observe({("json", "eagle3"): tally})
    blended = chooser.curve("json", table)
    assert blended[7] < HIGH[7] and blended[7] >= 0.5 * HIGH[7] + 0.5 * 1.0 - 1e-9


@pytest.mark.parametrize(
    ("mixes", "computed"),
    [
        # a steady mix: computed on the first step, then at least every RULE_REUSE_STEPS steps (a due re-blend
        # of the fast curves waits for that computation: it never adds one)
        ([{"json": 100, "prose": 100}] * (2 * widths_module.RULE_REUSE_STEPS + 1),
         [0, widths_module.RULE_REUSE_STEPS, 2 * widths_module.RULE_REUSE_STEPS]),
        # a share that moves by 5 points or more is computed again at once; smaller moves are not
        ([{"json": 100, "prose": 100}, {"json": 102, "prose": 98}, {"json": 112, "prose": 88}], [0, 2]),
        # a category that joins the batch is computed at once
        ([{"json": 100, "prose": 100}, {"json": 100, "prose": 100, "code": 1}], [0, 1]),
    ],
)
def test_the_width_rule_is_reused_only_while_its_inputs_hold(monkeypatch, mixes, computed) -> None:
    from specctl_vllm.engine_patch import widths as chooser_module

    calls: list[int] = []
    real = chooser_module.choose_width

    def counting(*args, **kwargs):
        calls.append(step)
        return real(*args, **kwargs)

    monkeypatch.setattr(chooser_module, "choose_width", counting)
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0)
    rig = Rig(GRAPH)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    table = rig.holder.current(rig.clock())
    for step, mix in enumerate(mixes):
        chooser.choose(mix, table, sum(mix.values()))
    assert calls == computed


def test_a_due_re_blend_of_the_curves_rides_on_a_computation_of_the_rule(monkeypatch) -> None:
    """Curves due for a re-blend between two computations wait for the next one: the re-blend (a curve per
    category) adds no computation of its own, and happens on the computation once the curves are due."""
    from specctl_vllm.engine_patch import widths as chooser_module

    computed: list[int] = []
    blended: list[int] = []
    real_rule, real_curve = chooser_module.choose_width, WidthChooser.curve

    def rule(*args, **kwargs):
        computed.append(step)
        return real_rule(*args, **kwargs)

    def curve(self, *args, **kwargs):
        blended.append(step)
        return real_curve(self, *args, **kwargs)

    monkeypatch.setattr(chooser_module, "choose_width", rule)
    monkeypatch.setattr(chooser_module, "CURVE_REFRESH_STEPS", 3)
    monkeypatch.setattr(WidthChooser, "curve", curve)
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0)
    rig = Rig(GRAPH)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    table = rig.holder.current(rig.clock())
    reuse = chooser_module.RULE_REUSE_STEPS
    for step in range(2 * reuse + 1):
        chooser.choose({"json": 100, "prose": 100}, table, 200)
    assert computed == [0, reuse, 2 * reuse]
    assert sorted(set(blended)) == [0, reuse, 2 * reuse] and len(blended) == 2 * 3  # two categories each time


def test_a_new_table_recomputes_the_width_at_once() -> None:
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0)
    rig = Rig(GRAPH)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    assert chooser.choose({"json": 200}, rig.holder.current(rig.clock()), 200) > 0
    dear = protocol.Policy(version=2, issued_at=0.0, ttl_s=60.0, default=CP(k=4),
                           categories={"json": CP(k=4, expected=HIGH)},
                           step_cells=cells([23.0, 45.0, 60.0, 95.0, 160.0]))  # every width dear
    rig.holder.install(dear, rig.clock())
    assert chooser.choose({"json": 200}, rig.holder.current(rig.clock()), 200) == 0


class PromptEngine:
    """An engine at 64 requests whose decode-only cells say a drafting width is cheap, while the prompt steps
    around it, which the cells leave out, cost a drafting width far more (the H200 at 64 requests, session 11:
    K = 1 7.8 ms against K = 0 6.0 ms before decode steps, 16.3 ms against 9.7 over all steps). A step carries a
    prompt with the chance that the previous step's commits finished a request (128 tokens each); the first step
    at a new width pays the previous width's cost (async scheduling); 10 % noise on every step."""

    DECODE_S: ClassVar[dict[int, float]] = {0: 6.0e-3, 1: 7.8e-3, 2: 9.0e-3, 4: 11.0e-3, 7: 15.0e-3}
    PROMPT_S: ClassVar[dict[int, float]] = {0: 7.0e-3, 1: 14.0e-3, 2: 16.0e-3, 4: 16.0e-3, 7: 16.0e-3}

    def __init__(self, curve: list[float], rng: np.random.Generator, batch: int = 64) -> None:
        self.curve, self.rng, self.batch = curve, rng, batch
        self.last_k = 0
        self.last_commit = float(batch)

    def step(self, k: int) -> tuple[int, float]:
        """(committed, seconds) of one step at width ``k``."""
        prompt = self.rng.random() < min(self.last_commit / 128, 1.0)
        paid = self.last_k if self.last_k != k else k
        seconds = (self.DECODE_S[paid] + (self.PROMPT_S[paid] if prompt else 0.0)) * (1 + self.rng.normal(0, 0.1))
        committed = int(self.batch * self.curve[k] * (1 + self.rng.normal(0, 0.05)))
        self.last_k, self.last_commit = k, committed
        return committed, seconds

    def steady_goodput(self, k: int) -> float:
        committed = self.batch * self.curve[k]
        return committed / (self.DECODE_S[k] + self.PROMPT_S[k] * min(committed / 128, 1.0))


def drafted(mix: dict[str, int], k: int, beta: dict[str, float], rng: np.random.Generator) -> dict:
    """A step's per-category histograms as the hook aggregates them: each request drafted ``k`` and accepted a
    geometric prefix of them at its category's acceptance."""
    agg = {}
    for category, n in mix.items():
        if k <= 0 or n <= 0:
            continue
        entry = agg[(category, "eagle3")] = new_entry()
        entry.requests = n
        accepted = np.minimum(rng.geometric(1.0 - beta[category], n) - 1, k)
        entry.hists[k] = np.bincount(accepted, minlength=k + 1).tolist()
    return agg


def run_prompted(chooser: WidthChooser, table, steps: int, engine: PromptEngine, category: str,
                 beta: float | None = None) -> tuple[list[int], float]:
    """``steps`` steps of ``engine`` under ``chooser``, fed as the hook feeds it: the drafts' histograms and
    the measured check's step (with what the width rule expected of it); the chosen widths and the goodput of
    the second half."""
    chosen, committed, seconds = [], 0, 0.0
    rng = np.random.default_rng(0)
    beta = beta if beta is not None else engine.curve[1] - 1.0
    for i in range(steps):
        k = chooser.choose({category: 64}, table, 64)
        c, s = engine.step(k)
        chooser.observe(drafted({category: 64}, k, {category: beta}, rng))
        chooser.measured.observe(64, k, c, s, chooser.measured_mix())
        chosen.append(k)
        if i >= steps // 2:
            committed, seconds = committed + c, seconds + s
    return chosen, committed / seconds


@pytest.mark.parametrize(("beta", "model_pick", "best"), [(0.45, 1, 0), (0.85, 4, 4)])
def test_the_measured_check_runs_a_drafting_width_only_while_it_beats_plain_over_every_step(
        beta: float, model_pick: int, best: int) -> None:
    """Low acceptance: the cells pick K = 1, and only the measured check, over the prompt steps too, moves the
    engine to plain decoding (within 3 % of it over the second half); high acceptance: K = 4 beats plain by
    measurement and keeps running, the probes of K = 0 costing at most 3 %."""
    curve = list(geometric_lengths(beta, 7))
    rig = Rig(GRAPH)
    install(rig, cells([PromptEngine.DECODE_S[k] * 1e3 for k in (0, 1, 2, 4, 7)]), prose=CP(k=4, expected=curve))
    table = rig.holder.current(rig.clock())
    unchecked = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0, probe_run=0)
    assert unchecked.choose({"prose": 64}, table, 64) == model_pick
    engine = PromptEngine(curve, np.random.default_rng(11))
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0)
    chosen, goodput = run_prompted(chooser, table, 8000, engine, "prose")
    tail = chosen[-2000:]
    assert max(set(tail), key=tail.count) == best
    assert goodput >= 0.97 * engine.steady_goodput(best)
    assert chooser.probes >= 1
    assert chooser.verdict is not None and chooser.verdict.state == ("confirmed" if best else "refuted")
    unchecked_engine = PromptEngine(curve, np.random.default_rng(11))
    _, unchecked_goodput = run_prompted(unchecked, table, 8000, unchecked_engine, "prose")
    if best == 0:
        assert unchecked_goodput < 0.85 * engine.steady_goodput(0)  # what the cells alone cost


def test_the_model_s_exploration_pauses_where_measurement_holds_its_width_off() -> None:
    """Low acceptance with the cells' exploration on (every 50th step at the least-measured width): once the
    check refutes the model's K = 1 the bucket's steps at drafting widths are only the check's own probes."""
    curve = list(geometric_lengths(0.45, 7))
    rig = Rig(GRAPH)
    step_s = [PromptEngine.DECODE_S[k] for k in (0, 1, 2, 4, 7)]
    few = protocol.StepCells(batch_edges=[4, 512], widths=[0, 1, 2, 4, 7], step_s=[step_s] * 2,
                             steps=[[1e4, 1e4, 1e4, 10.0, 1e4]] * 2)  # K = 4 is the least measured
    install(rig, few, prose=CP(k=4, expected=curve))
    table = rig.holder.current(rig.clock())
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=50)
    chosen, _ = run_prompted(chooser, table, 8000, PromptEngine(curve, np.random.default_rng(4)), "prose")
    assert chooser.explored >= 1  # it explored before the check had spoken
    tail = chosen[-3000:]
    drafting = [k for k in tail if k]
    assert len(drafting) <= 0.06 * len(tail)
    assert set(drafting) <= {1}  # probes of the model's width, no exploration of the others


@pytest.mark.parametrize(("beta", "first_probe_between"), [(0.45, (150, 300)), (0.85, (1000, 1200))])
def test_a_probe_of_plain_waits_longer_the_more_the_model_expects_from_drafting(beta, first_probe_between) -> None:
    """The cells rate K = 1 11 % above plain at beta 0.45 (gap x 2.1) and K = 4 100 % above it at beta 0.85
    (gap x 11): the first probe of K = 0 comes after that many gaps of the bucket's steps."""
    curve = list(geometric_lengths(beta, 7))
    rig = Rig(GRAPH)
    install(rig, cells([PromptEngine.DECODE_S[k] * 1e3 for k in (0, 1, 2, 4, 7)]), prose=CP(k=4, expected=curve))
    table = rig.holder.current(rig.clock())
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0)
    chosen, _ = run_prompted(chooser, table, 2000, PromptEngine(curve, np.random.default_rng(2)), "prose")
    low, high = first_probe_between
    assert low <= chosen.index(0) <= high


def test_a_new_belief_about_a_category_does_not_move_what_was_measured() -> None:
    """The measurement met the category's real acceptance: when the controller's curve for it moves (a cold
    start learning), the reading stays; only a change of mix moves it."""
    rig = Rig(GRAPH)
    install(rig, cells(K4_CHEAP), json=CP(k=4, expected=list(geometric_lengths(0.5, 7))),
            prose=CP(k=4, expected=list(geometric_lengths(0.45, 7))))
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0)
    table = rig.holder.current(rig.clock())
    assert chooser.choose({"json": 64}, table, 64) == 4
    for _ in range(20):
        chooser.measured.observe(64, 4, 200, 0.02, chooser.measured_mix())
    read = chooser.measured.reading(64, 4, chooser._transfer(4, table)).goodput
    assert read == pytest.approx(10000.0)
    learned = protocol.Policy(version=2, issued_at=0.0, ttl_s=60.0, default=CP(k=4), step_cells=cells(K4_CHEAP),
                              categories={"json": CP(k=4, expected=list(geometric_lengths(0.85, 7))),
                                          "prose": CP(k=4, expected=list(geometric_lengths(0.45, 7)))})
    rig.holder.install(learned, rig.clock())
    table = rig.holder.current(rig.clock())
    chooser.choose({"json": 64}, table, 64)
    assert chooser.curve("json", table)[4] == pytest.approx(sum(0.85 ** i for i in range(5)))
    assert chooser.measured.reading(64, 4, chooser._transfer(4, table)).goodput == pytest.approx(read)
    chooser.choose({"json": 32, "prose": 32}, table, 64)  # half the batch turns to prose
    e = {b: sum(b ** i for i in range(5)) for b in (0.85, 0.45)}
    assert chooser.measured.reading(64, 4, chooser._transfer(4, table)).goodput == pytest.approx(
        read * (e[0.85] + e[0.45]) / 2 / e[0.85], rel=1e-3)


def run_shift(chooser: WidthChooser, table, before: int, after: int) -> tuple[list[int], float, float]:
    """At least ``before`` steps of prose (beta 0.45: plain decoding wins, the check refutes the model's K = 4),
    up to a probe run that refutes it again on fresh evidence; then ``after`` steps of JSON (beta 0.85: K = 4
    commits 30 % more than plain): the widths after the shift, their goodput and K = 4's steady goodput."""
    prose = PromptEngine(list(geometric_lengths(0.45, 7)), np.random.default_rng(5))
    json_ = PromptEngine(list(geometric_lengths(0.85, 7)), np.random.default_rng(6))
    rng = np.random.default_rng(7)

    def step(engine: PromptEngine, category: str, beta: float) -> tuple[int, int, float]:
        k = chooser.choose({category: 64}, table, 64)
        c, s = engine.step(k)
        chooser.observe(drafted({category: 64}, k, {category: beta}, rng))
        chooser.measured.observe(64, k, c, s, chooser.measured_mix())
        return k, c, s

    i = 0
    while i < before or chooser.measured.reading(64, 4).steps < 50 or chooser.verdict.state != "refuted":
        step(prose, "prose", 0.45)
        i += 1
        assert i < 20 * before
    chosen, committed, seconds = [], 0, 0.0
    for _ in range(after):
        k, c, s = step(json_, "json", 0.85)
        chosen.append(k)
        committed, seconds = committed + c, seconds + s
    return chosen, committed / seconds, json_.steady_goodput(4)


#: decode-only cells that rate K = 4 the best width for prose and for JSON alike (the engine's steps cost what
#: PromptEngine says): the width the check refuted on prose is the one the model picks for JSON
K4_CHEAP = [6.0, 30.0, 30.0, 7.0, 40.0]


@pytest.mark.parametrize("json_known", [True, False])
def test_a_width_refuted_on_one_traffic_is_looked_at_again_when_the_traffic_changes(
        json_known: bool, monkeypatch) -> None:
    """A drafting width refuted on prose holds plain decoding; when the traffic turns to JSON the check reads
    the width's measured cost with JSON's acceptance (its curve known to the controller), or probes it at once
    (JSON new to the engine: nothing drafted it yet), so drafting resumes within a probe gap. With neither,
    as on the H200 in session 14, the refuted evidence has to fade first."""
    rig = Rig(GRAPH)
    install(rig, cells(K4_CHEAP), prose=CP(k=4, expected=list(geometric_lengths(0.45, 7))),
            **({"json": CP(k=4, expected=list(geometric_lengths(0.85, 7)))} if json_known else {}))
    table = rig.holder.current(rig.clock())
    chosen, goodput, k4 = run_shift(WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0), table, 4000, 1500)
    assert sum(1 for k in chosen[:200] if k) >= 180  # drafting again within the first probe
    assert goodput >= 0.97 * k4
    # the same engine reading the cells as measured and ignoring what it has not seen
    monkeypatch.setattr(WidthChooser, "_transfer", lambda self, width, table: None)
    monkeypatch.setattr(widths_module, "probe_due", functools.partial(measured_module.probe_due, unseen=0.0))
    rig = Rig(GRAPH)
    install(rig, cells(K4_CHEAP), prose=CP(k=4, expected=list(geometric_lengths(0.45, 7))),
            **({"json": CP(k=4, expected=list(geometric_lengths(0.85, 7)))} if json_known else {}))
    stale, stale_goodput, _ = run_shift(WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0),
                                    rig.holder.current(rig.clock()), 4000, 1500)
    assert sum(1 for k in stale if k) < 0.7 * len(stale)  # plain decoding until the prose evidence fades
    assert stale_goodput < 0.97 * goodput


def test_the_measured_check_is_taken_with_the_width_and_probes_keep_their_gap(monkeypatch) -> None:
    """The verdict is taken on the steps where the rule computes its width (at least every RULE_REUSE_STEPS
    steps), not on the steps that reuse it; a probe of plain still starts on the very step its gap runs out,
    a step that reuses the width here."""
    from specctl_vllm.engine_patch import widths as chooser_module

    rule: list[int] = []
    verdicts: list[int] = []
    real_rule, real_verdict = chooser_module.choose_width, chooser_module.verdict

    def counted_rule(*args, **kwargs):
        rule.append(step)
        return real_rule(*args, **kwargs)

    def counted_verdict(*args, **kwargs):
        verdicts.append(step)
        return real_verdict(*args, **kwargs)

    monkeypatch.setattr(chooser_module, "choose_width", counted_rule)
    monkeypatch.setattr(chooser_module, "verdict", counted_verdict)
    curve = list(geometric_lengths(0.85, 7))
    rig = Rig(GRAPH)
    install(rig, cells([PromptEngine.DECODE_S[k] * 1e3 for k in (0, 1, 2, 4, 7)]), prose=CP(k=4, expected=curve))
    table = rig.holder.current(rig.clock())
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0, probe_gap=2)
    chooser.measured.observe(64, 4, 200, 0.01)  # the engine times its steps: the check runs
    chosen = []
    for step in range(80):
        chosen.append(chooser.choose({"prose": 64}, table, 64))
    gap = int(2 * (1.0 + chooser._model_gain / widths_module.PROBE_GAIN_UNIT))
    first = gap - 1  # the bucket's steps count from 1
    assert chosen[:first] == [4] * first
    assert chosen[first:first + chooser.probe_run] == [0] * chooser.probe_run
    assert first not in rule  # the probe began on a step that reused the width
    assert verdicts == [s for s in rule if s < first or s >= first + chooser.probe_run]
    assert 0 < len(rule) <= -(-(80 - chooser.probe_run) // widths_module.RULE_REUSE_STEPS) + 1


def test_the_curves_of_a_cells_other_categories_are_resolved_once_per_re_blend(monkeypatch) -> None:
    """A measured cell's mix may hold categories the step's mix lacks (at one request it holds every category
    of the last few hundred steps): the verdict reads their curves to carry the cell to today's mix. They are
    resolved once and kept with the mix's own until the curves are re-blended, not at every verdict."""
    resolved: list[str] = []
    real_curve = WidthChooser.curve

    def curve(self, category, table):
        resolved.append(category)
        return real_curve(self, category, table)

    monkeypatch.setattr(WidthChooser, "curve", curve)
    high = list(geometric_lengths(0.85, 7))
    rig = Rig(GRAPH)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), prose=CP(k=4, expected=high), json=CP(k=4, expected=HIGH),
            code=CP(k=4, expected=LOW))
    table = rig.holder.current(rig.clock())
    chooser = WidthChooser((0, 1, 2, 4, 7), 7, explore_every=0, probe_run=0)
    for batch in (64, 200):  # both buckets: timed steps at width 4 taken on json and code traffic
        for _ in range(40):
            chooser.measured.observe(batch, 4, 4 * batch, 0.01, {"json": 0.5, "code": 0.5})
    verdicts = 0
    for step in range(widths_module.CURVE_REFRESH_STEPS - 1):  # one re-blend period; the bucket moves every step
        chooser.choose({"prose": 64}, table, 64 if step % 2 == 0 else 200)
        verdicts += chooser.verdict is not None
        chooser.verdict = None
    assert verdicts == widths_module.CURVE_REFRESH_STEPS - 1  # a verdict, and a transfer, on every step
    assert sorted(resolved) == ["code", "json", "prose"]
