"""ASGI middleware for vLLM's API server: writes the request's category into ``vllm_xargs``.

Use: ``--middleware specctl_vllm.engine_patch.middleware.CategoryMiddleware``. Only the API process sees ``tools`` and
``response_format``; the engine sees ``SamplingParams``. For ``POST`` bodies of the OpenAI generation routes
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``) without an explicit
``vllm_xargs.specctl_category`` the middleware adds the category derived by
:func:`specctl_vllm.engine_patch.categories.category_from_body` (resolution order documented there); an explicit
name written in another case (``SQL``) is rewritten to the category it means (``sql``), by the one rule of
:func:`specctl_vllm.kernel.protocol.category_name`.

It never fails a request: a body that is not a JSON object, too large, not JSON, or with a ``vllm_xargs``
that is not an object passes through byte for byte (vLLM then answers it as it would without the middleware).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from specctl_vllm.engine_patch.categories import CATEGORY_KEY, category_from_body, valid_category

# Under "vllm.": in a vLLM process the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.specctl.middleware")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
#: Bodies above this are passed through untagged (a tag is not worth buffering a huge prompt twice).
MAX_TAG_BODY_BYTES = 8 * 1024 * 1024


def tag_body(body: Any) -> dict[str, Any] | None:
    """The body with the derived category added, or None when it must be left as it is."""
    if not isinstance(body, dict):
        return None
    xargs = body.get("vllm_xargs")
    if xargs is None:
        xargs = {}
    elif not isinstance(xargs, dict):
        return None
    if CATEGORY_KEY in xargs:
        named = valid_category(xargs[CATEGORY_KEY])
        if named is None or named == xargs[CATEGORY_KEY]:
            return None  # as sent: the engine counts a name that names no category under "default"
        return {**body, "vllm_xargs": {**xargs, CATEGORY_KEY: named}}
    return {**body, "vllm_xargs": {**xargs, CATEGORY_KEY: category_from_body(body)}}


def _is_tagged_route(scope: Scope) -> bool:
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return False
    path = scope.get("path", "")
    return path.endswith(ROUTES)


class CategoryMiddleware:
    """Pure ASGI middleware (no Starlette request object: the body is read once and replayed)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = MAX_TAG_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _is_tagged_route(scope):
            await self.app(scope, receive, send)
            return
        chunks, complete, first_extra = await self._read_body(receive)
        body = b"".join(chunks)
        new_body = self._retag(body) if complete else None
        if new_body is not None:
            scope = dict(scope)
            scope["headers"] = _with_content_length(scope.get("headers", []), len(new_body))
            chunks = [new_body]
        await self.app(scope, _replay(chunks, complete, first_extra, receive), send)

    async def _read_body(self, receive: Receive) -> tuple[list[bytes], bool, Message | None]:
        """Body chunks, whether the whole body was read, and a non-body message received meanwhile."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                return chunks, False, message  # e.g. http.disconnect: hand it on untouched
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not message.get("more_body", False):
                return chunks, True, None
            if size > self.max_body_bytes:
                return chunks, False, None

    @staticmethod
    def _retag(body: bytes) -> bytes | None:
        try:
            tagged = tag_body(json.loads(body))
        except (ValueError, UnicodeDecodeError):
            return None
        except Exception:  # never fail a request because of the tag
            logger.exception("specctl: category tagging failed; request passed through untagged")
            return None
        return None if tagged is None else json.dumps(tagged, separators=(",", ":")).encode()


def _with_content_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"transfer-encoding")]
    kept.append((b"content-length", str(length).encode()))
    return kept


def _replay(chunks: list[bytes], complete: bool, extra: Message | None, receive: Receive) -> Receive:
    """A ``receive`` that yields the buffered body first, then whatever the client sends next."""
    pending: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": (i < len(chunks) - 1) or not complete}
        for i, chunk in enumerate(chunks)
    ]
    if not pending:
        pending.append({"type": "http.request", "body": b"", "more_body": not complete})
    if extra is not None:
        pending.append(extra)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
