"""GET /v1/audit: the append-only log of override changes, oldest first, paged by id."""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Query

from specctl_vllm.controller.service.deps import RuntimeDep, SingleValuedQuery
from specctl_vllm.controller.service.openapi_bodies import responses
from specctl_vllm.controller.service.routes.overrides import audit_entry
from specctl_vllm.controller.service.schemas import AuditEntry
from specctl_vllm.kernel.protocol import CATEGORY_INPUT_PATTERN, category_name

router = APIRouter(prefix="/v1", tags=["audit"], dependencies=[SingleValuedQuery])


@router.get("/audit", responses=responses(422), summary="Override changes (set, clear, expire)")
async def list_audit(
    runtime: RuntimeDep,
    after_id: Annotated[int, Query(ge=0, le=2**62, description="return entries with a larger id (paging)")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000, description="at most this many entries")] = 100,
    category: Annotated[str | None, Query(pattern=CATEGORY_INPUT_PATTERN,
                                          description="only this category (case folded)")] = None,
) -> list[AuditEntry]:
    category = None if category is None else category_name(category) or category
    records = await to_thread.run_sync(
        lambda: runtime.store.audit(limit=limit, after_id=after_id, category=category)
    )
    return [audit_entry(r) for r in records]
