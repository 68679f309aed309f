"""Every dashboard query against a real Prometheus scraping the real controller and the real vLLM engine.

A Prometheus server (Debian's ``prometheus`` binary) runs on loopback from a temporary directory with a 1 s
scrape interval, scraping the controller's and the vLLM server's ``/metrics`` and loading the project's
alert rules. Under a short mixed workload (every category of bench/support/workload.py, one category under
an operator override), each panel query of each dashboard is run through Prometheus' HTTP API the way
Grafana runs it (range or instant, template variables substituted) and must return data. The only queries
allowed to be empty are listed in ``EVIDENCE_GATED`` with the reason; each must return data exactly when the
controller's own API says the data exists. The engine-wide agreement the Engines dashboard promises is checked exactly over the workload window,
and ``promtool check metrics`` lints the controller's exposition.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from bench.harness import free_port, wait_http
from bench.support.vllm_server import SERVED_MODEL
from bench.support.workload import CATEGORIES, build_workload, run_workload
from dashboards.generate import ALERTS, REPO_ROOT, build_all
from dashboards.queries import PanelQuery, panel_queries, parse_label_values, substitute, variable_queries

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.prometheus,
    pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                       reason="prometheus/promtool not installed (Debian package: prometheus)"),
]

SCRAPE_S = 1
#: Grafana's $__rate_interval for a 1 s scrape interval and 1 s step: max(step + scrape, 4 * scrape).
RATE_INTERVAL = f"{4 * SCRAPE_S}s"
OVERRIDE_CATEGORY = "summarise"

#: Queries whose series exist only once the controller has enough evidence: (dashboard, panel, refId) ->
#: (why, does the controller's GET /v1/categories say the series must exist?). A short workload gives each
#: category tens of drafts, so whether they exist depends on what earlier tests of the session drove; the
#: test requires data exactly when the controller's own API says there is some.
#: (dashboard, panel, query ref) -> (why it may be empty, whether it must have data, from the controller's API)
EVIDENCE_GATED: dict[tuple[str, str, str], tuple[str, Callable[[Callable[[str], list[dict]]], bool]]] = {
    ("specctl_categories.json", "Entropy class", "B"): (
        (
            "specctl_acceptance_entropy is exported for a category once one of its methods has at least "
            "SPECCTL_POLICY_MIN_EVIDENCE drafts; before that the class is 'unknown' and has no bits"
        ),
        lambda api: any(c["entropy"]["bits"] is not None for c in api("/v1/categories")),
    ),
    ("specctl_engines.json", "Proposal width run, share of steps (graph-shaped engines)", "A"): (
        ("specctl_engine_width_steps_total counts the steps of graph-shaped engines (one width per step, CUDA "
         "graphs); an engine that verifies per-request k, as the CPU backend does, has none"),
        lambda api: any(e["graph_widths"] for e in api("/v1/engines")),
    ),
}


def host_port(url: str) -> str:
    return url.split("://", 1)[1].rstrip("/")


@dataclass
class Prometheus:
    """A Prometheus server on loopback, started from a temporary directory and stopped with its group."""

    workdir: Path
    targets: dict[str, str]  # job -> host:port
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        return {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "scrape_timeout": f"{SCRAPE_S}s",
                       "evaluation_interval": f"{SCRAPE_S}s"},
            "rule_files": ["specctl-alerts.yml"],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}
                               for job, target in self.targets.items()],
        }

    def start(self, timeout_s: float = 60.0) -> Prometheus:
        self.port = self.port or free_port()
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config()))
        shutil.copy(REPO_ROOT / ALERTS, self.workdir / "specctl-alerts.yml")
        with open(self.workdir / "prometheus.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                ["prometheus", f"--config.file={self.workdir / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        wait_http(self.url + "/-/ready", self.proc, timeout_s=timeout_s, what="prometheus", detail=self.log_tail)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(15)

    def log_tail(self) -> str:
        path = self.workdir / "prometheus.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def api(self, path: str, **params: str) -> dict:
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30.0)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def instant(self, expr: str, at: float) -> list[dict]:
        return self.api("query", query=expr, time=f"{at:.3f}")["result"]

    def range(self, expr: str, start: float, end: float, step_s: int = 1) -> list[dict]:
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step_s}s")["result"]

    def wait_targets_up(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            health = {t["labels"]["job"]: t["health"] for t in self.api("targets")["activeTargets"]}
            if set(health) == set(self.targets) and set(health.values()) == {"up"}:
                return
            time.sleep(0.5)
        raise AssertionError(f"targets not up: {self.api('targets')['activeTargets']}")

    def rules(self) -> list[dict]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]


# --- fixtures ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    controller_url: str
    vllm_url: str
    admin_token: str
    model: str


@pytest.fixture(scope="module")
def stack(controller, engine) -> Stack:
    """The session's controller and patched vLLM server (tests/e2e/conftest.py)."""
    return Stack(controller.url, engine.url, controller.admin_token, SERVED_MODEL)


