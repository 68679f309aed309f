"""GET /v1/engines: per-engine telemetry bookkeeping (last seq, gaps, dropped steps, policy age)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from controller.service.deps import RuntimeDep, SingleValuedQuery

router = APIRouter(prefix="/v1", tags=["engines"], dependencies=[SingleValuedQuery])


@router.get("/engines", summary="Engines that reported telemetry")
async def list_engines(runtime: RuntimeDep) -> list[dict[str, Any]]:
    return runtime.engines()
