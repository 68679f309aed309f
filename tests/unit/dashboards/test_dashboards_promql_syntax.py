"""Every panel query is valid PromQL: promtool parses each one as a recording rule (offline)."""

import shutil
import subprocess

import pytest

from dashboards.generate import all_panel_queries
from dashboards.queries import substitute

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)"),
]

VARIABLES = {"model_name": ".+", "engine": ".+", "category": ".+", "__rate_interval": "1m", "__range": "1h"}


def test_promtool_parses_every_query(tmp_path):
    import json

    rules = [{"record": f"specctl:q{i}", "expr": substitute(q.expr, VARIABLES)} for i, q in enumerate(all_panel_queries())]
    path = tmp_path / "queries.yml"
    path.write_text(json.dumps({"groups": [{"name": "panels", "rules": rules}]}))  # JSON is valid YAML
    done = subprocess.run(["promtool", "check", "rules", str(path)], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
