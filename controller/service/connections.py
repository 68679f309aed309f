"""Connection-level limits uvicorn does not have, through the protocol class its public ``http=`` setting
accepts: a cap on open connections that evicts idle ones first, a deadline, a size cap and a count cap on a
request's line and headers.

uvicorn's ``limit_concurrency`` counts open connections as well as requests, so idle sockets made every
request (``/healthz`` included) answer 503; it is not used. :class:`ConnectionGuard` wraps the protocol uvicorn
would have used (by composition, through ``asyncio.Protocol``'s public methods only) and sees the bytes:

- a connection waits for a request (nothing of it received yet), is reading headers, or is in a request (its
  headers ended, its response not started). At the cap a new connection evicts the connection that has been
  waiting or reading headers the longest; when every open connection is in a request, the new one is closed;
- headers must end within ``header_timeout_s`` of the connection opening or of the previous response;
- headers larger than ``max_header_bytes`` or with more than ``max_header_count`` lines get 431 and the
  connection is closed, before the HTTP parser buffers them.

Requests in progress are limited by class in :mod:`specctl_vllm.controller.service.request_classes`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specctl_vllm.controller.service.timing import BODIES, LatencyHistogram, body_class

log = logging.getLogger("controller.service")

#: File descriptors kept for everything but client connections (SQLite and its WAL, the recorder, the render
#: worker's pipes, the listening sockets, logs): the connection cap is the descriptor limit minus these.
FD_RESERVE = 64
_END = b"\r\n\r\n"
_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
              b"connection: close\r\ncontent-length: %d\r\n\r\n%s")

WAITING, HEADERS, REQUEST = "waiting", "headers", "request"
#: The request line a telemetry post starts with (its handling time is measured, :mod:`.timing`).
_TELEMETRY = b"POST /v1/telemetry "


def connection_cap(configured: int | None, soft_fd_limit: int | None = None) -> int:
    """Open connections allowed: what the descriptors allow (``RLIMIT_NOFILE`` less :data:`FD_RESERVE`), or
    the configured figure when it is lower."""
    if soft_fd_limit is None:
        soft_fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    allowed = max(1, soft_fd_limit - FD_RESERVE)
    return allowed if configured is None else max(1, min(configured, allowed))


def content_length(head: bytes) -> int:
    """The request body's declared length; 0 where none is declared or it is unreadable (the HTTP parser
    refuses those requests itself). A chunked body counts as 0: its bytes after an early response are then
    read as headers, the behaviour without this count."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() and len(value) <= 18 else 0
    return 0


def header_problem(head: bytes, max_bytes: int, max_count: int) -> str | None:
    """Why a request line and headers received so far (``head``, maybe not complete) are refused, or None."""
    if len(head) > max_bytes:
        return f"request line and headers exceed {max_bytes} bytes"
    if head.count(b"\n") - 1 > max_count + 1:  # the request line, the headers, the blank line
        return f"more than {max_count} header lines"
    return None


@dataclass
class ConnectionPolicy:
    """The limits and the open connections of one server (no module-level state)."""

    max_connections: int
    header_timeout_s: float
    max_header_bytes: int = 16 * 1024
    max_header_count: int = 64
    open: dict[Any, None] = field(default_factory=dict)  # insertion order = least recently active first
    refused: int = 0
    evicted: int = 0
    timed_out: int = 0
    headers_refused: int = 0
    #: telemetry posts' handling time, first byte read to first byte of the answer written, by body size
    telemetry: dict[str, LatencyHistogram] = field(default_factory=lambda: {c: LatencyHistogram() for c in BODIES})
    clock: Callable[[], float] = time.monotonic

    def touch(self, conn: Any) -> None:
        self.open.pop(conn, None)
        self.open[conn] = None

    def idlest(self) -> Any | None:
        """The connection to evict for a new one: waiting or reading headers, least recently active."""
        return next((c for c in self.open if c.state != REQUEST), None)


