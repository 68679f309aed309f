"""POST /v1/telemetry: one engine's batch in, the policy for that engine out."""

from __future__ import annotations

import json
import re

from fastapi import APIRouter, Request, Response

from controller.core.brain import IngestRejected
from controller.protocol import ENGINE_ID_PATTERN, TelemetryAck, TelemetryBatch
from controller.service.deps import IngestRuntime, read_json
from controller.service.errors import BadInput
from controller.service.openapi_bodies import json_body, responses

router = APIRouter(prefix="/v1", tags=["telemetry"])

_ENGINE_ID = re.compile(ENGINE_ID_PATTERN)


def _engine_id_of(raw: bytes) -> str | None:
    """Best-effort engine id of a refused batch, so the rejection is counted against its engine."""
    try:
        value = json.loads(raw).get("engine_id")
    except (ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, str) and _ENGINE_ID.match(value) else None


@router.post(
    "/telemetry",
    response_model=TelemetryAck,
    openapi_extra=json_body(TelemetryBatch),
    responses=responses(400, 401, 403, 408, 409, 413, 415, 422, 429),
    summary="Report engine steps; answer carries the policy for this engine",
)
async def post_telemetry(request: Request, runtime: IngestRuntime) -> Response:
    try:
        batch = await read_json(request, TelemetryBatch, "telemetry batch")
    except BadInput as exc:
        if exc.status in (400, 422):
            runtime.record_rejected(_engine_id_of(await request.body()))
        raise
    try:
        ack = runtime.ingest(batch)
    except IngestRejected as exc:
        runtime.record_rejected(batch.engine_id)
        raise BadInput(exc.status, f"telemetry batch refused: {exc.reason}") from None
    # Already serialised (the response model documents it): FastAPI would validate and serialise it again.
    return Response(ack, media_type="application/json")
