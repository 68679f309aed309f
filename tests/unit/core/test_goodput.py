"""Goodput policy: table-driven over batch sizes, evidence, hysteresis, probing, methods."""

import pytest

from specctl_vllm.controller.core.config import PolicySettings
from specctl_vllm.controller.core.learn.estimator import expected_committed
from specctl_vllm.controller.core.policy import baseline, goodput
from specctl_vllm.controller.core.policy.types import CategoryInput, Choice, MethodProfile, PolicySnapshot
from specctl_vllm.kernel.cost import CPU, H200, PRESETS

CFG = PolicySettings(cost_preset="h200")


def prof(method="eagle3", beta=0.8, evidence=10_000.0, cf=False, k=8):
    betas = tuple([beta] * k) if isinstance(beta, float) else tuple(beta)
    return MethodProfile(method, betas, evidence, cf, method in ("ngram", "suffix"))


def snap(cats, batch, cost=H200, k_max=4, engine="eagle3", methods=None, pooled=None, prev_default=None):
    cats = tuple(CategoryInput(*c) if isinstance(c, tuple) else c for c in cats)
    if methods is None:
        methods = (engine,) if engine != "off" else ()
    return PolicySnapshot(cats, tuple(pooled or ()), float(batch), 0.0, cost, k_max, engine, tuple(methods),
                          prev_default)


def one(beta, batch, **kw):
    return goodput.decide(snap([("c", float(batch), (prof(beta=beta),))], batch, **kw), CFG).by_name()["c"]


@pytest.mark.parametrize("batch, spec_on", [(1, True), (4, True), (16, True), (256, False)])
def test_same_acceptance_flips_with_batch_size_on_h200(batch, spec_on):
    d = one(0.8, batch)
    assert (d.k > 0) == spec_on, d.reason


@pytest.mark.parametrize("beta, batch, k", [(0.95, 1, 4), (0.05, 1, 0)])
def test_extremes(beta, batch, k):
    assert one(beta, batch).k == k


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("batch", [1, 8, 64, 256])
@pytest.mark.parametrize("betas", [(0.9, 0.2), (0.5, 0.5), (0.3, 0.8), (0.75, 0.1)])
def test_never_below_plain_under_the_model(preset, batch, betas):
    cats = [("a", batch / 2, (prof(beta=betas[0]), prof("ngram", betas[1], cf=True))),
            ("b", batch / 2, (prof(beta=betas[1]),))]
    d = goodput.decide(snap(cats, batch, cost=PRESETS[preset], methods=("eagle3", "ngram")), CFG)
    assert d.goodput >= d.plain_goodput * (1 - 1e-9)
    for c in d.categories:
        assert 0 <= c.k <= 4


def test_optimum_matches_brute_force_for_one_category():
    beta = (0.8, 0.7, 0.6, 0.5)
    for batch in (1, 32, 128):
        d = one(beta, batch)
        n = float(batch)
        e = expected_committed(beta)
        g = [n * e[k] / H200.step_time(n, n * (1 + k), k) for k in range(5)]
        assert d.k == max(range(5), key=lambda k: g[k])


def test_categories_get_their_own_k():
    cats = [("code", 1.0, (prof(beta=0.8),)), ("chat", 1.0, (prof(beta=0.25),))]
    d = goodput.decide(snap(cats, 2), CFG).by_name()
    assert d["code"].k > d["chat"].k
    assert d["code"].speedup > 1.0


def _best_k_at(beta: float, batch: float, cost, k_max: int, free: bool) -> int:
    """Brute force: the k >= 1 with the best goodput of a batch all drafting at conditional acceptance beta."""
    e = expected_committed((beta,) * k_max)
    return max(range(1, k_max + 1), key=lambda k: batch * e[k] / cost.step_time(
        batch, batch * (1 + k), 0 if free else k, batch * k if free else 0))


