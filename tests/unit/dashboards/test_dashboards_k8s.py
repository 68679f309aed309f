"""The Kubernetes wrappers carry exactly the dashboards and the alert rules."""

import json

import pytest
import yaml

from dashboards.generate import ALERTS, K8S_DASHBOARDS, K8S_RULE, REPO_ROOT
from dashboards.k8s import prometheus_rule


def test_dashboard_configmaps_match_the_json(boards):
    docs = list(yaml.safe_load_all((REPO_ROOT / K8S_DASHBOARDS).read_text(encoding="utf-8")))
    by_file = {}
    for doc in docs:
        assert doc["kind"] == "ConfigMap"
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert len(json.dumps(doc).encode()) < 1_000_000, "ConfigMaps are limited to 1 MiB"
        (filename, body), = doc["data"].items()
        by_file[filename] = json.loads(body)
    assert by_file == json.loads(json.dumps(boards))  # None/True round-trip through JSON


def test_prometheus_rule_carries_the_alert_file():
    rule = yaml.safe_load((REPO_ROOT / K8S_RULE).read_text(encoding="utf-8"))
    alerts = yaml.safe_load((REPO_ROOT / ALERTS).read_text(encoding="utf-8"))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["spec"] == alerts


@pytest.mark.parametrize("text", ["---\ngroups: []\n", "groups: []\n---\ngroups: []\n"])
def test_prometheus_rule_refuses_multi_document_files(text):
    with pytest.raises(ValueError):
        prometheus_rule(text)
