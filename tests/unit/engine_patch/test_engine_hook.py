"""The per-step hook on a simulated engine: caps, drafting depth, histograms, adaptation, methods, fallback."""

from __future__ import annotations

import pytest
from engine_rig import Rig

from specctl_vllm.engine_patch.hook import STATE_ATTR, probe_selected
from specctl_vllm.engine_patch.policy_table import EngineSpec
from specctl_vllm.engine_patch.telemetry import row_to_wire
from specctl_vllm.kernel import protocol

CP = protocol.CategoryPolicy


def totals(rig: Rig) -> dict[tuple[str, str], list[int]]:
    """(category, method) -> [request steps, drafts, draft tokens, accepted tokens] over all queued rows."""
    out: dict[tuple[str, str], list[int]] = {}
    for row in rig.queue.drain(100_000):
        record = protocol.StepRecord.model_validate(row_to_wire(row))  # every row is a valid StepRecord
        for cat in record.categories:
            t = out.setdefault((cat.category, cat.method), [0, 0, 0, 0])
            t[0] += cat.requests
            for h in cat.hists:
                t[1] += h.drafts
                t[2] += h.draft_tokens
                t[3] += h.accepted_tokens
    return out


def run(rig: Rig, steps: int) -> list:
    return [rig.sim.step() for _ in range(steps)]


def test_static_config_changes_nothing(rig: Rig) -> None:
    rig.add("a", "code")
    rig.add("b")
    truths = run(rig, 6)
    out = rig.sim.last_output
    assert out.num_spec_tokens_to_schedule == 4  # the engine's own depth
    assert all(len(d) == 4 for d in out.scheduled_spec_decode_tokens.values())
    t = totals(rig)
    assert sum(v[2] for v in t.values()) == sum(x.draft_tokens for x in truths)
    assert set(t) == {("code", "ngram"), ("default", "ngram")}


def test_category_caps_and_batch_depth() -> None:
    rig = Rig(correct={"code": 4, "json": 1})
    rig.install(json=CP(k=1), code=CP(k=3))
    rig.add("c", "code")
    rig.add("j", "json")
    truths = run(rig, 8)
    per_request = {}
    for truth in truths:
        for rid, n in truth.per_request_drafts.items():
            per_request[rid] = max(per_request.get(rid, 0), n)
    assert per_request == {"c": 3, "j": 1}
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 3  # the largest k in the batch


def test_depth_follows_the_batch() -> None:
    rig = Rig()
    rig.install(json=CP(k=1))
    rig.add("j1", "json")
    rig.add("j2", "json")
    run(rig, 3)
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 1  # a json-only batch drafts 1


def test_k0_means_no_drafts_and_off_requests() -> None:
    rig = Rig(correct={"prose": 2})
    rig.install(prose=CP(k=0))
    rig.add("p", "prose")
    truths = run(rig, 5)
    assert all(not t.per_request_drafts for t in truths)
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 0
    assert totals(rig) == {("prose", "off"): [5, 0, 0, 0]}


def test_trim_assigns_new_lists_and_never_mutates_shared_placeholders(rig: Rig) -> None:
    rig.install(json=CP(k=1))
    a = rig.add("a", "json")
    b = rig.add("b", "json")
    rig.sim.step()  # prefill
    shared = [-1, -1, -1, -1]  # the async scheduler hands every request this same list
    a.spec_token_ids = shared
    b.spec_token_ids = shared
    rig.hook.before_schedule([a, b])
    assert shared == [-1, -1, -1, -1]
    assert a.spec_token_ids == [-1] and b.spec_token_ids == [-1]
    assert a.spec_token_ids is not b.spec_token_ids


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


def test_rejections_drop_k_at_once_and_retry_later() -> None:
    rig = Rig(correct={"chat": 0})  # every draft wrong
    rig.install(chat=CP(k=3, adapt=protocol.AdaptRule(k_min=0, k_max=4)))
    r = rig.add("r", "chat", max_tokens=60)
    truths = run(rig, 4)
    assert [t.per_request_drafts.get("r", 0) for t in truths] == [0, 3, 0, 0]  # prefill, one try, dropped
    assert getattr(r, STATE_ATTR).adapt.k == 0
    truths = run(rig, 20)
    assert any(t.per_request_drafts.get("r") == 1 for t in truths)  # retried at k = max(k_min, 1)