@pytest.mark.parametrize("preset, engine, k_max, batch", [
    ("h200", "eagle3", 4, 1), ("h200", "eagle3", 8, 16), ("h200", "eagle3", 8, 64), ("cpu", "ngram", 8, 4),
    ("cpu", "ngram", 8, 16), ("cpu", "ngram", 4, 1),
])
def test_cold_start_runs_the_presets_best_k_for_the_prior_acceptance(preset, engine, k_max, batch):
    """Without pooled evidence a category runs the engine's drafter at the k >= 1 the cost model prices best
    for the prior acceptance at this batch (not the engine's k_max: at batch 64 on the H200 that is k = 1)."""
    cost = PRESETS[preset]
    d = goodput.decide(snap([("new", float(batch), ())], batch, cost=cost, k_max=k_max, engine=engine),
                       PolicySettings(cost_preset=preset))
    new = d.by_name()["new"]
    want = _best_k_at(0.5, float(batch), cost, k_max, engine == "ngram")
    assert (new.k, new.method, new.source) == (want, engine, "default")
    assert (d.default.k, d.default.method) == (want, engine)
    assert "insufficient evidence" in new.reason and "cold start" in new.reason


def test_cold_start_prices_the_few_drafts_seen_and_the_prior():
    """The pool's posterior so far (prior shrunk toward 10 drafts at 0.05) is what the cold k is chosen for:
    fewer drafts than with the prior alone."""
    cats = [("new", 1.0, (prof(beta=0.05, evidence=10.0),))]
    cold = goodput.decide(snap(cats, 1), CFG).by_name()["new"].k
    low = goodput.decide(snap(cats, 1, pooled=[prof(beta=0.2, evidence=10.0)]), CFG).by_name()["new"]
    assert 1 <= low.k < cold <= 4 and low.source == "default"


@pytest.mark.parametrize("window, k_new", [(0.0, 0), (10.0, 1)])
def test_min_evidence_falls_back_to_the_pooled_decision_or_measures_quickly(window, k_new):
    """Below min evidence a category takes the pooled decision, or, when its own drafter can be measured
    within the exploration window, runs it (k >= 1, priced with the pooled profile) to get evidence."""
    cfg = PolicySettings(cost_preset="h200", explore_window_s=window)
    cats = [("new", 1.0, (prof(beta=0.9, evidence=10.0),))]
    pooled = [prof(beta=0.05, evidence=5000.0)]
    d = goodput.decide(snap(cats, 1, pooled=pooled), cfg)
    assert d.default.k == 0
    new = d.by_name()["new"]
    assert (new.k, new.source) == (k_new, "default")


def test_a_category_on_a_free_drafter_gets_measured_on_the_engine_drafter():
    cats = [("edit", 4.0, (prof("eagle3", 0.9, evidence=20.0), prof("ngram", 0.8, cf=True)))]
    pooled = [prof("eagle3", 0.6, evidence=5000.0), prof("ngram", 0.5, cf=True)]
    d = goodput.decide(snap(cats, 4, methods=("eagle3", "ngram"), pooled=pooled), CFG).by_name()["edit"]
    assert d.method == "eagle3" and d.k >= 1 and "measuring" in d.reason


@pytest.mark.parametrize(
    "hysteresis, previous, expect_kept",
    [
        (0.0, Choice(3, "eagle3"), False),
        (0.5, Choice(3, "eagle3"), True),
        (0.5, Choice(2, "eagle3"), True),
        (0.5, Choice(0, "off"), False),  # a huge gain moves even with a high threshold
        (0.5, None, False),
    ],
)
def test_hysteresis(hysteresis, previous, expect_kept):
    cfg = PolicySettings(cost_preset="h200", hysteresis=hysteresis)
    beta = (0.9, 0.9, 0.9, 0.9)
    free = goodput.decide(snap([CategoryInput("c", 1.0, (prof(beta=beta),))], 1), cfg).by_name()["c"]
    d = goodput.decide(snap([CategoryInput("c", 1.0, (prof(beta=beta),), previous)], 1), cfg).by_name()["c"]
    if expect_kept:
        assert d.k == previous.k and "kept previous" in d.reason
    else:
        assert d.k == free.k


def test_probing_at_k0_is_bounded():
    d = goodput.decide(snap([("c", 32.0, (prof(beta=0.6, evidence=250.0),))], 32), CFG).by_name()["c"]
    assert d.k == 0 and d.source == "probe"
    assert 0 < d.probe_rate <= CFG.probe_rate and d.probe_k == CFG.probe_k and d.probe_method == "eagle3"