@pytest.fixture(scope="module")
def prometheus(stack: Stack, tmp_path_factory) -> Iterator[Prometheus]:
    server = Prometheus(tmp_path_factory.mktemp("prometheus"),
                        {"specctl-controller": host_port(stack.controller_url), "vllm": host_port(stack.vllm_url)})
    server.start()
    try:
        server.wait_targets_up()
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    baseline: float  # an instant after the first scrapes and before the workload

    @property
    def range(self) -> str:
        return f"{math.ceil(self.end - self.start)}s"


def _override(stack: Stack, method: str) -> None:
    """Pin k = 1 for OVERRIDE_CATEGORY (PUT) or clear it (DELETE), so the override panels have a subject."""
    headers = {"Authorization": f"Bearer {stack.admin_token}"}
    url = f"{stack.controller_url}/v1/overrides/{OVERRIDE_CATEGORY}"
    if method == "PUT":
        response = httpx.put(url, headers=headers, timeout=10.0, json={
            "k": 1, "method": None, "off": False, "ttl_s": 600, "reason": "prometheus e2e: overrides panels",
            "actor": "e2e"})
    else:
        response = httpx.delete(url, headers=headers, timeout=10.0, params={"actor": "e2e", "reason": "done"})
    assert response.status_code in (200, 201, 204), response.text


@pytest.fixture(scope="module")
def window(stack: Stack, prometheus: Prometheus) -> Iterator[Window]:
    """The mixed workload, with one category under an override, bracketed by settled scrapes."""
    time.sleep(3 * SCRAPE_S)  # a few scrapes of the idle state: the baseline for the agreement check
    baseline = time.time()
    _override(stack, "PUT")
    try:
        start = time.time()
        results = run_workload(stack.vllm_url, build_workload(per_category=3, seed=7, max_tokens=64),
                               model=stack.model, concurrency=4)
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        # The last telemetry batch (0.1 s) and the next scrapes of both targets.
        time.sleep(4 * SCRAPE_S)
        end = time.time()
        yield Window(start=start, end=end, baseline=baseline)
    finally:
        _override(stack, "DELETE")


def _variables(window: Window) -> dict[str, str]:
    """Template variables as Grafana's "All" sends them (allValue ".+"), intervals for this window."""
    return {"datasource": "prometheus", "model_name": ".+", "engine": ".+", "category": ".+",
            "__rate_interval": RATE_INTERVAL, "__interval": f"{SCRAPE_S}s", "__range": window.range}


def _run(prometheus: Prometheus, query: PanelQuery, window: Window) -> list[dict]:
    expr = substitute(query.expr, _variables(window))
    if query.instant:
        return prometheus.instant(expr, window.end)
    return [s for s in prometheus.range(expr, window.start, window.end) if s["values"]]


# --- tests ------------------------------------------------------------------------------------------------

QUERIES = panel_queries(build_all())


