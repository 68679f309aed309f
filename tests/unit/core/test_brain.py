"""Brain: dedup, gaps, restarts, caps, policy versions and tailoring, views, metrics, dump/load."""

import json

import pytest

from specctl_vllm.controller.core.brain import MAX_MODELS, Brain, IngestRejected
from specctl_vllm.kernel.protocol import (
    METHOD_ENGINE,
    OVERFLOW_CATEGORY,
    CategoryStep,
    DraftHistogram,
    SpecConfig,
    StepRecord,
)
from tests.unit.core.factories import SPEC, batch, brain, cat_step, config, step

CODE = [0.8] * 8
CHAT = [0.25] * 8


def feed(b: Brain, seqs, now=1000.0, engine="e1", boot="b1", per_step=1, model="m", spec=SPEC, cats=None):
    out = []
    for s in seqs:
        steps = [step(cats or [cat_step("code", per_step, CODE), cat_step("chat", per_step, CHAT)])]
        out.append(b.ingest(batch(steps, s, engine=engine, boot=boot, model=model, spec=spec), now))
    return out


@pytest.mark.parametrize(
    "seqs, outcomes, gaps",
    [
        ([0, 1, 2], ["accepted"] * 3, 0),
        ([0, 1, 1], ["accepted", "accepted", "duplicate"], 0),
        ([0, 3], ["accepted", "accepted"], 2),
        ([0, 3, 1], ["accepted", "accepted", "accepted"], 1),  # a late batch fills a gap
        ([0, 3, 1, 1], ["accepted", "accepted", "accepted", "duplicate"], 1),
        ([5, 6], ["accepted", "accepted"], 0),  # first contact: earlier seqs are not ours to miss
    ],
)
def test_dedup_and_gaps(seqs, outcomes, gaps):
    b = brain()
    results = feed(b, seqs)
    assert [r.outcome for r in results] == outcomes
    assert results[-1].gaps == gaps
    (e,) = b.engines(1000.0)
    assert e.batches["duplicate"] == outcomes.count("duplicate")
    assert e.gaps == gaps


def test_duplicates_are_not_counted_twice():
    b = brain()
    feed(b, [0, 1, 1, 0])
    m = b.metrics(1000.0)
    code = next(c for c in m.categories if c.category == "code")
    assert code.request_steps == 2


def test_boot_restart_starts_a_new_seq_space():
    b = brain()
    feed(b, [0, 1, 2], boot="b1", model="m")
    r = feed(b, [0, 1], boot="b2", model="m")
    assert [x.outcome for x in r] == ["accepted", "accepted"]
    assert r[-1].gaps == 0
    stale = feed(b, [3], boot="b1")  # a late batch of the old boot
    assert stale[0].outcome == "duplicate"
    r = feed(b, [5], boot="b3")  # a new boot whose first batch we see is seq 5: 0..4 missing
    assert r[0].gaps == 5


def test_dropped_steps_survive_restarts():
    b = brain()
    b.ingest(batch([], 0, boot="b1", dropped=3), 1.0)
    b.ingest(batch([], 1, boot="b1", dropped=7), 2.0)
    b.ingest(batch([], 0, boot="b2", dropped=2), 3.0)
    assert b.engines(3.0)[0].dropped_steps == 9


def test_category_cap_pools_overflow_and_counts():
    b = Brain(config().__class__(config().learner.model_copy(update={"max_categories_per_model": 2}),
                                 config().policy))
    cats = [cat_step(f"c{i}", 1, CODE) for i in range(5)]
    b.ingest(batch([step(cats)], 0), 10.0)
    names = {v.category for v in b.categories(10.0)}
    assert names == {"c0", "c1", OVERFLOW_CATEGORY}
    m = b.metrics(10.0)
    assert dict(m.overflow_steps)["m"] == 3
    over = next(c for c in m.categories if c.category == OVERFLOW_CATEGORY)
    assert over.request_steps == 3


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: [step([cat_step("a", 1, CODE, k=6)])], "above the engine's k_max"),
        (lambda s: [step([cat_step("a", 1, CODE), cat_step("a", 1, CODE)])], "reported twice"),
        (lambda s: [StepRecord(t=0, wall_s=0.01, batch_size=1, scheduled_tokens=10, draft_tokens=4,
                               categories=[cat_step("a", 2, CODE)])], "batch_size"),
        (lambda s: [step([CategoryStep(category="a", method="off", requests=1,
                                       hists=[DraftHistogram(k=1, accepted=[1, 0])])])], "method 'off'"),
    ],
)
def test_semantic_rejections_change_nothing(mutate, message):
    b = brain()
    feed(b, [0])
    before = json.dumps(b.dump(), sort_keys=True)
    with pytest.raises(IngestRejected) as err:
        b.ingest(batch(mutate(None), 1), 1000.0)
    assert message in err.value.reason
    assert json.dumps(b.dump(), sort_keys=True) == before
    b.record_rejected("e1")
    b.record_rejected("never-seen")
    b.record_rejected(None)
    m = b.metrics(1000.0)
    assert m.engines[0].batches["rejected"] == 1 and m.rejected_unknown_engine == 2


