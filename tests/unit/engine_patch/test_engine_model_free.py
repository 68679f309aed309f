"""Model-free drafting and counterfactual scoring on a simulated engine."""

from __future__ import annotations

import pytest
from engine_rig import CP, Rig, run, totals

from specctl_vllm.engine_patch.policy_table import EngineSpec
from specctl_vllm.engine_patch.telemetry import row_to_wire
from specctl_vllm.kernel import protocol


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
