"""The policy served to an engine is reused while nothing it is built from changed, rebuilt when something did.

Rebuilding is skipped only when the decision, the active overrides and the engine's shape are the very ones
the served policy came from; these tests check that every change of those still reaches the engine.
"""

import pytest

from specctl_vllm.controller.core.overrides import Override
from specctl_vllm.kernel.protocol import SpecConfig
from tests.unit.core.factories import SPEC, brain
from tests.unit.core.test_brain import feed

T0 = 1000.0


def learned(**policy):
    b = brain(interval_s=2.0, **policy)
    feed(b, range(20), now=T0)
    return b


def pin_code(b, now):
    b.set_overrides([Override("code", k=1, reason="incident", actor="ops", created_at=1.0)])


def pin_code_briefly(b, now):
    b.set_overrides([Override("code", k=1, expires_at=now + 1.0, created_at=1.0)])


def unpin_everything(b, now):
    b.set_overrides([])


def nothing(b, now):
    pass


@pytest.mark.parametrize(
    ("before", "change", "at", "new_version", "code_source"),
    [
        # same decision (cached), same overrides: the very same policy object, no new version
        pytest.param(nothing, nothing, T0 + 0.5, False, None, id="nothing changed"),
        # an override is applied at once, without waiting for the decision interval
        pytest.param(nothing, pin_code, T0 + 0.5, True, "override", id="override set"),
        pytest.param(pin_code, unpin_everything, T0 + 0.5, True, "not override", id="override cleared"),
        # expiry changes the active overrides although nobody called set_overrides (and the decision is
        # still the cached one: interval_s is 2 s)
        pytest.param(pin_code_briefly, nothing, T0 + 1.5, True, "not override", id="override expired"),
        pytest.param(pin_code_briefly, nothing, T0 + 0.5, False, "override", id="override not yet expired"),
    ],
)
def test_served_policy_follows_its_inputs(before, change, at, new_version, code_source):
    b = learned()
    before(b, T0)
    first = b.policy_for("m", SPEC, T0, "e1")
    change(b, T0)
    then = b.policy_for("m", SPEC, at, "e1")
    assert (then.version > first.version) is new_version
    if not new_version:
        assert then is first  # reused, not rebuilt
    code = then.categories.get("code", then.default)
    if code_source == "override":
        assert (code.source, code.k) == ("override", 1)
    elif code_source == "not override":
        assert code.source != "override"


def test_recomputed_decision_with_the_same_content_keeps_the_version():
    b = learned()
    first = b.policy_for("m", SPEC, T0, "e1")
    later = b.policy_for("m", SPEC, T0 + 10.0, "e1")  # past interval_s: decided again, same data
    assert later.version == first.version


@pytest.mark.parametrize(
    ("spec_a", "spec_b"),
    [
        (SpecConfig(method="eagle3", k_max=2), SpecConfig(method="eagle3", k_max=4)),
        (SpecConfig(method="eagle3", k_max=4), SpecConfig(method="ngram", k_max=4)),
        (SpecConfig(method="eagle3", k_max=4), SpecConfig(method="eagle3", k_max=4, model_free_methods=["suffix"])),
    ],
)
def test_each_engine_shape_gets_its_own_policy(spec_a, spec_b):
    b = learned()
    a1 = b.policy_for("m", spec_a, T0, "e1")
    b1 = b.policy_for("m", spec_b, T0, "e2")
    a2 = b.policy_for("m", spec_a, T0 + 0.5, "e1")
    assert a2 is a1 and b1 is not a1
    assert all(c.k <= spec_a.k_max for c in [a1.default, *a1.categories.values()])
    assert all(c.k <= spec_b.k_max for c in [b1.default, *b1.categories.values()])


def test_the_same_shape_on_two_engines_is_answered_per_engine():
    b = learned()
    feed(b, range(20), now=T0, engine="e2", per_step=64)  # a much bigger batch: its own decision
    e1 = b.policy_for("m", SPEC, T0, "e1")
    e2 = b.policy_for("m", SPEC, T0, "e2")
    assert b.policy_for("m", SPEC, T0 + 0.5, "e1") is e1
    assert b.policy_for("m", SPEC, T0 + 0.5, "e2") is e2
    assert e1 is not e2
