"""A recording proxy between engines and the controller: captures every ``TelemetryBatch`` as a JSON line.

The engine patch posts to ``SPECCTL_CONTROLLER_URL``; point it at :class:`RecordingProxy` and the proxy
forwards every request (telemetry, policy reads, anything) to the real controller unchanged -- headers,
body, status and answer -- while appending each telemetry body to the current sink file. The lines are
exactly what ``specctl replay`` reads. Observers (e.g. the EMA-tiers override driver) get each batch
that the controller accepted, after it was forwarded, on the proxy's event loop: they must be quick.

    proxy = RecordingProxy(controller_url).start()
    proxy.record_to(Path("phase1.jsonl"))     # switch files between phases; None stops recording
    ... engine with SPECCTL_CONTROLLER_URL=proxy.url ...
    proxy.stop()

Used as a library by the CPU benchmark; ``python -m bench cpu.record --upstream URL --out FILE`` runs it
standalone (Ctrl-C to stop).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Self

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.harness import free_port

Observer = Callable[[dict], None]
_HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


class RecordingProxy:
    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.host = host
        self.port = port or free_port(host)
        self.observers: list[Observer] = []
        self.batches = 0
        self._sink: IO[str] | None = None
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- recording ---------------------------------------------------------------------------------------
    def record_to(self, path: Path | None) -> None:
        """Append telemetry to ``path`` from now on (None: stop recording); the previous file is closed."""
        with self._lock:
            if self._sink is not None:
                self._sink.close()
            self._sink = None
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._sink = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across posts, closed here

    def _write(self, batch: dict) -> None:
        with self._lock:
            if self._sink is not None:
                self._sink.write(json.dumps(batch, separators=(",", ":")) + "\n")
                self._sink.flush()

    # -- forwarding ---------------------------------------------------------------------------------------
    async def _forward(self, request: Request) -> Response:
        assert self._client is not None
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        url = self.upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            answer = await self._client.request(request.method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return Response(f"upstream unreachable: {type(exc).__name__}", status_code=502)
        if request.method == "POST" and request.url.path == "/v1/telemetry" and answer.status_code == 200:
            try:
                batch = json.loads(body)
            except ValueError:
                batch = None
            if isinstance(batch, dict):
                self.batches += 1
                self._write(batch)
                for observe in self.observers:
                    observe(batch)
        out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_HEADERS | {"content-encoding"}}
        return Response(answer.content, status_code=answer.status_code, headers=out_headers)

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            self._client = httpx.AsyncClient(timeout=10.0, trust_env=False)
            try:
                yield
            finally:
                await self._client.aclose()

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
        return Starlette(routes=[Route("/{path:path}", self._forward, methods=methods)], lifespan=lifespan)

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 15.0) -> Self:
        config = uvicorn.Config(self.app(), host=self.host, port=self.port, log_level="warning", access_log=False,
                                lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="specctl-record-proxy", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("recording proxy did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10.0)
        self.record_to(None)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Forward engine telemetry to a controller and record it as JSON lines.")
    ap.add_argument("--upstream", default="http://127.0.0.1:8081", help="the real controller")
    ap.add_argument("--port", type=int, default=8082, help="port engines post to (their SPECCTL_CONTROLLER_URL)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines file (appended)")
    a = ap.parse_args(argv)
    proxy = RecordingProxy(a.upstream, port=a.port).start()
    proxy.record_to(a.out)
    print(f"recording telemetry at {proxy.url} -> {a.upstream} into {a.out} (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
        print(f"{proxy.batches} batches recorded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
