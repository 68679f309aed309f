"""Graph-shaped engines: the controller learns the step-cost cells from width-reporting steps and sends them,
with E_c(K) per category, in the policy; both survive a dump/load; per-request engines get neither."""

from __future__ import annotations

import pytest

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.kernel.model.cells import bucket_of
from specctl_vllm.kernel.model.widths import expected_lengths
from specctl_vllm.kernel.protocol import SpecConfig
from tests.unit.core.factories import SPEC, batch, brain, cat_step, config, step

GRAPH_SPEC = SpecConfig(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=[0, 1, 2, 4, 7])
JSON = [0.85] * 8


def feed_width_steps(b: Brain, spec: SpecConfig, n: int = 16, width: int = 4, seconds: float = 0.0098,
                     batches: int = 20) -> None:
    for seq in range(batches):
        steps = []
        for _ in range(10):
            s = step([cat_step("json", n, JSON, k=width)], wall_s=seconds * 2, depth=width)
            steps.append(s.model_copy(update={"width": width, "interval_s": seconds}))
        b.ingest(batch(steps, seq, spec=spec), 1000.0 + seq)


def test_policy_carries_measured_cells_and_curves() -> None:
    b = brain()
    feed_width_steps(b, GRAPH_SPEC)
    policy = b.policy_for("m", GRAPH_SPEC, 1030.0, engine_id="e1")
    cells = policy.step_cells
    assert cells is not None and cells.widths == [0, 1, 2, 4, 7]
    i, j = bucket_of(16), cells.widths.index(4)
    assert cells.steps[i][j] >= 128  # 200 steps, decayed a little, rounded down to a power of two
    assert cells.step_s[i][j] == pytest.approx(0.0098, rel=0.05)  # the interval, not the longer wall time
    curve = policy.categories["json"].expected
    assert len(curve) == 8 and curve[0] == 1.0
    assert curve[4] == pytest.approx(expected_lengths([0.85] * 4, 4)[4], abs=0.15)


def test_per_request_engines_get_no_cells() -> None:
    b = brain()
    feed_width_steps(b, SPEC)
    policy = b.policy_for("m", SPEC, 1030.0, engine_id="e1")
    assert policy.step_cells is None and all(not p.expected for p in policy.categories.values())


def test_cells_survive_dump_and_load() -> None:
    b = brain()
    feed_width_steps(b, GRAPH_SPEC)
    again = Brain.load(b.dump(), config())
    first = b.policy_for("m", GRAPH_SPEC, 1030.0, engine_id="e1").step_cells
    second = again.policy_for("m", GRAPH_SPEC, 1030.0, engine_id="e1").step_cells
    assert first == second


def test_steps_with_prefill_do_not_enter_the_cells() -> None:
    b = brain()
    steps = [step([cat_step("json", 4, JSON, k=2)], depth=2).model_copy(
        update={"width": 2, "interval_s": 0.5, "prefill_tokens": 256, "scheduled_tokens": 500})]
    b.ingest(batch(steps, 0, spec=GRAPH_SPEC), 1000.0)
    cells = b.policy_for("m", GRAPH_SPEC, 1001.0, engine_id="e1").step_cells
    assert all(c == 0 for row in cells.steps for c in row)


def decode(width: int, seconds: float) -> object:
    return step([cat_step("json", 64, JSON, k=width)], depth=width).model_copy(
        update={"width": width, "interval_s": seconds})


def prompt() -> object:
    return step([cat_step("json", 64, JSON, k=1)], depth=1).model_copy(
        update={"width": 1, "interval_s": 0.03, "prefill_tokens": 255, "scheduled_tokens": 383})


def cell(b: Brain, width: int) -> tuple[float, float]:
    """(mean seconds, decayed steps) the model's cell table holds for 64 requests at ``width``."""
    seconds, steps = b._models["m"].cells.sums.get((bucket_of(64), width), [0.0, 0.0])
    return (seconds / steps if steps else 0.0), steps


