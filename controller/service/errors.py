"""Error answers: every rejection is a 4xx with a reason; a 500 only for a bug, and then sanitized.

Validation errors list field paths and messages but never the offending input (it may be large, or
carry something the client should not see echoed back in a log or proxy).
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Iterable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from specctl_vllm.controller.service.auth import AuthError
from specctl_vllm.controller.service.store import describe_store_error

log = logging.getLogger("controller.service")

M = TypeVar("M", bound=BaseModel)

MAX_ERRORS = 20
MAX_MSG_CHARS = 300


class BadInput(Exception):
    """A request the service refuses, with the status and the reason to send back."""

    def __init__(self, status: int, detail: str, errors: list[dict[str, Any]] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = errors or []


def error_items(errors: Iterable[Any]) -> list[dict[str, Any]]:
    items = []
    for err in list(errors)[:MAX_ERRORS]:
        items.append(
            {
                "loc": [p if isinstance(p, int) else str(p) for p in err.get("loc", ())],
                "msg": str(err.get("msg", ""))[:MAX_MSG_CHARS],
                "type": str(err.get("type", "")),
            }
        )
    return items


def from_validation_error(exc: ValidationError, what: str) -> BadInput:
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    if any(e["type"] == "json_invalid" for e in errors):
        return BadInput(400, f"malformed JSON: {errors[0]['msg'][:MAX_MSG_CHARS]}")
    return BadInput(422, f"invalid {what}", error_items(errors))


def parse_json(raw: bytes, model: type[M], what: str) -> M:
    """``raw`` as ``model``, strictly: JSON types must match the schema (no `false` for a number, no "3" for an
    integer; integers are still accepted where a number is expected). 400 for malformed JSON, 422 else."""
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise from_validation_error(exc, what) from None


def _body(detail: str, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"detail": detail, "errors": errors or []}


async def _bad_input(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BadInput)
    return JSONResponse(_body(exc.detail, exc.errors), status_code=exc.status)


async def _auth(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(_body(exc.reason), status_code=exc.status, headers=headers)


async def _request_validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(_body("invalid request parameters", error_items(exc.errors())), status_code=422)


async def _http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else "request refused"
    return JSONResponse(_body(detail), status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _store(_: Request, exc: Exception) -> JSONResponse:
    what = describe_store_error(exc)
    log.error("SQLite store failed", extra={"error": what})
    return JSONResponse(_body(f"the SQLite store failed: {what[:MAX_MSG_CHARS]}"), status_code=503)


async def _disconnect(request: Request, exc: Exception) -> Response:
    """The client went away mid-body: nobody reads the answer, and it is no internal error (not counted)."""
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.client_disconnects += 1
    log.info("client disconnected before its body arrived", extra={"path": request.url.path})
    return Response(status_code=499)


async def _bug(request: Request, exc: Exception) -> JSONResponse:
    """Last resort: log the traceback under an id, answer only the id."""
    error_id = uuid.uuid4().hex[:12]
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is not None:
        runtime.internal_errors += 1
    log.error("unhandled error", exc_info=exc, extra={"error_id": error_id, "path": request.url.path})
    return JSONResponse(_body(f"internal error (id {error_id})"), status_code=500)


def install(app: FastAPI) -> None:
    app.add_exception_handler(BadInput, _bad_input)
    app.add_exception_handler(AuthError, _auth)
    app.add_exception_handler(RequestValidationError, _request_validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(sqlite3.Error, _store)
    app.add_exception_handler(ClientDisconnect, _disconnect)
    app.add_exception_handler(Exception, _bug)
