"""Bad input against a real server: each answered 4xx with a reason, none 5xx, the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.unit.service.batches import batch, hist, step

pytestmark = pytest.mark.api


def _raw(body: dict) -> bytes:
    return json.dumps(body).encode()


def _with(path, value):
    body = batch(0, engine_id="bad-engine")
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return _raw(body)


CASES = [
    ("malformed JSON", b'{"engine_id": ', 400, "malformed JSON"),
    ("empty", b"", 400, "empty body"),
    ("wrong type", _with(["seq"], "seven"), 422, "seq"),
    ("negative", _with(["steps", 0, "wall_s"], -1.0), 422, "wall_s"),
    ("NaN", _with(["steps", 0, "wall_s"], float("nan")), 422, "wall_s"),
    ("Infinity", _with(["sent_at"], float("inf")), 422, "sent_at"),
    ("accepted > drafted", _with(["steps", 0, "categories", 0, "requests"], 0), 422, "more drafted"),
    ("histogram longer than k", _with(["steps", 0, "categories", 0, "hists", 0, "accepted"], [0, 0, 0, 0, 0, 1]),
     422, "buckets"),
    ("k above k_max", _with(["spec", "k_max"], 1), 422, "k_max"),
    ("extra field", _with(["steps", 0, "x"], 1), 422, "x"),
    ("deep nesting", b"[" * 50_000 + b"]" * 50_000, 400, "recursion limit"),
    ("oversized", b'{"pad": "' + b"x" * (4 * 1024 * 1024 + 10) + b'"}', 413, "exceeds"),
]


@pytest.mark.parametrize(("case", "raw", "status", "mentions"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_reason(server, case, raw, status, mentions):
    response = httpx.post(server.url + "/v1/telemetry", content=raw, timeout=30,
                          headers={**server.headers("ingest"), "Content-Type": "application/json"})
    assert response.status_code == status, response.text[:500]
    assert mentions in response.text


def test_chunked_oversized_body(server):
    def chunks():
        for _ in range(5 * 1024):
            yield b"x" * 1024

    response = httpx.post(server.url + "/v1/telemetry", content=chunks(), timeout=30,
                          headers={**server.headers("ingest"), "Content-Type": "application/json"})
    assert response.status_code == 413


def test_category_overflow_is_pooled(server):
    """200 distinct names against the default cap of 64 per model: the rest pooled, nothing refused."""
    for seq in range(4):
        names = {f"c{seq}-{i:03d}": [hist(1, [1, 1])] for i in range(50)}
        body = batch(seq, [step(names)], engine_id="many-cats", model="many-model")
        assert httpx.post(server.url + "/v1/telemetry", json=body, headers=server.headers("ingest")).status_code == 200
    cats = [v["category"] for v in httpx.get(server.url + "/v1/categories").json() if v["model"] == "many-model"]
    assert "_overflow" in cats and len(cats) <= 65
    assert 'specctl_overflow_category_steps_total{model_name="many-model"}' in httpx.get(server.url + "/metrics").text


def test_server_healthy_after_bad_inputs(server):
    assert httpx.get(server.url + "/readyz").status_code == 200
    assert "specctl_http_internal_errors_total 0.0" in httpx.get(server.url + "/metrics").text
