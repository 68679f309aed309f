"""HTTP edges: client disconnects, body and header read deadlines, the connection cap."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.connections import (
    ConnectionPolicy,
    content_length,
    guarded_protocol,
    header_problem,
)
from specctl_vllm.controller.service.server import http_protocol
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


def _serve(tmp_path, max_connections, header_timeout_s, http="httptools", loop="asyncio", **limits):
    app = create_app(settings_for(tmp_path / "db"), sleep=parked_sleep)
    policy = ConnectionPolicy(max_connections=max_connections, header_timeout_s=header_timeout_s, **limits)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, http=guarded_protocol(http_protocol(http), policy), loop=loop,
                            log_config=None, lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    return server, thread, sock.getsockname()[1], policy


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


def _request(port, raw, sock=None):
    s = sock or socket.create_connection(("127.0.0.1", port), timeout=3)
    s.sendall(raw)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    if sock is None:
        s.close()
    return data.split(b"\r\n")[0]


@pytest.mark.parametrize(("http", "loop"), [("httptools", "asyncio"), ("h11", "asyncio"), ("httptools", "uvloop")])
def test_idle_connections_are_evicted_for_new_ones(tmp_path, http, loop):
    server, thread, port, policy = _serve(tmp_path, max_connections=4, header_timeout_s=30, http=http, loop=loop)
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        time.sleep(0.2)
        assert _healthz(port) == b"HTTP/1.1 200 OK"  # at the cap: the idlest connection made room
        assert _closed(idle[0], 2.0) and policy.evicted >= 1
        kept = socket.create_connection(("127.0.0.1", port), timeout=3)
        get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        assert _request(port, get, kept) == b"HTTP/1.1 200 OK"  # kept open, recently active
        for _ in range(6):  # newer idle sockets evict the older ones, never the one just used... in turn
            socket.create_connection(("127.0.0.1", port))
        assert _healthz(port) == b"HTTP/1.1 200 OK"
        for s in idle + [kept]:
            s.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_trickling_headers_time_out(tmp_path):
    server, thread, port, policy = _serve(tmp_path, max_connections=8, header_timeout_s=0.5)
    try:
        partial = socket.create_connection(("127.0.0.1", port))
        partial.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        assert _closed(partial)
        assert policy.timed_out == 1
        assert _healthz(port) == b"HTTP/1.1 200 OK"
        partial.close()
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.parametrize(
    "raw",
    [b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
     b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(100)) + b"\r\n",
     b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000],  # never ends: refused as it grows
    ids=["large", "many", "unfinished"],
)
def test_oversized_headers_get_431(tmp_path, http, raw):
    server, thread, port, policy = _serve(tmp_path, max_connections=8, header_timeout_s=30, http=http,
                                          max_header_bytes=16 * 1024, max_header_count=64)
    try:
        assert _request(port, raw) == b"HTTP/1.1 431 Request Header Fields Too Large"
        assert policy.headers_refused == 1
        assert _healthz(port) == b"HTTP/1.1 200 OK"
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_large_body_after_small_headers_is_not_counted_as_headers(tmp_path):
    server, thread, port, policy = _serve(tmp_path, max_connections=8, header_timeout_s=30,
                                          max_header_bytes=1024)
    try:
        body = b"x" * 200_000
        raw = (b"POST /v1/telemetry HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
        status = _request(port, raw)
        assert status.startswith(b"HTTP/1.1 ") and b"431" not in status
        assert policy.headers_refused == 0
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_a_body_arriving_after_an_early_response_is_body_not_headers(tmp_path, http):
    """The app answers 401 before reading the body; the body's bytes that arrive afterwards are not the next
    request's headers (they were refused as 431 when the response was taken for the end of the request)."""
    server, thread, port, policy = _serve(tmp_path, max_connections=8, header_timeout_s=30, max_header_bytes=1024,
                                          http=http)
    try:
        body = b"x" * 200_000
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            head = b"POST /v1/telemetry HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
            assert _request(port, head, s) == b"HTTP/1.1 401 Unauthorized"  # answered before the body was sent
            s.sendall(body)
            deadline = time.monotonic() + 2
            while policy.headers_refused == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert policy.headers_refused == 0
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.mark.parametrize(("head", "length"), [
    (b"POST / HTTP/1.1\r\nContent-Length: 12\r\n\r\n", 12),
    (b"POST / HTTP/1.1\r\ncontent-length:  7 \r\n\r\n", 7),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 0),
    (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 0),
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0),
])
def test_content_length(head, length):
    assert content_length(head) == length


@pytest.mark.parametrize(
    ("head", "problem"),
    [(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", None),
     (b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 4 + b"\r\n", None),
     (b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 5 + b"\r\n", "more than 4 header lines"),
     (b"GET / HTTP/1.1\r\nA: " + b"b" * 200, "request line and headers exceed 128 bytes")],
)
def test_header_problem(head, problem):
    assert header_problem(head, 128, 4) == problem


def test_telemetry_posts_are_timed_by_the_guard_and_scraped(tmp_path):
    """Each telemetry post answered (200 or refused) is timed from its first byte read to its answer's first byte
    written; other requests are not. The clock steps 0.3 s a call: every post observes exactly 0.3 s."""
    import itertools

    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from tests.unit.service.batches import batch
    from tests.unit.service.conftest import ADMIN

    ticks = itertools.count(step=0.3)
    server, thread, port, policy = _serve(tmp_path, max_connections=8, header_timeout_s=30,
                                          clock=lambda: next(ticks))
    server.config.app.state.runtime.connections = policy  # what the lifespan does under `specctl serve`
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:  # one kept-open connection
            assert client.get("/healthz").status_code == 200
            assert client.post("/v1/telemetry", json=batch(0), headers=INGEST).status_code == 200
            assert client.post("/v1/telemetry", json=batch(1)).status_code == 401
            assert client.get("/readyz").status_code == 200
            text = client.get("/metrics", headers=ADMIN).text
    finally:
        server.should_exit = True
        thread.join(10)
    small = policy.telemetry["small"]
    assert small.count == 2 and small.total_s == pytest.approx(0.6) and policy.telemetry["large"].count == 0
    assert small.counts[small.bounds.index(0.5)] == 2
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "specctl_http_telemetry_seconds"]
    samples = {(s.name, s.labels["body"], s.labels.get("le")): s.value for s in family.samples}
    assert samples[("specctl_http_telemetry_seconds_count", "small", None)] == 2
    assert samples[("specctl_http_telemetry_seconds_bucket", "small", "0.25")] == 0
    assert samples[("specctl_http_telemetry_seconds_bucket", "small", "0.5")] == 2
    assert samples[("specctl_http_telemetry_seconds_count", "large", None)] == 0
