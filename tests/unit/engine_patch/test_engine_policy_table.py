"""Engine-side validation of policies, interning, expiry."""

from __future__ import annotations

import math

import pytest

from specctl_vllm.engine_patch.policy_table import (
    EngineSpec,
    PolicyHolder,
    build_table,
    next_k_bound,
    resolve,
    static_table,
)
from specctl_vllm.kernel import protocol
from specctl_vllm.kernel.adapt import RequestK

NGRAM = EngineSpec(method="ngram", k_max=4, model_free_methods=("suffix",))
ASYNC_EAGLE = EngineSpec(method="eagle3", k_max=3)
NO_SPEC = EngineSpec(method="off", k_max=0)


def cp(**kw) -> protocol.CategoryPolicy:
    return protocol.CategoryPolicy(**kw)


def adapt(k_min: int, k_max: int, **kw) -> protocol.AdaptRule:
    return protocol.AdaptRule(k_min=k_min, k_max=k_max, **kw)


@pytest.mark.parametrize(
    ("engine", "policy", "k", "method", "model_free", "bounds"),
    [
        (NGRAM, cp(k=2), 2, "ngram", False, (2, 2)),  # default rule: fixed k
        (NGRAM, cp(k=9), 4, "ngram", False, (4, 4)),  # clamped to the engine's k
        (NGRAM, cp(k=3, method="engine"), 3, "ngram", False, (3, 3)),
        (NGRAM, cp(k=3, method="ngram"), 3, "ngram", False, (3, 3)),  # the engine's own drafter by name
        (NGRAM, cp(k=3, method="suffix"), 3, "suffix", True, (3, 3)),  # model-free substitute
        (NGRAM, cp(k=3, method="eagle3"), 3, "ngram", False, (3, 3)),  # unavailable -> engine
        (NGRAM, cp(k=3, method="off"), 0, "off", False, (0, 0)),
        (NGRAM, cp(k=0), 0, "off", False, (0, 0)),
        (NGRAM, cp(k=2, adapt=adapt(0, 8)), 2, "ngram", False, (0, 4)),
        (NGRAM, cp(k=0, adapt=adapt(1, 3)), 1, "ngram", False, (1, 3)),  # k lifted into the rule's bounds
        (ASYNC_EAGLE, cp(k=2, method="suffix"), 2, "eagle3", False, (2, 2)),  # no substitution under async
        (NO_SPEC, cp(k=4), 0, "off", False, (0, 0)),
    ],
)
def test_resolve(engine, policy, k, method, model_free, bounds) -> None:
    rule = resolve(policy, engine)
    assert (rule.k, rule.method, rule.model_free, (rule.adapt.k_min, rule.adapt.k_max)) == (k, method, model_free, bounds)


@pytest.mark.parametrize(
    ("policy", "probe"),
    [
        (cp(k=0, probe_rate=0.1, probe_k=2), (2, "ngram")),
        (cp(k=0, method="off", probe_rate=0.1, probe_k=9), (4, "ngram")),  # off: probes use the engine drafter
        (cp(k=0, method="suffix", probe_rate=0.1, probe_k=2), (2, "suffix")),
        (cp(k=2, probe_rate=0.1, probe_k=2), None),  # probes only while k = 0
        (cp(k=0, probe_rate=0.1, probe_k=0), None),
        (cp(k=0, probe_rate=0.0, probe_k=2), None),
    ],
)
def test_probe(policy, probe) -> None:
    rule = resolve(policy, NGRAM)
    if probe is None:
        assert rule.probe is None and rule.probe_rate == 0.0
    else:
        assert (rule.probe.k, rule.probe.method) == probe and rule.probe_rate == policy.probe_rate


def policy(version: int, ttl: float = 2.0, **categories: protocol.CategoryPolicy) -> protocol.Policy:
    return protocol.Policy(version=version, issued_at=0.0, ttl_s=ttl, default=cp(k=4), categories=categories)


def test_static_table_is_the_engine_config() -> None:
    table = static_table(NGRAM)
    assert table.is_static and table.expires_at == math.inf
    assert (table.rule_for("anything").k, table.rule_for("anything").method) == (4, "ngram")
    assert static_table(NO_SPEC).default.method == "off"


def test_build_table_reuses_unchanged_rules_and_generation() -> None:
    first = build_table(policy(1, json=cp(k=1)), NGRAM, received_at=10.0)
    same = build_table(policy(1, json=cp(k=1)), NGRAM, received_at=10.1, previous=first)
    assert same.rule_for("json") is first.rule_for("json")
    assert same.generation == first.generation and same.expires_at == pytest.approx(12.1)
    changed = build_table(policy(2, json=cp(k=2)), NGRAM, received_at=11.0, previous=same)
    assert changed.generation != same.generation
    assert changed.rules_generation != same.rules_generation
    assert changed.rule_for("json").k == 2
    assert changed.default is first.default  # the default did not change: same object


def test_a_new_version_with_the_same_rules_keeps_the_rules_generation_only() -> None:
    """The controller's learning moves the curves or cells under a new version: the width rule must see a new
    table (generation), the requests' resolved rules stay valid (rules generation)."""
    first = build_table(policy(1, json=cp(k=1)), NGRAM, received_at=10.0)
    repriced = build_table(policy(2, json=cp(k=1)), NGRAM, received_at=10.1, previous=first)
    assert repriced.rule_for("json") is first.rule_for("json")
    assert repriced.rules_generation == first.rules_generation
    assert repriced.generation != first.generation
    joined = build_table(policy(3, json=cp(k=1), code=cp(k=1)), NGRAM, received_at=10.2, previous=repriced)
    assert joined.rules_generation != repriced.rules_generation  # a category more is a rule more
    assert static_table(NGRAM).rules_generation not in (first.rules_generation, joined.rules_generation)


def test_holder_expiry_falls_back_and_reattaches() -> None:
    holder = PolicyHolder(NGRAM)
    assert holder.current(0.0).is_static and holder.applied_version(0.0) is None
    holder.install(policy(7, ttl=1.0, json=cp(k=1)), now=100.0)
    assert holder.current(100.5).version == 7
    assert holder.current(101.0).is_static  # expired at exactly received + ttl
    holder.install(policy(8, ttl=1.0), now=200.0)
    assert holder.applied_version(200.1) == 8


@pytest.mark.parametrize(
    ("state", "rule", "bound"),
    [
        (RequestK(k=2), adapt(2, 2), 2),
        (RequestK(k=2, full_streak=1), adapt(0, 4, climb_after=2), 3),
        (RequestK(k=2, full_streak=0), adapt(0, 4, climb_after=2), 2),
        (RequestK(k=4, full_streak=5), adapt(0, 4), 4),
        (RequestK(k=0, idle_steps=15), adapt(0, 4), 1),
        (RequestK(k=0, idle_steps=3), adapt(0, 4), 0),
        (RequestK(k=0, idle_steps=15), adapt(2, 4), 2),
    ],
)
def test_next_k_bound_covers_next_k(state: RequestK, rule: protocol.AdaptRule, bound: int) -> None:
    from specctl_vllm.kernel.adapt import next_k

    r = resolve(cp(k=state.k, adapt=rule), EngineSpec(method="ngram", k_max=8))
    assert next_k_bound(state, r) == bound
    # Whatever the step brings, the request's next k never exceeds the bound.
    for drafted in range(state.k + 1):
        for accepted in range(drafted + 1):
            probe = RequestK(k=state.k, full_streak=state.full_streak, reject_streak=state.reject_streak,
                             idle_steps=state.idle_steps)
            assert next_k(probe, drafted, accepted, r.adapt).k <= bound
