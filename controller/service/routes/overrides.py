"""Operator overrides: reads are open, writes need the admin token and are durable before the 2xx."""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request

from specctl_vllm.controller.core.overrides import drafters_offered, unavailable_method
from specctl_vllm.controller.service.deps import AdminAuth, RuntimeDep, read_json
from specctl_vllm.controller.service.errors import BadInput
from specctl_vllm.controller.service.openapi_bodies import json_body, responses
from specctl_vllm.controller.service.schemas import (
    ACTOR_PATTERN,
    AuditEntry,
    ErrorBody,
    OverrideChange,
    OverrideIn,
    OverrideOut,
)
from specctl_vllm.controller.service.store import AuditRecord, describe_store_error
from specctl_vllm.kernel.protocol import CATEGORY_INPUT_PATTERN, category_name

log = logging.getLogger("controller.service")

router = APIRouter(prefix="/v1", tags=["overrides"])

CategoryPath = Annotated[str, Path(pattern=CATEGORY_INPUT_PATTERN,
                                   description="request category (case folded: SQL is sql; protocol.category_name)")]


def _named(category: str) -> str:
    """The category the path names (the pattern admits only names that fold to one)."""
    named = category_name(category)
    if named is None:  # not reached: the path pattern refused it
        raise BadInput(422, f"{category!r} names no category")
    return named


def audit_entry(record: AuditRecord) -> AuditEntry:
    return AuditEntry.model_validate(record, from_attributes=True)


def _not_stored(exc: sqlite3.Error) -> BadInput:
    log.error("override not applied", extra={"error": describe_store_error(exc)})
    return BadInput(503, f"override not applied: the SQLite store failed: {describe_store_error(exc)[:300]}")


@router.get("/overrides", summary="Overrides in force")
async def list_overrides(runtime: RuntimeDep) -> list[OverrideOut]:
    now = runtime.clock.now()
    return [OverrideOut.of(o, now) for o in runtime.overrides()]


@router.get("/overrides/{category}", responses=responses(404, 422), summary="The category's override")
async def get_override(runtime: RuntimeDep, category: CategoryPath) -> OverrideOut:
    category = _named(category)
    now = runtime.clock.now()
    for override in runtime.overrides():
        if override.category == category:
            return OverrideOut.of(override, now)
    raise BadInput(404, f"no override for category {category!r}")


@router.put(
    "/overrides/{category}",
    openapi_extra=json_body(OverrideIn),
    responses={**responses(400, 401, 403, 413, 415, 422, 503),
               409: {"description": "the pinned method is offered by no engine of the models serving the category",
                     "model": ErrorBody}},
    summary="Pin k, pin the method, or force speculation off (replaces the category's override)",
    description="A pinned method that no engine of the models serving the category offers is refused (409, with "
                "the drafters they have). With no engine known yet the override is kept, and applied on each "
                "engine that offers the method once it reports.",
)
async def put_override(request: Request, runtime: RuntimeDep, _: AdminAuth, category: CategoryPath) -> OverrideChange:
    category = _named(category)
    body = await read_json(request, OverrideIn, "override")
    now = runtime.clock.now()
    override = body.to_override(category, now)
    if override.method is not None and not override.off:
        engines = json.loads(await runtime.engines())
        problem = unavailable_method(override.method, engines, category)
        if problem is not None:
            _, offered = drafters_offered(engines, category)
            raise BadInput(409, problem, [{"loc": ["method"], "msg": f"model {m} offers: {', '.join(d) or 'none'}",
                                           "type": "method_not_offered"} for m, d in offered.items()])
    try:
        record = await runtime.set_override(override)
    except sqlite3.Error as exc:
        raise _not_stored(exc) from None
    return OverrideChange(override=OverrideOut.of(override, now), audit=audit_entry(record))


@router.delete(
    "/overrides/{category}",
    responses=responses(401, 403, 404, 422, 503),
    summary="Remove the category's override (the policy decides again)",
)
async def delete_override(
    runtime: RuntimeDep,
    _: AdminAuth,
    category: CategoryPath,
    actor: Annotated[str, Query(pattern=ACTOR_PATTERN, description="who (kept in the audit log)")],
    reason: Annotated[str, Query(max_length=512, description="why (kept in the audit log)")] = "cleared",
) -> OverrideChange:
    category = _named(category)
    try:
        record = await runtime.clear_override(category, actor, reason)
    except sqlite3.Error as exc:
        raise _not_stored(exc) from None
    if record is None:
        raise BadInput(404, f"no override for category {category!r}")
    return OverrideChange(override=None, audit=audit_entry(record))
