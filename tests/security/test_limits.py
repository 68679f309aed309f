"""Resource caps and exposure: body size (413), category count, CORS, and a separate admin address."""

from __future__ import annotations

import httpx
import pytest

from bench.support.specctl_serve import telemetry_batch
from tests.security.conftest import ALLOWED_ORIGIN, CATEGORY_CAP

DEFAULT_MAX_BODY = 4 * 1024 * 1024  # ServerSettings.max_body_bytes default
OVERRIDE = {"k": 2, "reason": "limits test", "actor": "tester"}


def _padded_batch(size: int) -> bytes:
    """A syntactically valid JSON batch of about ``size`` bytes (the padding is a long model name)."""
    doc = telemetry_batch("big-engine", 0, {"default": [1, 0, 0, 0, 0]})
    doc["model_name"] = "m" * size
    return httpx.Request("POST", "http://x", json=doc).content


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_the_cap_is_413(controller, chunked):
    body = _padded_batch(DEFAULT_MAX_BODY + 1024)
    content = (body[i:i + 65536] for i in range(0, len(body), 65536)) if chunked else body
    response = httpx.post(controller.url + "/v1/telemetry", content=content, timeout=30,
                          headers={**controller.headers("ingest"), "content-type": "application/json"})
    assert response.status_code == 413
    assert str(DEFAULT_MAX_BODY) in response.json()["detail"]
    # the controller carries on: a normal batch right after is acknowledged
    ok = httpx.post(controller.url + "/v1/telemetry", headers=controller.headers("ingest"), timeout=10,
                    json=telemetry_batch("after-413", 0, {"default": [1, 0, 0, 0, 0]}))
    assert ok.status_code == 200


def test_oversized_override_is_413_and_not_applied(controller):
    body = {**OVERRIDE, "reason": "r" * (DEFAULT_MAX_BODY + 10)}
    response = httpx.put(controller.url + "/v1/overrides/big", json=body, headers=controller.headers("admin"),
                         timeout=30)
    assert response.status_code == 413
    assert httpx.get(controller.url + "/v1/overrides/big").status_code == 404


def test_category_count_is_capped(hardened):
    """Fresh names beyond the cap pool into one overflow category instead of growing state."""
    names = [f"cat{i:02d}" for i in range(CATEGORY_CAP * 3)]
    for seq, chunk in enumerate(names[i:i + 4] for i in range(0, len(names), 4)):
        batch = telemetry_batch("cap-engine", seq, {n: [1, 1, 0, 0, 0] for n in chunk}, model="cap-model")
        response = httpx.post(hardened.url + "/v1/telemetry", json=batch, headers=hardened.headers("ingest"))
        assert response.status_code == 200, response.text
    listed = {c["category"] for c in httpx.get(hardened.url + "/v1/categories").json() if c["model"] == "cap-model"}
    assert len(listed - {"_overflow"}) <= CATEGORY_CAP
    assert "_overflow" in listed
    metrics = httpx.get(hardened.url + "/metrics").text
    assert 'category="_overflow"' in metrics


def test_too_many_categories_in_one_step_is_422(controller):
    batch = telemetry_batch("wide-engine", 0, {f"w{i:03d}": [1, 0, 0, 0, 0] for i in range(65)})
    response = httpx.post(controller.url + "/v1/telemetry", json=batch, headers=controller.headers("ingest"))
    assert response.status_code == 422
    assert response.json()["errors"]


# -- CORS --------------------------------------------------------------------------------------

def _preflight(url: str, origin: str) -> httpx.Response:
    return httpx.options(url + "/v1/overrides/x", headers={
        "Origin": origin, "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "authorization,content-type"})


def test_cors_is_off_by_default(controller):
    for origin in (ALLOWED_ORIGIN, "https://evil.example"):
        assert "access-control-allow-origin" not in _preflight(controller.url, origin).headers
        read = httpx.get(controller.url + "/v1/overrides", headers={"Origin": origin})
        assert read.status_code == 200
        assert "access-control-allow-origin" not in read.headers


def test_cors_allows_only_the_configured_origins(hardened):
    allowed = _preflight(hardened.url, ALLOWED_ORIGIN)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    refused = _preflight(hardened.url, "https://evil.example")
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers


# -- admin API on its own address ------------------------------------------------------------

def test_admin_writes_only_on_the_admin_address(hardened):
    admin = hardened.headers("admin")
    on_main = httpx.put(hardened.url + "/v1/overrides/split", json=OVERRIDE, headers=admin)
    assert on_main.status_code == 403
    assert "admin listener" in on_main.json()["detail"]
    on_admin = httpx.put(hardened.admin_url + "/v1/overrides/split", json=OVERRIDE, headers=admin)
    assert on_admin.status_code == 200, on_admin.text
    # the admin address still checks the token
    assert httpx.put(hardened.admin_url + "/v1/overrides/split", json=OVERRIDE).status_code == 401
    # reads and ingest stay on the main address
    assert httpx.get(hardened.url + "/v1/overrides/split").json()["k"] == OVERRIDE["k"]
    batch = telemetry_batch("split-engine", 0, {"default": [1, 0, 0, 0, 0]})
    assert httpx.post(hardened.url + "/v1/telemetry", json=batch, headers=hardened.headers("ingest")).status_code == 200
    clear = httpx.delete(hardened.admin_url + "/v1/overrides/split", params={"actor": "tester"}, headers=admin)
    assert clear.status_code == 200
