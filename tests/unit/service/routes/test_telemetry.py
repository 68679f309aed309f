"""The telemetry posts' lean route: the same answers as the FastAPI route it stands in front of."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.routes import telemetry
from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN, INGEST, FakeClock, parked_sleep, settings_for

JSON = {"Content-Type": "application/json"}
LARGE = batch(5, [step({"code": [hist(4, [1, 0, 0, 0, 3])]}, t=i * 0.02) for i in range(80)])

#: (what, method, url, headers, body): posted in this order, to both apps
REQUESTS = [
    ("accepted", "POST", "/v1/telemetry", {**INGEST, **JSON}, json.dumps(batch(0))),
    ("duplicate", "POST", "/v1/telemetry", {**INGEST, **JSON}, json.dumps(batch(0))),
    ("gap", "POST", "/v1/telemetry", {**INGEST, **JSON}, json.dumps(batch(3))),
    ("large body", "POST", "/v1/telemetry", {**INGEST, **JSON}, json.dumps(LARGE)),
    ("no token", "POST", "/v1/telemetry", JSON, json.dumps(batch(6))),
    ("wrong token", "POST", "/v1/telemetry", {"Authorization": "Bearer nope", **JSON}, json.dumps(batch(6))),
    ("admin token", "POST", "/v1/telemetry", {**ADMIN, **JSON}, json.dumps(batch(6))),
    ("not JSON type", "POST", "/v1/telemetry", {**INGEST, "Content-Type": "text/plain"}, "{}"),
    ("empty body", "POST", "/v1/telemetry", {**INGEST, **JSON}, ""),
    ("malformed", "POST", "/v1/telemetry", {**INGEST, **JSON}, "{not json"),
    ("invalid field", "POST", "/v1/telemetry", {**INGEST, **JSON}, json.dumps({**batch(7), "seq": "x"})),
    ("refused k_max", "POST", "/v1/telemetry", {**INGEST, **JSON}, json.dumps(batch(8, k_max=2))),
    ("repeated query", "POST", "/v1/telemetry?a=1&a=2", {**INGEST, **JSON}, json.dumps(batch(9))),
    ("single query", "POST", "/v1/telemetry?a=1", {**INGEST, **JSON}, json.dumps(batch(10))),
    ("bad length", "POST", "/v1/telemetry", {**INGEST, **JSON, "Content-Length": "x"}, json.dumps(batch(11))),
    ("GET", "GET", "/v1/telemetry", INGEST, None),
    ("trailing slash", "POST", "/v1/telemetry/", {**INGEST, **JSON}, json.dumps(batch(12))),
    ("after all", "POST", "/v1/telemetry", {**INGEST, **JSON}, json.dumps(batch(13))),
]
HEADERS = ("content-type", "www-authenticate", "retry-after", "allow", "location")


def _answers(tmp_path, name: str, lean: bool) -> list[tuple]:
    app = create_app(settings_for(tmp_path / f"{name}.db"), FakeClock(), sleep=parked_sleep)
    if not lean:
        app.router.routes.remove(telemetry.lean_route)
    out = []
    with TestClient(app, follow_redirects=False) as client:
        for what, method, url, headers, body in REQUESTS:
            response = client.request(method, url, headers=headers, content=body)
            out.append((what, response.status_code, response.content,
                        {h: response.headers.get(h) for h in HEADERS}))
        out.append(("engines", client.get("/v1/engines", headers=ADMIN).json()))
    return out


def test_lean_route_answers_as_the_fastapi_route(tmp_path):
    lean, full = _answers(tmp_path, "lean", True), _answers(tmp_path, "full", False)
    for a, b in zip(lean, full, strict=True):
        assert a == b
    statuses = {row[0]: row[1] for row in lean[:-1]}
    assert statuses["accepted"] == statuses["large body"] == 200
    assert {statuses[w] for w in ("no token", "wrong token", "admin token")} == {401, 403}
    assert statuses["repeated query"] == 422 and statuses["GET"] == 405 and statuses["not JSON type"] == 415


def test_lean_route_is_matched_first_and_the_schema_keeps_the_endpoint(tmp_path):
    app = create_app(settings_for(tmp_path / "s.db"), FakeClock(), sleep=parked_sleep)
    assert app.router.routes[0] is telemetry.lean_route
    post = app.openapi()["paths"]["/v1/telemetry"]["post"]
    assert post["summary"].startswith("Report engine steps")