def test_alert_rules_evaluate_on_real_series(prometheus: Prometheus, window: Window):
    """Prometheus loaded every rule and evaluated each on the real series without an error (a vector
    matching mistake only shows on real label sets)."""
    expected = {r["alert"] for g in yaml.safe_load((REPO_ROOT / ALERTS).read_text())["groups"] for r in g["rules"]}
    rules = prometheus.rules()
    assert {r["name"] for r in rules} == expected
    for rule in rules:
        assert rule["health"] == "ok", (rule["name"], rule.get("lastError"))
        assert not rule["lastEvaluation"].startswith("0001-"), f"{rule['name']} never evaluated"


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q.key)
def test_panel_query_returns_data(prometheus: Prometheus, window: Window, query: PanelQuery, stack: Stack):
    result = _run(prometheus, query, window)
    gated = EVIDENCE_GATED.get((query.dashboard, query.panel, query.ref_id))
    expected = True
    if gated is not None:
        expected = gated[1](lambda path: httpx.get(f"{stack.controller_url}{path}", timeout=10.0).json())
    assert bool(result) == expected, (
        f"{query.key}: {'no data' if expected else 'data although the controller reports none'} for "
        f"{substitute(query.expr, _variables(window))}" + (f" ({gated[0]})" if gated else "")
    )


def test_evidence_gated_entries_exist():
    keys = {(q.dashboard, q.panel, q.ref_id) for q in QUERIES}
    assert set(EVIDENCE_GATED) <= keys


def test_template_variables_list_the_workload(prometheus: Prometheus, window: Window, stack: Stack):
    values = {}
    for dashboard, name, query in variable_queries(build_all()):
        series, label = parse_label_values(query)
        series = substitute(series, {"model_name": ".+"})
        values[(dashboard, name)] = set(prometheus.api(f"label/{label}/values", **{"match[]": series}))
    for (dashboard, name), found in values.items():
        assert found, (dashboard, name)
        if name == "model_name":
            assert stack.model in found
        if name == "category":
            assert set(CATEGORIES) <= found


@pytest.mark.parametrize(
    ("vllm_counter", "specctl_counter"),
    [
        ("vllm:spec_decode_num_draft_tokens_total", "specctl_draft_tokens_total"),
        ("vllm:spec_decode_num_accepted_tokens_total", "specctl_accepted_tokens_total"),
        ("vllm:spec_decode_num_drafts_total", "specctl_drafts_total"),
    ],
)
def test_engine_wide_agreement(prometheus: Prometheus, window: Window, stack: Stack, vllm_counter, specctl_counter):
    """What the Engines dashboard promises: over the workload, vLLM's counter and specctl's sum over
    categories moved by exactly the same amount (both read through Prometheus)."""

    def total(metric: str, at: float) -> float:
        found = prometheus.instant(f'sum({metric}{{model_name="{stack.model}"}})', at)
        return float(found[0]["value"][1]) if found else 0.0  # a counter not exported yet is still at 0

    vllm_delta = total(vllm_counter, window.end) - total(vllm_counter, window.baseline)
    specctl_delta = total(specctl_counter, window.end) - total(specctl_counter, window.baseline)
    assert vllm_delta > 0
    assert specctl_delta == vllm_delta


def test_override_is_visible(prometheus: Prometheus, window: Window):
    found = prometheus.instant(f'specctl_override_active{{category="{OVERRIDE_CATEGORY}"}}', window.end)
    assert {s["metric"]["kind"] for s in found} >= {"k"}
    (k,) = prometheus.instant(f'max(specctl_current_k{{category="{OVERRIDE_CATEGORY}"}})', window.end)
    assert float(k["value"][1]) == 1


def test_promtool_check_metrics_on_controller(stack: Stack, window: Window):
    text = httpx.get(stack.controller_url + "/metrics", timeout=10.0).text
    assert "specctl_draft_tokens_total{" in text  # populated by the workload, not an empty exposition
    done = subprocess.run(["promtool", "check", "metrics"], input=text, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
