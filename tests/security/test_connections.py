"""Idle and oversized connections against a real ``specctl serve`` with its shipped defaults: probes and
engines on kept-open connections are answered whatever else is connected."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from bench.support.specctl_serve import SpecctlServe, telemetry_batch

IDLE = 300  # more than the old SPECCTL_CONCURRENCY_LIMIT default (256), which counted open connections


@pytest.fixture
def serve(tmp_path):
    with SpecctlServe(tmp_path / "conn", env={"SPECCTL_ACCESS_LOG": "false"}) as proc:
        yield proc


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_idle_connections_never_block_probes_or_kept_open_engines(serve):
    with httpx.Client(base_url=serve.url, headers=serve.headers("ingest"), timeout=10) as engine:
        assert engine.post("/v1/telemetry", json=telemetry_batch("kept-open", 0, {"default": [1, 0, 0, 0, 0]})
                           ).status_code == 200
        idle = [socket.create_connection(("127.0.0.1", serve.port)) for _ in range(IDLE)]
        try:
            for path in ("/healthz", "/readyz"):
                assert httpx.get(serve.url + path, timeout=10).status_code == 200
            for seq in range(1, 6):  # the engine's kept-open connection keeps being served
                answer = engine.post("/v1/telemetry",
                                     json=telemetry_batch("kept-open", seq, {"default": [1, 0, 0, 0, 0]}))
                assert answer.status_code == 200, answer.text
        finally:
            for s in idle:
                s.close()


def test_huge_headers_are_refused_without_growing_memory(serve):
    before = _rss_kib(serve.pid)
    header = b"X-Pad: " + b"a" * (8 * 1024 * 1024) + b"\r\n"
    for _ in range(4):
        with socket.create_connection(("127.0.0.1", serve.port), timeout=10) as s:
            try:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the controller closed it part-way: what matters is that it did not buffer it
            try:
                first = s.recv(200).split(b"\r\n")[0]
            except ConnectionResetError:
                first = b"reset"
            assert first in (b"HTTP/1.1 431 Request Header Fields Too Large", b"reset", b"")
    assert httpx.get(serve.url + "/healthz", timeout=10).status_code == 200
    assert _rss_kib(serve.pid) - before < 32 * 1024  # the old parser buffered each 8 MiB header (+46 MB each)
