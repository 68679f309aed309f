"""Graph-shaped engines: one width per step for every request, chosen by the width rule from the policy."""

from __future__ import annotations

import functools
import itertools
from typing import ClassVar

import numpy as np
import pytest
from engine_rig import Rig

from specctl_vllm.engine_patch import widths as widths_module
from specctl_vllm.engine_patch.policy_table import EngineSpec
from specctl_vllm.engine_patch.telemetry import new_entry, row_to_wire, step_aggregate
from specctl_vllm.engine_patch.widths import MIN_FULL_STEPS, BudgetMeter, WidthChooser, verified_width
from specctl_vllm.kernel import protocol
from specctl_vllm.kernel.model import measured as measured_module
from specctl_vllm.kernel.model.widths import PRIOR_PASS_S, geometric_lengths

CP = protocol.CategoryPolicy
GRAPH = EngineSpec(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=(0, 1, 2, 4, 7))
HIGH = list(geometric_lengths(0.85, 7))
LOW = list(geometric_lengths(0.1, 7))


def cells(step_ms: list[float], steps: float = 1e4) -> protocol.StepCells:
    return protocol.StepCells(batch_edges=[4, 512], widths=[0, 1, 2, 4, 7], step_s=[[t / 1e3 for t in step_ms]] * 2,
                              steps=[[steps] * 5] * 2)


def install(rig: Rig, cell_table: protocol.StepCells | None, **categories: CP) -> None:
    policy = protocol.Policy(version=1, issued_at=0.0, ttl_s=60.0, default=CP(k=4), categories=categories,
                             step_cells=cell_table)
    rig.holder.install(policy, rig.clock())


def widths_seen(rig: Rig, steps: int) -> list[set[int]]:
    out = []
    for _ in range(steps):
        rig.sim.step()
        out.append({len(d) for d in rig.sim.last_output.scheduled_spec_decode_tokens.values()})
    return out


def test_every_request_of_a_step_verifies_one_width() -> None:
    rig = Rig(GRAPH, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(3):
        rig.add(f"j{i}", "json")
        rig.add(f"p{i}", "prose")
    seen = widths_seen(rig, 12)
    assert all(len(s) <= 1 for s in seen)  # uniform: never two widths in one step
    assert rig.sim.last_output.num_spec_tokens_to_schedule in GRAPH.graph_widths


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


def test_drafts_of_a_category_whose_policy_is_off_count_under_the_engine_drafter() -> None:
    """A category decided off (k=0, method 'off') still verifies the step's width beside a category that
    speculates; its drafts came from the engine's drafter and are reported under it. Under 'off' the controller
    refuses the whole batch (seen on the H200: every batch of the mixed profile at c >= 64)."""
    rig = Rig(GRAPH, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH),
            prose=CP(k=0, method=protocol.METHOD_OFF, expected=LOW))
    for i in range(3):
        rig.add(f"j{i}", "json")
        rig.add(f"p{i}", "prose")
    widths_seen(rig, 12)
    rows = [protocol.StepRecord.model_validate(row_to_wire(r)) for r in rig.queue.drain(100)]
    prose = [c for r in rows if r.width for c in r.categories if c.category == "prose"]
    assert prose and any(c.hists for c in prose)
    assert all(c.method == "eagle3" for c in prose if c.hists)
    assert not any(c.hists for r in rows for c in r.categories if c.method == protocol.METHOD_OFF)


def test_all_categories_pinned_by_overrides_fix_the_width() -> None:
    rig = Rig(GRAPH, correct={"json": 7})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=3, expected=HIGH, source="override"))
    rig.add("a", "json")
    widths_seen(rig, 4)
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 2  # k=3 rounded down to the width set


def test_static_config_keeps_the_engine_width_and_steps_report_it() -> None:
    rig = Rig(GRAPH, correct={"json": 7})
    rig.add("a", "json")
    rig.add("b", "json")
    widths_seen(rig, 5)
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 7
    rows = [protocol.StepRecord.model_validate(row_to_wire(r)) for r in rig.queue.drain(100)]
    decode = [r for r in rows if r.prefill_tokens == 0 and r.draft_tokens]
    assert decode and all(r.width == 7 and r.draft_tokens == 7 * r.batch_size for r in decode)