@pytest.mark.parametrize(("batches", "k1_steps"), [
    # H200 session 8, low at 64 requests: a decode step before a prompt step measured 16.8 ms, the others 7.6
    ([[decode(1, 0.0076), decode(1, 0.0168), prompt(), decode(1, 0.0076)]], 1),  # the last: next step unknown
    ([[decode(1, 0.0076), decode(1, 0.0076)], [prompt(), decode(1, 0.0076)]], 1),  # held, then dropped
    ([[decode(1, 0.0076), decode(1, 0.0076)], [decode(1, 0.0076), decode(0, 0.0065)]], 3),  # held, then kept
])
def test_decode_steps_before_a_prompt_step_do_not_enter_the_cells(batches, k1_steps) -> None:
    """Such a step is charged for part of the prompt step after it; a width measured by a few of them looked
    dear (K = 1 priced at 15 ms at 64 requests on low, 2x its cost before decode steps) and was passed over."""
    b = brain()
    for seq, steps in enumerate(batches):
        b.ingest(batch(steps, seq, spec=GRAPH_SPEC), 1000.0 + seq)
    seconds, measured = cell(b, 1)
    assert measured == pytest.approx(k1_steps, abs=0.05)  # decayed a little
    assert seconds == pytest.approx(0.0076, rel=0.05)


def test_a_held_decode_step_pairs_only_with_its_own_engine_s_next_step() -> None:
    b = brain()
    b.ingest(batch([decode(1, 0.0076), decode(1, 0.0076)], 0, spec=GRAPH_SPEC), 1000.0)
    b.ingest(batch([decode(1, 0.0076)], 0, engine="e2", spec=GRAPH_SPEC), 1000.5)  # another engine's step
    b.ingest(batch([prompt()], 1, spec=GRAPH_SPEC), 1001.0)
    _seconds, measured = cell(b, 1)
    assert measured == pytest.approx(1.0, abs=0.05)  # e1's first step; its held one met a prompt, e2's waits


@pytest.mark.parametrize("widths", [[0, 0], [1, 2], [0, 4, 2], [0, 9]])
def test_malformed_width_sets_are_refused_by_the_protocol(widths) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="graph_widths"):
        SpecConfig(method="eagle3", k_max=7, graph_widths=widths)
    assert SpecConfig(method="eagle3", k_max=7, graph_widths=[0, 7]).graph_widths == [0, 7]


BUDGET_SPEC = GRAPH_SPEC.model_copy(update={"token_budget": 2048})


def budget_bound_steps(n: int = 226) -> list:
    """Steps of a budget-bound load: every one carries prompts, some fill the 2048 tokens; their time is on
    their width's line through the full step, a_K = 10 + 2.15 K ms (session 5's H200 fit at 256 requests).
    Mostly K = 2, a run of two K = 0 steps in five (the first of a run is a switch, not fitted), so the fit
    sees two widths."""
    out = []
    for tokens, width in ((2048, 2), (1400, 2), (2048, 2), (1700, 0), (1500, 0)):
        s = step([cat_step("json", n, JSON, k=width)], depth=width)
        fixed = 0.010 + 0.00215 * width
        out.append(s.model_copy(update={"width": width, "scheduled_tokens": tokens,
                                        "prefill_tokens": tokens - n - s.draft_tokens,
                                        "interval_s": fixed + (0.0565 - fixed) * tokens / 2048}))
    return out


def test_the_controller_measures_the_token_budget_as_the_engine_does() -> None:
    from specctl_vllm.kernel.model.budget import BudgetMeter, budget_sample

    b, engine = brain(), BudgetMeter(2048)
    for seq in range(40):
        steps = budget_bound_steps()
        b.ingest(batch(steps, seq, spec=BUDGET_SPEC), 1000.0 + seq)
        for s in steps:
            engine.observe(*budget_sample(s))
    mine = b._models["m"].budget_meter(2048).current()
    assert mine is not None and mine == engine.current()
    # the fit, near the line the steps are on (the prior on p, 3 ms, pulls it a little: two widths, two points)
    assert mine.fixed_s == pytest.approx(0.010, rel=0.05) and mine.pass_s == pytest.approx(0.00215, rel=0.15)
    assert mine.rho > 0
    # an engine that does not report a budget feeds no meter; a read does not create one
    other = brain()
    other.ingest(batch(budget_bound_steps(), 0, spec=GRAPH_SPEC), 1000.0)
    assert other._models["m"].budget_meter(2048) is None and other._models["m"].budgets == {}


