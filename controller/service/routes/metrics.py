"""GET /metrics: Prometheus exposition of the learned state, rendered off the event loop (see
:mod:`specctl_vllm.controller.service.render`)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from specctl_vllm.controller.service.deps import RuntimeDep

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}},
    summary="Prometheus metrics",
)
async def get_metrics(request: Request, runtime: RuntimeDep) -> Response:
    body, content_type = await request.app.state.renderer.scrape(runtime, request.headers.get("accept", ""))
    return Response(body, media_type=content_type)
