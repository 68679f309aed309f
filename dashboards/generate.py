"""Generate the specctl Grafana dashboards and their Kubernetes wrappers.

Usage:
    python -m dashboards.generate           # write the files
    python -m dashboards.generate --check   # exit 1 if a committed file is stale or unexpected (CI)

Outputs (all generated, never edited by hand):
    dashboards/grafana/*.json                      Grafana dashboards (import, or provision from files)
    deploy/k8s/base/grafana-dashboards.yaml        the same dashboards as ConfigMaps for the Grafana sidecar
    deploy/k8s/base/prometheus-rule.yaml           deploy/prometheus/specctl-alerts.yml as a PrometheusRule

``all_panel_queries()`` lists every PromQL query of every panel, for tests that run them against Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from dashboards import categories, controller, engines
from dashboards.k8s import dashboards_manifest, prometheus_rule
from dashboards.panels import JSON
from dashboards.queries import PanelQuery, panel_queries, unknown_metrics

REPO_ROOT = Path(__file__).resolve().parent.parent
GRAFANA_DIR = Path("dashboards/grafana")
ALERTS = Path("deploy/prometheus/specctl-alerts.yml")
K8S_DASHBOARDS = Path("deploy/k8s/base/grafana-dashboards.yaml")
K8S_RULE = Path("deploy/k8s/base/prometheus-rule.yaml")

DASHBOARDS: dict[str, Callable[[], JSON]] = {
    "specctl_categories.json": categories.build,
    "specctl_engines.json": engines.build,
    "specctl_controller.json": controller.build,
}


def build_all() -> dict[str, JSON]:
    return {filename: build() for filename, build in DASHBOARDS.items()}


def all_panel_queries() -> list[PanelQuery]:
    """Every panel query of every specctl dashboard, template variables still in place."""
    return panel_queries(build_all())


def render_all(root: Path = REPO_ROOT) -> dict[Path, str]:
    """Every generated file (path relative to the repository root) and its exact content."""
    boards = build_all()
    files = {GRAFANA_DIR / name: json.dumps(board, indent=2, ensure_ascii=False) + "\n" for name, board in boards.items()}
    files[K8S_DASHBOARDS] = dashboards_manifest(boards)
    files[K8S_RULE] = prometheus_rule((root / ALERTS).read_text(encoding="utf-8"))
    return files


def problems(root: Path = REPO_ROOT) -> list[str]:
    """What ``--check`` reports: stale or missing files, unexpected dashboards, unknown metric names."""
    errors = []
    files = render_all(root)
    for path, content in files.items():
        target = root / path
        if not target.exists() or target.read_text(encoding="utf-8") != content:
            errors.append(f"{path} is out of date; run: python -m dashboards.generate")
    unexpected = sorted({p.name for p in (root / GRAFANA_DIR).glob("*.json")} - set(DASHBOARDS))
    if unexpected:
        errors.append(f"dashboards not produced by dashboards.generate: {unexpected}")
    if unknown := unknown_metrics([q.expr for q in all_panel_queries()]):
        errors.append(f"dashboards query metrics not listed in dashboards/metrics.py: {unknown}")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the specctl Grafana dashboards.")
    parser.add_argument("--check", action="store_true", help="fail if committed files differ from generated ones")
    args = parser.parse_args(argv)
    if not args.check:
        for path, content in render_all().items():
            (REPO_ROOT / path).parent.mkdir(parents=True, exist_ok=True)
            (REPO_ROOT / path).write_text(content, encoding="utf-8")
    errors = problems()
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