@pytest.mark.parametrize("evidence, budget", [(250.0, "probe_budget"), (1e6, "probe_idle_budget")])
def test_probing_spends_its_budget_only_while_it_can_change_the_decision(evidence, budget):
    """Uncertain acceptance near the break-even point: probe at the full budget. Certain acceptance far
    from it: only the keep-alive budget."""
    cats = [("c", 32.0, (prof(beta=0.6, evidence=evidence),))]
    wide = PolicySettings(cost_preset="h200", probe_budget=0.05, probe_idle_budget=0.0005, probe_rate=0.25)
    d = goodput.decide(snap(cats, 32), wide).by_name()["c"]
    assert d.k == 0
    only_idle = PolicySettings(cost_preset="h200", probe_budget=0.0005, probe_idle_budget=0.0005,
                               probe_rate=0.25)
    idle = goodput.decide(snap(cats, 32), only_idle).by_name()["c"]
    if budget == "probe_budget":
        assert d.probe_rate > idle.probe_rate and d.probe_rate > 0
    else:
        assert d.probe_rate == idle.probe_rate


@pytest.mark.parametrize("budget", [0.0001, 0.001, 0.01])
def test_probe_rate_respects_the_cost_budget(budget):
    cfg = PolicySettings(cost_preset="h200", probe_budget=budget)
    cats = [("big", 200.0, (prof(beta=0.1),)), ("small", 56.0, (prof(beta=0.1),))]
    d = goodput.decide(snap(cats, 256), cfg).by_name()["small"]
    assert d.k == 0
    assert d.probe_rate <= cfg.probe_rate
    tighter = PolicySettings(cost_preset="h200", probe_budget=budget / 10)
    d2 = goodput.decide(snap(cats, 256), tighter).by_name()["small"]
    assert d2.probe_rate <= d.probe_rate


def test_no_probe_when_every_drafter_is_scored_counterfactually():
    cats = [("chat", 8.0, (prof("ngram", 0.05, cf=True),))]
    d = goodput.decide(snap(cats, 8, cost=CPU, engine="ngram", methods=("ngram",)), CFG).by_name()["chat"]
    assert d.k == 0 and d.probe_rate == 0.0 and d.source == "policy"


def test_method_choice_uses_counterfactual_stats():
    cats = [("edit", 4.0, (prof("eagle3", 0.3), prof("ngram", 0.9, cf=True)))]
    d = goodput.decide(snap(cats, 4, methods=("eagle3", "ngram")), CFG).by_name()["edit"]
    assert d.method == "ngram" and d.k > 0
    assert d.best_method == "ngram"


def test_best_method_is_published_even_if_this_engine_cannot_run_it():
    cats = [("edit", 4.0, (prof("eagle3", 0.3), prof("suffix", 0.95, cf=True)))]
    d = goodput.decide(snap(cats, 4, methods=("eagle3",)), CFG).by_name()["edit"]
    assert d.method in ("eagle3", "off")
    assert d.best_method == "suffix" and d.best_method_speedup > 1


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_adapt_band_holds_the_choice(batch):
    d = one((0.85, 0.8, 0.75, 0.7), batch)
    assert 0 <= d.adapt_k_min <= d.k <= d.adapt_k_max <= 4
    if d.k == 0:
        assert d.adapt_k_min == d.adapt_k_max == 0


def test_adapt_band_widens_with_tolerance():
    narrow = goodput.decide(snap([("c", 1.0, (prof(beta=0.8),))], 1),
                            PolicySettings(cost_preset="h200", adapt_tolerance=0.0)).by_name()["c"]
    wide = goodput.decide(snap([("c", 1.0, (prof(beta=0.8),))], 1),
                          PolicySettings(cost_preset="h200", adapt_tolerance=0.3)).by_name()["c"]
    assert narrow.adapt_k_min == narrow.adapt_k_max == narrow.k
    assert wide.adapt_k_max - wide.adapt_k_min > 0


