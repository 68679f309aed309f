"""One meaning of "mean acceptance length" (vLLM's: 1 + accepted draft tokens per draft) across the API, the
metrics, the dashboards and the docs; the 0..k quantity is "accepted tokens per draft"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import INGEST

ROOT = Path(__file__).resolve().parents[3]


def test_api_gauge_and_counters_agree(client) -> None:
    # k=4 drafts: 2 with 0 accepted, 3 with 2, 5 with 4 -> accepted per draft 2.6, acceptance length 3.6
    steps = [step({"code": [hist(4, [2, 0, 3, 0, 5])]})]
    assert client.post("/v1/telemetry", json=batch(0, steps), headers=INGEST).status_code == 200
    view = client.get("/v1/categories/code").json()
    assert view["mean_acceptance_length"] == pytest.approx(3.6, rel=1e-6)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    gauge = families["specctl_mean_acceptance_length"]
    assert "1 + accepted" in gauge.documentation
    (sample,) = [s for s in gauge.samples if s.labels["category"] == "code"]
    assert sample.value == pytest.approx(3.6, rel=1e-6)

    def total(name: str) -> float:
        return sum(s.value for s in families[name].samples
                   if s.labels.get("category") == "code" and s.name == f"{name}_total")

    assert 1 + total("specctl_accepted_tokens") / total("specctl_drafts") == pytest.approx(3.6)
    hist_family = families["specctl_accepted_tokens_per_draft"]
    assert "accepted draft tokens per verified draft" in hist_family.documentation.lower()
    count = next(s.value for s in hist_family.samples if s.name.endswith("_count") and s.labels["category"] == "code")
    assert count == 10
    # the distribution is indexed by accepted tokens: element j = acceptance length j + 1
    assert view["acceptance_length_distribution"][:5] == pytest.approx([0.2, 0.0, 0.3, 0.0, 0.5])


def _panels(board: dict):
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_dashboard_mean_acceptance_length_is_one_plus() -> None:
    board = json.loads((ROOT / "dashboards" / "grafana" / "specctl_categories.json").read_text())
    panels = {p["title"]: p for p in _panels(board)}
    mean = panels["Mean acceptance length"]
    exprs = [t["expr"] for t in mean["targets"]]
    assert exprs[0].startswith("1 + ") and "specctl_mean_acceptance_length" in exprs[1]
    assert "1 + accepted" in mean["description"]
    per_draft = panels["Accepted tokens per draft"]
    assert not per_draft["targets"][0]["expr"].startswith("1 + ")


def test_docs_define_the_two_quantities() -> None:
    policy = (ROOT / "docs" / "policy.md").read_text()
    assert "**mean acceptance length** | 1 + accepted draft tokens per verified draft" in policy
    assert "**accepted tokens per draft** | accepted draft tokens per verified draft, 0 … k" in policy
    for path in ("docs/controller.md", "dashboards/README.md"):
        text = (ROOT / path).read_text().lower()
        assert "mean accepted tokens per draft |" not in text, path  # the old, contradicting definition
