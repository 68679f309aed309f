"""/metrics rendered in its own process (the default), shared by concurrent scrapes, and the thread fallback."""

from __future__ import annotations

import asyncio

import pytest

from specctl_vllm.controller.service.render import Renderer
from tests.unit.service.batches import batch
from tests.unit.service.conftest import INGEST


@pytest.mark.parametrize("processes", [1, 0], ids=["process", "thread"])
def test_render_process_and_thread_give_the_same_text(make_client, processes):
    client = make_client(render_processes=processes)
    client.post("/v1/telemetry", json=batch(0), headers=INGEST)
    text = client.get("/metrics").text
    assert "specctl_drafts_total" in text and "specctl_series " in text
    open_metrics = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert open_metrics.headers["content-type"].startswith("application/openmetrics-text")


def test_concurrent_scrapes_share_one_render(client, monkeypatch):
    runtime = client.app.state.runtime
    calls = []
    original = runtime.metrics

    def counted():
        calls.append(1)
        return original()

    monkeypatch.setattr(runtime, "metrics", counted)
    renderer = Renderer(processes=0)

    async def three():
        return await asyncio.gather(*(renderer.scrape(runtime, "") for _ in range(3)))

    results = client.portal.call(three)
    assert len({body for body, _ in results}) == 1 and len(calls) == 1


def test_unusable_render_process_falls_back_to_a_thread(client):
    runtime = client.app.state.runtime

    class Broken:
        def submit(self, *args, **kwargs):
            raise OSError("no /dev/shm")

        def shutdown(self, **kwargs):
            pass

    renderer = Renderer(processes=0)
    renderer._pool = Broken()
    body, _ = client.portal.call(renderer.scrape, runtime, "")
    assert b"specctl_series" in body and renderer._pool is None
