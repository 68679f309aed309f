"""The decide stage: a graph-shaped engine's decision caps every category at k_max and forecasts the width the
engine's own rule picks from the cells and curves it is sent (the table rows from the cells); a per-request
engine's is the goodput policy's."""

from __future__ import annotations

import pytest

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.overrides import Override
from specctl_vllm.controller.core.policy import goodput
from specctl_vllm.controller.core.stages import decide
from specctl_vllm.controller.core.stages.snapshot import policy_snapshot
from specctl_vllm.kernel.model.cells import bucket_of
from specctl_vllm.kernel.model.widths import COLD_BETA, choose_width, geometric_lengths
from specctl_vllm.kernel.protocol import SpecConfig
from tests.unit.core.factories import batch, brain, cat_step, step

GRAPH = SpecConfig(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=[0, 1, 2, 4, 7])
JSON, PROSE = [0.85] * 8, [0.3] * 8
MIX = {"json": 12, "prose": 4}
NOW = 1030.0


def fed(spec: SpecConfig, step_s: dict[int, float]) -> Brain:
    """An engine that ran 12 json and 4 prose requests per step at every width of ``step_s``, at those costs."""
    b = brain()
    seq = 0
    for width, seconds in step_s.items():
        for _ in range(6):
            steps = []
            for _ in range(10):
                cats = [cat_step("json", MIX["json"], JSON, k=width), cat_step("prose", MIX["prose"], PROSE, k=width)]
                s = step(cats, wall_s=seconds * 2, depth=width)
                steps.append(s.model_copy(update={"width": width, "interval_s": seconds} if spec.graph_widths else {}))
            b.ingest(batch(steps, seq, spec=spec), 1000.0 + seq * 0.1)
            seq += 1
    return b


#: step seconds per width at 16 requests: which width the rule picks depends on them
CASES = {
    "cheap drafts: the widest width": {0: 0.010, 1: 0.0102, 2: 0.0104, 4: 0.0108, 7: 0.0112},
    "dear drafts: plain": {0: 0.010, 1: 0.020, 2: 0.030, 4: 0.050, 7: 0.080},
    "in between": {0: 0.010, 1: 0.0125, 2: 0.0150, 4: 0.0240, 7: 0.040},
}


def forecast(b: Brain) -> int:
    """The width the graph policy forecasts the engine's rule to pick (its decision, as served)."""
    got, problem = decide.compute(b._models["m"], b._engines["e1"], GRAPH, NOW, None, b.config, b._preset)
    assert problem is None
    return got.width


@pytest.mark.parametrize("step_s", CASES.values(), ids=CASES.keys())
def test_graph_engine_gets_the_rule_s_inputs_under_a_cap_and_the_forecast_is_the_rule_s_pick(step_s) -> None:
    """The engine owns each step's width: the policy caps every category at k_max with the engine's drafter
    (whatever the width), sends the cells and curves, and reports the width choose_width picks from them."""
    b = fed(GRAPH, step_s)
    policy = b.policy_for("m", GRAPH, NOW, engine_id="e1")
    cells = policy.step_cells
    curves = {c: tuple(p.expected) for c, p in policy.categories.items()}
    i = bucket_of(16, cells.batch_edges)
    want = choose_width(MIX, curves, cells.widths, cells.step_s[i], cells.steps[i],
                        geometric_lengths(COLD_BETA, GRAPH.k_max)).width
    cap = GRAPH.k_max
    assert {c: (p.k, p.adapt.k_min, p.adapt.k_max) for c, p in policy.categories.items()} == {
        "json": (cap, cap, cap), "prose": (cap, cap, cap)}
    assert policy.default.k == cap
    assert all(p.method == "engine" and p.source == "policy" for p in policy.categories.values())
    assert forecast(b) == want
    for name in MIX:
        view = b.category(name, NOW).decision
        assert view.k == cap and view.width == want
        assert view.reason.startswith(f"graph-shaped engine: its width rule picks each step's width, up to {cap}; "
                                      f"at batch 16 it is forecast to pick {want} from the cell table")
        assert view.expected_committed == pytest.approx(curves[name][want], abs=1e-4)
        table = view.goodput_table
        assert [r["k"] for r in table] == GRAPH.graph_widths  # rows for the engine's widths only
        for j, r in enumerate(table):
            t = cells.step_s[i][j]
            modelled = sum(n * curves[c][r["k"]] for c, n in MIX.items()) / t
            assert r["step_ms"] == pytest.approx(t * 1e3, rel=1e-6)
            assert r["goodput_tokens_per_s"] == pytest.approx(modelled, rel=1e-3)
            assert r["expected_committed"] == pytest.approx(curves[name][r["k"]], abs=1e-4)
        assert max(table, key=lambda r: r["goodput_tokens_per_s"])["k"] == want or want == 0


def test_forecast_widths_differ_across_the_cases_and_the_rules_sent_do_not() -> None:
    """The cases above exercise plain, the widest and a middle width (else they would test one branch); the
    rules the engine acts on are the same in all three, so a forecast that moves makes no new rules version
    at the engine (only the cells and curves move)."""
    from specctl_vllm.controller.core.stages.wire import content

    picked, rules = set(), set()
    for step_s in CASES.values():
        b = fed(GRAPH, step_s)
        policy = b.policy_for("m", GRAPH, NOW, engine_id="e1")
        picked.add(forecast(b))
        rules.add((content(policy.default), tuple(sorted((c, content(p)) for c, p in policy.categories.items()))))
    assert 0 in picked and 7 in picked and len(picked) == 3
    assert len(rules) == 1


def test_per_request_engine_decision_is_the_goodput_policy_s() -> None:
    spec = SpecConfig(method="eagle3", k_max=4)
    b = fed(spec, {4: 0.012})
    snap = policy_snapshot(b._models["m"], b._engines["e1"], spec, NOW, None, b.config.learner, b._preset)
    got, problem = decide.compute(b._models["m"], b._engines["e1"], spec, NOW, None, b.config, b._preset)
    assert problem is None and got == goodput.decide(snap, b.config.policy)
    assert not got.default.reason.startswith("graph-shaped")


def test_an_operator_k_still_pins_a_graph_engine_s_category() -> None:
    b = fed(GRAPH, CASES["cheap drafts: the widest width"])
    b.set_overrides([Override("prose", k=2, reason="test", actor="ops", created_at=1.0)])
    policy = b.policy_for("m", GRAPH, NOW, engine_id="e1")
    prose = policy.categories["prose"]
    assert (prose.k, prose.source, prose.adapt.k_min, prose.adapt.k_max) == (2, "override", 2, 2)
    assert policy.categories["json"].k == 7 and prose.expected  # the engine still gets the category's curve