class _Transport:
    """The transport as the wrapped protocol sees it: every call passes through; a write marks the response."""

    def __init__(self, transport: Any, on_write: Callable[[], None]) -> None:
        self._transport = transport
        self._on_write = on_write

    def write(self, data: bytes) -> None:
        if not data.startswith(b"HTTP/1.1 1"):  # "100 Continue" is not the response: the body follows it
            self._on_write()
        self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        self._on_write()
        self._transport.writelines(lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(inner: Callable[..., asyncio.Protocol], policy: ConnectionPolicy) -> type[asyncio.Protocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` that builds ``inner`` with uvicorn's arguments and
    enforces ``policy`` around it."""

    class ConnectionGuard(asyncio.Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._inner = inner(*args, **kwargs)
            self._loop = asyncio.get_running_loop() if kwargs.get("_loop") is None else kwargs["_loop"]
            self.state = WAITING
            self._head = b""
            self._timer: asyncio.TimerHandle | None = None
            self._transport: Any = None
            self._served = False  # the wrapped protocol was given the connection (and must hear of its end)
            # bytes of the request body not yet received (Content-Length); a response may start before the body
            # is in (an early 401), and what arrives after it is still that body, not the next request's headers
            self._body_left = 0
            self._responded = False
            self._started: float | None = None  # when this request's first bytes were read, if a telemetry post
            self._body_class = BODIES[0]

        # -- asyncio.Protocol ------------------------------------------------------------------------
        def connection_made(self, transport: Any) -> None:  # uvloop's transports are not asyncio's classes
            self._transport = transport
            if len(policy.open) >= policy.max_connections:
                victim = policy.idlest()
                if victim is None:
                    policy.refused += 1
                    transport.abort()
                    return
                policy.evicted += 1
                victim.close()
            policy.touch(self)
            self._arm()
            self._served = True
            self._inner.connection_made(_Transport(transport, self._responding))

        def data_received(self, data: bytes) -> None:
            if self not in policy.open:
                return
            policy.touch(self)
            if self.state == REQUEST:
                self._body_left -= len(data)
                if self._responded and self._body_left <= 0:
                    self._next_request()
                self._inner.data_received(data)
                return
            if self.state == WAITING:
                self._started = policy.clock()
            self.state = HEADERS
            start = max(0, len(self._head) - 3)
            self._head += data
            end = self._head.find(_END, start)
            head = self._head if end < 0 else self._head[: end + 4]
            problem = header_problem(head, policy.max_header_bytes, policy.max_header_count)
            if problem is not None:
                self._refuse_headers(problem)
                return
            if end >= 0:
                if not head.startswith(_TELEMETRY):
                    self._started = None
                declared = content_length(head)
                self._body_class = body_class(declared)
                self._body_left = declared - (len(self._head) - end - 4)
                self.state, self._head, self._responded = REQUEST, b"", False
                self._disarm()
            self._inner.data_received(data)

        def eof_received(self) -> bool | None:
            return self._inner.eof_received() if self._served else None

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            policy.open.pop(self, None)
            if self._served:
                self._inner.connection_lost(exc)

        def pause_writing(self) -> None:
            self._inner.pause_writing()

        def resume_writing(self) -> None:
            self._inner.resume_writing()

        # -- the policy ------------------------------------------------------------------------------
        def close(self) -> None:
            policy.open.pop(self, None)  # no longer counted: its room goes to the connection that evicted it
            if self._transport is not None and not self._transport.is_closing():
                self._transport.close()

        def _responding(self) -> None:
            if self.state == REQUEST:
                if self._started is not None and not self._responded:
                    policy.telemetry[self._body_class].observe(policy.clock() - self._started)
                    self._started = None
                self._responded = True
                if self._body_left <= 0:  # the response starts: what arrives next is the next request's headers
                    self._next_request()
            policy.touch(self)

        def _next_request(self) -> None:
            self.state, self._body_left = WAITING, 0
            self._arm()

        def _refuse_headers(self, problem: str) -> None:
            policy.headers_refused += 1
            self._disarm()
            body = json.dumps({"detail": problem, "errors": []}).encode()
            assert self._transport is not None
            self._transport.write(_TOO_LARGE % (len(body), body))
            self._head = b""
            self.close()

        def _arm(self) -> None:
            self._disarm()
            self._timer = self._loop.call_later(policy.header_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _too_slow(self) -> None:
            self._timer = None
            if self.state != REQUEST:
                policy.timed_out += 1
                self.close()

    return ConnectionGuard
