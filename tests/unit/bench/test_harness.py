"""bench/harness.py: ports, the readiness poll, /proc readers, and that the copies it replaced are gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench import harness

REPO = Path(__file__).resolve().parents[3]


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_free_port_can_be_bound():
    port = harness.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_wait_http_returns_once_the_url_answers_200():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        harness.wait_http(f"http://127.0.0.1:{server.server_port}/readyz", timeout_s=5)
        with pytest.raises(RuntimeError, match="not ready after"):
            harness.wait_http(f"http://127.0.0.1:{server.server_port}/other", timeout_s=0.5, interval_s=0.1)
    finally:
        server.shutdown()


def test_wait_http_fails_early_when_the_process_exits():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(30)
    with pytest.raises(RuntimeError, match="exited with 3 during start-up:\nthe log"):
        harness.wait_http(f"http://127.0.0.1:{harness.free_port()}/readyz", proc, timeout_s=30,
                          what="controller", detail=lambda: "the log")


def test_controller_command_is_specctl_serve():
    assert harness.controller_command(8123, "--insecure-dev") == [
        sys.executable, "-m", "specctl_vllm.controller", "serve", "--host", "127.0.0.1", "--port", "8123", "--insecure-dev"]


def test_proc_readers_read_this_process():
    assert harness.proc_status_kb(os.getpid(), "VmRSS") > 0
    assert harness.proc_status_kb(os.getpid(), "NoSuchKey") == 0
    assert harness.proc_cpu_seconds(os.getpid()) > 0


def test_one_free_port():
    """The copies of free_port that bench/harness.py replaced stay gone."""
    copies = []
    for folder in ("bench", "tests", "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text()
            if path == Path(__file__).resolve():
                continue
            if "def free_port(" in text or "def _free_port(" in text:
                copies.append(path.relative_to(REPO).as_posix())
    assert copies == ["bench/harness.py"]
