"""GET /v1/engines: per-engine telemetry bookkeeping (last seq, gaps, dropped steps, policy age);
POST /v1/forget: an operator drops what was learned for an engine, a model or a (model, category)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from specctl_vllm.controller.core.brain import category_key
from specctl_vllm.controller.service.deps import AdminAuth, RuntimeDep, SingleValuedQuery, read_json
from specctl_vllm.controller.service.errors import BadInput
from specctl_vllm.controller.service.openapi_bodies import json_body, responses
from specctl_vllm.controller.service.schemas import ForgetIn, Forgotten

router = APIRouter(prefix="/v1", tags=["engines"], dependencies=[SingleValuedQuery])


@router.get("/engines", response_model=list[dict[str, Any]], summary="Engines that reported telemetry")
async def list_engines(runtime: RuntimeDep) -> Response:
    return Response(await runtime.engines(), media_type="application/json")  # encoded off the loop


@router.post("/forget", openapi_extra=json_body(ForgetIn), responses=responses(400, 401, 403, 404, 415, 422, 503),
             summary="Forget an engine, a model or a (model, category) now (as the idle sweep would)")
async def forget(request: Request, runtime: RuntimeDep, _: AdminAuth) -> Forgotten:
    body = await read_json(request, ForgetIn, "forget request")
    if body.engine is not None:
        kind, name = "engine", body.engine
    elif body.category is not None:
        kind, name = "category", category_key(body.model or "", body.category)
    else:
        kind, name = "model", body.model or ""
    series = await runtime.forget(kind, name, actor=body.actor, reason=body.reason)
    if series is None:
        raise BadInput(404, f"no {kind} {name!r} is known")
    return Forgotten(kind=kind, engine=body.engine, model=body.model, category=body.category, series=series)
