"""Liveness and readiness probes."""

from __future__ import annotations

import sqlite3

from anyio import to_thread
from fastapi import APIRouter, Request, Response

from controller.service.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", responses={503: {"model": Readiness, "description": "not ready"}}, summary="Readiness")
async def readyz(request: Request, response: Response) -> Readiness:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        response.status_code = 503
        return Readiness(status="starting", store="not open", last_snapshot_age_s=None, overrides=0)
    store = "ok"
    try:
        await to_thread.run_sync(runtime.store.ping)
    except sqlite3.Error as exc:
        store = f"{type(exc).__name__}: {exc}"
    if store == "ok" and runtime.store_error:
        store = f"last write failed: {runtime.store_error}"
    now = runtime.clock.now()
    age = None if runtime.last_snapshot_ts is None else max(0.0, now - runtime.last_snapshot_ts)
    status = "ready" if store == "ok" else "degraded"
    if status != "ready":
        response.status_code = 503
    return Readiness(status=status, store=store, last_snapshot_age_s=age, overrides=len(runtime.overrides()))
