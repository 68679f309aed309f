"""The committed OpenAPI document matches the code, and documents what clients rely on."""

import json

from specctl_vllm.controller import openapi


def test_committed_document_is_current():
    assert openapi.DEFAULT_PATH.read_text() == openapi.render(openapi.build()), (
        "controller/openapi.json is stale: run `python -m specctl_vllm.controller.openapi`"
    )


def test_check_mode_detects_drift(tmp_path, capsys):
    stale = tmp_path / "openapi.json"
    stale.write_text("{}\n")
    assert openapi.main(["--check", "--out", str(stale)]) == 1
    assert openapi.main(["--out", str(stale)]) == 0
    assert openapi.main(["--check", "--out", str(stale)]) == 0


def test_document_covers_the_fixed_endpoints():
    doc = json.loads(openapi.DEFAULT_PATH.read_text())
    expected = {
        ("/v1/telemetry", "post"), ("/v1/policy", "get"), ("/v1/categories", "get"), ("/v1/categories/{name}", "get"),
        ("/v1/overrides", "get"), ("/v1/overrides/{category}", "get"), ("/v1/overrides/{category}", "put"),
        ("/v1/overrides/{category}", "delete"), ("/v1/audit", "get"), ("/v1/engines", "get"), ("/healthz", "get"),
        ("/readyz", "get"), ("/metrics", "get"), ("/v1/forget", "post"),
    }
    assert {(p, m) for p, ops in doc["paths"].items() for m in ops} == expected
    assert doc["paths"]["/v1/telemetry"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TelemetryBatch"
    }
    assert doc["paths"]["/v1/telemetry"]["post"]["security"] == [{"IngestToken": []}]
    assert doc["paths"]["/v1/overrides/{category}"]["put"]["security"] == [{"AdminToken": []}]
    assert "security" not in doc["paths"]["/v1/overrides/{category}"]["get"]