def test_engine_without_speculation_gets_off_everywhere():
    d = goodput.decide(snap([("c", 1.0, (prof(beta=0.9),))], 1, k_max=0, engine="off"), CFG)
    assert d.by_name()["c"].k == 0 and d.default.k == 0 and d.by_name()["c"].probe_rate == 0


def test_goodput_table_rows():
    d = one(0.8, 1)
    ks = [r.k for r in d.table]
    assert ks == [0, 1, 2, 3, 4]
    best = max(d.table, key=lambda r: r.goodput)
    assert best.k == d.k
    assert d.table[0].speedup == pytest.approx(1.0)


def test_decide_is_deterministic_and_pure():
    s = snap([("a", 3.0, (prof(beta=0.7),)), ("b", 5.0, (prof(beta=0.3),))], 8)
    assert goodput.decide(s, CFG) == goodput.decide(s, CFG)


def test_baseline_is_the_engine_static_config():
    d = baseline.decide(snap([("a", 1.0, (prof(beta=0.1),))], 1), CFG)
    assert (d.by_name()["a"].k, d.by_name()["a"].method) == (4, "eagle3")


@pytest.mark.parametrize("batch, rho", [(64, 1.0), (96, 1.0), (64, 2.0)])
def test_prefill_that_grows_with_goodput_discourages_speculation(batch, rho):
    """With every finished request replaced, faster decoding brings more prefill into each step: pricing
    prefill as a fixed amount per step (what the current k shows) overrates speculation."""
    cats = (CategoryInput("c", float(batch), (prof(beta=0.8),)),)
    fixed = PolicySnapshot(cats, (), float(batch), rho * batch, H200, 4, "eagle3", ("eagle3",))
    scaling = PolicySnapshot(cats, (), float(batch), rho * batch, H200, 4, "eagle3", ("eagle3",),
                             extra_per_committed=rho)
    assert goodput.decide(scaling, CFG).by_name()["c"].k < goodput.decide(fixed, CFG).by_name()["c"].k


def test_bursty_prefill_costs_more_above_the_knee():
    cats = (CategoryInput("c", 128.0, (prof(beta=0.8),)),)
    smooth = PolicySnapshot(cats, (), 128.0, 300.0, H200, 4, "eagle3", ("eagle3",), extra_tokens_dist=((300.0, 1.0),))
    bursty = PolicySnapshot(cats, (), 128.0, 300.0, H200, 4, "eagle3", ("eagle3",),
                            extra_tokens_dist=((0.0, 0.5), (600.0, 0.5)))
    assert goodput.decide(bursty, CFG).plain_step_ms > goodput.decide(smooth, CFG).plain_step_ms


@pytest.mark.parametrize("batch, beta, previous_k", [(4, 0.75, 3), (8, 0.7, 2), (32, 0.7, 4)])
def test_categories_that_would_only_move_together_keep_their_decision(batch, beta, previous_k):
    """Two categories share the drafting pass: each alone looks worth moving, together the batch gains
    less than the hysteresis, so both keep their previous k (no flapping between near-equal optima)."""
    fresh = goodput.decide(snap([("a", batch / 2, (prof(beta=beta),)), ("b", batch / 2, (prof(beta=beta),))],
                                batch), CFG).by_name()
    assert fresh["a"].k != previous_k
    prev = Choice(previous_k, "eagle3")
    cats = [CategoryInput(n, batch / 2, (prof(beta=beta),), prev) for n in ("a", "b")]
    d = goodput.decide(snap(cats, batch), CFG).by_name()
    assert d["a"].k == d["b"].k == previous_k
    assert "move together" in d["a"].reason
    loose = goodput.decide(snap(cats, batch), PolicySettings(cost_preset="h200", hysteresis=0.0)).by_name()
    assert loose["a"].k == fresh["a"].k


