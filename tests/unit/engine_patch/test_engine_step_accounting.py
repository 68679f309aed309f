"""Step accounting on a simulated engine: histograms reconcile with the engine's counts, the engine-loop
tallies, the key table, the rows queued and the meters fed."""

from __future__ import annotations

import pytest
from engine_rig import CP, GRAPH, HIGH, LOW, Rig, cells, install, run, totals

from specctl_vllm.engine_patch.policy_table import EngineSpec
from specctl_vllm.engine_patch.telemetry import row_to_wire, step_aggregate
from specctl_vllm.engine_patch.widths import BudgetMeter
from specctl_vllm.kernel import protocol
from specctl_vllm.kernel.model.widths import geometric_lengths


@pytest.mark.parametrize("policy", [None, CP(k=2), CP(k=3, adapt=protocol.AdaptRule(k_min=0, k_max=4))])
def test_histograms_reconcile_with_engine_counts(policy: CP | None) -> None:
    rig = Rig(correct={"a": 1, "b": 3, "": 2})
    if policy is not None:
        rig.install(a=policy, b=CP(k=4))
    for i in range(6):
        rig.add(f"r{i}", ["a", "b", None][i % 3], max_tokens=30)
    rig.sim.invalid = lambda rid, spec: 1 if rid == "r1" and len(spec) > 1 else 0  # grammar-rejected drafts
    truths = run(rig, 40)
    t = totals(rig)
    assert sum(v[1] for v in t.values()) == sum(x.drafts for x in truths)
    assert sum(v[2] for v in t.values()) == sum(x.draft_tokens for x in truths)
    assert sum(v[3] for v in t.values()) == sum(x.accepted_tokens for x in truths)


class RunnerOutput034:
    """vLLM 0.34's ModelRunnerOutput: no ``req_id_to_index``; the sampled rows follow ``req_ids`` (here the reverse
    of the scheduling order, so a hook that read rows in scheduling order would pair requests with wrong tokens)."""

    def __init__(self, req_id_to_index: dict[str, int], sampled: list[list[int]]) -> None:
        self.req_ids = sorted(req_id_to_index, key=req_id_to_index.get, reverse=True)
        self.sampled_token_ids = [sampled[req_id_to_index[rid]] for rid in self.req_ids]


def test_histograms_reconcile_with_vllm_034_runner_output(monkeypatch) -> None:
    from bench.support import engine_sim

    monkeypatch.setattr(engine_sim, "SimRunnerOutput", RunnerOutput034)
    rig = Rig(correct={"a": 1, "b": 3, "": 2})
    rig.install(a=CP(k=2), b=CP(k=4))
    for i in range(6):
        rig.add(f"r{i}", ["a", "b", None][i % 3], max_tokens=30)
    truths = run(rig, 40)
    t = totals(rig)
    assert sum(x.accepted_tokens for x in truths) > 0
    assert sum(v[1] for v in t.values()) == sum(x.drafts for x in truths)
    assert sum(v[2] for v in t.values()) == sum(x.draft_tokens for x in truths)
    assert sum(v[3] for v in t.values()) == sum(x.accepted_tokens for x in truths)


def test_steps_flow_into_a_bounded_queue() -> None:
    rig = Rig()
    rig.queue = rig.hook.queue = type(rig.queue)(4)
    rig.add("a")
    run(rig, 10)
    assert len(rig.queue) == 4 and rig.queue.dropped == 6
    assert rig.hook.stats.steps == 10


def test_stale_async_frames_vllm_discards_are_not_counted() -> None:
    rig = Rig(correct={"code": 4})
    rig.install(code=CP(k=4))
    request = rig.add("c", "code")
    run(rig, 3)
    before = totals(rig)
    assert before[("code", "ngram")][1] > 0  # drafts were counted
    request.async_tokens_to_discard = 1  # vLLM 0.26 drops this frame after a forced preemption
    run(rig, 3)
    after = totals(rig)
    assert after.get(("code", "ngram"), [0, 0, 0, 0])[1] == 0


@pytest.mark.parametrize(("mix", "drafted", "batch", "expected"), [
    ({"json": 6, "prose": 2}, {"json": 6}, 8, {"prose": 2}),  # every request of the mix in the batch
    ({"json": 6, "prose": 2}, {"json": 4}, 8, {"json": 2, "prose": 2}),
    ({"json": 6, "prose": 2}, {"json": 6, "prose": 2}, 8, {}),  # all drafted: nothing to count
    ({"json": 6, "prose": 4}, {"json": 2}, 8, {"json": 4, "prose": 2}),  # mix over the batch: the largest first
    ({"json": 3, "prose": 5}, {}, 6, {"prose": 5, "json": 1}),
    ({"json": 2}, {"json": 1}, 1, {}),  # the batch is full of drafted requests already
])
def test_undrafted_requests_come_from_the_mix_and_never_exceed_the_batch(mix, drafted, batch, expected) -> None:
    from specctl_vllm.engine_patch.hook_stats import Step

    rig = Rig(EngineSpec(method="eagle3", k_max=4, graph_widths=(0, 2, 4)))
    step = Step(0, rig.holder.current(rig.clock()), lambda: 0)
    step.mix = dict(mix)
    rig.hook.accounting.count_undrafted(step, batch, {c: [0, 0, n] for c, n in drafted.items()})
    counted = {category: e.requests for (category, method), e in step.agg.items() if method == protocol.METHOD_OFF}
    assert counted == expected
    assert sum(counted.values()) + sum(drafted.values()) <= max(batch, sum(drafted.values()))


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
    from specctl_vllm.engine_patch.request_rules import KEYS_SLACK

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
