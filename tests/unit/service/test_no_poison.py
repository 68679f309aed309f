"""No accepted input may poison the controller: after any batch, override or store failure every later
request still answers below 500 (regression cases of the defects found, table-driven where possible)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from specctl_vllm.controller.core.policy import goodput
from specctl_vllm.kernel.protocol import MAX_SEQ
from tests.unit.service.batches import MODEL, batch
from tests.unit.service.conftest import INGEST

READS = ("/metrics", "/v1/categories", "/v1/engines", "/readyz", "/healthz")


def post(client, body):
    return client.post("/v1/telemetry", content=json.dumps(body),
                       headers={**INGEST, "Content-Type": "application/json"})


def assert_all_answer(client):
    for path in READS:
        response = client.get(path)
        assert response.status_code < 500, (path, response.status_code, response.text[:300])
    assert post(client, batch(10_000, engine_id="engine-probe")).status_code == 200


@pytest.mark.parametrize(
    ("seqs", "status"),
    [
        ([0, MAX_SEQ], [200, 200]),  # the largest valid seq: the gap counter stays a writable sample
        ([0, MAX_SEQ + 1], [200, 422]),  # beyond it: refused with a reason
        ([0, 10**400], [200, 422]),  # made the gaps counter an int no float holds: /metrics 500 for good
    ],
)
def test_huge_seq_never_breaks_metrics(client, seqs, status):
    assert [post(client, batch(s)).status_code for s in seqs] == status
    assert_all_answer(client)
    gaps = [line for line in client.get("/metrics").text.splitlines() if line.startswith("specctl_telemetry_gaps_total")]
    assert gaps and all(float(line.split()[-1]) <= 2.0**53 for line in gaps)


def _raise(*_args, **_kwargs):
    raise ZeroDivisionError("float division by zero")


def _non_finite(real):
    def decide(snapshot, cfg):
        d = real(snapshot, cfg)
        return d.__class__(d.categories, d.default.__class__(**{**d.default.to_dict(), "table": (),
                                                                "speedup": float("inf")}),
                           d.batch_size, float("nan"), d.plain_goodput, d.step_ms, d.plain_step_ms)
    return decide


@pytest.mark.parametrize("breaker", ["raises", "non_finite"])
def test_undecidable_model_serves_last_good_decision(client, clock, monkeypatch, breaker):
    first = post(client, batch(0))
    assert first.status_code == 200
    good = first.json()["policy"]
    real = goodput.decide
    monkeypatch.setattr(goodput, "decide", _raise if breaker == "raises" else _non_finite(real))
    clock.advance(60)  # past the decision interval: the next post recomputes
    later = post(client, batch(1))
    assert later.status_code == 200 and later.json()["outcome"] == "accepted"  # ingest still acknowledged
    assert later.json()["policy"]["default"] == good["default"]  # the last good decision
    assert_all_answer(client)
    errors = [line for line in client.get("/metrics").text.splitlines()
              if line.startswith("specctl_decision_errors_total")]
    assert errors and float(errors[0].split()[-1]) >= 1 and MODEL in errors[0]


def test_undecidable_without_history_serves_static_config(client, monkeypatch):
    monkeypatch.setattr(goodput, "decide", _raise)
    ack = post(client, batch(0, k_max=3))
    assert ack.status_code == 200
    default = ack.json()["policy"]["default"]
    assert default["k"] == 3 and default["method"] == "engine" and "static config" in default["reason"]
    assert_all_answer(client)


def test_readyz_recovers_after_transient_lock(client, db):
    other = sqlite3.connect(db, isolation_level=None, timeout=0)
    client.app.state.runtime.store._conn.execute("PRAGMA busy_timeout = 0")
    other.execute("BEGIN IMMEDIATE")  # another process (a backup) holds the write lock
    busy = client.get("/readyz")
    assert busy.status_code == 503 and "locked" in busy.json()["store"]
    other.execute("ROLLBACK")
    other.close()
    assert client.get("/readyz").status_code == 200  # by itself: no write needed


def test_disk_full_reported_as_disk_full(client, runtime):
    conn = runtime.store._conn
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")  # the file cannot grow: SQLITE_FULL
    response = client.put("/v1/overrides/code", json={"k": 1, "reason": "r" * 500, "actor": "a"},
                          headers={"Authorization": "Bearer admin-token-0123456789"})
    for _ in range(40):  # fill the free pages first
        if response.status_code != 200:
            break
        response = client.put(f"/v1/overrides/c{_}", json={"k": 1, "reason": "r" * 500, "actor": "a"},
                              headers={"Authorization": "Bearer admin-token-0123456789"})
    assert response.status_code == 503
    detail = response.json()["detail"]
    assert "disk full" in detail and "cannot rollback" not in detail


def test_shared_engine_id_is_refused_with_a_reason_and_exposed(client):
    assert post(client, batch(0, boot_id="boot-a")).status_code == 200
    assert post(client, batch(0, boot_id="boot-b")).status_code == 200  # looks like a restart
    assert post(client, batch(1, boot_id="boot-a")).json()["outcome"] == "duplicate"  # maybe in flight
    refused = post(client, batch(2, boot_id="boot-a"))  # ... but boot-a is still running
    assert refused.status_code == 409 and "two running engines" in refused.json()["detail"]
    engine = client.get("/v1/engines").json()[0]
    assert engine["id_conflicts"] == 1 and engine["conflict_boot"] == "boot-a"
    metrics = client.get("/metrics").text
    assert 'specctl_engine_id_conflicts_total{engine="engine-a"} 1.0' in metrics
    assert_all_answer(client)


def _edge_timing_batch(seq: int, wall_s: float) -> dict:
    """14 000 schema-valid steps: one request, 10^7 tokens verified, depth 32, in ``wall_s`` seconds."""
    hist = {"k": 32, "accepted": [1] + [0] * 32}
    step = {"t": 0.0, "wall_s": wall_s, "batch_size": 1, "scheduled_tokens": 10_000_000, "draft_tokens": 32,
            "draft_depth": 32, "categories": [{"category": "code", "method": "eagle3", "requests": 1, "hists": [hist]}]}
    return {**batch(seq, k_max=32, method="eagle3"), "steps": [step] * 14_000}


@pytest.mark.parametrize("wall_s", [5e-324, 1e-9, 1e-6])
def test_step_timings_at_the_edge_poison_nothing(make_client, clock, wall_s):
    """The fitted step cost went to 0 and every decision divided by it: every later post of the model,
    /metrics and /v1/categories answered 500, and the state in the snapshot did the same after a restart."""
    client = make_client()
    for seq in (0, 1):  # two posts: enough weight to outvote the cost model's prior
        raw = json.dumps(_edge_timing_batch(seq, wall_s), separators=(",", ":"))  # compact: under the 4 MiB cap
        assert client.post("/v1/telemetry", content=raw, headers={**INGEST, "Content-Type": "application/json"}
                           ).status_code == 200
        clock.advance(3)
    assert post(client, batch(2, k_max=32, method="eagle3")).status_code == 200
    assert_all_answer(client)
    errors = [ln for ln in client.get("/metrics").text.splitlines() if ln.startswith("specctl_decision_errors_total{")]
    assert errors and all(ln.endswith(" 0.0") for ln in errors), errors  # the fit stayed sound
    client.portal.call(client.app.state.runtime.snapshot)
    restarted = make_client()
    clock.advance(3)
    assert_all_answer(restarted)
    assert post(restarted, batch(3, k_max=32, method="eagle3")).status_code == 200
