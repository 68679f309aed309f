"""Reads never change state: views and metrics leave what was learned, the decision cache and the policy
version as they were, so an engine is served the same policy whether or not anyone looked."""

from __future__ import annotations

import json

import pytest

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.overrides import Override
from tests.unit.core.factories import SPEC, batch, brain, cat_step, step

CODE, CHAT = [0.8] * 8, [0.25] * 8


def trained() -> Brain:
    b = brain(interval_s=2.0)
    for s in range(20):
        b.ingest(batch([step([cat_step("code", 40, CODE), cat_step("chat", 40, CHAT)])], s), 1000.0)
    b.policy_for("m", SPEC, 1000.0, "e1")
    # an override set after the last post: a read that wired a policy would bump the version for it
    b.set_overrides([Override("code", off=True, reason="incident", actor="ops", created_at=1.0)])
    return b


def state(b: Brain) -> str:
    return json.dumps(b.dump(), sort_keys=True, default=str)


READS = {
    "categories": lambda b, now: b.categories(now),
    "category": lambda b, now: b.category("code", now),
    "engines": lambda b, now: b.engines(now),
    "metrics": lambda b, now: b.metrics(now),
    "model_metrics": lambda b, now: b.model_metrics("m", now),
}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("now", [1000.5, 1030.0, 5000.0])  # inside the decision interval, past it, much later
def test_a_read_changes_no_state_and_no_policy_version(read, now) -> None:
    b, twin = trained(), trained()
    before = state(b)
    version = b.dump()["policy_version"]
    for _ in range(3):
        READS[read](b, now)
    assert state(b) == before
    assert b.dump()["policy_version"] == version
    assert b._decisions.keys() == twin._decisions.keys()
    assert all(b._decisions[k].computed_at == twin._decisions[k].computed_at for k in b._decisions)
    # and the engine's next policy is the one it gets when nobody read
    assert b.policy_for("m", SPEC, now + 1, "e1") == twin.policy_for("m", SPEC, now + 1, "e1")


def test_a_read_shows_decayed_figures() -> None:
    """Pure does not mean stale: the view at a later time shows less (decayed) evidence than at ingest."""
    b = trained()
    early = {m.method: m.evidence for m in b.category("code", 1000.0).methods}
    late = {m.method: m.evidence for m in b.category("code", 1000.0 + 3 * 3600).methods}
    assert all(late[m] < early[m] for m in early)
    assert {m.method: m.evidence for m in b.category("code", 1000.0).methods} == early
