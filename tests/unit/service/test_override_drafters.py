"""An override pinning a drafter no engine of the category's models offers is refused (409, with the drafters they
have); with no engine known it is kept, and applied once an engine that offers the drafter reports."""

from __future__ import annotations

import httpx
from typer.testing import CliRunner

from specctl_vllm.controller import cli
from specctl_vllm.controller.core.overrides import unavailable_method
from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN, ADMIN_TOKEN, INGEST


def report(client, seq: int, *, engine_id: str = "engine-a", model_free: list[str] | None = None,
           model: str = "m") -> None:
    body = batch(seq, [step({"code": [hist(4, [1, 0, 0, 0, 3])]})], engine_id=engine_id, model=model)
    body["spec"]["model_free_methods"] = model_free or []
    assert client.post("/v1/telemetry", json=body, headers=INGEST).status_code == 200


def pin(client, method: str):
    return client.put("/v1/overrides/code", json={"method": method, "reason": "r", "actor": "alice"}, headers=ADMIN)


def test_a_drafter_no_engine_offers_is_refused_with_the_ones_they_have(client):
    report(client, 0)  # an n-gram engine without model-free drafters
    answer = pin(client, "suffix")
    assert answer.status_code == 409, answer.text
    assert "offers drafter 'suffix'" in answer.json()["detail"]
    assert [e["msg"] for e in answer.json()["errors"]] == ["model m offers: ngram"]
    assert client.get("/v1/overrides").json() == []
    assert pin(client, "ngram").status_code == 200
    assert pin(client, "engine").status_code == 200  # the alias: whatever each engine was started with


def test_kept_without_engines_and_applied_when_one_offers_it(client):
    assert pin(client, "suffix").status_code == 200  # nothing known yet: kept
    report(client, 0, model_free=["suffix"])
    view = client.get("/v1/categories/code").json()
    assert (view["decision"]["method"], view["decision"]["source"]) == ("suffix", "override")


def test_one_model_offering_it_is_enough():
    engines = [{"model": "a", "spec_method": "ngram", "spec_k_max": 4, "model_free_methods": [], "category_mix": {}},
               {"model": "b", "spec_method": "eagle3", "spec_k_max": 4, "model_free_methods": ["suffix"],
                "category_mix": {}}]
    assert unavailable_method("suffix", engines, "code") is None
    assert "model a" in unavailable_method("suffix", engines[:1], "code")
    # only the models whose engines serve the category count, when some do
    engines[0]["category_mix"] = {"code": 2.0}
    assert "model a" in unavailable_method("suffix", engines, "code")
    assert unavailable_method("eagle3", [{**engines[1], "spec_k_max": 0}], "code") is not None


def test_the_cli_shows_the_refusal(client, monkeypatch):
    report(client, 0)
    monkeypatch.setattr(httpx, "request", lambda method, url, headers=None, timeout=None, **kw: client.request(
        method, url.replace("http://ctl", ""), headers=headers, **kw))
    result = CliRunner().invoke(cli.app, ["override", "set", "code", "--method", "suffix", "--reason", "r"],
                                env={"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN, "SPECCTL_CONTROLLER_URL": "http://ctl"})
    assert result.exit_code == cli.EXIT_REFUSED
    assert "HTTP 409" in result.output and "model m offers: ngram" in result.output