#: One bucket where K = 2 has 3 measured steps and every other width thousands: exploration's target.
EXPLORE_ROW = protocol.StepCells(batch_edges=[512], widths=[0, 1, 2, 4, 7],
                                 step_s=[[5e-3, 5.6e-3, 6.2e-3, 7.2e-3, 9.5e-3]], steps=[[1e4, 1e4, 3.0, 1e4, 1e4]])


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


@pytest.mark.parametrize(("joins_every_step", "explored"), [(False, True), (True, False)])
def test_the_hook_explores_only_after_decode_only_steps(monkeypatch, joins_every_step: bool, explored: bool) -> None:
    monkeypatch.setattr(widths_module, "PROBE_GAIN_UNIT", float("inf"))  # explore once in 50, whatever the gain
    rig = Rig(GRAPH, correct={"json": 7})
    install(rig, EXPLORE_ROW, json=CP(k=4, expected=HIGH))
    for i in range(4):
        rig.add(f"a{i}", "json", max_tokens=400)
    for i in range(150):
        if joins_every_step:
            rig.add(f"n{i}", "json", max_tokens=400)  # every step schedules a new request's prompt
        rig.sim.step()
    assert (rig.hook.widths.explored > 0) is explored


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


def test_the_hook_feeds_the_budget_meter_from_its_steps() -> None:
    rig = Rig(GRAPH, correct={"json": 7})
    rig.hook.widths.budget = BudgetMeter(8)  # 4 requests at any width above 1 fill 8 tokens
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    for i in range(4):
        rig.add(f"a{i}", "json", max_tokens=400)
    for _ in range(60):
        rig.clock.t += 0.01  # back-to-back steps: each has an interval
        rig.sim.step()
    budget = rig.hook.widths.budget.current()
    assert budget is not None and budget.tokens == 8
    assert budget.capacity == pytest.approx(8 / 0.01)
    assert 0 <= budget.rho < 1  # prompts only in the first steps; then every step commits


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


def test_overhead_share_counts_busy_steps_by_their_interval() -> None:
    from specctl_vllm.engine_patch.hook import HookStats

    stats = HookStats()
    assert stats.overhead_line() == "hook no steps; at batch >= 128: no steps"
    stats.record_busy(4, 10_000, 0.005, 5_000)  # 10 us of hook (5 us of its thread's CPU) in a 5 ms step
    stats.record_busy(256, 100_000, 0.025, 50_000, [40_000, 20_000, 30_000, 10_000], 12_000)
    assert stats.overhead_line() == (
        "hook 0.37 % of 2 steps (thread CPU 0.18 %); at batch >= 128: 0.40 % of 1 steps (thread CPU 0.20 %); "
        "us per step there: before 40, after 20 (width rule 12), observe 30, finish 10")


@pytest.mark.parametrize("engine_loop", [False, True])
def test_hook_charges_each_section_its_wall_and_thread_cpu_time(engine_loop: bool) -> None:
    """Each section reads both clocks once at its start and once at its end: on a wall clock that ticks 1 us
    and a thread-CPU clock that ticks 0.5 us per read, every section of a busy large step costs one tick (after
    three: it also times the width rule). Drafts counted in vLLM's loop run outside every section: each call is
    charged to observe (and to thread CPU) at the price measured at start-up, here 700 ns."""
    from itertools import count

    rig = Rig(GRAPH, correct={"json": 7}, engine_loop=engine_loop)
    cpu = count(0, 500)
    rig.hook.cpu_ns = lambda: next(cpu)
    rig.hook.cpu_sample_every = 1  # every step reads the thread-CPU clock
    rig.hook.spec_call_ns = 700.0
    calls: list[str] = []
    counting = rig.sim._counting_call()

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(str(kwargs["request_id"]))
        return counting(*args, **kwargs)

    rig.sim._count = counted
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    for i in range(130):
        rig.add(f"j{i}", "json")
    seen = widths_seen(rig, 6)
    stats = rig.hook.stats
    steps = stats.busy_large[0]
    assert steps >= 4
    # the steps after the first (prefill) one draft for every request; all but the first step are busy steps
    spec_ticks = 700 * len(calls) if engine_loop else 0
    assert (len(calls) > 0) == engine_loop and all(seen[1:])
    # the after section reads the wall clock twice more around the width rule: one tick of its three
    assert stats.sections_large == [1_000 * steps, 3_000 * steps, 1_000 * steps + spec_ticks, 1_000 * steps]
    assert stats.rule_large_ns == 1_000 * steps
    assert stats.busy_large[3] == 4 * 500 * steps + spec_ticks