def test_faster_categories_hold_fewer_slots():
    """Closed loop: a finished request is replaced from the same mix, so the committed-token demand per
    category (w_c) is fixed and a category decoding E_c tokens per step holds n * (w_c/E_c) / sum(w/E)
    slots. The decision's goodput must follow exactly that accounting."""
    cats = (CategoryInput("code", 1.0, (prof(beta=0.8),), None, 3.0),
            CategoryInput("chat", 1.0, (prof(beta=0.25),), None, 1.0))
    s = PolicySnapshot(cats, (), 2.0, 0.0, H200, 4, "eagle3", ("eagle3",))
    d = goodput.decide(s, CFG)
    by = d.by_name()
    e = {c: by[c].expected_committed for c in ("code", "chat")}
    w = {"code": 3.0, "chat": 1.0}
    slots = {c: w[c] / e[c] for c in w}
    n = {c: 2.0 * slots[c] / sum(slots.values()) for c in w}
    tokens = sum(n[c] * (1 + by[c].k) for c in w)
    p_depth = {c: n[c] / 2.0 for c in w}
    depth_cdf = [sum(p for c, p in p_depth.items() if by[c].k <= x) ** 2.0 for x in range(5)]
    t = (H200.base + H200.per_request * 2 + H200.per_token * tokens
         + (1 - depth_cdf[0]) * (H200.draft_fixed + H200.draft_fixed_per_request * 2)
         + sum(1 - depth_cdf[x] for x in range(4)) * (H200.draft_pass + H200.draft_pass_per_request * 2))
    assert d.goodput == pytest.approx(2.0 * sum(w.values()) / sum(slots.values()) / t, rel=1e-3)


def _with_factors(s: PolicySnapshot, factors) -> PolicySnapshot:
    from dataclasses import replace
    return replace(s, depth_factor=tuple(factors))


@pytest.mark.parametrize(
    ("beta", "batch", "factors", "check"),
    [
        # trimmed depths slower than the full one (piecewise vs full CUDA graph): the policy drafts k_max
        (0.85, 4, (1.0,) + (1.4,) * 6 + (1.0,), lambda d, d0: d.k == 7 and d0.k < 7),
        # "off" inside a draft-model engine still pays the drafter's catch-up pass: drafting pays sooner
        (0.15, 1, (2.0,) + (1.0,) * 7, lambda d, d0: d.k > 0 and d0.k == 0),
        # all ones: the same decision as without factors
        (0.85, 4, (1.0,) * 8, lambda d, d0: (d.k, d.method) == (d0.k, d0.method)),
    ],
)
def test_depth_factors_steer_the_choice(beta, batch, factors, check):
    base = snap([("c", float(batch), (prof(beta=beta),))], batch, k_max=7)
    d0 = goodput.decide(base, CFG).by_name()["c"]
    d = goodput.decide(_with_factors(base, factors), CFG).by_name()["c"]
    assert check(d, d0), (d, d0)


def test_plain_reference_carries_the_depth_zero_factor():
    base = snap([("c", 4.0, (prof(beta=0.05),))], 4, k_max=4)
    plain = goodput.decide(base, CFG).plain_goodput
    slowed = goodput.decide(_with_factors(base, (2.0, 1, 1, 1, 1)), CFG).plain_goodput
    assert slowed == pytest.approx(plain / 2, rel=1e-3)


@pytest.mark.parametrize(("penalty", "collapsed"), [(1.0, False), (1.02, False), (1.6, True)])
def test_a_mixed_k_penalty_collapses_the_adaptation_band(penalty, collapsed):
    from dataclasses import replace
    base = snap([("c", 16.0, (prof(beta=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)),))], 16, k_max=7)
    free = goodput.decide(base, CFG).by_name()["c"]
    d = goodput.decide(replace(base, mixed_penalty=penalty), CFG).by_name()["c"]
    assert free.adapt_k_min < free.adapt_k_max  # the case has a band to collapse
    band = (d.adapt_k_min, d.adapt_k_max)
    assert band == ((d.k, d.k) if collapsed else (free.adapt_k_min, free.adapt_k_max)), d


def test_a_mixed_k_penalty_pulls_two_categories_to_one_k():
    from dataclasses import replace
    cats = [("a", 2.0, (prof(beta=0.9),)), ("b", 2.0, (prof(beta=0.2),))]
    base = snap(cats, 4, k_max=4)
    free = goodput.decide(base, CFG).by_name()
    pinned = goodput.decide(replace(base, mixed_penalty=3.0), CFG).by_name()
    assert free["a"].k != free["b"].k  # without a penalty the two acceptances want different k
    assert pinned["a"].k == pinned["b"].k  # a mixed batch costing 3x: one k for the whole batch


