"""OpenAPI for the bodies the service parses itself (see :mod:`specctl_vllm.controller.service.deps`)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from specctl_vllm.controller.service.schemas import ErrorBody

REF = "#/components/schemas/{model}"

_REASONS = {
    304: "policy unchanged since the ETag given in If-None-Match",
    400: "malformed JSON or request",
    401: "bearer token missing",
    403: "bearer token not valid for this operation",
    404: "not found",
    408: "the request body did not arrive within SPECCTL_BODY_TIMEOUT_S",
    409: "the engine id is used by two running engines (interleaved boot ids)",
    429: "the learned-state budget or the engine/model cap is full (SPECCTL_BUDGET_*): the reason says which",
    413: "request body too large",
    415: "body is not application/json",
    422: "well-formed but invalid: the errors list says which fields and why",
    503: "the controller cannot serve this now (starting, or its SQLite file is failing)",
}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring ``model`` as the required JSON request body."""
    ref = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entry: dict[str, Any] = {"description": _REASONS[code]}
        if code != 304:
            entry["model"] = ErrorBody
        out[code] = entry
    return out


def install(app: FastAPI, body_models: list[type[BaseModel]]) -> None:
    """Generate the schema once, with the hand-parsed body models added to ``components``."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            _, defs = models_json_schema([(m, "validation") for m in body_models], ref_template=REF)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in defs.get("$defs", {}).items():
                components.setdefault(name, definition)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