def test_accepting_requests_climb_within_bounds() -> None:
    rig = Rig(correct={"code": 4})
    rig.install(code=CP(k=1, adapt=protocol.AdaptRule(k_min=1, k_max=4, climb_after=1)))
    rig.add("c", "code", max_tokens=60)
    truths = run(rig, 6)
    assert [t.per_request_drafts.get("c", 0) for t in truths] == [0, 1, 2, 3, 4, 4]


def test_model_free_method_replaces_the_engines_drafts() -> None:
    rig = Rig(correct={})  # the engine's drafter is always wrong
    rig.install(edit=CP(k=4, method="suffix"))
    text = list(range(300, 340))
    # The target copies its prompt: a suffix match on the prompt predicts it exactly.
    rig.add("e", "edit", prompt=text, script=text[8:] + text, max_tokens=24)
    truths = run(rig, 8)
    t = totals(rig)
    assert set(t) == {("edit", "suffix")}
    assert t[("edit", "suffix")][3] > 0  # accepted tokens from the patch's own proposals
    assert rig.sim.last_output.num_spec_tokens_to_schedule == 0  # the engine's drafter has nothing to do
    assert all(n <= 4 for tr in truths for n in tr.per_request_drafts.values())


def test_async_engines_keep_their_drafter() -> None:
    rig = Rig(EngineSpec(method="eagle3", k_max=4), async_mode=True)
    rig.install(edit=CP(k=2, method="suffix"))
    rig.add("e", "edit")
    run(rig, 4)
    assert set(totals(rig)) == {("edit", "eagle3")}


def test_policy_expiry_returns_to_the_static_config_and_reattaches() -> None:
    rig = Rig(correct={"json": 4})
    rig.install(ttl=1.0, json=CP(k=1))
    rig.add("j", "json", max_tokens=60)
    assert max(t.per_request_drafts.get("j", 0) for t in run(rig, 4)) == 1
    rig.clock.t += 2.0  # the controller went silent
    assert max(t.per_request_drafts.get("j", 0) for t in run(rig, 3)) == 4
    rig.install(ttl=1.0, version=2, json=CP(k=2))
    assert max(t.per_request_drafts.get("j", 0) for t in run(rig, 3)) == 2


@pytest.mark.parametrize(("budget", "requests", "binding"), [(0.02, 4, False), (0.002, 48, True)])
def test_counterfactual_scoring_fills_the_budget_the_hook_leaves(budget: float, requests: int,
                                                               binding: bool) -> None:
    rig = Rig(budget=budget, correct={"": 1})  # every perf_counter call is 1 µs, a model execution 10 ms
    text = [5, 6, 7, 8, 9] * 6
    for i in range(requests):
        rig.add(f"r{i}", prompt=text, script=text * 40, max_tokens=150)
    run(rig, 60)
    scored = {}
    for row in rig.queue.drain(100_000):
        for entry in row_to_wire(row)["categories"]:
            for method, hists in entry.get("counterfactual", {}).items():
                s = scored.setdefault(method, [0, 0])
                s[0] += sum(h["k"] * sum(h["accepted"]) for h in hists)
                s[1] += sum(j * n for h in hists for j, n in enumerate(h["accepted"]))
    assert set(scored) == {"suffix"}  # the engine's own drafter (ngram) is measured, not simulated
    assert scored["suffix"][1] > 0  # repetitive text: the suffix drafter would have been accepted
    stats = rig.hook.stats
    overhead = stats.hook_ns - stats.draft_ns
    # Within budget on average, overdrawn by at most one request's scoring (a few perf_counter calls here).
    assert overhead <= budget * stats.wall_ns + 20_000
    if binding:  # more scoring work than budget: the budget is used, not left idle
        assert overhead >= 0.8 * budget * stats.wall_ns


