"""POST /v1/telemetry and GET /v1/policy through the real app, on fake time."""

import json

import pytest

from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN, INGEST


def post(client, body, headers=INGEST):
    # json.dumps writes inf/nan as Infinity/NaN, as a careless client would
    return client.post("/v1/telemetry", content=json.dumps(body), headers={**headers, "Content-Type": "application/json"})


def test_ack_carries_policy_tailored_to_engine(client):
    ack = post(client, batch(0, k_max=3)).json()
    assert ack["outcome"] == "accepted" and ack["seq"] == 0 and ack["gaps"] == 0
    policy = ack["policy"]
    assert policy["protocol"] == 1 and policy["ttl_s"] > 0
    assert all(p["k"] <= 3 for p in [policy["default"], *policy["categories"].values()])


@pytest.mark.parametrize(
    ("seqs", "outcomes", "gaps"),
    [
        ([0, 1, 2], ["accepted"] * 3, 0),
        ([0, 0, 1], ["accepted", "duplicate", "accepted"], 0),  # a retry is acknowledged, not counted
        ([0, 3], ["accepted", "accepted"], 2),  # seq 1 and 2 missing
        ([0, 3, 1], ["accepted", "accepted", "accepted"], 1),  # a late batch fills its gap
    ],
)
def test_duplicates_and_gaps(client, seqs, outcomes, gaps):
    acks = [post(client, batch(s)).json() for s in seqs]
    assert [a["outcome"] for a in acks] == outcomes
    assert acks[-1]["gaps"] == gaps
    engine = client.get("/v1/engines").json()[0]
    assert engine["gaps"] == gaps and engine["batches"]["duplicate"] == outcomes.count("duplicate")


def test_duplicate_not_double_counted(client):
    body = batch(0, [step({"code": [hist(2, [1, 1, 2])]})], k_max=2)
    post(client, body)
    post(client, body)
    view = client.get("/v1/categories/code").json()
    assert view["request_steps"] == 4  # one step of 4 requests, counted once


def _mutate(path, value):
    def apply(body):
        target = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return body

    return apply


BAD_BATCHES = [
    ("wrong type", _mutate(["seq"], "one"), 422, "seq"),
    ("negative seq", _mutate(["seq"], -1), 422, "seq"),
    ("number as string", _mutate(["seq"], "3"), 422, "seq"),
    ("bool as number", _mutate(["steps", 0, "wall_s"], False), 422, "wall_s"),
    ("unknown field", _mutate(["surprise"], 1), 422, "surprise"),
    ("missing spec", lambda b: {k: v for k, v in b.items() if k != "spec"}, 422, "spec"),
    ("wrong protocol", _mutate(["protocol"], 2), 422, "protocol"),
    ("bad engine id", _mutate(["engine_id"], "has space"), 422, "engine_id"),
    ("histogram longer than k", _mutate(["steps", 0, "categories", 0, "hists", 0, "accepted"], [1, 0, 0, 0, 0, 9]),
     422, "buckets"),
    ("accepted > drafted requests", _mutate(["steps", 0, "categories", 0, "requests"], 1), 422, "more drafted"),
    ("k above engine k_max", _mutate(["spec", "k_max"], 2), 422, "above the engine's k_max"),
    ("negative count", _mutate(["steps", 0, "categories", 0, "hists", 0, "accepted"], [-1, 0, 0, 0, 1]), 422,
     "accepted"),
    ("infinite time", _mutate(["steps", 0, "wall_s"], float("inf")), 422, "wall_s"),
    ("NaN time", _mutate(["steps", 0, "t"], float("nan")), 422, "\"t\""),
    ("bad category name", _mutate(["steps", 0, "categories", 0, "category"], "Bad Name!"), 422, "category"),
    ("draft tokens > scheduled", _mutate(["steps", 0, "scheduled_tokens"], 0), 422, "draft_tokens"),
    ("k too large", _mutate(["spec", "k_max"], 10_000), 422, "k_max"),
]


@pytest.mark.parametrize(("case", "mutate", "status", "mentions"), BAD_BATCHES, ids=[c[0] for c in BAD_BATCHES])
def test_bad_batches_refused_with_reason(client, case, mutate, status, mentions):
    response = post(client, mutate(batch(0)))
    assert response.status_code == status, response.text
    body = response.json()
    assert body["detail"]
    assert mentions in json.dumps(body)
    # the offending value is not echoed back: only where, what and which rule
    assert all(set(item) == {"loc", "msg", "type"} for item in body["errors"])


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "mentions"),
    [
        (b"{not json", "application/json", 400, "malformed JSON"),
        (b'{"seq": NaN}', "application/json", 422, "invalid telemetry batch"),
        (b"", "application/json", 400, "empty body"),
        (b"[]", "application/json", 422, "invalid telemetry batch"),
        (b'"text"', "application/json", 422, "invalid telemetry batch"),
        (b"{}", "text/plain", 415, "application/json"),
        (b"\xff\xfe garbage", "application/json", 400, "malformed JSON"),
        (b"[" * 100_000, "application/json", 400, "malformed JSON"),
    ],
)
def test_unparseable_bodies(client, raw, content_type, status, mentions):
    response = client.post("/v1/telemetry", content=raw, headers={**INGEST, "Content-Type": content_type})
    assert response.status_code == status, response.text
    assert mentions in response.json()["detail"]


