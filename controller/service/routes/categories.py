"""GET /v1/categories and /v1/categories/{name}: learned stats, entropy class, decision and reason."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response

from specctl_vllm.controller.service.deps import RuntimeDep, SingleValuedQuery
from specctl_vllm.controller.service.errors import BadInput
from specctl_vllm.controller.service.openapi_bodies import responses
from specctl_vllm.kernel.protocol import CATEGORY_INPUT_PATTERN, category_name

router = APIRouter(prefix="/v1", tags=["categories"], dependencies=[SingleValuedQuery])


@router.get("/categories", response_model=list[dict[str, Any]],
            summary="Every (model, category) the controller has learned about")
async def list_categories(runtime: RuntimeDep) -> Response:
    return Response(await runtime.categories(), media_type="application/json")  # encoded off the loop


@router.get("/categories/{name}", responses=responses(404, 422), summary="One category")
async def get_category(
    runtime: RuntimeDep,
    name: Annotated[str, Path(pattern=CATEGORY_INPUT_PATTERN, description="case folded: SQL is sql")],
    model: Annotated[str | None, Query(min_length=1, max_length=256, description="restrict to one model")] = None,
) -> dict[str, Any]:
    name = category_name(name) or name
    view = await runtime.category(name, model)
    if view is None:
        raise BadInput(404, f"no data for category {name!r}" + (f" of model {model!r}" if model else ""))
    return view
