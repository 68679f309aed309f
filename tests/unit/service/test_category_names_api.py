"""The controller and the CLI name categories by the one rule (``protocol.category_name``): ``SQL`` is ``sql``
in every path and query; a name that names no category is refused (422 / exit 2), never turned into another."""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from specctl_vllm.controller import cli
from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN, ADMIN_TOKEN, INGEST

BODY = {"k": 2, "reason": "pin", "actor": "alice"}


def test_override_paths_fold_the_name(client):
    put = client.put("/v1/overrides/SQL", json=BODY, headers=ADMIN)
    assert put.status_code == 200, put.text
    assert put.json()["override"]["category"] == "sql"
    assert [o["category"] for o in client.get("/v1/overrides").json()] == ["sql"]
    assert client.get("/v1/overrides/Sql").json()["category"] == "sql"
    assert [e["category"] for e in client.get("/v1/audit", params={"category": "SQL"}).json()] == ["sql"]
    assert client.delete("/v1/overrides/sQl", params={"actor": "bob"}, headers=ADMIN).status_code == 200
    assert client.get("/v1/overrides").json() == []


def test_category_reads_fold_the_name(client):
    client.post("/v1/telemetry", json=batch(0, [step({"sql": [hist(2, [1, 1, 4])]})]), headers=INGEST)
    got = client.get("/v1/categories/SQL")
    assert got.status_code == 200 and got.json()["category"] == "sql"


@pytest.mark.parametrize("name", ["Straße", "_overflow", "a" * 65, "-x"])
def test_a_name_that_names_no_category_is_refused(client, name):
    assert client.put(f"/v1/overrides/{name}", json=BODY, headers=ADMIN).status_code == 422
    assert client.get("/v1/overrides").json() == []


def test_the_cli_sends_the_category_the_name_means(client, monkeypatch):
    sent = []

    def request(method, url, headers=None, timeout=None, **kw):
        sent.append(url)
        return client.request(method, url.replace("http://ctl", ""), headers=headers, **kw)

    monkeypatch.setattr(httpx, "request", request)
    env = {"SPECCTL_ADMIN_TOKEN": ADMIN_TOKEN, "SPECCTL_CONTROLLER_URL": "http://ctl"}
    result = CliRunner().invoke(cli.app, ["override", "set", "SQL", "--k", "2", "--reason", "r"], env=env)
    assert result.exit_code == 0, result.output
    assert sent == ["http://ctl/v1/overrides/sql"] and "override set for sql:" in result.output
    result = CliRunner().invoke(cli.app, ["override", "set", "Straße", "--k", "2", "--reason", "r"], env=env)
    assert result.exit_code == cli.EXIT_USAGE and "invalid category" in result.output and len(sent) == 1