@pytest.mark.parametrize("match", [1.0, 0.6, 0.3, 0.05])
@pytest.mark.parametrize("batch", [1, 8])
def test_match_rate_scales_the_gain_and_the_drafted_tokens(match, batch):
    """A model-free drafter that drafts on ``match`` of the request steps commits 1 + m (E(k) - 1) tokens per
    step and adds m k tokens to verify: both priced, on the CPU preset where every verified token costs."""
    betas = (0.9,) * 8
    p = MethodProfile("ngram", betas, 10_000.0, False, True, 10_000.0, match)
    s = snap([("c", float(batch), (p,))], batch, cost=CPU, k_max=8, engine="ngram")
    d = goodput.decide(s, CFG)
    c = d.by_name()["c"]
    e = expected_committed(betas)
    if c.k:
        assert c.expected_committed == pytest.approx(1 + match * (e[c.k] - 1), abs=1e-3)
        n = float(batch)
        t = CPU.step_time(n, n * (1 + match * c.k), 0, n * match * c.k)
        assert d.step_ms == pytest.approx(t * 1e3, rel=1e-3)
    # whatever the match rate, speculation that drafts rarely cannot look better than it is
    assert c.speedup <= 1 + match * (e[8] - 1) + 1e-9


def test_a_rarely_matching_drafter_loses_to_one_that_matches():
    """Same acceptance per draft: the drafter that drafts on more steps wins the category."""
    rare = MethodProfile("ngram", (0.95,) * 8, 10_000.0, False, True, 10_000.0, 0.05)
    often = MethodProfile("suffix", (0.8,) * 8, 10_000.0, True, True, 10_000.0, 0.6)
    s = snap([("c", 8.0, (rare, often))], 8, cost=CPU, k_max=8, engine="ngram", methods=("ngram", "suffix"))
    assert goodput.decide(s, CFG).by_name()["c"].method == "suffix"


def _cpu_mix(batch):
    """JSON that matches often and is accepted, prose that rarely matches, on the CPU preset (n-gram engine)."""
    json_ = MethodProfile("ngram", (0.9,) * 8, 10_000.0, False, True, 10_000.0, 0.6)
    prose = MethodProfile("ngram", (0.5,) * 8, 10_000.0, False, True, 10_000.0, 0.07)
    return snap([("json", batch / 2, (json_,)), ("prose", batch / 2, (prose,))], batch, cost=CPU, k_max=8,
                engine="ngram")


@pytest.mark.parametrize("floor", [0.0, 0.9, 1.0])
@pytest.mark.parametrize("batch", [1, 8, 32])
def test_category_floor_keeps_every_category_at_or_above_its_share_of_plain(floor, batch):
    d = goodput.decide(_cpu_mix(batch), PolicySettings(cost_preset="cpu", category_floor=floor))
    assert d.goodput >= d.plain_goodput * (1 - 1e-9)
    if floor > 0:
        assert min(c.speedup for c in d.categories) >= floor - 1e-6, [c.reason for c in d.categories]


@pytest.mark.parametrize("batch, binds", [(1, False), (8, True), (32, True)])
def test_category_floor_costs_batch_goodput_only_where_categories_share_steps(batch, binds):
    """At batch 1 no two requests share a step, so the floor changes nothing; at 8 it trims JSON's drafts."""
    free = goodput.decide(_cpu_mix(batch), PolicySettings(cost_preset="cpu", category_floor=0.0))
    floored = goodput.decide(_cpu_mix(batch), PolicySettings(cost_preset="cpu", category_floor=1.0))
    assert min(c.speedup for c in free.categories) < 1.0 or not binds
    if binds:
        assert floored.by_name()["json"].k < free.by_name()["json"].k
        assert floored.goodput < free.goodput
        assert "category floor binds" in floored.by_name()["json"].reason
    else:
        assert [c.k for c in floored.categories] == [c.k for c in free.categories]