def test_the_policy_prices_a_budget_bound_batch_with_the_steady_step_model() -> None:
    with_budget, cells_only = brain(), brain()
    for seq in range(12):
        with_budget.ingest(batch(budget_bound_steps(), seq, spec=BUDGET_SPEC), 1000.0 + seq)
        cells_only.ingest(batch(budget_bound_steps(), seq, spec=GRAPH_SPEC), 1000.0 + seq)
    modelled = with_budget.policy_for("m", BUDGET_SPEC, 1013.0, engine_id="e1").categories["json"]
    priced_by_cells = cells_only.policy_for("m", GRAPH_SPEC, 1013.0, engine_id="e1").categories["json"]
    assert "steady-step model" in modelled.reason and "cell table" in priced_by_cells.reason
    # the wire caps every category at k_max: the engine's rule picks each step's width
    assert modelled.k == priced_by_cells.k == BUDGET_SPEC.k_max
    # the rule's forecast there, beta 0.85 at 226 requests with session 5's fixed costs: K = 2, as the H200's
    # static engines measured
    assert with_budget.category("json", 1013.0).decision.width == 2
    # the cells there hold only their prior (every step carried prompts): plain, by the unmeasured margin
    assert cells_only.category("json", 1013.0).decision.width == 0


def test_replay_reads_the_recorded_budget_as_the_engine_metered_it() -> None:
    from specctl_vllm.kernel.model.budget import BudgetMeter, budget_sample, recorded_budget

    batches = [batch(budget_bound_steps(), seq, spec=BUDGET_SPEC) for seq in range(12)]
    engine = BudgetMeter(2048)
    for b in batches:
        for s in b.steps:
            engine.observe(*budget_sample(s))
    assert recorded_budget(batches) == engine.current()
    assert recorded_budget([batch(budget_bound_steps(), 0, spec=GRAPH_SPEC)]) is None
    assert recorded_budget(batches[:2]) is None  # 4 full steps: below the evidence the engine needs


@pytest.mark.parametrize("tokens", [0, -1, 2**24 + 1])
def test_the_protocol_refuses_token_budgets_out_of_range(tokens) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="token_budget"):
        SpecConfig(method="eagle3", k_max=7, graph_widths=[0, 7], token_budget=tokens)
    assert SpecConfig(method="eagle3", k_max=7, graph_widths=[0, 7], token_budget=2**24).token_budget == 2**24


@pytest.mark.parametrize(("tokens", "interval_s"), [(2**24, 3600.0), (2**24, 1e-300), (1, 5e-324), (2048, 0.0)])
def test_extreme_but_valid_budgets_and_intervals_leave_the_policy_servable(tokens, interval_s) -> None:
    import json
    import math

    spec = GRAPH_SPEC.model_copy(update={"token_budget": tokens})
    b = brain()
    for seq in range(30):
        steps = [s.model_copy(update={"interval_s": interval_s}) for s in budget_bound_steps()]
        b.ingest(batch(steps, seq, spec=spec), 1000.0 + seq)
    reading = b._models["m"].budget_meter(tokens).current()
    assert reading is None or (math.isfinite(reading.capacity) and math.isfinite(reading.fixed_s))
    policy = b.policy_for("m", spec, 1031.0, engine_id="e1")
    json.dumps(policy.model_dump(mode="json"), allow_nan=False)  # every figure it serves is finite
    assert 0 <= policy.categories["json"].k <= 7


def test_steps_per_width_are_counted_and_exposed_for_graph_shaped_engines_only() -> None:
    """Every step counts once under the width it verified: its own width, or, for a step whose prompt chunks
    leave it without one, its drafts per request; a per-request engine counts none."""
    b = brain()
    feed_width_steps(b, GRAPH_SPEC, width=4, batches=2)
    chunked = step([cat_step("json", 8, JSON, k=2)], depth=2).model_copy(
        update={"width": None, "draft_tokens": 14, "prefill_tokens": 300, "scheduled_tokens": 330})
    b.ingest(batch([chunked], 2, spec=GRAPH_SPEC), 1003.0)
    rows = {e.engine: e for e in b.metrics(1004.0).engines}
    assert dict(rows["e1"].width_steps) == {2: 1, 4: 20}
    view = {e.engine_id: e for e in b.engines(1004.0)}["e1"]
    assert view.graph_widths == (0, 1, 2, 4, 7) and view.width_steps == {"2": 1, "4": 20}
    per_request = brain()
    feed_width_steps(per_request, SPEC, batches=2)
    assert all(not e.width_steps for e in per_request.metrics(1004.0).engines)
    assert all(not e.graph_widths and not e.width_steps for e in per_request.engines(1004.0))
