"""GET /v1/policy: the policy an engine with the given static config would get (ETag, 304)."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import ValidationError

from specctl_vllm.controller.service.deps import RuntimeDep, SingleValuedQuery
from specctl_vllm.controller.service.errors import from_validation_error
from specctl_vllm.controller.service.openapi_bodies import responses
from specctl_vllm.kernel.protocol import MAX_K, MAX_TOKEN_BUDGET, METHOD_PATTERN, Policy, SpecConfig

router = APIRouter(prefix="/v1", tags=["policy"], dependencies=[SingleValuedQuery])


def policy_etag(policy: Policy) -> str:
    """Strong ETag over everything but ``issued_at``, so an unchanged policy keeps its tag."""
    payload = policy.model_dump_json(exclude={"issued_at"}).encode()
    return '"' + hashlib.sha256(payload).hexdigest()[:32] + '"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag in tags


@router.get(
    "/policy",
    response_model=Policy,
    responses=responses(304, 422),
    summary="Current policy for an engine with this static speculative config",
)
async def get_policy(
    request: Request,
    response: Response,
    runtime: RuntimeDep,
    model: Annotated[str, Query(min_length=1, max_length=256, description="served model name")],
    k_max: Annotated[int, Query(ge=0, le=MAX_K, description="the engine's num_speculative_tokens")],
    method: Annotated[str, Query(pattern=METHOD_PATTERN, description="the engine's speculative method, or 'off'")],
    model_free: Annotated[
        list[Literal["ngram", "suffix"]] | None,
        Query(max_length=16, description="model-free drafters the engine can compute (the patch has these two)"),
    ] = None,
    full_cuda_graphs: Annotated[
        bool, Query(description="the engine replays full CUDA graphs for uniform decode batches")
    ] = False,
    graph_widths: Annotated[
        list[int] | None,
        Query(max_length=MAX_K + 1, description="graph-shaped engines: the widths it captured full CUDA graphs for "
              "(ascending, 0 first); the policy is then the one such an engine gets (caps and width inputs)"),
    ] = None,
    token_budget: Annotated[
        int | None, Query(ge=1, le=MAX_TOKEN_BUDGET, description="graph-shaped engines: max_num_batched_tokens")
    ] = None,
) -> Policy | Response:
    try:
        spec = SpecConfig(method=method, k_max=k_max, model_free_methods=model_free or [],
                          full_cuda_graphs=full_cuda_graphs, graph_widths=graph_widths or [],
                          token_budget=token_budget)
    except ValidationError as exc:
        raise from_validation_error(exc, "query") from None
    policy, etag = await runtime.policy(model, spec, policy_etag)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if _matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    response.headers.update(headers)
    return policy
