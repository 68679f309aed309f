"""Reads, metrics, persistence across app restarts, admin listener, CORS and the last-resort handler."""

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.auth import AdminListener
from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN, INGEST, parked_sleep, settings_for


def test_health(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["store"] == "ok"


def test_categories_and_engines(client):
    steps = [step({"code": [hist(4, [0, 0, 1, 1, 6])], "prose": [hist(4, [6, 2, 0, 0, 0])]}, t=float(i))
             for i in range(3)]
    client.post("/v1/telemetry", json=batch(0, steps), headers=INGEST)
    views = {v["category"]: v for v in client.get("/v1/categories").json()}
    assert set(views) == {"code", "prose"}
    assert views["code"]["request_steps"] == 24 and views["code"]["model"] == "test-model"
    assert views["code"]["mean_acceptance_length"] > views["prose"]["mean_acceptance_length"]
    assert views["code"]["decision"]["k"] <= 4 and views["code"]["entropy"]["class"]
    assert client.get("/v1/categories/code").json() == views["code"]
    assert client.get("/v1/categories/code", params={"model": "other"}).status_code == 404
    assert client.get("/v1/categories/nothing").status_code == 404
    assert client.get("/v1/categories/Bad Name").status_code == 422
    engine = client.get("/v1/engines").json()
    assert [(e["engine_id"], e["last_seq"], e["steps"]) for e in engine] == [("engine-a", 0, 3)]


def _samples(text):
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _key(name, **labels):
    return (name, tuple(sorted(labels.items())))


def test_metrics_reconcile_with_telemetry(client):
    # 3 steps x (2 drafts at k=4 with 4 accepted, 1 draft at k=2 with 0 accepted)
    steps = [step({"code": [hist(2, [1, 0, 0]), hist(4, [0, 0, 0, 0, 2])]}, t=float(i)) for i in range(3)]
    client.put("/v1/overrides/prose", json={"off": True, "reason": "r", "actor": "a"}, headers=ADMIN)
    client.post("/v1/telemetry", json=batch(0, steps), headers=INGEST)
    samples = _samples(client.get("/metrics").text)
    labels = (("category", "code"), ("method", "ngram"), ("model_name", "test-model"))
    assert samples[("specctl_drafts_total", labels)] == 9
    assert samples[("specctl_draft_tokens_total", labels)] == 3 * (2 + 2 * 4)
    assert samples[("specctl_accepted_tokens_total", labels)] == 3 * 2 * 4
    per_pos = {dict(l)["position"]: v for (n, l), v in samples.items() if n == "specctl_accepted_tokens_per_pos_total"}
    assert per_pos == {"0": 6, "1": 6, "2": 6, "3": 6}
    cat = (("category", "code"), ("model_name", "test-model"))
    assert samples[("specctl_accepted_tokens_per_draft_count", cat)] == 9
    assert samples[("specctl_accepted_tokens_per_draft_sum", cat)] == 24
    code = {"category": "code", "model_name": "test-model"}
    buckets = {le: samples[_key("specctl_accepted_tokens_per_draft_bucket", le=le, **code)]
               for le in ("0.0", "1.0", "2.0", "3.0", "4.0", "+Inf")}
    assert buckets == {"0.0": 3, "1.0": 3, "2.0": 3, "3.0": 3, "4.0": 9, "+Inf": 9}
    assert samples[("specctl_request_steps_total", cat)] == 9
    assert samples[_key("specctl_override_active", category="prose", kind="off")] == 1
    assert samples[("specctl_telemetry_batches_total", (("engine", "engine-a"), ("outcome", "accepted")))] == 1
    assert samples[("specctl_steps_total", (("engine", "engine-a"), ("model_name", "test-model")))] == 3
    assert ("specctl_current_k", cat) in samples and ("specctl_estimated_speedup", cat) in samples
    assert any(n == "specctl_current_method_info" for n, _ in samples)
    assert any(n == "specctl_entropy_class_info" for n, _ in samples)


@pytest.mark.parametrize("accept", ["", "text/plain", "application/openmetrics-text; version=1.0.0",
                                    "text/plain; version=banana", "application/openmetrics-text; version=x.y"])
def test_metrics_content_negotiation_never_fails(client, accept):
    response = client.get("/metrics", headers={"Accept": accept})
    assert response.status_code == 200 and b"specctl_http_internal_errors" in response.content


def test_state_survives_restart(db, clock):
    settings = settings_for(db)
    steps = [step({"code": [hist(4, [0, 0, 1, 1, 6])]}, t=float(i)) for i in range(5)]
    with TestClient(create_app(settings, clock, sleep=parked_sleep)) as client:
        client.post("/v1/telemetry", json=batch(7, steps), headers=INGEST)
        client.put("/v1/overrides/prose", json={"k": 1, "ttl_s": 3600, "reason": "r", "actor": "a"}, headers=ADMIN)
        before = client.get("/v1/categories/code").json()
    clock.advance(1.0)
    with TestClient(create_app(settings, clock, sleep=parked_sleep)) as client:
        after = client.get("/v1/categories/code").json()
        assert after["request_steps"] == before["request_steps"] == 40
        assert after["mean_acceptance_length"] == pytest.approx(before["mean_acceptance_length"], rel=1e-3)
        assert [o["category"] for o in client.get("/v1/overrides").json()] == ["prose"]
        # the engine's seq book survived too: a retry of seq 7 is still a duplicate
        assert client.post("/v1/telemetry", json=batch(7, steps), headers=INGEST).json()["outcome"] == "duplicate"
        assert client.get("/readyz").json()["last_snapshot_age_s"] == pytest.approx(1.0)


def test_periodic_snapshot_is_what_a_crash_leaves(db, clock, monkeypatch):
    """Without the clean-shutdown snapshot (a crash), the next start loads the newest periodic one."""
    settings = settings_for(db)
    with TestClient(create_app(settings, clock, sleep=parked_sleep)) as client:
        runtime = client.app.state.runtime
        client.post("/v1/telemetry", json=batch(0), headers=INGEST)
        client.portal.call(runtime.snapshot)
        client.post("/v1/telemetry", json=batch(1), headers=INGEST)  # after the snapshot: lost in a crash

        async def crashed() -> None:
            return None

        monkeypatch.setattr(runtime, "snapshot", crashed)
    with TestClient(create_app(settings, clock, sleep=parked_sleep)) as fresh:
        assert fresh.get("/v1/engines").json()[0]["last_seq"] == 0


def test_admin_listener_refuses_writes_elsewhere(db, clock):
    app = create_app(settings_for(db), clock, sleep=parked_sleep, admin_listener=AdminListener("127.0.0.1", 9100))
    with TestClient(app) as client:  # TestClient connections arrive on ("testserver", 80)
        response = client.put("/v1/overrides/code", json={"k": 1, "reason": "r", "actor": "a"}, headers=ADMIN)
        assert response.status_code == 403 and "admin listener" in response.json()["detail"]
        assert client.post("/v1/telemetry", json=batch(0), headers=INGEST).status_code == 200


@pytest.mark.parametrize(("origins", "allowed"), [([], False), (["https://ops.example"], True)])
def test_cors_off_by_default(make_client, origins, allowed):
    client = make_client(cors_origins=origins)
    response = client.options("/v1/overrides", headers={"Origin": "https://ops.example",
                                                       "Access-Control-Request-Method": "GET"})
    assert ("access-control-allow-origin" in response.headers) is allowed


def test_bug_answers_sanitized_500(db, clock, monkeypatch):
    app = create_app(settings_for(db), clock, sleep=parked_sleep)
    with TestClient(app, raise_server_exceptions=False) as client:
        runtime = client.app.state.runtime

        def boom():
            raise RuntimeError("secret internals /etc/specctl admin-token-0123456789")

        monkeypatch.setattr(runtime, "categories", boom)
        response = client.get("/v1/categories")
        assert response.status_code == 500
        assert response.json()["detail"].startswith("internal error (id ")
        assert "secret" not in response.text and "admin-token" not in response.text
        assert runtime.internal_errors == 1
        assert "specctl_http_internal_errors_total 1.0" in client.get("/metrics").text
