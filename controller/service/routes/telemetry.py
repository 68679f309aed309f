"""POST /v1/telemetry: one engine's batch in, the policy for that engine out.

Thin on purpose: the body is read here, everything else (parse, merge, decision) runs off the event loop in
:meth:`specctl_vllm.controller.service.runtime.Runtime.ingest`.

Two routes serve the same handler: :data:`lean_route`, a plain Starlette route matched first, answers the posts
(FastAPI's per-request dependency solving and endpoint wrapping were about a tenth of a small post's CPU; the
checks are the same ones, in the same order: 503 while starting, then 401/403, then 422 for a repeated query
parameter); the FastAPI route below it documents the endpoint in the OpenAPI schema. Errors raised by either
are answered by the app's exception handlers alike.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from specctl_vllm.controller.service.deps import IngestRuntime, check_ingest, get_runtime, read_body
from specctl_vllm.controller.service.errors import BadInput
from specctl_vllm.controller.service.openapi_bodies import json_body, responses
from specctl_vllm.controller.service.runtime import INLINE_BODY_BYTES, Runtime
from specctl_vllm.kernel.protocol import TelemetryAck, TelemetryBatch

router = APIRouter(prefix="/v1", tags=["telemetry"])


@router.post(
    "/telemetry",
    response_model=TelemetryAck,
    openapi_extra=json_body(TelemetryBatch),
    responses=responses(400, 401, 403, 408, 409, 413, 415, 422, 429),
    summary="Report engine steps; answer carries the policy for this engine",
)
async def post_telemetry(request: Request, runtime: IngestRuntime) -> Response:
    declared = request.headers.get("content-length", "")
    # a large body is admitted before it is read, within the bytes in flight (429 beyond); chunked counts as large
    size = int(declared) if declared.isdigit() else request.app.state.max_body_bytes
    if size <= INLINE_BODY_BYTES:
        return await _ingest(request, runtime)
    with runtime.flow.body(size):
        return await _ingest(request, runtime)


async def _ingest(request: Request, runtime: Runtime) -> Response:
    try:
        raw = await read_body(request, "telemetry batch")
    except BadInput as exc:
        if exc.status == 400:  # an empty body: counted as a refused batch of no known engine
            await runtime.record_rejected(None)
        raise
    # Already serialised (the response model documents it): FastAPI would validate and serialise it again.
    return Response(await runtime.ingest(raw), media_type="application/json")


class LeanIngest:
    """The telemetry endpoint as a plain ASGI app: the ingest dependency's checks, then :func:`post_telemetry`."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        runtime = await get_runtime(request)
        check_ingest(request)
        response = await post_telemetry(request, runtime)
        await response(scope, receive, send)


#: Matched before the FastAPI route (see the module's docstring); not in the schema, which the FastAPI route gives.
lean_route = Route("/v1/telemetry", LeanIngest(), methods=["POST"], include_in_schema=False)
