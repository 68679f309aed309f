"""Alert rules: promtool unit tests pass, every alert is tested both ways, documented, and consistent with
the dashboards' thresholds."""

import re
import shutil
import subprocess

import pytest
import yaml
from deploy_support import DEPLOY, REPO

from dashboards import controller, engines, panels
from dashboards.queries import unknown_metrics

RULES = DEPLOY / "prometheus" / "specctl-alerts.yml"
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
ALERTS = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_alerts_the_project_needs_exist():
    assert {
        "SpecctlAcceptanceCollapse",
        "SpecctlSpeculationSlowerThanPlain",
        "SpecctlControllerDown",
        "SpecctlPolicyStale",
        "SpecctlTelemetryGaps",
        "SpecctlDraftCostHigh",
    } <= set(ALERTS)


@pytest.mark.prometheus
@promtool
def test_promtool_check_rules():
    done = subprocess.run(["promtool", "check", "rules", str(RULES)], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


@pytest.mark.prometheus
@promtool
@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_test_rules(path):
    done = subprocess.run(["promtool", "test", "rules", str(path)], check=False, capture_output=True, text=True, timeout=120,
                          cwd=path.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_tested_firing_and_quiet():
    fired, quiet = set(), set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert set(ALERTS) - fired == set(), "alerts without a firing test case"
    assert set(ALERTS) - quiet == set(), "alerts without a case where they must stay quiet"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_is_documented(name):
    rule = ALERTS[name]
    assert rule["labels"]["severity"] in {"warning", "critical"} and rule["labels"]["component"] == "specctl"
    assert {"summary", "description", "runbook"} <= set(rule["annotations"])
    doc, _, fragment = rule["annotations"]["runbook"].partition("#")
    headings = [line.lstrip("#") for line in (REPO / doc).read_text().splitlines() if line.startswith("#")]
    assert fragment in {anchor(h) for h in headings}, f"{doc} has no section for #{fragment}"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_reads_known_metrics(name):
    assert unknown_metrics([ALERTS[name]["expr"]]) == []


def test_thresholds_match_the_dashboards():
    """The dashed threshold lines on the dashboards are the alert thresholds."""
    def red(steps):
        return max(s["value"] or 0 for s in steps["steps"])

    assert f") >= {engines.DRAFT_COST_ALERT:g}\n" in ALERTS["SpecctlDraftCostHigh"]["expr"]
    assert red(engines.DRAFT_COST) == engines.DRAFT_COST_ALERT
    assert ALERTS["SpecctlPolicyStale"]["expr"].rstrip().endswith(f"> {red(panels.POLICY_AGE):g}")
    assert ALERTS["SpecctlStateNotPersisted"]["expr"].rstrip().endswith(f"> {red(controller.SNAPSHOT_AGE):g}")
