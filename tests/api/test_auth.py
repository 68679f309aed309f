"""Bearer tokens on a real server: separate scopes, 401 missing, 403 wrong, tokens never logged."""

from __future__ import annotations

import httpx
import pytest

from bench.support.specctl_serve import ADMIN_TOKEN, INGEST_TOKEN
from tests.unit.service.batches import batch

pytestmark = pytest.mark.api

WRITES = [
    ("POST", "/v1/telemetry", "ingest", batch(0, engine_id="auth-engine")),
    ("PUT", "/v1/overrides/auth-cat", "admin", {"k": 1, "reason": "r", "actor": "t"}),
    ("DELETE", "/v1/overrides/auth-cat?actor=t", "admin", None),
]
AUTH = [
    ("missing", lambda own, other: {}, 401),
    ("not bearer", lambda own, other: {"Authorization": f"Basic {own}"}, 401),
    ("wrong", lambda own, other: {"Authorization": "Bearer " + "x" * len(own)}, 403),
    ("other scope", lambda own, other: {"Authorization": f"Bearer {other}"}, 403),
]


@pytest.mark.parametrize(("method", "path", "scope", "body"), WRITES, ids=[w[1] + " " + w[0] for w in WRITES])
@pytest.mark.parametrize(("case", "headers", "status"), AUTH, ids=[a[0] for a in AUTH])
def test_refused(server, method, path, scope, body, case, headers, status):
    own, other = (ADMIN_TOKEN, INGEST_TOKEN) if scope == "admin" else (INGEST_TOKEN, ADMIN_TOKEN)
    response = httpx.request(method, server.url + path, json=body, headers=headers(own, other), timeout=10)
    assert response.status_code == status and response.json()["detail"]
    assert own not in response.text and other not in response.text


def test_tokens_not_in_logs(server):
    httpx.put(server.url + "/v1/overrides/auth-cat", json={"k": 1, "reason": "r", "actor": "t"},
              headers=server.headers("admin"), timeout=10)
    httpx.post(server.url + "/v1/telemetry", content=b"{bad", timeout=10,
               headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
    log = server.log_text()
    assert '"msg": "listening"' in log  # the log is there, and JSON
    assert ADMIN_TOKEN not in log and INGEST_TOKEN not in log