def test_no_scoring_when_the_hook_alone_uses_the_budget() -> None:
    rig = Rig(budget=1e-7, correct={"": 1})  # far below what the per-request work costs
    for i in range(4):
        rig.add(f"r{i}", prompt=[5, 6, 7, 8, 9] * 6, max_tokens=60)
    run(rig, 60)
    assert rig.hook.stats.cf_scored == 0 and rig.hook.stats.cf_ns == 0


def test_probes_are_deterministic_per_request_id() -> None:
    ids = [f"req-{i}" for i in range(2000)]
    picked = [i for i in ids if probe_selected(i, 0.1)]
    assert 140 <= len(picked) <= 260
    assert picked == [i for i in ids if probe_selected(i, 0.1)]
    assert not any(probe_selected(i, 0.0) for i in ids)


def test_probed_requests_draft_while_the_category_is_off() -> None:
    rig = Rig(correct={"prose": 2})
    rig.install(prose=CP(k=0, probe_rate=0.25, probe_k=2))
    for i in range(40):
        rig.add(f"p{i}", "prose", max_tokens=6)
    run(rig, 8)
    t = totals(rig)
    probed = {rid for rid in rig.sim.requests if probe_selected(rid, 0.25)}
    assert 0 < len(probed) < 40
    assert t[("prose", "ngram")][1] > 0 and t[("prose", "off")][0] > 0


def test_category_names_are_capped() -> None:
    rig = Rig(max_categories=3)
    for name in ["a", "b", "c", "d"]:
        rig.add(name, name)
    run(rig, 2)
    assert set(rig.hook.categories()) == {"default", "a", "b"}
    assert {cat for cat, _ in totals(rig)} == {"default", "a", "b"}


def test_steps_flow_into_a_bounded_queue() -> None:
    rig = Rig()
    rig.queue = rig.hook.queue = type(rig.queue)(4)
    rig.add("a")
    run(rig, 10)
    assert len(rig.queue) == 4 and rig.queue.dropped == 6
    assert rig.hook.stats.steps == 10


@pytest.mark.parametrize(("category", "text", "matches"), [
    ("rep", [5, 6, 7, 8, 9] * 6, True),  # every n-gram recurs: the drafters match
    ("uniq", list(range(1000, 1030)), False),  # no n-gram recurs: nothing to propose
])
def test_counterfactual_tries_are_counted_with_or_without_a_match(category: str, text: list[int],
                                                                  matches: bool) -> None:
    """The match rate's denominator: every try is reported, matched or not, and never fewer than the drafts;
    a category running without drafts keeps measuring the engine's own (model-free) drafter too."""
    rig = Rig(budget=0.05, correct={"": 1})
    rig.install(default=CP(k=0, method="off"))
    script = text * 20 if matches else list(range(2000, 2400))
    for i in range(4):
        rig.add(f"r{i}", category, prompt=text, script=script, max_tokens=120)
    run(rig, 80)
    tries: dict[str, int] = {}
    drafts: dict[str, int] = {}
    for row in rig.queue.drain(100_000):
        record = protocol.StepRecord.model_validate(row_to_wire(row))
        for cat in record.categories:
            for method, n in cat.counterfactual_attempts.items():
                tries[method] = tries.get(method, 0) + n
            for method, hists in cat.counterfactual.items():
                drafts[method] = drafts.get(method, 0) + sum(h.drafts for h in hists)
                assert sum(h.drafts for h in hists) <= cat.counterfactual_attempts.get(method, 0)
    assert set(tries) == {"suffix", "ngram"}
    assert min(tries.values()) >= 10
    if matches:
        assert all(drafts.get(m, 0) >= 0.5 * tries[m] for m in tries), (drafts, tries)
    else:
        assert drafts == {}


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
    from specctl_vllm.engine_patch.hook import _Step

    rig = Rig(EngineSpec(method="eagle3", k_max=4, graph_widths=(0, 2, 4)))
    step = _Step(0, rig.holder.current(rig.clock()), lambda: 0)
    step.mix = dict(mix)
    rig.hook._count_undrafted(step, batch, {c: [0, 0, n] for c, n in drafted.items()})
    counted = {category: e.requests for (category, method), e in step.agg.items() if method == protocol.METHOD_OFF}
    assert counted == expected
    assert sum(counted.values()) + sum(drafted.values()) <= max(batch, sum(drafted.values()))
