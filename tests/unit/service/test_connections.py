"""HTTP edges: client disconnects, body and header read deadlines, the connection cap."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.connections import limited_protocol
from tests.unit.service.conftest import INGEST, parked_sleep, settings_for


def _asgi_post(app, messages, timeout=5.0):
    """POST /v1/telemetry straight into the ASGI app with these receive messages; (status, internal errors)."""
    sent = []

    async def run():
        queue = list(messages)

        async def receive():
            if queue:
                item = queue.pop(0)
                if item == "hang":
                    await asyncio.Event().wait()
                return item
            await asyncio.Event().wait()

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/telemetry", "raw_path": b"/v1/telemetry",
                 "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
                 "server": ("127.0.0.1", 8081), "client": ("127.0.0.1", 5000),
                 "headers": [(b"authorization", INGEST["Authorization"].encode()),
                             (b"content-type", b"application/json")]}
        await asyncio.wait_for(app(scope, receive, send), timeout)

    asyncio.run(run())
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


@pytest.mark.parametrize(
    ("messages", "status"),
    [
        ([{"type": "http.request", "body": b'{"protocol"', "more_body": True}, {"type": "http.disconnect"}], 499),
        ([{"type": "http.disconnect"}], 499),
        ([{"type": "http.request", "body": b'{"protocol"', "more_body": True}, "hang"], 408),
    ],
    ids=["drops-mid-body", "drops-before-body", "trickles"],
)
def test_client_going_away_is_not_an_internal_error(client, messages, status):
    runtime = client.app.state.runtime
    limit = next(m for m in _middlewares(client.app.middleware_stack) if type(m).__name__ == "BodyLimit")
    limit.body_timeout_s = 0.2
    assert _asgi_post(client.app, messages) == status  # the started app (lifespan done by the TestClient)
    assert runtime.internal_errors == 0
    metrics = client.get("/metrics").text
    assert "specctl_http_internal_errors_total 0.0" in metrics


def _middlewares(app):
    while app is not None:
        yield app
        app = getattr(app, "app", None)


def _serve(tmp_path, max_connections, header_timeout_s):
    app = create_app(settings_for(tmp_path / "db"), sleep=parked_sleep)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, http=limited_protocol(max_connections, header_timeout_s), loop="asyncio",
                            log_config=None, lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return server, thread, sock.getsockname()[1]


def _healthz(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return s.recv(100).split(b"\r\n")[0]


def _closed(s, wait=3.0):
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_cannot_exhaust_the_server(tmp_path):
    server, thread, port = _serve(tmp_path, max_connections=4, header_timeout_s=0.5)
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        extra = socket.create_connection(("127.0.0.1", port))
        assert _closed(extra, 2.0)  # beyond the cap: closed at once
        partial = idle[0]
        partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        assert all(_closed(s) for s in idle)  # header deadline: idle and trickling sockets are let go
        assert _healthz(port) == b"HTTP/1.1 200 OK"  # and the server serves again
        for s in idle + [extra]:
            s.close()
    finally:
        server.should_exit = True
        thread.join(10)