def test_model_change_within_a_boot_is_rejected():
    b = brain()
    feed(b, [0], model="m")
    with pytest.raises(IngestRejected):
        feed(b, [1], model="other")
    feed(b, [0], model="other", boot="b2")  # after a restart the engine may serve another model


def test_model_count_is_capped_by_evicting_the_least_recently_seen():
    b = brain()
    for i in range(MAX_MODELS):
        feed(b, [0], engine=f"e{i}", model=f"m{i}")
    feed(b, [0], engine="ex", model="one-too-many")
    assert len(b.model_names()) == MAX_MODELS and "one-too-many" in b.model_names()


def test_policy_version_bumps_only_on_content_change():
    b = brain(interval_s=2.0)
    feed(b, range(20), per_step=1)
    p1 = b.policy_for("m", SPEC, 1000.0, "e1")
    p2 = b.policy_for("m", SPEC, 1000.5, "e1")  # cached decision
    p3 = b.policy_for("m", SPEC, 1010.0, "e1")  # recomputed, same content
    assert p1.version == p2.version == p3.version
    from specctl_vllm.controller.core.overrides import Override

    b.set_overrides([Override("code", off=True, reason="incident", actor="ops", created_at=1.0)])
    p4 = b.policy_for("m", SPEC, 1010.1, "e1")  # overrides apply fresh, without waiting for the interval
    assert p4.version > p3.version and p4.categories["code"].k == 0


def test_policy_is_tailored_to_the_engine():
    b = brain()
    feed(b, range(30))
    small = b.policy_for("m", SpecConfig(method="eagle3", k_max=2), 1000.0, "e1")
    big = b.policy_for("m", SpecConfig(method="eagle3", k_max=8), 1000.0, "e1")
    assert all(c.k <= 2 and c.adapt.k_max <= 2 for c in small.categories.values())
    assert big.categories["code"].k >= small.categories["code"].k
    assert big.categories["code"].method == METHOD_ENGINE
    off = b.policy_for("m", SpecConfig(method="off", k_max=0), 1000.0, "e1")
    assert all(c.k == 0 for c in off.categories.values()) and off.default.k == 0


def test_batch_size_of_the_asking_engine_matters():
    b = brain()
    feed(b, range(30), engine="small", per_step=1)
    feed(b, range(30), engine="big", per_step=128)
    small = b.policy_for("m", SPEC, 1000.0, "small").categories["code"]
    big = b.policy_for("m", SPEC, 1000.0, "big").categories["code"]
    assert small.k > 0 and big.k == 0


def test_probing_lets_a_category_recover():
    """A category at k=0 keeps receiving probe evidence; when its acceptance rises it comes back."""
    b = brain()
    bad, good = [0.05] * 8, [0.95] * 8
    t = 1000.0
    for s in range(40):
        b.ingest(batch([step([cat_step("x", 10, bad)])], s), t)
        t += 1
    assert b.policy_for("m", SPEC, t, "e1").categories["x"].k == 0
    pol = b.policy_for("m", SPEC, t, "e1").categories["x"]
    assert pol.probe_rate > 0 and pol.probe_k >= 1
    for s in range(40, 400):  # only probe-sized evidence (k=1) arrives, now highly accepted
        b.ingest(batch([step([cat_step("x", 1, good, k=1)], depth=1)], s), t)
        t += 1
    assert b.policy_for("m", SPEC, t + 10, "e1").categories["x"].k > 0


def test_views_carry_the_numbers_behind_the_decision():
    b = brain()
    feed(b, range(50), per_step=5)
    v = b.category("code", 1000.0)
    d = v.to_dict()
    json.dumps(d)
    assert d["entropy"]["class"] == "low" and d["entropy"]["thresholds"]["low_below_bits"] == 0.5
    assert d["positions"][0]["ci_low"] < d["positions"][0]["beta"] < d["positions"][0]["ci_high"]
    assert d["decision"]["k"] > 0 and d["decision"]["goodput_table"]
    assert b.category("chat", 1000.0, model="m").entropy["class"] == "high"
    assert b.category("nope", 1000.0) is None
    assert json.dumps([e.to_dict() for e in b.engines(1000.0)])


def test_metrics_reconcile_with_the_histograms():
    b = brain()
    feed(b, range(10), per_step=100)
    m = b.metrics(1000.0)
    code = next(r for r in m.methods if r.category == "code" and not r.counterfactual)
    assert code.drafts == 1000 and code.draft_tokens == 4000
    assert code.accepted_tokens == sum(j * c for j, c in enumerate(code.accepted_length_counts))
    assert code.accepted_per_pos[0] == sum(code.accepted_length_counts[1:])
    cat = next(c for c in m.categories if c.category == "code")
    assert cat.committed_tokens == cat.request_steps + code.accepted_tokens
    assert cat.spec_off_request_steps == 0 and cat.current_k is not None
    assert {(mm, me): r for mm, me, r in m.draft_cost_ratio}[("m", "eagle3")] > 0


def test_overrides_pin_and_expire():
    from specctl_vllm.controller.core.overrides import Override

    b = brain()
    feed(b, range(30))
    b.set_overrides([Override("code", k=2, expires_at=1100.0, reason="test", actor="alice", created_at=1.0),
                     Override("chat", method="ngram", created_at=1.0),
                     Override("newcat", off=True, created_at=1.0)])
    p = b.policy_for("m", SPEC, 1000.0, "e1")
    assert (p.categories["code"].k, p.categories["code"].source) == (2, "override")
    assert p.categories["code"].adapt.k_min == p.categories["code"].adapt.k_max == 2
    assert "alice" in p.categories["code"].reason
    assert "not available" in p.categories["chat"].reason  # this engine has no n-gram drafter
    assert p.categories["newcat"].k == 0
    m = b.metrics(1000.0)
    assert ("code", "k") in m.overrides and ("newcat", "off") in m.overrides
    later = b.policy_for("m", SPEC, 1100.0, "e1")  # expired exactly at 1100
    assert later.categories["code"].source != "override"
    assert ("code", "k") not in b.metrics(1100.0).overrides


def test_dump_load_roundtrip():
    b = brain()
    feed(b, range(20), per_step=3)
    b.record_rejected(None)
    p = b.policy_for("m", SPEC, 1000.0, "e1")
    data = json.loads(json.dumps(b.dump()))
    b2 = Brain.load(data, config())
    assert json.dumps(b2.dump(), sort_keys=True) == json.dumps(data, sort_keys=True)
    p2 = b2.policy_for("m", SPEC, 1000.0, "e1")
    assert p2.categories == p.categories
    assert p2.version > p.version  # versions stay monotonic across restarts
    assert feed(b2, [19])[0].outcome == "duplicate"  # dedup state survives too


@pytest.mark.parametrize(
    "data",
    [None, [], {}, {"format": "specctl-brain", "version": 999},
     {"format": "specctl-brain", "version": 1, "models": {"m": {"categories": {"c": {"methods": {"x": {}}}}}}},
     {"format": "specctl-brain", "version": 1, "models": "garbage", "engines": {"e": {"nope": 1}}}],
)
def test_load_tolerates_bad_snapshots(data):
    b = Brain.load(data, config())
    feed(b, [0])
    assert b.policy_for("m", SPEC, 1000.0, "e1").version >= 1


def test_load_keeps_the_good_parts():
    b = brain()
    feed(b, range(5))
    data = b.dump()
    data["models"]["m"]["categories"]["chat"]["methods"]["eagle3"]["reached"] = ["bad"]
    b2 = Brain.load(data, config())
    assert {v.category for v in b2.categories(1000.0)} == {"code"}


def test_counterfactual_evidence_reaches_the_policy():
    b = brain()
    spec = SpecConfig(method="eagle3", k_max=4, model_free_methods=["ngram"])
    cats = [cat_step("edit", 10, [0.3] * 8, cf={"ngram": [0.95] * 8})]
    for s in range(40):
        b.ingest(batch([step(cats)], s, spec=spec), 1000.0 + s)
    p = b.policy_for("m", spec, 1040.0, "e1")
    assert p.categories["edit"].method == "ngram"
    v = b.category("edit", 1040.0).to_dict()
    ngram = next(mv for mv in v["methods"] if mv["method"] == "ngram")
    assert ngram["counterfactual"] is True and ngram["model_free"] is True
    m = b.metrics(1040.0)
    assert any(r.method == "ngram" and r.counterfactual for r in m.methods)
    assert not any(r.method == "ngram" and not r.counterfactual for r in m.methods)


@pytest.mark.parametrize(("full_graphs", "band_collapsed"), [(False, False), (True, True)])
def test_an_engine_with_full_cuda_graphs_starts_without_adaptation_bands(full_graphs, band_collapsed):
    """Mixed-k steps run piecewise graphs there: the controller assumes the penalty until steps say otherwise."""
    spec = SPEC.model_copy(update={"full_cuda_graphs": full_graphs, "k_max": 7})
    b = brain()
    for seq in range(20):
        steps = [step([cat_step("code", 16, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3], k=7)], depth=7)] * 20
        b.ingest(batch(steps, seq, spec=spec), float(seq))
    rule = b.policy_for("m", spec, 20.0, "e1").categories["code"]
    assert rule.k > 0
    assert (rule.adapt.k_min == rule.adapt.k_max == rule.k) is band_collapsed, rule


def test_decision_periods_differ_per_engine_and_stay_near_the_interval():
    from specctl_vllm.controller.core.stages.decide import key as _key
    from specctl_vllm.controller.core.stages.decide import refresh_interval
    periods = [refresh_interval(_key("m", SPEC, f"engine-{i}"), 2.0) for i in range(64)]
    assert all(1.5 <= p < 2.5 for p in periods)
    assert len({round(p, 6) for p in periods}) == 64  # no two engines share a period
    assert max(periods) - min(periods) > 0.5  # spread over most of the band
    assert refresh_interval(_key("m", SPEC, "engine-0"), 2.0) == periods[0]  # stable for one engine


def test_a_decision_is_kept_until_its_own_period_runs_out():
    from specctl_vllm.controller.core.stages.decide import key as _key
    from specctl_vllm.controller.core.stages.decide import refresh_interval
    b = brain()
    b.ingest(batch([step([cat_step("code", 4, [0.8] * 4)])] * 20, 0), 0.0)
    period = refresh_interval(_key("m", SPEC, "e1"), b.config.policy.interval_s)
    first = b.policy_for("m", SPEC, 1.0, "e1")
    b.ingest(batch([step([cat_step("code", 4, [0.05] * 4)])] * 400, 1), 1.0 + period * 0.5)
    assert b.policy_for("m", SPEC, 1.0 + period * 0.99, "e1").version == first.version  # cached
    later = b.policy_for("m", SPEC, 1.0 + period * 1.01, "e1")
    assert later.categories["code"].k < first.categories["code"].k  # recomputed on the new evidence


NGRAM_SPEC = SpecConfig(method="ngram", k_max=8, model_free_methods=["suffix"])


@pytest.mark.parametrize(("drafting", "suffix_hits"), [(1, 2), (5, 10), (10, 20)])
def test_match_rates_are_learned_per_drafter_and_priced(drafting, suffix_hits):
    """10 requests per step ask the engine's n-gram drafter and ``drafting`` of them draft; the suffix drafter
    is tried 20 times and matches ``suffix_hits``: both rates reach the views and the policy's E(k)."""
    b = brain("cpu")
    good = [0.9] * 8
    for s in range(60):
        cs = CategoryStep(category="prose", method="ngram", requests=10, hists=[hist_of(good, 8, drafting)],
                          counterfactual={"suffix": [hist_of(good, 8, suffix_hits)]},
                          counterfactual_attempts={"suffix": 20})
        b.ingest(batch([step([cs], wall_s=0.08)], s, spec=NGRAM_SPEC), 1000.0 + s * 0.1)
    view = b.category("prose", 1006.0).to_dict()
    rates = {m["method"]: m["match_rate"] for m in view["methods"]}
    assert rates["ngram"] == pytest.approx(drafting / 10, abs=0.01)
    assert rates["suffix"] == pytest.approx(suffix_hits / 20, abs=0.01)
    d = view["decision"]
    if d["k"] > 0:
        m = rates[d["method"]]
        e_drafted = 1 + sum(0.9 ** i for i in range(1, d["k"] + 1))  # E(k) of the drafts that happened
        assert d["expected_committed"] <= 1 + m * (e_drafted - 1) + 0.05
        if m < 0.99:
            assert "match rate" in d["reason"]


def hist_of(betas, k, n):
    from tests.unit.core.factories import hist

    return hist(betas, k, n)


def test_match_rates_are_exported_for_model_free_drafters_only():
    b = brain("cpu")
    for s in range(20):
        cs = CategoryStep(category="prose", method="ngram", requests=10, hists=[hist_of([0.9] * 8, 8, 2)],
                          counterfactual={"suffix": [hist_of([0.9] * 8, 8, 5)]},
                          counterfactual_attempts={"suffix": 20})
        b.ingest(batch([step([cs], wall_s=0.08)], s, spec=NGRAM_SPEC), 1000.0 + s * 0.1)
    b.ingest(batch([step([cat_step("code", 4, CODE)])], 0, engine="e2"), 1002.0)  # eagle3: drafts every step
    rates = {(c, m): r for _, c, m, r in b.metrics(1003.0).match_rates}
    assert set(rates) == {("prose", "ngram"), ("prose", "suffix")}
    assert rates[("prose", "ngram")] == pytest.approx(0.2, abs=0.02)
    assert rates[("prose", "suffix")] == pytest.approx(0.25, abs=0.02)