def test_oversized_body_413(make_client):
    client = make_client(max_body_bytes=2048)
    body = batch(0, [step({"code": [hist(4, [1, 0, 0, 0, 3])]})] * 50)
    response = post(client, body)
    assert response.status_code == 413 and "exceeds 2048 bytes" in response.json()["detail"]


def test_rejections_counted_per_engine(client):
    post(client, batch(0))
    post(client, _mutate(["spec", "k_max"], 2)(batch(1)))  # refused by the Brain
    post(client, _mutate(["seq"], "x")(batch(2)))  # refused by the schema, engine id readable
    client.post("/v1/telemetry", content=b"{", headers={**INGEST, "Content-Type": "application/json"})
    engine = client.get("/v1/engines").json()[0]
    assert engine["batches"] == {"accepted": 1, "duplicate": 0, "rejected": 2}
    metrics = client.get("/metrics").text
    assert 'specctl_telemetry_batches_total{engine="engine-a",outcome="rejected"} 2.0' in metrics
    assert 'specctl_telemetry_batches_total{engine="_unknown",outcome="rejected"} 1.0' in metrics


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer nope"}, 403), (ADMIN, 403), (INGEST, 200)],
)
def test_ingest_token_required(client, headers, status):
    response = post(client, batch(0), headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.headers["www-authenticate"] == "Bearer"


def test_auth_checked_before_body(client):
    response = client.post("/v1/telemetry", content=b"{garbage", headers={"Content-Type": "application/json"})
    assert response.status_code == 401  # an unauthenticated client learns nothing about body parsing


POLICY_Q = {"model": "test-model", "k_max": 4, "method": "ngram"}


def test_policy_etag_and_304(client):
    post(client, batch(0))
    first = client.get("/v1/policy", params=POLICY_Q)
    etag = first.headers["etag"]
    assert first.status_code == 200 and etag.startswith('"')
    again = client.get("/v1/policy", params=POLICY_Q, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.headers["etag"] == etag and again.content == b""
    other = client.get("/v1/policy", params=POLICY_Q, headers={"If-None-Match": '"stale"'})
    assert other.status_code == 200
    client.put("/v1/overrides/code", json={"k": 1, "reason": "test", "actor": "t"}, headers=ADMIN)
    changed = client.get("/v1/policy", params=POLICY_Q, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert changed.json()["categories"]["code"]["k"] == 1


@pytest.mark.parametrize(
    "params",
    [
        {"model": "m", "k_max": 99, "method": "ngram"},
        {"model": "m", "k_max": -1, "method": "ngram"},
        {"model": "m", "k_max": "x", "method": "ngram"},
        {"model": "m", "k_max": 4, "method": "Not A Method"},
        {"model": "", "k_max": 4, "method": "ngram"},
        {"k_max": 4, "method": "ngram"},
        {"model": "m", "k_max": 4, "method": "ngram", "graph_widths": [1, 2]},
        {"model": "m", "k_max": 4, "method": "ngram", "graph_widths": [0, 2, 2]},
        {"model": "m", "k_max": 4, "method": "ngram", "graph_widths": [0, 7]},
        {"model": "m", "k_max": 4, "method": "ngram", "graph_widths": [0, 4], "token_budget": 0},
    ],
)
def test_policy_bad_query(client, params):
    response = client.get("/v1/policy", params=params)
    assert response.status_code == 422 and response.json()["errors"]


def test_policy_for_unknown_model_is_safe_default(client):
    policy = client.get("/v1/policy", params={"model": "never-seen", "k_max": 4, "method": "ngram"}).json()
    assert policy["categories"] == {} and policy["default"]["k"] <= 4


def test_policy_query_of_a_graph_engine_is_what_its_ack_carries(client):
    # a read of what a graph-shaped engine is served: the same spec as a query and as a posted batch
    spec = {"method": "ngram", "k_max": 4, "full_cuda_graphs": True, "graph_widths": [0, 1, 2, 4],
            "token_budget": 2048}
    body = batch(0)
    body["spec"] = spec
    ack = post(client, body).json()
    query = {**POLICY_Q, "full_cuda_graphs": "true", "graph_widths": [0, 1, 2, 4], "token_budget": 2048}
    read = client.get("/v1/policy", params=query)
    assert read.status_code == 200
    served, got = ack["policy"], read.json()
    assert served["categories"] == got["categories"] and served["default"] == got["default"]
    plain = client.get("/v1/policy", params=POLICY_Q).json()
    assert plain["categories"] != got["categories"] or plain["default"] != got["default"]
