"""A recording pass-through between the engine patch's reporter and the controller (benchmark only).

The controller keeps what it learns from step timings (its cost-model fit), not the timings themselves. To fit a
cost preset offline (``python -m bench sim.fit_presets --steps FILE``, ``bench/gpu/fit_cost.py``) and plot it
against measurements, the benchmark points ``SPECCTL_CONTROLLER_URL`` of its specctl engines at this tap, which
forwards every request unchanged and appends the body of each accepted ``POST /v1/telemetry`` (one
TelemetryBatch per line) to a JSONL file. It adds a loopback hop to the reporter's thread, never to the engine
loop.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A reporter that gave up waiting (its own timeout) closes the socket: not worth a traceback."""
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class Tap:
    def __init__(self, upstream: str, record: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self.record = record
        self.lock = threading.Lock()
        self.client = httpx.Client(timeout=10.0, trust_env=False)
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.steps = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> str:
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        return self.url

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.client.close()

    def _keep(self, body: bytes) -> None:
        try:
            batch = json.loads(body)
        except ValueError:
            return
        with self.lock, self.record.open("a") as fh:
            fh.write(json.dumps(batch, separators=(",", ":")) + "\n")
            self.steps += len(batch.get("steps", []))

    def _handler(self):
        tap = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                try:
                    upstream = tap.client.request(self.command, tap.upstream + self.path, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    self.send_error(502, f"controller unreachable: {type(exc).__name__}")
                    return
                if self.command == "POST" and self.path.startswith("/v1/telemetry") and upstream.status_code < 300:
                    tap._keep(body)
                self.send_response(upstream.status_code)
                for key, value in upstream.headers.items():
                    if key.lower() not in _HOP_HEADERS:
                        self.send_header(key, value)
                self.send_header("content-length", str(len(upstream.content)))
                self.end_headers()
                self.wfile.write(upstream.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args) -> None:  # the controller logs requests already
                pass

        return Handler
