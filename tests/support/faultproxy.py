"""A small HTTP/1.1 fault proxy on loopback: engine -> proxy -> controller, fault switchable at runtime.

The reliability tests point the engine's ``SPECCTL_CONTROLLER_URL`` at this proxy and switch the fault
while the engine serves traffic. The proxy runs its own asyncio loop in a daemon thread, so synchronous
tests call :meth:`FaultProxy.set_fault` from the test body.

Faults (:class:`Fault`):
  * ``pass``     forward unchanged;
  * ``refuse``   nothing listens on the port (connect -> ECONNREFUSED), open connections are reset: the
                 controller process is gone;
  * ``reset``    accept, read the request, then reset the connection (controller dies mid-request);
  * ``hang``     accept and read the request, never answer (controller wedged);
  * ``http500``  answer ``500`` without contacting the controller;
  * ``latency``  forward after ``latency_s`` seconds;
  * ``hostile``  forward, then replace the policy in the answer by a :class:`Hostile` variant.

Every ``POST /v1/telemetry`` body is also parsed (best effort) and kept in :attr:`FaultProxy.seen`, so a
test observes what the engine reports (``policy_version``, ``dropped_steps``, drafts per category) even
while the controller is unreachable. An upstream that cannot be reached is mirrored as a reset, so
killing the real controller behind the proxy looks to the engine like a dead controller, not like a 502.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import enum
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Self

import httpx

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host",
     "content-length", "content-encoding"}
)
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024


class Fault(enum.StrEnum):
    PASS = "pass"
    REFUSE = "refuse"
    RESET = "reset"
    HANG = "hang"
    HTTP500 = "http500"
    LATENCY = "latency"
    HOSTILE = "hostile"


class Hostile(enum.StrEnum):
    """Policies a broken or malicious controller could send; the engine must ignore or clamp each."""

    K_ABOVE_MAX = "k_above_max"  # valid on the wire (k = MAX_K) but above any test engine's k_max
    K_OUT_OF_RANGE = "k_out_of_range"  # k = 10**6: outside the protocol's bounds
    NEGATIVE_K = "negative_k"
    UNKNOWN_METHOD = "unknown_method"  # well-formed name of a drafter no engine has
    MALFORMED_JSON = "malformed_json"
    WRONG_SHAPE = "wrong_shape"  # valid JSON, not an ack
    HUGE_PAYLOAD = "huge_payload"  # a policy listing 50 000 categories (~1 MB; the protocol allows 1024)


#: What the protocol allows at most for k (specctl_vllm.kernel.protocol.MAX_K); kept literal so this module has no
#: dependency on the code under test.
WIRE_MAX_K = 32
HUGE_PAYLOAD_CATEGORIES = 50_000


def _set_all_k(policy: dict, k: int, method: str | None = None) -> dict:
    entries = [policy.get("default")] + list((policy.get("categories") or {}).values())
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        entry["k"] = k
        entry["probe_k"] = k
        if isinstance(entry.get("adapt"), dict):
            entry["adapt"]["k_min"] = k
            entry["adapt"]["k_max"] = k
        if method is not None:
            entry["method"] = method
    return policy


def _hostile_policy(kind: Hostile, policy: dict) -> dict:
    policy = copy.deepcopy(policy)
    # A new version, so an engine that skips an already-applied version still has to look at it.
    policy["version"] = int(policy.get("version") or 0) + 1_000_000
    if kind is Hostile.K_ABOVE_MAX:
        return _set_all_k(policy, WIRE_MAX_K)
    if kind is Hostile.K_OUT_OF_RANGE:
        return _set_all_k(policy, 10**6)
    if kind is Hostile.NEGATIVE_K:
        return _set_all_k(policy, -3)
    if kind is Hostile.UNKNOWN_METHOD:
        return _set_all_k(policy, 2, method="warp-drive")
    if kind is Hostile.HUGE_PAYLOAD:
        template = dict(policy.get("default") or {"k": WIRE_MAX_K})
        policy["categories"] = {f"c{i:07d}": template for i in range(HUGE_PAYLOAD_CATEGORIES)}
        return policy
    raise ValueError(f"{kind} is not a policy rewrite")


def hostile_body(kind: Hostile, upstream_body: bytes) -> bytes:
    """The answer body a hostile controller sends instead of ``upstream_body`` (an ack or a policy).

    Pure function so that the rewrite itself is unit-tested apart from the sockets.
    """
    if kind is Hostile.MALFORMED_JSON:
        return b'{"outcome": "accepted", "policy": {"version": 7, "categories": {"default": {"k": '
    if kind is Hostile.WRONG_SHAPE:
        return b'[1, 2, "three", null, {"policy": "k=4"}]'
    try:
        doc = json.loads(upstream_body)
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    if isinstance(doc.get("policy"), dict):  # TelemetryAck
        doc["policy"] = _hostile_policy(kind, doc["policy"])
    elif "version" in doc:  # bare Policy (GET /v1/policy)
        doc = _hostile_policy(kind, doc)
    else:  # upstream said something else (error): still hand out a hostile policy
        doc = {"outcome": "accepted", "seq": 0, "gaps": 0,
               "policy": _hostile_policy(kind, {"version": 1, "issued_at": time.time(), "ttl_s": 5.0,
                                                "default": {"k": 1}, "categories": {}})}
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class TelemetrySeen:
    """What one engine telemetry POST said, as seen on the wire by the proxy."""

    at: float  # proxy monotonic clock
    fault: Fault
    engine_id: str | None
    seq: int | None
    policy_version: int | None
    dropped_steps: int | None
    steps: int
    draft_tokens: int
    draft_tokens_by_category: dict[str, int]
    #: (t, wall_s, draft_depth) of each step record: engine monotonic clock (CLOCK_MONOTONIC, comparable
    #: with the test's time.monotonic()) at step end, the step's duration, and the drafting depth the engine
    #: asked for the next step
    step_times: tuple[tuple[float, float, int], ...] = ()


def _telemetry_doc(body: bytes) -> dict:
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


#: A batch whose ``sent_at`` is older than this when the proxy reads it is a retry (the reporter resends its
#: pending batch as built, ``sent_at`` included): its send time is unknown, and the proxy's reading stands.
MAX_SEND_SKEW_S = 2.0


def _client_began(doc: dict, received: float) -> float:
    """When the client began this post, on this process's monotonic clock: the batch's ``sent_at`` (the
    engine's wall clock, this host's) where it is earlier than the proxy's reading of the request. On a loaded
    host the proxy reads a request well after the engine sent it, and the engine's request timeout counts from
    its send: an answer the proxy wrote 0.4 s after reading it could reach an engine that had given up."""
    sent_at = doc.get("sent_at")
    if not isinstance(sent_at, int | float) or isinstance(sent_at, bool):
        return received
    skew = time.time() - float(sent_at)
    return received - skew if 0.0 < skew <= MAX_SEND_SKEW_S else received


def _summarise_telemetry(doc: dict, fault: Fault) -> TelemetrySeen:
    steps = doc.get("steps") if isinstance(doc.get("steps"), list) else []
    by_category: dict[str, int] = collections.Counter()
    for step in steps:
        for cat in (step or {}).get("categories") or []:
            for hist in cat.get("hists") or []:
                by_category[cat.get("category", "?")] += int(hist.get("k", 0)) * sum(hist.get("accepted") or [])
    return TelemetrySeen(
        at=time.monotonic(),
        fault=fault,
        engine_id=doc.get("engine_id"),
        seq=doc.get("seq"),
        policy_version=doc.get("policy_version"),
        dropped_steps=doc.get("dropped_steps"),
        steps=len(steps),
        draft_tokens=sum(int((s or {}).get("draft_tokens") or 0) for s in steps),
        draft_tokens_by_category=dict(by_category),
        step_times=tuple((float(st.get("t", 0.0)), float(st.get("wall_s", 0.0)), int(st.get("draft_depth", 0)))
                         for st in steps if isinstance(st, dict)),
    )


@dataclass(slots=True)
class _Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(slots=True)
class ProxyStats:
    requests: collections.Counter = field(default_factory=collections.Counter)  # by fault in force
    statuses: collections.Counter = field(default_factory=collections.Counter)  # answered to the client
    upstream_errors: int = 0
    connections: int = 0


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN, as a crashed peer's kernel would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return None
    headers = [(k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)]
    length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
    if length > MAX_BODY_BYTES:
        return None
    try:
        body = await reader.readexactly(length) if length else b""
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return _Request(parts[0], parts[1], headers, body)


def _response_bytes(status: int, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [f"HTTP/1.1 {status} {httpx.codes.get_reason_phrase(status) or 'Status'}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP_BY_HOP]
    lines += [f"content-length: {len(body)}", "connection: keep-alive", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


class FaultProxy:
    """Loopback proxy to ``upstream`` (``http://host:port``) with a runtime-switchable fault.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. ``port=0`` picks a free port once;
    the proxy keeps that port across ``refuse`` -> ``pass`` so the engine's URL stays valid.
    """

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0, seen_maxlen: int = 100_000):
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = port
        self.fault = Fault.PASS
        self.latency_s = 0.0
        self.hostile = Hostile.K_ABOVE_MAX
        # built once, here: generating ~1 MB per request would load the host, and building it when the fault is
        # applied held this process (the proxy's event loop) while the engine's posts waited to be read
        self._huge_body = hostile_body(Hostile.HUGE_PAYLOAD, b"{}")
        self.stats = ProxyStats()
        self.seen: collections.deque[TelemetrySeen] = collections.deque(maxlen=seen_maxlen)
        #: (request sent: the client's send where its batch says, else when the proxy read it; answer written;
        #: status; fault) of every telemetry post that got an answer
        self.answers: collections.deque[tuple[float, float, int, Fault]] = collections.deque(maxlen=seen_maxlen)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._client: httpx.AsyncClient | None = None
        self._stopping: asyncio.Event | None = None

    # ---- lifecycle (test thread) -------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FaultProxy:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="faultproxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def set_fault(self, fault: Fault | str, *, latency_s: float | None = None,
                  hostile: Hostile | str | None = None) -> None:
        """Switch the fault; takes effect for the next request (and at once for ``refuse``)."""
        fault = Fault(fault)
        with self._lock:
            if latency_s is not None:
                self.latency_s = float(latency_s)
            if hostile is not None:
                self.hostile = Hostile(hostile)
            previous, self.fault = self.fault, fault
        if fault is Fault.REFUSE and previous is not Fault.REFUSE:
            self._call(self._close_listener())
        elif fault is not Fault.REFUSE and previous is Fault.REFUSE:
            self._call(self._open_listener())

    def set_upstream(self, upstream: str) -> None:
        with self._lock:
            self.upstream = upstream.rstrip("/")

    def seen_since(self, t0: float) -> list[TelemetrySeen]:
        return [s for s in list(self.seen) if s.at >= t0]

    def _call(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # ---- event loop (proxy thread) ----------------------------------------------------------
    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        self._stopping = asyncio.Event()
        # No connection pooling to the controller: a restarted controller must not see stale sockets.
        self._client = httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_keepalive_connections=0))
        loop.run_until_complete(self._open_listener())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    async def _open_listener(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True,
                                                  limit=MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            _abort(writer)

    async def _shutdown(self) -> None:
        self._stopping.set()
        await self._close_listener()
        await self._client.aclose()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.stats.connections += 1
        try:
            while not self._stopping.is_set():
                request = await _read_request(reader)
                if request is None:
                    break
                if not await self._serve_one(request, reader, writer):
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            if not writer.transport.is_closing():
                writer.close()

    async def _serve_one(self, request: _Request, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> bool:
        """Answer one request under the fault in force; False when the connection must end."""
        with self._lock:
            fault, latency_s, hostile, upstream = self.fault, self.latency_s, self.hostile, self.upstream
        self.stats.requests[fault] += 1
        received = time.monotonic()
        telemetry = request.method == "POST" and request.target.split("?")[0] == "/v1/telemetry"
        note = None
        if telemetry:
            doc = _telemetry_doc(request.body)
            self.seen.append(_summarise_telemetry(doc, fault))
            note = (_client_began(doc, received), fault)
        return await self._serve_fault(request, reader, writer, fault, latency_s, hostile, upstream, note)

    async def _serve_fault(self, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           fault: Fault, latency_s: float, hostile: Hostile, upstream: str,
                           note: tuple[float, Fault] | None) -> bool:
        """Answer under ``fault``; False when the connection was dropped instead."""
        if fault in (Fault.RESET, Fault.REFUSE):
            _abort(writer)
            return False
        if fault is Fault.HANG:
            await self._hang(reader)
            return False
        if fault is Fault.HTTP500:
            return await self._answer(writer, 500, [("content-type", "text/plain")], b"injected fault: 500\n", note)
        if fault is Fault.LATENCY:
            await asyncio.sleep(latency_s)
        try:
            upstream_response = await self._client.request(
                request.method, upstream + request.target,
                headers=[(k, v) for k, v in request.headers if k.lower() not in _HOP_BY_HOP],
                content=request.body,
            )
        except httpx.HTTPError:
            self.stats.upstream_errors += 1
            _abort(writer)
            return False
        headers = list(upstream_response.headers.multi_items())
        body = upstream_response.content
        if fault is Fault.HOSTILE:
            body = self._huge_body if hostile is Hostile.HUGE_PAYLOAD else hostile_body(hostile, body)
            headers = [(k, v) for k, v in headers if k.lower() not in ("etag", "content-type")]
            headers.append(("content-type", "application/json"))
        return await self._answer(writer, upstream_response.status_code, headers, body, note)

    async def _answer(self, writer: asyncio.StreamWriter, status: int, headers, body: bytes,
                      note: tuple[float, Fault] | None = None) -> bool:
        if writer.transport.is_closing():
            # the connection was reset while the upstream answered (a fault began: ``refuse`` resets open
            # connections); the client never gets this answer, so it is not recorded as one
            return False
        if note is not None:  # recorded before the write, so a client that has its answer also finds the record
            self.answers.append((note[0], time.monotonic(), status, note[1]))
        writer.write(_response_bytes(status, headers, body))
        await writer.drain()
        self.stats.statuses[status] += 1
        return True

    async def _hang(self, reader: asyncio.StreamReader) -> None:
        """Hold the connection until the client gives up or the proxy stops; never answer."""
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                chunk = asyncio.ensure_future(reader.read(65536))
                done, _ = await asyncio.wait({chunk, stop}, return_when=asyncio.FIRST_COMPLETED)
                if chunk not in done:
                    chunk.cancel()
                    return
                if not chunk.result():
                    return
        finally:
            stop.cancel()
