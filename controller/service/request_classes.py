"""Requests in progress, limited by class: probes never, telemetry by its own share, everything else by another.

A flood of reads or admin calls cannot take the telemetry share, a flood of telemetry cannot keep an operator
out, and ``/healthz`` and ``/readyz`` answer whatever else is going on (the Kubernetes probes restart the pod
when they fail). Beyond its share a request gets 503 with ``Retry-After`` before anything reads its body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from starlette.types import ASGIApp, Receive, Scope, Send

RequestClass = Literal["probe", "telemetry", "admin"]
PROBES = frozenset({"/healthz", "/readyz"})
#: seconds a client refused for its class's share is told to wait
RETRY_AFTER_S = 1


def request_class(method: str, path: str) -> RequestClass:
    if path in PROBES:
        return "probe"
    if path == "/v1/telemetry" and method == "POST":
        return "telemetry"
    return "admin"  # reads, metrics, overrides, forget


@dataclass
class ClassCounts:
    in_progress: dict[str, int] = field(default_factory=lambda: {"probe": 0, "telemetry": 0, "admin": 0})
    refused: dict[str, int] = field(default_factory=lambda: {"telemetry": 0, "admin": 0})


class RequestClasses:
    def __init__(self, app: ASGIApp, telemetry_limit: int, admin_limit: int, counts: ClassCounts) -> None:
        self.app = app
        self.limits = {"telemetry": telemetry_limit, "admin": admin_limit}
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = request_class(scope["method"], scope["path"])
        in_progress = self.counts.in_progress
        if kind != "probe" and in_progress[kind] >= self.limits[kind]:
            self.counts.refused[kind] += 1
            body = json.dumps({"detail": f"too many {kind} requests in progress (limit {self.limits[kind]})",
                               "errors": []}).encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"retry-after", str(RETRY_AFTER_S).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        in_progress[kind] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            in_progress[kind] -= 1
