"""``promtool check metrics`` accepts the controller's exposition (names, units, counters, info gauges)."""

import shutil
import subprocess

import pytest

from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import ADMIN, INGEST

pytestmark = pytest.mark.prometheus


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (.ci/run installs it)")
def test_promtool_lint_clean(client):
    steps = [step({"code": [hist(2, [1, 0, 1]), hist(4, [0, 1, 0, 0, 3])], "chat": [hist(1, [2, 1])]})]
    client.post("/v1/telemetry", json=batch(0, steps), headers=INGEST)
    client.post("/v1/telemetry", json=batch(0, steps), headers=INGEST)  # a duplicate
    client.post("/v1/telemetry", content=b"{", headers={**INGEST, "Content-Type": "application/json"})
    client.put("/v1/overrides/chat", json={"k": 1, "method": "ngram", "reason": "r", "actor": "a"}, headers=ADMIN)
    client.portal.call(client.app.state.runtime.snapshot)
    text = client.get("/metrics").text
    assert "specctl_accepted_tokens_per_draft_bucket" in text and "specctl_snapshot_age_seconds" in text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr
