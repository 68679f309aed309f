"""The simulator benchmark's own machinery (bench/sim): traces, engine accounting, baselines, telemetry."""

import numpy as np
import pytest

from bench.sim import oracle
from bench.sim.engine import SimEngine
from bench.sim.profiles import builtin_mixed, parse, trace_from_telemetry
from bench.sim.run import run_one
from bench.sim.strategies import BatchTable, FixedK, NoSpec, SglangTiers, Specctl
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.kernel.cost import H200


def sure_trace(beta: float = 1.0) -> dict:
    return {"format": "specctl-sim-trace/1", "name": "t", "prompt_tokens": 16,
            "engine": {"method": "draft_model", "k_max": 4, "model_free_methods": ["ngram"]},
            "categories": [{"name": "a", "share": 1.0, "output_tokens": 10_000, "acceptance": {"engine": [beta]}}]}


def test_trace_parsing_pads_and_normalises():
    t = parse(builtin_mixed())
    assert sum(c.share for c in t.categories) == pytest.approx(1.0)
    assert all(len(v) == t.k_max for c in t.categories for v in c.betas.values())
    with pytest.raises(ValueError):
        parse({**sure_trace(), "format": "other"})


@pytest.mark.parametrize("k", [1, 3, 4])
def test_engine_commits_k_plus_one_when_everything_is_accepted(k):
    eng = SimEngine(parse(sure_trace(1.0)), H200, batch=4, seed=1, noise=0.0)
    res = eng.step(np.full(4, k), np.zeros(4, dtype=int))
    assert (res.accepted[res.decoding] == k).all()
    assert (res.committed[res.decoding] == k + 1).all()
    assert res.depth == k and res.draft_tokens == 4 * k
    assert res.wall_s == pytest.approx(H200.step_time(4, res.scheduled_tokens, k, 0))


def test_engine_never_accepts_with_zero_acceptance_and_scores_free_drafters():
    eng = SimEngine(parse(sure_trace(0.0)), H200, batch=8, seed=2, noise=0.0)
    res = eng.step(np.full(8, 4), np.zeros(8, dtype=int))
    assert res.accepted.sum() == 0
    assert (res.cf_accepted[res.decoding] >= 0).all()  # n-gram scored on every decoding request


def test_same_seed_same_requests_for_every_strategy():
    """Request i has the same category whatever the strategy did before (common random numbers)."""
    t = parse(builtin_mixed())
    seen = []
    for k in (0, 4):
        eng = SimEngine(t, H200, 16, seed=5)
        cats = {}
        for _ in range(300):
            eng.step(np.full(16, k), np.zeros(16, dtype=int))
            cats.update(zip(eng.admitted.tolist(), eng.cat.tolist()))
        seen.append(cats)
    common = set(seen[0]) & set(seen[1])
    assert len(common) > 16
    assert all(seen[0][i] == seen[1][i] for i in common)


def test_sglang_tiers_move_with_the_accepted_length():
    t = parse(sure_trace(1.0))
    s = SglangTiers(t.k_max)
    eng = SimEngine(t, H200, 4, seed=3, noise=0.0)
    for _ in range(40):
        k, m = s.choose(eng, 0.0)
        s.observe(eng.step(k, m), 0.0)
    assert s.k == max(s.tiers)
    low = SglangTiers(t.k_max)
    eng0 = SimEngine(parse(sure_trace(0.0)), H200, 4, seed=3, noise=0.0)
    for _ in range(40):
        k, m = low.choose(eng0, 0.0)
        low.observe(eng0.step(k, m), 0.0)
    assert low.k == min(low.tiers)


def test_batch_table_lookup():
    table = BatchTable([(1, 4, 3), (5, 64, 1), (65, 1024, 0)])
    assert [table.k_for(b) for b in (1, 4, 5, 64, 65, 256)] == [3, 3, 1, 1, 0, 0]


def test_specctl_in_the_loop_emits_valid_telemetry_and_learns():
    t = parse(builtin_mixed())
    cfg = BrainConfig(LearnerSettings(), PolicySettings(cost_preset="h200"))
    s = Specctl(t, cfg, seed=4)
    r = run_one(t, H200, 8, s, requests=400, warmup=0.2, seed=4)
    assert s.validated and s.seq > 0 and r["goodput"] > 0
    views = {v.category: v for v in s.brain.categories(r["sim_seconds"])}
    assert set(views) == {c.name for c in t.categories}
    assert views["code"].entropy["bits"] < views["conversation"].entropy["bits"]
    assert views["edit"].entropy["class"] == "low"
    assert s.policy.categories["conversation"].k <= s.policy.categories["code"].k


def test_oracle_ranks_off_first_when_drafts_never_match():
    t = parse(sure_trace(0.0))
    exp = oracle.category_expectations(t, samples=200)
    ((_g, choice),) = oracle.best_static(t, exp, H200, 8, top=1)
    assert choice == [(0, 0)]


def test_trace_from_recorded_telemetry():
    t = parse(builtin_mixed())
    s = Specctl(t, BrainConfig(LearnerSettings(), PolicySettings(cost_preset="h200")), seed=6)
    run_one(t, H200, 4, s, requests=40, warmup=0.0, seed=6)
    step = s._record(SimEngine(t, H200, 4, seed=6).step(np.full(4, 2), np.zeros(4, dtype=int)), 1.0)
    from specctl_vllm.kernel.protocol import TelemetryBatch

    line = TelemetryBatch(engine_id="e", boot_id="b", model_name="m", seq=0, sent_at=0.0, spec=s.spec,
                          steps=[step]).model_dump_json()
    trace = parse(trace_from_telemetry([line]))
    assert {c.name for c in trace.categories} <= {c.name for c in t.categories}
    assert trace.k_max == t.k_max


def test_fixed_and_nospec_choose_shapes():
    eng = SimEngine(parse(builtin_mixed()), H200, 5, seed=1)
    for s, k in ((NoSpec(), 0), (FixedK(3), 3)):
        ks, ms = s.choose(eng, 0.0)
        assert ks.shape == (5,) and (ks == k).all() and (ms == 0).all()
