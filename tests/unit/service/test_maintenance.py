"""The background loop on fake time: expiry sweeps every tick, snapshots every snapshot_interval_s."""

import pytest

from specctl_vllm.controller.service.app import maintain
from tests.unit.service.batches import batch
from tests.unit.service.conftest import ADMIN, INGEST, settings_for


class StopLoop(Exception):
    pass


def stepped_sleep(clock, ticks):
    calls = []

    async def sleep(seconds: float) -> None:
        if len(calls) == ticks:
            raise StopLoop
        calls.append(seconds)
        clock.advance(seconds)

    return sleep, calls


@pytest.mark.parametrize(
    ("maintenance_s", "snapshot_s", "ticks", "tick_s", "snapshots"),
    [
        (1.0, 30.0, 29, 1.0, 0),
        (1.0, 30.0, 30, 1.0, 1),
        (1.0, 30.0, 95, 1.0, 3),
        (5.0, 2.0, 4, 2.0, 4),  # the tick never exceeds the snapshot interval
    ],
)
def test_snapshot_cadence(client, clock, db, monkeypatch, maintenance_s, snapshot_s, ticks, tick_s, snapshots):
    runtime = client.app.state.runtime
    written = []
    original = runtime.snapshot

    async def counting() -> None:
        written.append(clock.now())
        await original()

    monkeypatch.setattr(runtime, "snapshot", counting)
    settings = settings_for(db, maintenance_interval_s=maintenance_s, store={"snapshot_interval_s": snapshot_s})
    sleep, calls = stepped_sleep(clock, ticks)
    with pytest.raises(StopLoop):
        client.portal.call(maintain, runtime, settings, sleep)
    assert set(calls) == {tick_s} and len(written) == snapshots


def test_sweep_expires_and_audits(client, clock, db):
    runtime = client.app.state.runtime
    client.put("/v1/overrides/code", json={"k": 1, "ttl_s": 2.5, "reason": "r", "actor": "a"}, headers=ADMIN)
    client.put("/v1/overrides/prose", json={"k": 2, "reason": "r", "actor": "a"}, headers=ADMIN)
    sleep, _ = stepped_sleep(clock, 3)
    with pytest.raises(StopLoop):
        client.portal.call(maintain, runtime, settings_for(db), sleep)
    audit = client.get("/v1/audit").json()
    assert [(a["action"], a["category"]) for a in audit][-1] == ("expire", "code")
    assert [o["category"] for o in client.get("/v1/overrides").json()] == ["prose"]


def test_loop_survives_store_failure(client, clock, db, monkeypatch):
    runtime = client.app.state.runtime
    client.post("/v1/telemetry", json=batch(0), headers=INGEST)

    async def failing() -> None:
        raise OSError("disk full")

    monkeypatch.setattr(runtime, "snapshot", failing)
    settings = settings_for(db, store={"snapshot_interval_s": 1.0})
    sleep, calls = stepped_sleep(clock, 3)
    with pytest.raises(StopLoop):
        client.portal.call(maintain, runtime, settings, sleep)
    assert len(calls) == 3  # kept ticking after each failure
