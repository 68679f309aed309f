"""GET /metrics: Prometheus exposition of the controller's private registry (read at scrape time)."""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

from controller.service.deps import RuntimeDep

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}},
    summary="Prometheus metrics",
)
async def get_metrics(request: Request, _: RuntimeDep) -> Response:
    try:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    except Exception:  # noqa: BLE001 -- any Accept header the library cannot parse gets the classic text format
        encoder, content_type = generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    # rendered in a worker thread: the event loop (and every engine's post) never waits on a scrape; the
    # snapshot is taken under the Brain lock there, the text is written outside it
    body = await to_thread.run_sync(encoder, request.app.state.registry)
    return Response(body, media_type=content_type)
