"""Telemetry acks built around a cached policy JSON: byte-identical to the model's own JSON, and never stale."""

import json

import pytest

from specctl_vllm.controller.service.answers import AckEncoder
from specctl_vllm.kernel.protocol import AdaptRule, CategoryPolicy, Policy, TelemetryAck
from tests.unit.service.batches import batch
from tests.unit.service.conftest import ADMIN, INGEST


def policy(version: int, k: int = 2, reason: str = "", issued_at: float = 1_700_000_000.25, **categories) -> Policy:
    default = CategoryPolicy(k=0, method="off", adapt=AdaptRule(), probe_rate=0.05, probe_k=1, source="default",
                             reason=reason)
    cats = {name: CategoryPolicy(k=k, method=method, adapt=AdaptRule(k_min=1, k_max=k), source="policy",
                                 reason=reason)
            for name, method in categories.items()}
    return Policy(version=version, issued_at=issued_at, ttl_s=30.0, default=default, categories=cats)


@pytest.mark.parametrize(
    ("outcome", "seq", "gaps", "p"),
    [
        ("accepted", 0, 0, policy(1)),
        ("duplicate", 7, 3, policy(2, code="engine", chat="ngram")),
        ("accepted", 2**62, 10**9, policy(3, k=4, reason="k=4: +12 % goodput (ü, 引号 \"quoted\")", code="engine")),
        ("accepted", 5, 0, policy(4, issued_at=1e-5, tool_call="suffix")),
    ],
)
def test_ack_bytes_are_the_models_own_json(outcome, seq, gaps, p):
    encoded = AckEncoder().encode(outcome, seq, gaps, p)
    expected = TelemetryAck(outcome=outcome, seq=seq, gaps=gaps, policy=p)
    assert encoded == expected.model_dump_json().encode()
    assert TelemetryAck.model_validate_json(encoded) == expected


def test_a_policy_is_serialised_once():
    acks, p = AckEncoder(), policy(1, code="engine")
    assert acks.policy_json(p) is acks.policy_json(p)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (policy(1, k=2, code="engine"), policy(2, k=3, code="engine")),  # a new version
        # the same version number for a different policy (another Brain, a restore): not taken for the old one
        (policy(1, k=2, code="engine"), policy(1, k=3, code="engine")),
    ],
)
def test_another_policy_gets_its_own_json(first, second):
    acks = AckEncoder()
    acks.policy_json(first)
    assert json.loads(acks.policy_json(second)) == json.loads(second.model_dump_json())


def test_cache_is_bounded_oldest_first():
    acks = AckEncoder(capacity=3)
    policies = [policy(v) for v in range(1, 6)]
    held = [acks.policy_json(p) for p in policies]
    assert acks.policy_json(policies[-1]) is held[-1]  # the newest are kept
    assert acks.policy_json(policies[0]) is not held[0]  # the oldest was dropped, serialised again
    assert len(acks._policies) == 3


# -- through the app: what an engine receives ---------------------------------------------------------------------

def post(client, body):
    response = client.post("/v1/telemetry", content=json.dumps(body),
                           headers={**INGEST, "Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return TelemetryAck.model_validate_json(response.content)  # the declared response model, strictly


def test_answer_changes_with_overrides_and_back(client):
    first = post(client, batch(0))
    assert post(client, batch(1)).policy == first.policy  # nothing changed: the same policy, same version

    response = client.put("/v1/overrides/code", json={"k": 1, "reason": "incident", "actor": "ops"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    pinned = post(client, batch(2)).policy
    assert pinned.version > first.policy.version
    assert (pinned.categories["code"].source, pinned.categories["code"].k) == ("override", 1)

    response = client.delete("/v1/overrides/code", params={"actor": "ops", "reason": "over"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    released = post(client, batch(3)).policy
    assert released.version > pinned.version
    assert released.categories.get("code", released.default).source != "override"


def test_answer_is_per_engine(client):
    small = post(client, batch(0, engine_id="engine-small", k_max=2)).policy
    big = post(client, batch(0, engine_id="engine-big", k_max=4)).policy
    assert all(c.k <= 2 and c.adapt.k_max <= 2 for c in [small.default, *small.categories.values()])
    assert post(client, batch(1, engine_id="engine-small", k_max=2)).policy == small
    assert post(client, batch(1, engine_id="engine-big", k_max=4)).policy == big
