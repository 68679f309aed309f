"""Ingest -> policy -> categories on a real server: acks, duplicates, gaps, ETag, engines, metrics."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.service.batches import batch, hist, step

pytestmark = pytest.mark.api


def post(server, body):
    return httpx.post(server.url + "/v1/telemetry", json=body, headers=server.headers("ingest"), timeout=10)


def steps(n, t0=0.0):
    return [step({"json": [hist(4, [0, 0, 0, 1, 7])], "chat": [hist(4, [6, 2, 0, 0, 0])]}, t=t0 + i * 0.02)
            for i in range(n)]


def test_ingest_policy_categories(server):
    eng = "flow-engine"
    acks = [post(server, batch(seq, steps(20, seq), engine_id=eng, model="flow-model")) for seq in range(5)]
    assert [a.status_code for a in acks] == [200] * 5
    ack = acks[-1].json()
    assert ack["outcome"] == "accepted" and ack["gaps"] == 0 and ack["policy"]["ttl_s"] > 0
    views = {v["category"]: v for v in httpx.get(server.url + "/v1/categories").json() if v["model"] == "flow-model"}
    assert views["json"]["request_steps"] == 5 * 20 * 8
    assert views["json"]["mean_acceptance_length"] > views["chat"]["mean_acceptance_length"]
    assert views["json"]["decision"]["reason"]
    one = httpx.get(server.url + "/v1/categories/json", params={"model": "flow-model"}).json()
    assert one["category"] == "json" and one["entropy"]["thresholds"]
    policy = httpx.get(server.url + "/v1/policy", params={"model": "flow-model", "k_max": 4, "method": "ngram"})
    assert policy.status_code == 200 and set(policy.json()["categories"]) >= {"json", "chat"}
    same = httpx.get(server.url + "/v1/policy", params={"model": "flow-model", "k_max": 4, "method": "ngram"},
                     headers={"If-None-Match": policy.headers["etag"]})
    assert same.status_code == 304


def test_policy_tailored_to_engine_k_max(server):
    for seq in range(3):
        post(server, batch(seq, steps(10, seq), engine_id="small-engine", model="tailor-model", k_max=4))
    small = post(server, batch(0, [], engine_id="k2-engine", model="tailor-model", k_max=2)).json()["policy"]
    assert all(p["k"] <= 2 and p["adapt"]["k_max"] <= 2 for p in [small["default"], *small["categories"].values()])


def test_duplicates_and_gaps(server):
    eng = "gap-engine"
    outcomes = [post(server, batch(seq, steps(1), engine_id=eng)).json() for seq in (0, 1, 1, 4, 0)]
    assert [o["outcome"] for o in outcomes] == ["accepted", "accepted", "duplicate", "accepted", "duplicate"]
    assert outcomes[-1]["gaps"] == 2
    engine = next(e for e in httpx.get(server.url + "/v1/engines").json() if e["engine_id"] == eng)
    assert engine["batches"] == {"accepted": 3, "duplicate": 2, "rejected": 0} and engine["gaps"] == 2
    metrics = httpx.get(server.url + "/metrics").text
    assert f'specctl_telemetry_gaps_total{{engine="{eng}"}} 2.0' in metrics
    assert f'specctl_telemetry_batches_total{{engine="{eng}",outcome="duplicate"}} 2.0' in metrics


def test_reads_are_open(server):
    for path in ("/v1/categories", "/v1/engines", "/v1/overrides", "/v1/audit", "/healthz", "/readyz", "/metrics",
                 "/v1/policy?model=m&k_max=4&method=ngram"):
        assert httpx.get(server.url + path).status_code == 200, path
