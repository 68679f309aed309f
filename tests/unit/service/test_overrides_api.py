"""Overrides and audit through the real app on fake time: auth, validation, TTL, durability order."""

import sqlite3

import pytest

from tests.unit.service.batches import batch
from tests.unit.service.conftest import ADMIN, INGEST

POLICY_Q = {"model": "test-model", "k_max": 4, "method": "ngram"}


def put(client, category, body, headers=ADMIN):
    return client.put(f"/v1/overrides/{category}", json=body, headers=headers)


def policy_for(client, category):
    policy = client.get("/v1/policy", params=POLICY_Q).json()
    return policy["categories"].get(category, policy["default"])


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ({"k": 2, "reason": "r", "actor": "alice"}, {"k": 2, "off": False, "kinds": ["k"]}),
        ({"k": 0, "reason": "r", "actor": "alice"}, {"k": 0, "off": True, "kinds": ["off"]}),
        ({"off": True, "reason": "r", "actor": "alice"}, {"k": 0, "off": True, "kinds": ["off"]}),
        ({"method": "off", "reason": "r", "actor": "alice"}, {"off": True, "kinds": ["off"]}),
        ({"method": "suffix", "reason": "r", "actor": "alice"}, {"method": "suffix", "kinds": ["method"]}),
        ({"k": 3, "method": "ngram", "ttl_s": 60, "reason": "r", "actor": "a@b"},
         {"k": 3, "method": "ngram", "kinds": ["k", "method"], "ttl_remaining_s": 60.0}),
    ],
)
def test_set_shapes(client, body, expect):
    response = put(client, "code", body)
    assert response.status_code == 200, response.text
    override = response.json()["override"]
    assert {k: override[k] for k in expect} == expect
    assert client.get("/v1/overrides/code").json() == override


@pytest.mark.parametrize(
    ("body", "status", "mentions"),
    [
        ({"reason": "r", "actor": "a"}, 422, "nothing to override"),
        ({"k": 2, "off": True, "reason": "r", "actor": "a"}, 422, "conflicts"),
        ({"k": 0, "method": "ngram", "reason": "r", "actor": "a"}, 422, "k=0"),
        ({"k": 99, "reason": "r", "actor": "a"}, 422, "k"),
        ({"k": -1, "reason": "r", "actor": "a"}, 422, "k"),
        ({"k": "two", "reason": "r", "actor": "a"}, 422, "k"),
        ({"k": False, "reason": "r", "actor": "a"}, 422, "k"),
        ({"k": "2", "reason": "r", "actor": "a"}, 422, "k"),
        ({"k": 1, "off": 0, "reason": "r", "actor": "a"}, 422, "off"),
        ({"k": 1, "reason": "", "actor": "a"}, 422, "reason"),
        ({"k": 1, "actor": "a"}, 422, "reason"),
        ({"k": 1, "reason": "r"}, 422, "actor"),
        ({"k": 1, "reason": "r", "actor": "a b"}, 422, "actor"),
        ({"k": 1, "ttl_s": 0, "reason": "r", "actor": "a"}, 422, "ttl_s"),
        ({"k": 1, "ttl_s": -5, "reason": "r", "actor": "a"}, 422, "ttl_s"),
        ({"k": 1, "ttl_s": 1e12, "reason": "r", "actor": "a"}, 422, "ttl_s"),
        ({"k": 1, "reason": "r", "actor": "a", "extra": 1}, 422, "extra"),
        ({"method": "Bad Method", "reason": "r", "actor": "a"}, 422, "method"),
        ([1, 2], 422, "invalid override"),
    ],
)
def test_invalid_overrides(client, body, status, mentions):
    response = put(client, "code", body)
    assert response.status_code == status, response.text
    assert mentions in response.text
    assert client.get("/v1/overrides").json() == []  # nothing applied
    assert client.get("/v1/audit").json() == []  # nothing audited


@pytest.mark.parametrize("raw", [b'{"k": 1, "ttl_s": NaN, "reason": "r", "actor": "a"}',
                                 b'{"k": 1, "ttl_s": Infinity, "reason": "r", "actor": "a"}'])
def test_non_finite_ttl(client, raw):
    response = client.put("/v1/overrides/code", content=raw, headers={**ADMIN, "Content-Type": "application/json"})
    assert response.status_code == 422 and "ttl_s" in response.text


@pytest.mark.parametrize("category", ["Has Caps", "_overflow", "a" * 65, "sp ace"])
def test_invalid_category_path(client, category):
    assert put(client, category, {"k": 1, "reason": "r", "actor": "a"}).status_code in (404, 422)


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("PUT", "/v1/overrides/code", {}, 401),
        ("PUT", "/v1/overrides/code", INGEST, 403),
        ("PUT", "/v1/overrides/code", {"Authorization": "Bearer wrong"}, 403),
        ("DELETE", "/v1/overrides/code?actor=a", {}, 401),
        ("DELETE", "/v1/overrides/code?actor=a", INGEST, 403),
        ("GET", "/v1/overrides", {}, 200),
        ("GET", "/v1/audit", {}, 200),
    ],
)
def test_auth(client, method, path, headers, status):
    body = {"k": 1, "reason": "r", "actor": "a"} if method == "PUT" else None
    assert client.request(method, path, json=body, headers=headers).status_code == status


