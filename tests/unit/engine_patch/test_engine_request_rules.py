"""Per-request rules on a simulated engine: caps, drafting depth, adaptation, probes, expiry, categories."""

from __future__ import annotations

from engine_rig import CP, GRAPH, HIGH, LOW, Rig, cells, install, run, totals, widths_seen

from specctl_vllm.engine_patch.request_rules import STATE_ATTR, probe_selected
from specctl_vllm.engine_patch.telemetry import row_to_wire
from specctl_vllm.kernel import protocol


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


def test_policy_expiry_returns_to_the_static_config_and_reattaches() -> None:
    rig = Rig(correct={"json": 4})
    rig.install(ttl=1.0, json=CP(k=1))
    rig.add("j", "json", max_tokens=60)
    assert max(t.per_request_drafts.get("j", 0) for t in run(rig, 4)) == 1
    rig.clock.t += 2.0  # the controller went silent
    assert max(t.per_request_drafts.get("j", 0) for t in run(rig, 3)) == 4
    rig.install(ttl=1.0, version=2, json=CP(k=2))
    assert max(t.per_request_drafts.get("j", 0) for t in run(rig, 3)) == 2


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


def test_graph_shaped_steps_do_not_adapt_a_requests_own_k() -> None:
    """Every request verifies the step's width, so a rejected request keeps its rule's k and every step still
    verifies one width for all (on a per-request engine the same rejections drop its k to 0 at once)."""
    from specctl_vllm.engine_patch.request_rules import STATE_ATTR

    rig = Rig(GRAPH, correct={"chat": 0})
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), chat=CP(k=4, expected=HIGH,
                                                       adapt=protocol.AdaptRule(k_min=0, k_max=7)))
    requests = [rig.add(f"c{i}", "chat", max_tokens=60) for i in range(4)]
    seen = widths_seen(rig, 10)
    assert all(len(s) <= 1 for s in seen)
    state = getattr(requests[0], STATE_ATTR)
    assert not state.adaptive and state.adapt.k == 4
