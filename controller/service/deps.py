"""FastAPI dependencies: the runtime, the clock, the two bearer-token scopes, and JSON bodies.

Bodies are parsed here rather than by FastAPI's body parameters so that authentication runs first
(an unauthenticated client gets 401/403 before the service spends time on its body) and so that
malformed JSON and invalid fields get distinct answers (400 vs 422).
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from specctl_vllm.controller.service.auth import AuthError, Scope, TokenCheck
from specctl_vllm.controller.service.errors import BadInput, parse_json
from specctl_vllm.controller.service.runtime import Runtime

M = TypeVar("M", bound=BaseModel)

_admin_scheme = HTTPBearer(auto_error=False, scheme_name="AdminToken", description="SPECCTL_ADMIN_TOKEN")


# Dependencies are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in a worker thread,
# a thread hop per dependency per request for work that never blocks.


async def get_runtime(request: Request) -> Runtime:
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:  # only between process start and the end of the lifespan's startup
        raise BadInput(503, "controller is starting")
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]

#: Query parameters declared as lists; every other one must appear at most once.
MULTI_VALUED_QUERY = frozenset({"model_free", "graph_widths"})


def reject_repeated_query(request: Request) -> None:
    """Refuse ``?k_max=1&k_max=4``: FastAPI would silently keep the last value of a repeated scalar."""
    if not request.scope.get("query_string"):  # the common request: no query string, nothing to parse
        return
    repeated = sorted(
        key for key in set(request.query_params.keys())
        if key not in MULTI_VALUED_QUERY and len(request.query_params.getlist(key)) > 1
    )
    if repeated:
        raise BadInput(422, "query parameter given more than once: " + ", ".join(repeated[:8]))


async def single_valued_query(request: Request) -> None:
    reject_repeated_query(request)


#: For routers without a token; authenticated routes run the same check after the token check.
SingleValuedQuery = Depends(single_valued_query)


def _check(request: Request, scope: Scope) -> None:
    checks: dict[Scope, TokenCheck] = request.app.state.token_checks
    checks[scope].verify(request.headers.get("authorization"))
    reject_repeated_query(request)


def check_ingest(request: Request) -> None:
    """401/403 unless the request carries the ingest token; 422 for a repeated query parameter."""
    _check(request, Scope.INGEST)


class _IngestScheme(HTTPBearer):
    """The ingest token scheme (so OpenAPI documents it) that also checks the token and hands over the runtime.

    Telemetry is the hot path: one dependency per post instead of a chain of three (runtime, check, scheme)
    saves FastAPI's per-dependency work (about a tenth of a post's CPU in a profile of the chain). The order
    of the checks is the chain's: 503 while starting, then 401/403.
    """

    async def __call__(self, request: Request) -> Runtime:  # type: ignore[override]
        runtime = await get_runtime(request)
        check_ingest(request)
        return runtime


_ingest_scheme = _IngestScheme(auto_error=False, scheme_name="IngestToken", description="SPECCTL_INGEST_TOKEN")


async def require_admin(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_scheme)]) -> None:
    listener = request.app.state.admin_listener
    if listener is not None and not listener.matches(request.scope.get("server")):
        raise AuthError(403, "admin writes are accepted only on the admin listener")
    _check(request, Scope.ADMIN)


#: The runtime, for a request that carries the ingest token.
IngestRuntime = Annotated[Runtime, Depends(_ingest_scheme)]
AdminAuth = Annotated[None, Depends(require_admin)]


async def read_body(request: Request, what: str) -> bytes:
    """The raw body of a JSON request: 415 for another content type, 400 for an empty body."""
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise BadInput(415, f"expected Content-Type application/json, got {content_type!r}")
    raw = await request.body()
    if not raw:
        raise BadInput(400, f"empty body: expected a JSON {what}")
    return raw


async def read_json(request: Request, model: type[M], what: str) -> M:
    """A small JSON body (an override, a forget) parsed on the loop; telemetry is parsed off it
    (:meth:`Runtime.ingest`)."""
    return parse_json(await read_body(request, what), model, what)