def test_override_beats_policy_then_clear_restores(client):
    client.post("/v1/telemetry", json=batch(0), headers=INGEST)
    before = policy_for(client, "code")
    put(client, "code", {"k": 1, "reason": "pin", "actor": "alice"})
    pinned = policy_for(client, "code")
    assert (pinned["k"], pinned["source"], pinned["adapt"]["k_max"]) == (1, "override", 1)
    assert "alice" in pinned["reason"] and "pin" in pinned["reason"]
    response = client.delete("/v1/overrides/code", params={"actor": "bob", "reason": "done"}, headers=ADMIN)
    assert response.status_code == 200 and response.json()["override"] is None
    after = policy_for(client, "code")
    assert after["source"] != "override" and (after["k"], after["method"]) == (before["k"], before["method"])
    assert client.delete("/v1/overrides/code", params={"actor": "bob"}, headers=ADMIN).status_code == 404


def test_ttl_expiry_on_fake_time(client, clock, runtime, db):
    put(client, "code", {"off": True, "ttl_s": 30, "reason": "incident", "actor": "alice"})
    clock.advance(29.9)
    assert [o["category"] for o in client.get("/v1/overrides").json()] == ["code"]
    assert policy_for(client, "code")["source"] == "override"
    clock.advance(0.1)
    # expired at read time, before any sweep ran
    assert client.get("/v1/overrides").json() == []
    assert policy_for(client, "code")["source"] != "override"
    assert client.get("/v1/overrides/code").status_code == 404
    # the sweep removes it from the file and audits the expiry
    client.portal.call(runtime.expire_overrides)
    audit = client.get("/v1/audit").json()
    assert [(a["action"], a["actor"]) for a in audit] == [("set", "alice"), ("expire", "specctl")]
    other = sqlite3.connect(db)
    assert other.execute("SELECT count(*) FROM overrides").fetchone()[0] == 0
    other.close()


def test_clear_after_expiry_is_404(client, clock):
    put(client, "code", {"k": 1, "ttl_s": 5, "reason": "r", "actor": "a"})
    clock.advance(5)
    assert client.delete("/v1/overrides/code", params={"actor": "b"}, headers=ADMIN).status_code == 404
    assert [a["action"] for a in client.get("/v1/audit").json()] == ["set"]


def test_audit_log(client):
    put(client, "code", {"k": 2, "reason": "first", "actor": "alice"})
    put(client, "code", {"k": 3, "reason": "second", "actor": "bob"})
    client.delete("/v1/overrides/code", params={"actor": "carol", "reason": "third"}, headers=ADMIN)
    put(client, "prose", {"off": True, "reason": "fourth", "actor": "dave"})
    audit = client.get("/v1/audit").json()
    assert [(a["id"], a["action"], a["category"], a["actor"], a["reason"]) for a in audit] == [
        (1, "set", "code", "alice", "first"),
        (2, "set", "code", "bob", "second"),
        (3, "clear", "code", "carol", "third"),
        (4, "set", "prose", "dave", "fourth"),
    ]
    assert audit[1]["before"]["k"] == 2 and audit[1]["after"]["k"] == 3
    assert [a["id"] for a in client.get("/v1/audit", params={"after_id": 2, "limit": 1}).json()] == [3]
    assert [a["id"] for a in client.get("/v1/audit", params={"category": "prose"}).json()] == [4]
    assert client.get("/v1/audit", params={"limit": 0}).status_code == 422


def test_write_is_durable_before_answer(client, db):
    """Another connection sees the override as soon as the 200 is back (committed, not just in memory)."""
    assert put(client, "code", {"k": 2, "reason": "r", "actor": "a"}).status_code == 200
    other = sqlite3.connect(db)
    assert other.execute("SELECT category, k FROM overrides").fetchall() == [("code", 2)]
    assert other.execute("SELECT count(*) FROM audit").fetchone()[0] == 1
    other.close()


def test_store_failure_applies_nothing(client, runtime, monkeypatch):
    def broken(_override):
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(runtime.store, "put_override", broken)
    response = put(client, "code", {"k": 2, "reason": "r", "actor": "a"})
    assert response.status_code == 503 and "not applied" in response.json()["detail"]
    assert client.get("/v1/overrides").json() == []
    assert policy_for(client, "code")["source"] != "override"
    # readiness is the store's health now: the file itself still takes writes, so ready (it used to stay 503
    # until the next successful write)
    assert client.get("/readyz").status_code == 200