def test_the_thread_cpu_clock_is_read_on_one_step_in_cpu_sample_every_and_its_share_is_over_those_steps() -> None:
    """The thread-CPU clock (a system call) is read by the sections of every CPU_SAMPLE_EVERY-th step only; the
    logged thread-CPU share is their CPU over their own intervals, and the wall share still counts every step."""
    from specctl_vllm.engine_patch.hook import CPU_SAMPLE_EVERY, HookStats

    assert CPU_SAMPLE_EVERY > 1
    rig = Rig(GRAPH, correct={"json": 7}, engine_loop=True)
    reads: list[int] = []
    rig.hook.cpu_ns = lambda: (reads.append(rig.hook._cpu_ticks), 1_000 * len(reads))[1]
    rig.hook.cpu_sample_every = 4
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    for i in range(8):
        rig.add(f"j{i}", "json", max_tokens=200)
    widths_seen(rig, 12)
    # 12 steps, of which 0, 4 and 8 sample: each of their four sections reads the clock at its start and end
    assert len(reads) == 3 * 4 * 2 and [t for t in reads[::8]] == [1, 5, 9]
    stats = HookStats()
    stats.record_busy(4, 10_000, 0.005, 5_000)  # sampled: 5 us of CPU in a 5 ms step
    stats.record_busy(4, 10_000, 0.005, 0, cpu_sampled=False)  # its CPU not read
    assert stats.overhead_line().startswith("hook 0.20 % of 2 steps (thread CPU 0.10 %)")
    unsampled = HookStats()
    unsampled.record_busy(4, 10_000, 0.005, 0, cpu_sampled=False)
    assert unsampled.overhead_line().startswith("hook 0.20 % of 1 steps (thread CPU not sampled)")


def test_graph_shaped_steps_do_not_adapt_a_requests_own_k() -> None:
    """Every request verifies the step's width, so a rejected request keeps its rule's k and every step still
    verifies one width for all (on a per-request engine the same rejections drop its k to 0 at once)."""
    from specctl_vllm.engine_patch.hook import STATE_ATTR

    rig = Rig(GRAPH, correct={"chat": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), chat=CP(k=4, expected=HIGH,
                                                       adapt=protocol.AdaptRule(k_min=0, k_max=7)))
    requests = [rig.add(f"c{i}", "chat", max_tokens=60) for i in range(4)]
    seen = widths_seen(rig, 10)
    assert all(len(s) <= 1 for s in seen)
    state = getattr(requests[0], STATE_ATTR)
    assert not state.adaptive and state.adapt.k == 4


def step_counts(rig: Rig) -> list[dict[str, tuple[int, dict[int, list[int]]]]]:
    """Per queued step: category -> (request steps, drafted -> accepted histogram), summed over methods."""
    out = []
    for row in rig.queue.drain(100_000):
        record = protocol.StepRecord.model_validate(row_to_wire(row))  # every row is a valid StepRecord
        per: dict[str, tuple[int, dict[int, list[int]]]] = {}
        for cat in record.categories:
            requests, hists = per.get(cat.category, (0, {}))
            for h in cat.hists:
                merged = hists.setdefault(h.k, [0] * (h.k + 1))
                hists[h.k] = [a + b for a, b in zip(merged, h.accepted)]
            per[cat.category] = (requests + cat.requests, hists)
        out.append(per)
    return out


def recording(observe, into: list) -> object:
    """The meter's ``observe``, noting each step's (batch, width, committed tokens) first."""

    def call(batch: int, width: int, committed: int, *rest: object) -> None:
        into.append((batch, width, committed))
        observe(batch, width, committed, *rest)

    return call


