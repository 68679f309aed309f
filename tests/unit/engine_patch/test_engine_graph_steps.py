"""Graph-shaped steps: one width per step for every request, the batch pass and its reuse."""

from __future__ import annotations

import pytest
from engine_rig import CP, EXPLORE_ROW, GRAPH, HIGH, LOW, Rig, cells, install, widths_seen

from specctl_vllm.engine_patch import widths as widths_module
from specctl_vllm.engine_patch.telemetry import row_to_wire, step_aggregate
from specctl_vllm.kernel import protocol


def test_every_request_of_a_step_verifies_one_width() -> None:
    rig = Rig(GRAPH, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(3):
        rig.add(f"j{i}", "json")
        rig.add(f"p{i}", "prose")
    seen = widths_seen(rig, 12)
    assert all(len(s) <= 1 for s in seen)  # uniform: never two widths in one step
    assert rig.sim.last_output.num_spec_tokens_to_schedule in GRAPH.graph_widths


def test_static_config_keeps_the_engine_width_and_steps_report_it() -> None:
    rig = Rig(GRAPH, correct={"json": 7})
    rig.add("a", "json")
    rig.add("b", "json")
    widths_seen(rig, 5)
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 7
    rows = [protocol.StepRecord.model_validate(row_to_wire(r)) for r in rig.queue.drain(100)]
    decode = [r for r in rows if r.prefill_tokens == 0 and r.draft_tokens]
    assert decode and all(r.width == 7 and r.draft_tokens == 7 * r.batch_size for r in decode)


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


@pytest.mark.parametrize("resolved", [True, False])
def test_the_batch_pass_pads_and_counts_alike_on_its_fast_and_its_slow_path(resolved: bool) -> None:
    """Every request resolved under the current table takes the C passes; one that is not (a new table) takes
    the loop: either way drafts end at exactly the step's width (cut, or padded with vLLM's -1), a request
    without drafts keeps none, and the mix counts the batch per category."""
    from specctl_vllm.engine_patch.request_rules import STATE_ATTR

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


def _count_batch_passes(monkeypatch) -> list[int]:
    """Steps (by their number in the run) whose before-section passed over the batch's requests."""
    from specctl_vllm.engine_patch.graph_steps import GraphSteps

    passes: list[int] = []
    calls = iter(range(10**9))
    real = GraphSteps.before

    def spy(self, running, table, step):
        real(self, running, table, step)
        n = next(calls)
        if step.batch_pass:
            passes.append(n)

    monkeypatch.setattr(GraphSteps, "before", spy)
    return passes


@pytest.mark.parametrize(("async_mode", "passes"), [(True, 3), (False, 24)])
def test_a_steady_async_batch_is_passed_over_once_in_batch_pass_every_steps(monkeypatch, async_mode, passes) -> None:
    """Under async scheduling vLLM sizes every request's placeholder drafts from the width the patch set, so once
    a pass finds the batch at the width, the next BATCH_PASS_EVERY - 1 steps reuse its counts; a synchronous
    engine hands back drafts of any length, so there every step passes."""
    from specctl_vllm.engine_patch.graph_steps import BATCH_PASS_EVERY

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
    from specctl_vllm.engine_patch.graph_steps import BATCH_PASS_EVERY

    seen = _count_batch_passes(monkeypatch)
    rig = Rig(GRAPH, async_mode=True, correct={"json": 7, "prose": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH), prose=CP(k=0, expected=LOW))
    for i in range(16):
        rig.add(f"r{i}", ("json", "prose")[i % 2], max_tokens=2000)
    widths_seen(rig, BATCH_PASS_EVERY + 1)
    while rig.hook.graph.reuses_left != BATCH_PASS_EVERY - 1:  # the step after a pass that found the batch at width
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
        rig.hook.graph.reuses_left = 0  # the next step passes; give it a request off the width
        rig.sim.running[0].spec_token_ids = [1] * (rig.hook.widths.width + 1)
        widths_seen(rig, 1)
        assert len(seen) == 1 and rig.hook.graph.reuses_left == 0  # it cut the drafts: no reuse after it
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
    while rig.hook.graph.reuses_left < 2:
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


def test_a_repriced_policy_keeps_the_batch_pass_and_the_requests_rules_a_new_rule_does_not(monkeypatch) -> None:
    """The controller's learning bumps the policy version when only the cells or the curves move (a few
    times a second at 256 requests on the H200): the width rule computes again on the next step, but the
    requests keep their resolved rules and the next step reuses the last batch pass. A new rule resolves
    every request again and passes over the batch."""
    from specctl_vllm.engine_patch import widths as chooser_module
    from specctl_vllm.engine_patch.graph_steps import BATCH_PASS_EVERY
    from specctl_vllm.engine_patch.request_rules import STATE_ATTR

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
        if hook.graph.reuses_left == BATCH_PASS_EVERY - 1:
            break
    assert hook.graph.reuses_left == BATCH_PASS_EVERY - 1
    states = [getattr(r, STATE_ATTR) for r in rig.sim.running]
    resolved_under = {s.gen for s in states}
    passed_under = hook.graph.generation

    rig.holder.install(policy(2, 4, [5.0, 5.7, 6.3, 7.4, 9.9]), rig.clock())  # repriced: same rules
    computed.clear()
    rig.sim.step()
    assert computed  # the width rule saw the new cells at once
    assert hook.graph.reuses_left == BATCH_PASS_EVERY - 2  # the step reused the pass
    assert hook.graph.generation == passed_under
    assert {s.gen for s in states} == resolved_under

    rig.holder.install(policy(3, 2, [5.0, 5.7, 6.3, 7.4, 9.9]), rig.clock())  # json's rule changed
    rig.sim.step()
    table = rig.holder.current(rig.clock())
    assert hook.graph.generation == table.rules_generation != passed_under
    assert {s.gen for s in states} == {table.rules_generation}
    assert {s.rule.k for s in states} == {2}
