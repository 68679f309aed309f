"""The FastAPI application factory: routers, middleware, error handlers, and the lifespan that builds
the Brain, the SQLite store, the metrics registry and the background maintenance loop.

Nothing is built at import time; ``create_app`` itself does no I/O (the lifespan does), so the OpenAPI
exporter and tests can create apps freely.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.controller.service import errors, openapi_bodies
from specctl_vllm.controller.service.auth import AdminListener, Scope, TokenCheck
from specctl_vllm.controller.service.clock import Clock, Sleep, SystemClock, real_sleep
from specctl_vllm.controller.service.ingest_flow import BytesInFlight
from specctl_vllm.controller.service.limits import BodyLimit
from specctl_vllm.controller.service.recorder import Recorder
from specctl_vllm.controller.service.render import Renderer
from specctl_vllm.controller.service.request_classes import ClassCounts, RequestClasses
from specctl_vllm.controller.service.restore import restore_brain
from specctl_vllm.controller.service.routes import (
    audit,
    categories,
    engines,
    health,
    metrics,
    overrides,
    policy,
    telemetry,
)
from specctl_vllm.controller.service.runtime import Runtime
from specctl_vllm.controller.service.schemas import ForgetIn, OverrideIn
from specctl_vllm.controller.service.settings import ServiceSettings
from specctl_vllm.controller.service.store import Store
from specctl_vllm.kernel.protocol import TelemetryBatch

log = logging.getLogger("controller.service")

API_VERSION = "1"


async def maintain(runtime: Runtime, settings: ServiceSettings, sleep: Sleep) -> None:
    """Expire overrides every tick; snapshot the learned state every ``snapshot_interval_s``."""
    snapshot_every = settings.store.snapshot_interval_s
    tick = min(settings.server.maintenance_interval_s, snapshot_every)
    next_snapshot = runtime.clock.now() + snapshot_every
    while True:
        await sleep(tick)
        try:
            await runtime.expire_overrides()
            await runtime.evict_idle()
            if runtime.clock.now() >= next_snapshot:
                await runtime.snapshot()
                next_snapshot = runtime.clock.now() + snapshot_every
        except Exception:  # keep serving; /readyz reports the store failure
            log.exception("maintenance failed")


async def _open_runtime(settings: ServiceSettings, clock: Clock, brain_config: BrainConfig) -> Runtime:
    cfg = settings.store
    store = await to_thread.run_sync(
        lambda: Store.open(cfg.db, busy_timeout_ms=cfg.busy_timeout_ms, snapshots_kept=cfg.snapshots_kept)
    )
    try:
        brain, snapshot_ts = await to_thread.run_sync(restore_brain, store, brain_config)
        # what was evicted after that snapshot was taken stays forgotten
        dropped = brain.apply_forgotten(await to_thread.run_sync(store.forgotten), snapshot_ts)
        if dropped:
            log.info("evicted state kept forgotten", extra={"count": dropped})
        loaded = await to_thread.run_sync(store.load_overrides)
    except BaseException:
        store.close()
        raise
    log.info(
        "state restored",
        extra={"db": str(cfg.db), "overrides": len(loaded), "snapshot_ts": snapshot_ts},
    )
    srv = settings.server
    flow = BytesInFlight(total_limit=srv.ingest_bytes_in_flight, engine_limit=srv.ingest_engine_bytes_in_flight)
    return Runtime(brain, store, clock, loaded, snapshot_ts, flow=flow, large_share=srv.large_batch_cpu_share)


def _lifespan(settings: ServiceSettings, clock: Clock, sleep: Sleep, brain_config: BrainConfig):
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await _open_runtime(settings, clock, brain_config)
        if settings.record.record_dir is not None:
            try:
                recorder = Recorder(settings.record)
                await to_thread.run_sync(recorder.start)
            except BaseException:
                runtime.store.close()
                raise
            runtime.recorder = recorder
        app.state.renderer = Renderer(settings.server.render_processes)
        app.state.runtime = runtime
        runtime.connections = app.state.connections  # its telemetry timing is scraped with the runtime's figures
        task = None
        try:
            await runtime.expire_overrides()
            task = asyncio.create_task(maintain(runtime, settings, sleep))
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            try:
                await runtime.snapshot()  # clean shutdown loses no learning
                log.info("final snapshot written", extra={"db": str(settings.store.db)})
            except Exception:
                log.exception("final snapshot failed")
            app.state.runtime = None
            await runtime.close_merger()
            if runtime.recorder is not None:
                await to_thread.run_sync(runtime.recorder.stop)  # closes the gzip file: a complete recording
            app.state.renderer.close()
            runtime.store.close()

    return lifespan


def create_app(
    settings: ServiceSettings,
    clock: Clock | None = None,
    *,
    sleep: Sleep = real_sleep,
    brain_config: BrainConfig | None = None,
    admin_listener: AdminListener | None = None,
) -> FastAPI:
    """Build the controller app; the Brain, store and collector come to life in its lifespan."""
    app = FastAPI(
        title="specctl controller",
        version=API_VERSION,
        description="Adaptive speculative-decoding controller for vLLM: telemetry in, per-category k and "
        "draft method out, operator overrides, metrics.",
        lifespan=_lifespan(settings, clock or SystemClock(), sleep, brain_config or BrainConfig()),
    )
    app.state.runtime = None
    app.state.token_checks = {
        Scope.INGEST: TokenCheck.from_secret(Scope.INGEST, settings.auth.ingest_token),
        Scope.ADMIN: TokenCheck.from_secret(Scope.ADMIN, settings.auth.admin_token),
    }
    app.state.admin_listener = admin_listener
    app.state.max_body_bytes = settings.server.max_body_bytes
    for module in (telemetry, policy, categories, engines, overrides, audit, health, metrics):
        app.include_router(module.router)
    app.router.routes.insert(0, telemetry.lean_route)  # answers the posts; the FastAPI route documents them
    errors.install(app)
    openapi_bodies.install(app, [TelemetryBatch, OverrideIn, ForgetIn])
    if settings.server.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.server.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "If-None-Match"],
        )
    app.add_middleware(BodyLimit, max_bytes=settings.server.max_body_bytes,
                       body_timeout_s=settings.server.body_timeout_s)
    app.state.request_classes = ClassCounts()
    # outermost: a request beyond its class's share is refused before its body is read
    app.add_middleware(RequestClasses, telemetry_limit=settings.server.concurrency_limit,
                       admin_limit=settings.server.admin_concurrency, counts=app.state.request_classes)
    app.state.connections = None  # the server's ConnectionPolicy, set by server.serve
    return app