def test_drafts_counted_in_vllms_loop_match_the_patchs_own_pass() -> None:
    """The two ways a graph-shaped step is counted give the same request steps and the same histograms, step
    by step and per category, with grammar-invalid drafts, requests that finish and join, and width changes."""
    runs = []
    for engine_loop in (False, True):
        rig = Rig(GRAPH, correct={"json": 7, "prose": 1, "code": 3}, engine_loop=engine_loop)
        install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW),
                code=CP(k=4, expected=list(geometric_lengths(0.6, 7))))
        rig.sim.invalid = lambda rid, spec: 1 if rid.startswith("c") and len(spec) > 2 else 0
        metered: list[tuple[int, int, int]] = []  # what the engine thread read from each step: the meter's input
        rig.hook.widths.measured.observe = recording(rig.hook.widths.measured.observe, metered)
        for i in range(12):
            rig.add(f"{'jpc'[i % 3]}{i}", ("json", "prose", "code")[i % 3], max_tokens=20 + 3 * i)
        truths = [rig.sim.step() for _ in range(30)]
        for i in range(6):  # late joiners: their prefill steps verify no drafts
            rig.add(f"late{i}", "json", max_tokens=15)
        truths += [rig.sim.step() for _ in range(30)]
        table = rig.holder.current(rig.clock())
        curves = [rig.hook.widths.curve(c, table) for c in ("json", "prose", "code")]  # the fast timescale's
        runs.append((step_counts(rig), truths, metered, curves))
    (passed, truths, passed_metered, passed_curves), (looped, _, looped_metered, looped_curves) = runs
    assert looped == passed
    assert looped_metered == passed_metered and len(looped_metered) >= 20
    assert looped_curves == [pytest.approx(curve) for curve in passed_curves]
    assert looped_curves[0] != looped_curves[1]  # json and prose accept differently: the curves are fed
    drafted = sum(n for step in looped for _, hists in step.values() for counts in hists.values() for n in counts)
    assert drafted == sum(t.drafts for t in truths) > 0


def test_an_engine_loop_step_leaves_its_histograms_to_the_reporter() -> None:
    """The engine thread reads the packed codes once (the fast sums, the committed tokens) and queues them as they
    are: the row's own aggregate holds no drafted histogram, its packed codes hold every drafted request, and
    the reporter's read of the row unfolds them."""
    rig = Rig(GRAPH, correct={"json": 7, "prose": 1}, engine_loop=True)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=4, expected=HIGH))
    for i in range(8):
        rig.add(f"r{i}", ("json", "prose")[i % 2], max_tokens=30)
    truths = [rig.sim.step() for _ in range(12)]
    rows = rig.queue.drain(100)
    drafted_rows = [row for row in rows if row.draft_tokens]
    assert len(drafted_rows) >= 8
    for row in drafted_rows:
        assert row.packed is not None and all(not e.hists for e in row.agg.values())
        unfolded = step_aggregate(row)
        assert sum(row.packed.codes.values()) == sum(e.requests for e in unfolded.values()
                                                     if e.hists) == row.batch_size
    drafted_requests = sum(n for row in rows for e in step_aggregate(row).values()
                           for counts in e.hists.values() for n in counts)
    assert drafted_requests == sum(t.drafts for t in truths)


def test_the_key_table_resolves_a_request_it_lost_and_stays_bounded() -> None:
    """Drafted requests are tallied by a request id -> category table: a request missing from it (resumed after
    the table dropped it) is resolved from vLLM's request and counted as before (the table only drops ids vLLM
    no longer holds, so in vLLM's loop only a request freed in the very step it was dropped could be missed);
    the table never holds more than vLLM's live requests plus the slack, however many have come and gone."""
    from specctl_vllm.engine_patch.hook import KEYS_SLACK

    def run(forget: bool) -> list:
        rig = Rig(GRAPH, correct={"json": 7, "prose": 1}, engine_loop=True)
        install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
        for i in range(8):
            rig.add(f"r{i}", ("json", "prose")[i % 2], max_tokens=60)
        for n in range(12):
            if forget and n in (4, 8):  # twice: the second time the table must still hand over its misses
                rig.hook.keys.clear()
            rig.sim.step()
        return step_counts(rig)

    assert run(forget=True) == run(forget=False)

    rig = Rig(GRAPH, correct={"json": 7}, engine_loop=True)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    most = 0
    for wave in range(40):  # 40 waves of 8 short requests: 320 ids seen
        for i in range(8):
            rig.add(f"w{wave}-{i}", "json", max_tokens=4)
        for _ in range(4):
            rig.sim.step()
            live = sum(1 for r in rig.sim.requests.values() if not r.is_finished())
            most = max(most, len(rig.hook.keys) - live)
    assert 0 < most <= KEYS_SLACK + 8


