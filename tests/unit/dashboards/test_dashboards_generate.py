"""`python -m dashboards.generate --check` semantics: fresh files pass; stale, missing or foreign ones fail."""

import subprocess
import sys
from pathlib import Path

import pytest

from dashboards.generate import ALERTS, GRAFANA_DIR, K8S_DASHBOARDS, REPO_ROOT, problems, render_all


def test_committed_files_are_fresh():
    assert problems() == []


def test_check_command_exit_code():
    done = subprocess.run([sys.executable, "-m", "dashboards.generate", "--check"], cwd=REPO_ROOT, check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of every generated file plus its one input (the alert rules) under tmp_path."""
    (tmp_path / ALERTS).parent.mkdir(parents=True)
    (tmp_path / ALERTS).write_text((REPO_ROOT / ALERTS).read_text(encoding="utf-8"), encoding="utf-8")
    for path, content in render_all(tmp_path).items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content, encoding="utf-8")
    assert problems(tmp_path) == []
    return tmp_path


def _edit(path: Path) -> None:
    path.write_text(path.read_text(encoding="utf-8").replace('"refresh": "30s"', '"refresh": "5s"', 1),
                    encoding="utf-8")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda root: _edit(root / GRAFANA_DIR / "specctl_categories.json"), "specctl_categories.json is out of date"),
        (lambda root: (root / GRAFANA_DIR / "specctl_engines.json").unlink(), "specctl_engines.json is out of date"),
        (lambda root: (root / GRAFANA_DIR / "extra.json").write_text("{}"), "not produced by dashboards.generate"),
        (lambda root: (root / K8S_DASHBOARDS).write_text("# hand edit\n"), "grafana-dashboards.yaml is out of date"),
        # The PrometheusRule wraps the alert file: editing the rules without regenerating is stale too.
        (lambda root: (root / ALERTS).write_text((root / ALERTS).read_text() + "\n# new\n"),
         "prometheus-rule.yaml is out of date"),
    ],
    ids=["edited-json", "missing-json", "foreign-json", "edited-configmap", "rules-changed"],
)
def test_check_reports(tree, mutate, expected):
    mutate(tree)
    found = problems(tree)
    assert any(expected in p for p in found), found
