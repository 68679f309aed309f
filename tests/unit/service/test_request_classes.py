"""Requests in progress limited by class: probes never refused, telemetry and the rest each by their share."""

from __future__ import annotations

import asyncio

import pytest

from specctl_vllm.controller.service.connections import connection_cap
from specctl_vllm.controller.service.request_classes import ClassCounts, RequestClasses, request_class


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [("GET", "/healthz", "probe"), ("GET", "/readyz", "probe"), ("POST", "/v1/telemetry", "telemetry"),
     ("GET", "/v1/telemetry", "admin"), ("GET", "/metrics", "admin"), ("PUT", "/v1/overrides/chat", "admin"),
     ("GET", "/v1/policy", "admin")],
)
def test_request_class(method, path, kind):
    assert request_class(method, path) == kind


@pytest.mark.parametrize(
    ("configured", "fds", "cap"),
    [(None, 1024, 960), (512, 1024, 512), (5000, 1024, 960), (None, 10, 1), (None, 65536, 65472)],
)
def test_connection_cap_is_what_descriptors_allow(configured, fds, cap):
    assert connection_cap(configured, fds) == cap


def test_each_class_has_its_share_and_probes_are_never_refused():
    release = asyncio.Event()
    statuses: list[tuple[str, int]] = []

    async def app(scope, receive, send):
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    counts = ClassCounts()
    limited = RequestClasses(app, telemetry_limit=2, admin_limit=1, counts=counts)

    async def call(method, path):
        sent = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "headers": []}
        await limited(scope, None, send)
        statuses.append((path, sent[0]["status"]))
        return sent[0]

    async def run():
        held = [asyncio.create_task(call("POST", "/v1/telemetry")) for _ in range(2)]
        held.append(asyncio.create_task(call("GET", "/metrics")))
        held += [asyncio.create_task(call("GET", "/healthz")) for _ in range(50)]
        await asyncio.sleep(0.01)
        refused_t = await call("POST", "/v1/telemetry")
        refused_a = await call("GET", "/v1/engines")
        release.set()
        await asyncio.gather(*held)
        return refused_t, refused_a

    refused_t, refused_a = asyncio.run(run())
    assert refused_t["status"] == 503 and (b"retry-after", b"1") in refused_t["headers"]
    assert refused_a["status"] == 503
    assert sorted(s for p, s in statuses if p == "/healthz") == [200] * 50
    assert counts.refused == {"telemetry": 1, "admin": 1}
    assert counts.in_progress == {"probe": 0, "telemetry": 0, "admin": 0}
