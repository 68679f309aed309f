"""docs/controller.md documents every service setting (with its default) and every exported metric."""

from pathlib import Path

import pytest
from pydantic import SecretStr

from specctl_vllm.controller.service.settings import AuthSettings, RecordSettings, ServerSettings, StoreSettings

DOC = (Path(__file__).resolve().parents[3] / "docs" / "controller.md").read_text()


@pytest.mark.parametrize("cls", [ServerSettings, AuthSettings, StoreSettings, RecordSettings])
def test_every_setting_documented_with_its_default(cls):
    for name, field in cls.model_fields.items():
        row = next((line for line in DOC.splitlines() if line.startswith(f"| `SPECCTL_{name.upper()}` |")), None)
        assert row is not None, f"SPECCTL_{name.upper()} missing from docs/controller.md"
        default = field.get_default(call_default_factory=True)
        if default is None or isinstance(default, SecretStr):
            assert "unset" in row
        else:
            shown = str(default).lower() if isinstance(default, bool) else str(default)
            assert f"`{shown}`" in row, f"{name}: default {shown} not in {row}"


def test_every_exposed_metric_documented(client):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.unit.service.batches import batch
    from tests.unit.service.conftest import ADMIN, INGEST

    client.post("/v1/telemetry", json=batch(0), headers=INGEST)
    client.put("/v1/overrides/code", json={"k": 1, "reason": "r", "actor": "a"}, headers=ADMIN)
    families = {f.name for f in text_string_to_metric_families(client.get("/metrics").text)}
    assert len(families) > 25
    for family in families:
        assert family in DOC, f"{family} not documented in docs/controller.md"
