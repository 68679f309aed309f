"""The fault proxy itself, against a stub upstream: each fault does what the engine suite relies on.

Fast (no engine): the engine-level fault tests are only as good as the faults they inject.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.support.faultproxy import HUGE_PAYLOAD_CATEGORIES, WIRE_MAX_K, Fault, FaultProxy, Hostile, hostile_body

ACK = {
    "outcome": "accepted", "seq": 3, "gaps": 0,
    "policy": {"protocol": 1, "version": 5, "issued_at": 1.0, "ttl_s": 2.0,
               "default": {"k": 2, "method": "engine", "adapt": {"k_min": 0, "k_max": 2}},
               "categories": {"code": {"k": 4, "method": "engine", "adapt": {"k_min": 0, "k_max": 4}}}},
}
BATCH = {"engine_id": "e1", "seq": 3, "policy_version": 5, "dropped_steps": 7,
         "steps": [{"t": 12.5, "wall_s": 0.02, "draft_depth": 2, "draft_tokens": 6, "categories": [
             {"category": "code", "hists": [{"k": 2, "accepted": [0, 1, 2]}]}]}]}


class _Upstream(BaseHTTPRequestHandler):
    def _send(self, status: int, doc) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self._send(200, ACK)

    def do_GET(self):
        self._send(200, ACK["policy"] if self.path.startswith("/v1/policy") else {"path": self.path})

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def proxy(upstream):
    with FaultProxy(upstream) as p:
        yield p


def _post(proxy: FaultProxy, timeout: float = 2.0) -> httpx.Response:
    return httpx.post(proxy.url + "/v1/telemetry", json=BATCH, timeout=timeout)


def test_pass_forwards_and_records_telemetry(proxy):
    response = _post(proxy)
    assert response.status_code == 200
    assert response.json() == ACK
    [seen] = proxy.seen
    assert (seen.engine_id, seen.seq, seen.policy_version, seen.dropped_steps) == ("e1", 3, 5, 7)
    assert seen.draft_tokens == 6 and seen.draft_tokens_by_category == {"code": 6}
    assert seen.step_times == ((12.5, 0.02, 2),)
    [(received, answered, status, fault)] = proxy.answers
    assert received <= answered and status == 200 and fault is Fault.PASS


def test_an_answer_is_timed_from_when_the_client_sent_its_batch(proxy):
    """The engine's request timeout counts from its send, which its batch records (``sent_at``, wall clock):
    a batch sent 0.8 s before the proxy reads it is recorded as begun then, so an answer written soon after
    the read is not taken for one the engine surely had in time."""
    before = time.monotonic()
    response = httpx.post(proxy.url + "/v1/telemetry", json={**BATCH, "sent_at": time.time() - 0.8}, timeout=2.0)
    assert response.status_code == 200
    [(began, answered, _, _)] = proxy.answers
    assert began <= before - 0.7 and answered - began >= 0.8
    for sent_at in (time.time() + 60.0, time.time() - 30.0):  # a clock ahead; a retried batch's first send
        httpx.post(proxy.url + "/v1/telemetry", json={**BATCH, "sent_at": sent_at}, timeout=2.0)
        later, _, _, _ = proxy.answers[-1]
        assert later >= before  # the proxy's own reading stands


@pytest.mark.parametrize("fault", [Fault.REFUSE, Fault.RESET])
def test_dead_controller_faults_fail_the_connection(proxy, fault):
    proxy.set_fault(fault)
    with pytest.raises(httpx.TransportError):
        _post(proxy)
    proxy.set_fault(Fault.PASS)  # same port again: the engine's URL stays valid
    assert _post(proxy).status_code == 200


def test_upstream_down_looks_like_dead_controller():
    with FaultProxy("http://127.0.0.1:9") as p:  # discard port: nothing listens
        with pytest.raises(httpx.TransportError):
            _post(p)
        assert p.stats.upstream_errors == 1


def test_hang_accepts_and_never_answers(proxy):
    proxy.set_fault(Fault.HANG)
    t0 = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        _post(proxy, timeout=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert proxy.stats.connections == 1 and proxy.stats.requests[Fault.HANG] == 1


def test_http500(proxy):
    proxy.set_fault(Fault.HTTP500)
    assert _post(proxy).status_code == 500
    assert [(status, fault) for _, _, status, fault in proxy.answers] == [(500, Fault.HTTP500)]


def test_latency_is_added(proxy):
    proxy.set_fault(Fault.LATENCY, latency_s=0.4)
    t0 = time.monotonic()
    assert _post(proxy).status_code == 200
    assert time.monotonic() - t0 >= 0.4


def _all_k(policy: dict) -> list[int]:
    return [policy["default"]["k"]] + [c["k"] for c in policy["categories"].values()]


@pytest.mark.parametrize(
    ("kind", "k", "method"),
    [
        (Hostile.K_ABOVE_MAX, WIRE_MAX_K, "engine"),
        (Hostile.K_OUT_OF_RANGE, 10**6, "engine"),
        (Hostile.NEGATIVE_K, -3, "engine"),
        (Hostile.UNKNOWN_METHOD, 2, "warp-drive"),
    ],
)
def test_hostile_policy_rewrites(kind, k, method):
    doc = json.loads(hostile_body(kind, json.dumps(ACK).encode()))
    policy = doc["policy"]
    assert policy["version"] > ACK["policy"]["version"]
    assert set(_all_k(policy)) == {k}
    assert policy["categories"]["code"]["method"] == method
    bare = json.loads(hostile_body(kind, json.dumps(ACK["policy"]).encode()))  # GET /v1/policy shape
    assert set(_all_k(bare)) == {k}


@pytest.mark.parametrize("kind", [Hostile.MALFORMED_JSON, Hostile.WRONG_SHAPE])
def test_hostile_bodies_that_are_not_an_ack(kind):
    body = hostile_body(kind, json.dumps(ACK).encode())
    try:
        doc = json.loads(body)
    except ValueError:
        return
    assert not isinstance(doc, dict)


def test_hostile_huge_payload_through_the_proxy(proxy):
    proxy.set_fault(Fault.HOSTILE, hostile=Hostile.HUGE_PAYLOAD)
    response = _post(proxy, timeout=30)
    assert len(response.content) > 2**19
    assert len(response.json()["policy"]["categories"]) == HUGE_PAYLOAD_CATEGORIES
