"""An app on fake time: a TestClient over ``create_app`` with a temp SQLite file and a parked
maintenance loop (tests call the runtime's maintenance steps explicitly)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.settings import AuthSettings, ServerSettings, ServiceSettings, StoreSettings

ADMIN_TOKEN = "admin-token-0123456789"
INGEST_TOKEN = "ingest-token-0123456789"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
INGEST = {"Authorization": f"Bearer {INGEST_TOKEN}"}


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


async def parked_sleep(_: float) -> None:
    """The maintenance loop waits here forever: on fake time, nothing happens by itself."""
    await asyncio.Event().wait()


def settings_for(db: Path, *, store: dict | None = None, **server: object) -> ServiceSettings:
    """Validated settings without reading the environment (tokens fixed, SQLite file in a temp dir)."""
    return ServiceSettings(
        # scrapes render in a worker thread here (a render process per test app would cost a start-up each);
        # tests/unit/service/test_render.py runs the process
        server=ServerSettings.model_validate({**ServerSettings.model_construct().model_dump(), "render_processes": 0,
                                              **server}),
        auth=AuthSettings.model_construct(admin_token=SecretStr(ADMIN_TOKEN), ingest_token=SecretStr(INGEST_TOKEN)),
        store=StoreSettings.model_validate({**StoreSettings.model_construct().model_dump(), "db": db, **(store or {})}),
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "specctl.db"


@pytest.fixture
def make_client(db, clock):
    """``make_client(**server_settings)`` -> a started TestClient; closed (lifespan ended) at teardown."""
    clients = []

    def make(**server: object) -> TestClient:
        app = create_app(settings_for(db, **server), clock, sleep=parked_sleep)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()


@pytest.fixture
def runtime(client):
    return client.app.state.runtime
