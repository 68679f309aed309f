"""Graph-shaped engines: the controller learns the step-cost cells from width-reporting steps and sends them,
with E_c(K) per category, in the policy; both survive a dump/load; per-request engines get neither."""

from __future__ import annotations

import pytest

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.model.cells import bucket_of
from specctl_vllm.controller.core.model.widths import expected_lengths
from specctl_vllm.controller.protocol import SpecConfig
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


@pytest.mark.parametrize("widths", [[0, 0], [1, 2], [0, 4, 2], [0, 9]])
def test_malformed_width_sets_are_refused_by_the_protocol(widths) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="graph_widths"):
        SpecConfig(method="eagle3", k_max=7, graph_widths=widths)
    assert SpecConfig(method="eagle3", k_max=7, graph_widths=[0, 7]).graph_widths == [0, 7]
