"""Run the app under uvicorn on sockets bound here, so the bound addresses are known (port 0 works,
and the optional admin listener is recognised by its address)."""

from __future__ import annotations

import importlib.util
import logging
import socket
from typing import Any

import uvicorn

from specctl_vllm.controller.service import logs
from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.auth import AdminListener
from specctl_vllm.controller.service.clock import Clock, SystemClock
from specctl_vllm.controller.service.connections import limited_protocol
from specctl_vllm.controller.service.settings import ServiceSettings
from specctl_vllm.controller.service.store import Store

log = logging.getLogger("controller.service")

#: Exit codes of ``specctl serve``.
EXIT_CONFIG = 2
EXIT_STARTUP = 3


def bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def secrets_of(settings: ServiceSettings) -> list[str]:
    return [t.get_secret_value() for t in (settings.auth.admin_token, settings.auth.ingest_token) if t is not None]


def check_store(settings: ServiceSettings) -> None:
    """Open and close the SQLite file once, so a bad path fails before the server starts."""
    cfg = settings.store
    Store.open(cfg.db, busy_timeout_ms=cfg.busy_timeout_ms, snapshots_kept=cfg.snapshots_kept).close()


def fast_io() -> dict[str, str]:
    """uvicorn's event loop and HTTP parser: uvloop and httptools when importable (uvicorn[standard] installs
    both on Linux), else asyncio and h11. uvicorn's "auto" picks the same; naming them makes the choice visible
    in the startup log, since the C implementations are a good part of what one controller core can ingest."""
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return {"loop": loop, "http": http}


def serve(settings: ServiceSettings, clock: Clock | None = None) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit code."""
    logs.configure(settings.server.log_level, secrets_of(settings))
    sockets = [bind(settings.server.host, settings.server.port)]
    admin = None
    if settings.auth.separate_admin:
        admin_sock = bind(settings.auth.admin_host or settings.server.host, settings.auth.admin_port or 0)
        sockets.append(admin_sock)
        host, port = admin_sock.getsockname()[:2]
        admin = AdminListener(host, port)
    if settings.auth.insecure_dev:
        log.warning("insecure dev mode: scopes without a token accept any request")
    app = create_app(settings, clock or SystemClock(), admin_listener=admin)
    io = fast_io()
    srv = settings.server
    http: Any = io["http"]
    if http == "httptools":
        http = limited_protocol(srv.max_connections, srv.header_timeout_s)
    else:
        log.warning("httptools not installed: no connection cap or header timeout (only uvicorn's own limits)")
    config = uvicorn.Config(
        app,
        loop=io["loop"],
        http=http,
        timeout_keep_alive=srv.keep_alive_s,
        limit_concurrency=srv.concurrency_limit,
        log_config=None,  # logs.configure already routed uvicorn's loggers to the JSON handler
        lifespan="on",
        access_log=settings.server.access_log,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    log.info(
        "listening",
        extra={"url": _url(sockets[0]), "admin_url": _url(sockets[1]) if admin else None,
               "db": str(settings.store.db), **io},
    )
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
    return 0 if server.started else EXIT_STARTUP
