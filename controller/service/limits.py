"""Request body cap (413) and body read deadline (408), enforced before anything reads the body.

A declared ``Content-Length`` over the cap is refused without reading; a chunked body is counted as it
streams in and refused as soon as it crosses the cap, so memory per request stays bounded either way.
A body that has not fully arrived ``body_timeout_s`` after its request's headers is refused with 408, so a
client trickling its body cannot hold a request (and its memory) open.
"""

from __future__ import annotations

import asyncio
import json
import time

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
    def __init__(self, app: ASGIApp, max_bytes: int, body_timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout_s = body_timeout_s

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
        deadline = time.monotonic() + self.body_timeout_s
        complete = False

        async def counted() -> Message:
            nonlocal received, complete
            if complete:  # after the body: receive() waits for the disconnect, no deadline
                return await receive()
            try:
                # asyncio.timeout, not wait_for: wait_for wraps receive() in a task of its own, per message
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    message = await receive()
            except TimeoutError:
                raise HTTPException(408, f"request body not received within {self.body_timeout_s:g} s") from None
            if message["type"] == "http.request":
                complete = not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside the handler's body read: the exception handlers answer 413.
                    raise HTTPException(413, self._too_large())
            return message

        await self.app(scope, counted, send)
