"""The ASGI middleware tags bodies of the generation routes and otherwise passes bytes through untouched."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from specctl_vllm.engine_patch.middleware import CategoryMiddleware, tag_body


class Captured:
    """An ASGI app that records the scope and the body it receives."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] = {}
        self.body = b""

    async def __call__(self, scope, receive, send) -> None:
        self.scope = scope
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run(middleware: CategoryMiddleware, path: str, chunks: list[bytes], method: str = "POST") -> list[dict]:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"999")]}
    asyncio.run(middleware(scope, receive, send))
    return sent


def header(scope: dict, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


@pytest.mark.parametrize(
    ("path", "body", "category"),
    [
        ("/v1/chat/completions", {"messages": [], "tools": [{"type": "function"}]}, "tool_call"),
        ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}}, "structured"),
        ("/v1/chat/completions", {"messages": [], "vllm_xargs": {"seed_tag": "a"}}, "default"),
        ("/v1/responses", {"input": "x", "tools": [{"type": "function"}]}, "tool_call"),
    ],
)
def test_tags_generation_routes(path: str, body: dict, category: str) -> None:
    app = Captured()
    run(CategoryMiddleware(app), path, [json.dumps(body).encode()])
    tagged = json.loads(app.body)
    assert tagged["vllm_xargs"]["specctl_category"] == category
    assert {k: v for k, v in tagged.items() if k != "vllm_xargs"} == {k: v for k, v in body.items() if k != "vllm_xargs"}
    assert header(app.scope, b"content-length") == str(len(app.body)).encode()


@pytest.mark.parametrize(
    ("path", "method", "raw"),
    [
        ("/v1/chat/completions", "POST", b'{"vllm_xargs": {"specctl_category": "mine"}, "tools": [1]}'),
        ("/v1/chat/completions", "POST", b"not json"),
        ("/v1/chat/completions", "POST", b"[1, 2]"),
        ("/v1/chat/completions", "POST", b'{"vllm_xargs": 3}'),
        ("/v1/models", "POST", b'{"tools": [1]}'),
        ("/v1/chat/completions", "GET", b""),
    ],
)
def test_passes_through_untouched(path: str, method: str, raw: bytes) -> None:
    app = Captured()
    run(CategoryMiddleware(app), path, [raw], method=method)
    assert app.body == raw
    assert header(app.scope, b"content-length") == b"999"


def test_chunked_body_is_reassembled_and_response_passes() -> None:
    app = Captured()
    raw = json.dumps({"messages": [], "response_format": {"type": "json_object"}}).encode()
    sent = run(CategoryMiddleware(app), "/v1/chat/completions", [raw[:10], raw[10:20], raw[20:]])
    assert json.loads(app.body)["vllm_xargs"]["specctl_category"] == "structured"
    assert sent[-1]["body"] == b"ok"


def test_large_body_streams_through_untagged() -> None:
    app = Captured()
    raw = json.dumps({"messages": [], "tools": [1], "pad": "x" * 200}).encode()
    run(CategoryMiddleware(app, max_body_bytes=64), "/v1/chat/completions", [raw[:100], raw[100:]])
    assert app.body == raw


def test_tag_body_does_not_mutate_input() -> None:
    body = {"vllm_xargs": {"a": 1}, "tools": [1]}
    tagged = tag_body(body)
    assert body == {"vllm_xargs": {"a": 1}, "tools": [1]}
    assert tagged == {"vllm_xargs": {"a": 1, "specctl_category": "tool_call"}, "tools": [1]}
