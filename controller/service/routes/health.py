"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from specctl_vllm.controller.service.schemas import Health, Readiness

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
    # the store's health now (a write probe), not the last write's: a transient lock recovers by itself
    store = await runtime.check_store()
    now = runtime.clock.now()
    age = None if runtime.last_snapshot_ts is None else max(0.0, now - runtime.last_snapshot_ts)
    status = "ready" if store == "ok" else "degraded"
    if status != "ready":
        response.status_code = 503
    return Readiness(status=status, store=store, last_snapshot_age_s=age, overrides=len(runtime.overrides()))