def test_a_drafted_request_vllm_no_longer_holds_is_left_out_without_error() -> None:
    rig = Rig(GRAPH, correct={"json": 7}, engine_loop=True)
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    rig.add("a", "json", max_tokens=30)
    for _ in range(3):
        rig.sim.step()
    count = rig.sim._counting_call()
    real = rig.sim._counting_call

    def with_a_stranger():
        def calls(*args, **kwargs):
            count(None, num_draft_tokens=7, num_accepted_tokens=3, num_invalid_spec_tokens=None,
                  request_id="gone")
            return count(*args, **kwargs)
        return calls

    rig.sim._counting_call = with_a_stranger
    rig.sim.step()
    rig.sim._counting_call = real
    rows = rig.queue.drain(100)
    assert rows[-1].batch_size == 1 and sum(e.requests for e in step_aggregate(rows[-1]).values()) == 1
    assert rig.sim.counting_failures == [] and "gone" not in rig.hook.keys


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


@pytest.mark.parametrize("resolved", [True, False])
def test_the_batch_pass_pads_and_counts_alike_on_its_fast_and_its_slow_path(resolved: bool) -> None:
    """Every request resolved under the current table takes the C passes; one that is not (a new table) takes
    the loop: either way drafts end at exactly the step's width (cut, or padded with vLLM's -1), a request
    without drafts keeps none, and the mix counts the batch per category."""
    from specctl_vllm.engine_patch.hook import STATE_ATTR

    rig = Rig(GRAPH, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(6):
        rig.add(f"r{i}", ("json", "prose")[i % 2])
    widths_seen(rig, 3)
    running = rig.sim.running
    if not resolved:
        getattr(running[0], STATE_ATTR).gen = -5  # as after a new table: this request resolves again
    width = rig.hook.widths.width
    assert width >= 2  # json's high acceptance on cheap cells: a width to cut to and to pad to
    drafts = [[1] * (width + 2), [2] * max(width - 1, 1), [], [3] * width, [4], [5] * (width + 1)]
    for request, spec in zip(running, drafts):
        request.spec_token_ids = list(spec)
    rig.hook.before_schedule(running)
    for request, spec in zip(running, drafts):
        want = [] if not spec else (spec + [-1] * width)[:width] if len(spec) < width else spec[:width]
        assert request.spec_token_ids == want
    assert rig.hook._next.mix == {"json": 3, "prose": 3}


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


def test_steps_that_mostly_run_prompt_chunks_stay_out_of_the_measured_check() -> None:
    """A burst of arrivals (an engine's first seconds, a load step) gives steps that run mostly prompt chunks: they
    commit next to nothing whatever the width, and with few drafts they would read as K = 0 steps and make plain
    decoding look slow (the H200's second pass in session 12: its first steps at 2000 prompt tokens each). Such a
    step is left out; the decode steps around it count."""
    rig = Rig(GRAPH, correct={"json": 7})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    meter = rig.hook.widths.measured

    def steps(n: int) -> None:
        for _ in range(n):
            rig.clock.t += 0.01  # back to back: every step after the first is timed
            rig.sim.step()

    for i in range(2):
        rig.add(f"a{i}", "json", max_tokens=400)
    steps(6)
    before = meter.clock
    assert before == 5  # the first step had no previous one to be timed from
    for i in range(8):  # eight prompts of 40 tokens beside two decoding requests
        rig.add(f"b{i}", "json", prompt=list(range(100, 140)), max_tokens=400)
    steps(1)
    assert meter.clock == before  # the burst's step: 8 of 10 requests in prefill
    steps(5)
    assert meter.clock == before + 5



def test_the_hook_measures_each_step_with_the_mix_the_width_rule_priced() -> None:
    """The engine's measured check is fed each step's category shares, as the width rule priced the step."""
    rig = Rig(GRAPH, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(3):
        rig.add(f"j{i}", "json", max_tokens=400)
    rig.add("p0", "prose", max_tokens=400)
    for _ in range(40):
        rig.clock.t += 0.01
        rig.sim.step()
    meter, chooser = rig.hook.widths.measured, rig.hook.widths
    got = meter.reading(4, chooser.width)
    assert got.steps > 0
    total = sum(got.mix.values())
    assert {c: w / total for c, w in got.mix.items()} == pytest.approx({"json": 0.75, "prose": 0.25})
    assert chooser.measured_mix() == pytest.approx({"json": 0.75, "prose": 0.25})
    assert chooser.expected_at(0) == 1.0


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

def _count_batch_passes(monkeypatch) -> list[int]:
    """Steps (by their number in the run) whose before_schedule passed over the batch's requests."""
    from specctl_vllm.engine_patch import hook as hook_module

    passes: list[int] = []
    real = hook_module.SpecHook._before_graph_step

    def spy(self, running, table, step):
        real(self, running, table, step)
        if step.batch_pass:
            passes.append(self.stats.steps)

    monkeypatch.setattr(hook_module.SpecHook, "_before_graph_step", spy)
    return passes


@pytest.mark.parametrize(("async_mode", "passes"), [(True, 3), (False, 24)])
def test_a_steady_async_batch_is_passed_over_once_in_batch_pass_every_steps(monkeypatch, async_mode, passes) -> None:
    """Under async scheduling vLLM sizes every request's placeholder drafts from the width the patch set, so once
    a pass finds the batch at the width, the next BATCH_PASS_EVERY - 1 steps reuse its counts; a synchronous
    engine hands back drafts of any length, so there every step passes."""
    from specctl_vllm.engine_patch.hook import BATCH_PASS_EVERY

    seen = _count_batch_passes(monkeypatch)
    rig = Rig(GRAPH, async_mode=async_mode, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(12):
        rig.add(f"r{i}", ("json", "prose")[i % 2], max_tokens=2000)
    widths = widths_seen(rig, 8)
    seen.clear()
    widths += widths_seen(rig, 3 * BATCH_PASS_EVERY)
    assert len(seen) == passes
    assert all(len(s) <= 1 for s in widths)  # every step uniform: the reused steps too


@pytest.mark.parametrize("change", ["table", "batch", "off_width"])
def test_a_reused_mix_gives_way_to_a_pass_as_soon_as_its_inputs_change(monkeypatch, change) -> None:
    """A new policy table, a batch that grew by more than an eighth, or a pass that had drafts to cut or pad:
    the next step passes over the batch again."""
    from specctl_vllm.engine_patch.hook import BATCH_PASS_EVERY

    seen = _count_batch_passes(monkeypatch)
    rig = Rig(GRAPH, async_mode=True, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(16):
        rig.add(f"r{i}", ("json", "prose")[i % 2], max_tokens=2000)
    widths_seen(rig, BATCH_PASS_EVERY + 1)
    while rig.hook._pass_reuses_left != BATCH_PASS_EVERY - 1:  # the step after a pass that found the batch at width
        widths_seen(rig, 1)
    seen.clear()
    widths_seen(rig, 1)
    assert seen == []  # a reused step
    if change == "table":
        install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=1, expected=LOW))
    elif change == "batch":
        for i in range(3):  # 16 -> 19 requests: more than an eighth
            rig.add(f"n{i}", "json", max_tokens=2000)
        widths_seen(rig, 1)  # the step that admits them still reuses; they join the running list after it
        seen.clear()
    else:
        rig.hook._pass_reuses_left = 0  # the next step passes; give it a request off the width
        rig.sim.running[0].spec_token_ids = [1] * (rig.hook.widths.width + 1)
        widths_seen(rig, 1)
        assert len(seen) == 1 and rig.hook._pass_reuses_left == 0  # it cut the drafts: no reuse after it
        seen.clear()
    widths_seen(rig, 1)
    assert len(seen) == 1


def test_a_reused_step_counts_the_requests_it_admits(monkeypatch) -> None:
    """Between passes the width rule sees the last pass's requests per category plus the step's admitted ones."""
    mixes: list[dict[str, int]] = []
    rig = Rig(GRAPH, async_mode=True, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    real = rig.hook.widths.choose
    monkeypatch.setattr(rig.hook.widths, "choose", lambda mix, *a, **k: mixes.append(dict(mix)) or real(mix, *a, **k))
    for i in range(16):
        rig.add(f"r{i}", ("json", "prose")[i % 2], max_tokens=2000)
    widths_seen(rig, 10)
    while rig.hook._pass_reuses_left < 2:
        widths_seen(rig, 1)
    rig.add("new", "code", max_tokens=2000)
    widths_seen(rig, 1)
    assert mixes[-1] == {"json": 8, "prose": 8, "code": 1}


def test_steps_between_passes_never_report_more_requests_than_they_ran() -> None:
    """Requests finish and join between two passes: the reused counts may hold departed requests, but a step's
    telemetry counts each of its requests once, per category, never more than its batch."""
    rig = Rig(GRAPH, async_mode=True, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(24):
        rig.add(f"r{i}", ("json", "prose")[i % 2], max_tokens=8 + 3 * i)  # finishing at different steps
    for step in range(60):
        if step % 3 == 0:
            rig.add(f"n{step}", ("json", "prose")[step % 2], max_tokens=30)
        rig.sim.step()
    rows = rig.queue.drain(1000)
    assert len(rows) >= 50
    for row in rows:
        assert sum(e.requests for e in step_aggregate(row).values()) == row.batch_size


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


def test_a_repriced_policy_keeps_the_batch_pass_and_the_requests_rules_a_new_rule_does_not(monkeypatch) -> None:
    """The controller's learning bumps the policy version when only the cells or the curves move (a few
    times a second at 256 requests on the H200): the width rule computes again on the next step, but the
    requests keep their resolved rules and the next step reuses the last batch pass. A new rule resolves
    every request again and passes over the batch."""
    from specctl_vllm.engine_patch import widths as chooser_module
    from specctl_vllm.engine_patch.hook import BATCH_PASS_EVERY, STATE_ATTR

    computed: list[int] = []
    real_rule = chooser_module.choose_width

    def counted_rule(*args, **kwargs):
        computed.append(rig.sim.last_output is not None)
        return real_rule(*args, **kwargs)

    monkeypatch.setattr(chooser_module, "choose_width", counted_rule)
    rig = Rig(GRAPH, async_mode=True, correct={"json": 7})
    hook = rig.hook

    def policy(version: int, k: int, step_ms: list[float]) -> protocol.Policy:
        return protocol.Policy(version=version, issued_at=0.0, ttl_s=60.0, default=CP(k=4),
                               categories={"json": CP(k=k, expected=HIGH)}, step_cells=cells(step_ms))

    rig.holder.install(policy(1, 4, [5.0, 5.6, 6.2, 7.2, 9.5]), rig.clock())
    for i in range(8):
        rig.add(f"r{i}", "json", max_tokens=400)
    widths_seen(rig, 4)  # prompts done, drafts at the width
    for _ in range(40):  # until a pass has just been made: the next steps reuse it
        rig.sim.step()
        if hook._pass_reuses_left == BATCH_PASS_EVERY - 1:
            break
    assert hook._pass_reuses_left == BATCH_PASS_EVERY - 1
    states = [getattr(r, STATE_ATTR) for r in rig.sim.running]
    resolved_under = {s.gen for s in states}
    passed_under = hook._pass_generation

    rig.holder.install(policy(2, 4, [5.0, 5.7, 6.3, 7.4, 9.9]), rig.clock())  # repriced: same rules
    computed.clear()
    rig.sim.step()
    assert computed  # the width rule saw the new cells at once
    assert hook._pass_reuses_left == BATCH_PASS_EVERY - 2  # the step reused the pass
    assert hook._pass_generation == passed_under
    assert {s.gen for s in states} == resolved_under

    rig.holder.install(policy(3, 2, [5.0, 5.7, 6.3, 7.4, 9.9]), rig.clock())  # json's rule changed
    rig.sim.step()
    table = rig.holder.current(rig.clock())
    assert hook._pass_generation == table.rules_generation != passed_under
    assert {s.gen for s in states} == {table.rules_generation}
    assert {s.rule.k for s in states} == {2}
