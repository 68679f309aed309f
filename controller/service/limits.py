"""Request body cap (413), enforced before anything reads the body.

A declared ``Content-Length`` over the cap is refused without reading; a chunked body is counted as it
streams in and refused as soon as it crosses the cap, so memory per request stays bounded either way.
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _reject(status: int, detail: str) -> tuple[Message, Message]:
    body = json.dumps({"detail": detail, "errors": []}).encode()
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    return start, {"type": "http.response.body", "body": body}


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> str:
        return f"request body exceeds {self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            refusal = None
            if not declared.strip().isdigit():
                refusal = _reject(400, "invalid Content-Length header")
            elif int(declared) > self.max_bytes:
                refusal = _reject(413, self._too_large())
            if refusal is not None:
                for message in refusal:
                    await send(message)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the handler's body read: the exception handlers answer 413.
                    raise HTTPException(413, self._too_large())
            return message

        await self.app(scope, counted, send)
