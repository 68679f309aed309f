import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from specctl_vllm.controller.service import errors
from specctl_vllm.controller.service.limits import BodyLimit

CAP = 1024


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {"n": len(await request.body())}

    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=CAP)
    return app


def _chunks(total: int, size: int = 256):
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"x" * CAP, {}, 200),
        (b"x" * (CAP + 1), {}, 413),
        (b"x" * 10, {"content-length": "999999"}, 413),  # declared too large: refused unread
        (_chunks(CAP), {}, 200),  # chunked, at the cap
        (_chunks(CAP * 4), {}, 413),  # chunked, counted while streaming
    ],
)
def test_body_cap(body, headers, status):
    with TestClient(_app()) as client:
        response = client.post("/echo", content=body, headers=headers)
    assert response.status_code == status
    if status == 413:
        assert "exceeds" in response.json()["detail"]
