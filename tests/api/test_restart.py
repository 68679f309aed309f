"""Restart with the same SQLite file: overrides and learned state survive (clean stop and kill -9)."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.unit.service.batches import batch, hist, step

pytestmark = pytest.mark.api


def _learn(server, engine, seqs):
    for seq in seqs:
        steps = [step({"code": [hist(4, [0, 0, 1, 1, 6])]}, t=seq + i * 0.01) for i in range(10)]
        response = httpx.post(server.url + "/v1/telemetry", json=batch(seq, steps, engine_id=engine),
                              headers=server.headers("ingest"), timeout=10)
        assert response.status_code == 200


def _state(server):
    code = httpx.get(server.url + "/v1/categories/code").json()
    overrides = httpx.get(server.url + "/v1/overrides").json()
    engines = {e["engine_id"]: e for e in httpx.get(server.url + "/v1/engines").json()}
    return code, overrides, engines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["clean stop", "kill -9"])
def test_restart_keeps_overrides_and_learning(fresh_server, sig):
    server = fresh_server.start()
    _learn(server, "restart-engine", range(5))
    put = httpx.put(server.url + "/v1/overrides/prose", json={"k": 1, "reason": "kept", "actor": "ops"},
                    headers=server.headers("admin"))
    assert put.status_code == 200
    if sig == signal.SIGKILL:
        # the crash loses at most one snapshot interval (1 s here): wait for a snapshot covering the above
        deadline = time.monotonic() + 10
        while httpx.get(server.url + "/readyz").json()["last_snapshot_age_s"] is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
    code, _, _ = _state(server)
    server.restart(sig)
    code2, overrides2, engines2 = _state(server)
    assert code2["request_steps"] == code["request_steps"] == 5 * 10 * 8
    assert code2["mean_acceptance_length"] == pytest.approx(code["mean_acceptance_length"], rel=0.02)
    assert [(o["category"], o["k"], o["actor"]) for o in overrides2] == [("prose", 1, "ops")]
    assert engines2["restart-engine"]["last_seq"] == 4
    # the engine's seq book survived: a retried batch is not counted twice, the next one is accepted
    retry = httpx.post(server.url + "/v1/telemetry", json=batch(4, engine_id="restart-engine"),
                       headers=server.headers("ingest")).json()
    assert retry["outcome"] == "duplicate"
    audit = httpx.get(server.url + "/v1/audit").json()
    assert [(a["id"], a["action"]) for a in audit] == [(1, "set")]


def test_acknowledged_override_survives_immediate_kill(fresh_server):
    """kill -9 right after the 2xx: the override was committed before the answer."""
    server = fresh_server.start()
    for i in range(5):
        assert httpx.put(server.url + f"/v1/overrides/cat-{i}", json={"k": i % 3, "reason": "r", "actor": "a"},
                         headers=server.headers("admin")).status_code == 200
    server.kill(signal.SIGKILL)
    server.start()
    assert sorted(o["category"] for o in httpx.get(server.url + "/v1/overrides").json()) == [
        f"cat-{i}" for i in range(5)]
    assert [a["id"] for a in httpx.get(server.url + "/v1/audit").json()] == [1, 2, 3, 4, 5]
