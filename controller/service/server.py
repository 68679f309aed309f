"""Run the app under uvicorn on sockets bound here, so the bound addresses are known (port 0 works,
and the optional admin listener is recognised by its address)."""

from __future__ import annotations

import importlib.util
import logging
import socket
import sys
from typing import Any

import uvicorn

from specctl_vllm.controller.service import logs
from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.auth import AdminListener
from specctl_vllm.controller.service.clock import Clock, SystemClock
from specctl_vllm.controller.service.connections import ConnectionPolicy, connection_cap, guarded_protocol
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


def http_protocol(name: str) -> Any:
    """The protocol class uvicorn's ``http=name`` stands for (its documented names, resolved by its own table;
    tests/unit/service/test_uvicorn_contract.py checks the table and the constructor arguments)."""
    from uvicorn.config import HTTP_PROTOCOLS
    from uvicorn.importer import import_from_string

    return import_from_string(HTTP_PROTOCOLS[name])


def connection_policy(settings: ServiceSettings) -> ConnectionPolicy:
    srv = settings.server
    return ConnectionPolicy(max_connections=connection_cap(srv.max_connections),
                            header_timeout_s=srv.header_timeout_s, max_header_bytes=srv.max_header_bytes,
                            max_header_count=srv.max_header_count)


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
    sys.setswitchinterval(settings.server.gil_switch_interval_s)  # the process's own: set where it is served
    app = create_app(settings, clock or SystemClock(), admin_listener=admin)
    io = fast_io()
    srv = settings.server
    policy = connection_policy(settings)
    app.state.connections = policy
    config = uvicorn.Config(
        app,
        loop=io["loop"],
        http=guarded_protocol(http_protocol(io["http"]), policy),
        timeout_keep_alive=srv.keep_alive_s,
        # no limit_concurrency: uvicorn counts open connections against it too (idle sockets made every request
        # answer 503); requests are limited by class in the app, connections by the guard
        h11_max_incomplete_event_size=srv.max_header_bytes,
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
               "db": str(settings.store.db), "max_connections": policy.max_connections, **io},
    )
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
    return 0 if server.started else EXIT_STARTUP
