"""The budget over HTTP: idle eviction in the maintenance sweep, POST /v1/forget, no resurrection on restart,
429 with a reason when full, a quarantined snapshot is not fatal."""

from __future__ import annotations

import sqlite3

import pytest
from fastapi.testclient import TestClient

from specctl_vllm.controller.core.config import BrainConfig, BudgetSettings
from specctl_vllm.controller.service.app import create_app
from tests.unit.service.batches import batch
from tests.unit.service.conftest import ADMIN, INGEST, parked_sleep, settings_for


def app_for(db, clock, **budget):
    return create_app(settings_for(db), clock, sleep=parked_sleep, brain_config=BrainConfig(budget=BudgetSettings(**budget)))


def crash(runtime, monkeypatch):
    """No clean-shutdown snapshot (as after kill -9)."""
    async def nothing() -> None:
        return None

    monkeypatch.setattr(runtime, "snapshot", nothing)


def engines(client):
    return sorted(e["engine_id"] for e in client.get("/v1/engines").json())


def test_idle_engine_evicted_and_not_resurrected_after_a_crash(db, clock, monkeypatch):
    with TestClient(app_for(db, clock, engine_idle_s=60)) as client:
        runtime = client.app.state.runtime
        client.post("/v1/telemetry", json=batch(0, engine_id="old"), headers=INGEST)
        client.portal.call(runtime.snapshot)  # the snapshot still holds "old"
        clock.advance(61)
        client.post("/v1/telemetry", json=batch(0, engine_id="new"), headers=INGEST)
        assert client.portal.call(runtime.evict_idle) == [("engine", "old")]
        assert engines(client) == ["new"]
        crash(runtime, monkeypatch)
    with TestClient(app_for(db, clock, engine_idle_s=60)) as client:
        assert engines(client) == []  # "new" came after the snapshot (lost, as any crash loses); "old" stays gone


@pytest.mark.parametrize(
    ("body", "gone"),
    [
        ({"engine": "engine-a"}, "engine"),
        ({"model": "test-model"}, "model"),
        ({"model": "test-model", "category": "code"}, "category"),
    ],
)
def test_forget_endpoint(db, clock, monkeypatch, body, gone):
    with TestClient(app_for(db, clock)) as client:
        client.post("/v1/telemetry", json=batch(0), headers=INGEST)
        client.portal.call(client.app.state.runtime.snapshot)
        before = client.get("/metrics").text
        assert client.post("/v1/forget", json={**body, "reason": "r", "actor": "a"}).status_code == 401
        answer = client.post("/v1/forget", json={**body, "reason": "r", "actor": "a"}, headers=ADMIN)
        assert answer.status_code == 200 and answer.json()["kind"] == gone
        again = client.post("/v1/forget", json={**body, "reason": "r", "actor": "a"}, headers=ADMIN)
        assert again.status_code == 404
        assert len(client.get("/metrics").text) < len(before)
        crash(client.app.state.runtime, monkeypatch)
    with TestClient(app_for(db, clock)) as client:
        if gone == "engine":
            assert engines(client) == []
        else:
            assert client.get("/v1/categories").json() == []


@pytest.mark.parametrize(
    "body",
    [{"reason": "r", "actor": "a"}, {"engine": "e", "model": "m", "reason": "r", "actor": "a"},
     {"category": "code", "reason": "r", "actor": "a"}, {"engine": "bad id!", "reason": "r", "actor": "a"}],
)
def test_forget_refuses_ambiguous_requests(client, body):
    assert client.post("/v1/forget", json=body, headers=ADMIN).status_code == 422


def test_a_new_engine_at_the_engine_cap_is_served(db, clock):
    with TestClient(app_for(db, clock, max_engines=1)) as client:
        assert client.post("/v1/telemetry", json=batch(0, engine_id="a"), headers=INGEST).status_code == 200
        clock.advance(1)
        assert client.post("/v1/telemetry", json=batch(0, engine_id="b"), headers=INGEST).status_code == 200
        assert engines(client) == ["b"]  # the least recently seen made room
        assert "specctl_budget_refusals_total 0.0" in client.get("/metrics").text


@pytest.mark.parametrize(
    "data",
    [('{"format": "specctl-brain", "version": 1, "models": {"m": {"categories": {"c": {"methods": {"x": '
      '{"reached": [1e400]}}}}}}}'),
     "not json", '{"format": "something-else"}', '[1, 2]'],
    ids=["non-finite", "not-json", "other-format", "wrong-shape"],
)
def test_bad_snapshot_is_quarantined_not_fatal(db, clock, data):
    with TestClient(app_for(db, clock)) as client:
        client.post("/v1/telemetry", json=batch(0), headers=INGEST)
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO snapshots (ts, data) VALUES (?, ?)", (clock.now() + 1, data))
    conn.commit()
    conn.close()
    with TestClient(app_for(db, clock)) as client:
        assert client.get("/readyz").status_code == 200
        assert engines(client) == ["engine-a"]  # the older, good snapshot was used
        assert client.app.state.runtime.store.quarantined()
