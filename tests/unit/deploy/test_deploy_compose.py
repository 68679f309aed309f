"""Compose stack: files parse and validate (docker-compose config, no Docker engine needed), the platform
files give the engine its accelerator, and Prometheus / Grafana provisioning fit together."""

import shutil
import subprocess

import pytest
import yaml
from deploy_support import DEPLOY, REPO

COMPOSE = DEPLOY / "compose"
PLATFORMS = {"cuda": COMPOSE / "compose.cuda.yaml", "rocm": COMPOSE / "compose.rocm.yaml"}
ENV = {
    "SPECCTL_INGEST_TOKEN": "ingest-token-for-config-check",
    "SPECCTL_ADMIN_TOKEN": "admin-token-for-config-check",
    "GRAFANA_ADMIN_PASSWORD": "x",
}


def load(path):
    return yaml.safe_load(path.read_text())


def env_file(tmp_path):
    """.env.example with its blanks filled, as a user would."""
    lines = []
    for line in (COMPOSE / ".env.example").read_text().splitlines():
        key = line.split("=", 1)[0]
        lines.append(f"{key}={ENV[key]}" if key in ENV else line)
    path = tmp_path / ".env"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(params=sorted(PLATFORMS))
def platform(request):
    return request.param


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed (Debian: docker-compose)")
def test_docker_compose_config_validates(platform, tmp_path):
    done = subprocess.run(
        ["docker-compose", "--env-file", str(env_file(tmp_path)), "-f", str(COMPOSE / "compose.yaml"),
         "-f", str(PLATFORMS[platform]), "config"],
        check=False, capture_output=True, text=True, timeout=60, cwd=COMPOSE,
    )
    assert done.returncode == 0, done.stderr
    merged = yaml.safe_load(done.stdout)
    engine = merged["services"]["engine"]
    assert engine["image"] == f"specctl-engine:{platform}"
    # Everything the user must provide is provided by .env.example (no empty required value slipped in).
    assert all(arg.split("=", 1)[1] for arg in engine["command"] if "=" in arg)


def test_engine_command_loads_the_patch():
    command = load(COMPOSE / "compose.yaml")["services"]["engine"]["command"]
    assert "--scheduler-cls=specctl_vllm.engine_patch.scheduler.SpecctlAsyncScheduler" in command
    assert "--async-scheduling" in command  # the async subclass goes with async scheduling
    assert "--middleware=specctl_vllm.engine_patch.middleware.CategoryMiddleware" in command
    env = load(COMPOSE / "compose.yaml")["services"]["engine"]["environment"]
    assert env["SPECCTL_CONTROLLER_URL"] == "http://controller:8081"


@pytest.mark.parametrize(("platform_", "preset"), [("cuda", "h200"), ("rocm", "mi300x")])
def test_controller_cost_preset(platform_, preset):
    env = load(PLATFORMS[platform_])["services"]["controller"]["environment"]
    assert env["SPECCTL_POLICY_COST_PRESET"].endswith(f":-{preset}}}")


def test_rocm_platform():
    engine = load(PLATFORMS["rocm"])["services"]["engine"]
    assert {"/dev/kfd", "/dev/dri"} <= set(engine["devices"])
    assert "video" in engine["group_add"] and engine["ipc"] == "host"
    assert engine["environment"]["VLLM_ROCM_USE_AITER"] == "1"
    assert "rocm" in engine["build"]["args"]["VLLM_IMAGE"]


def test_rocm_runs_speculation_on_aiter_fa():
    """compose.rocm.yaml repeats compose.yaml's engine command (an override list replaces it) plus the backend."""
    base = load(COMPOSE / "compose.yaml")["services"]["engine"]["command"]
    rocm = load(PLATFORMS["rocm"])["services"]["engine"]["command"]
    assert rocm == [*base, "--attention-backend=${ATTENTION_BACKEND:-ROCM_AITER_FA}"]
    assert "command" not in load(PLATFORMS["cuda"])["services"]["engine"]
    assert not any(arg.startswith("--attention-backend") for arg in base)


def test_cuda_platform():
    engine = load(PLATFORMS["cuda"])["services"]["engine"]
    (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert "rocm" not in engine["build"]["args"]["VLLM_IMAGE"]


def test_prometheus_scrapes_both_with_the_jobs_the_alerts_expect():
    config = load(COMPOSE / "prometheus.yml")
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    services = load(COMPOSE / "compose.yaml")["services"]
    assert targets == {"specctl-controller": ["controller:8081"], "vllm": ["engine:8000"]}
    assert {t.split(":")[0] for ts in targets.values() for t in ts} <= set(services)


def test_rule_file_is_mounted_where_the_config_names_it():
    config = load(COMPOSE / "prometheus.yml")
    mounts = load(COMPOSE / "compose.yaml")["services"]["prometheus"]["volumes"]
    (rule_file,) = config["rule_files"]
    sources = {m.split(":")[1]: m.split(":")[0] for m in mounts}
    assert sources[f"/etc/prometheus/{rule_file}"] == "../prometheus/specctl-alerts.yml"
    assert (COMPOSE / sources[f"/etc/prometheus/{rule_file}"]).is_file()


def test_grafana_provisioning_fits():
    grafana = load(COMPOSE / "compose.yaml")["services"]["grafana"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in grafana["volumes"]}
    (provider,) = load(COMPOSE / "grafana/provisioning/dashboards/specctl.yaml")["providers"]
    source = COMPOSE / mounts[provider["options"]["path"]]
    assert source.resolve() == (REPO / "dashboards" / "grafana").resolve()
    assert sorted(p.name for p in source.glob("*.json"))
    (datasource,) = load(COMPOSE / "grafana/provisioning/datasources/prometheus.yaml")["datasources"]
    # $__rate_interval is derived from the data source's interval: it must be Prometheus' scrape interval.
    assert datasource["jsonData"]["timeInterval"] == load(COMPOSE / "prometheus.yml")["global"]["scrape_interval"]
    assert datasource["url"] == "http://prometheus:9090"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (source / home.rsplit("/", 1)[1]).is_file()


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_check_config(tmp_path):
    """The config as Prometheus sees it in the container: rule file beside it."""
    shutil.copy(COMPOSE / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(DEPLOY / "prometheus" / "specctl-alerts.yml", tmp_path / "specctl-alerts.yml")
    done = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                          check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_secrets_committed():
    """Only the example is tracked; its secrets are blank for the user to fill in."""
    if shutil.which("git") and (REPO / ".git").exists():
        tracked = subprocess.run(["git", "ls-files", "--", str(COMPOSE)], cwd=REPO, check=False,
                                 capture_output=True, text=True, timeout=30).stdout.split()
        assert not [t for t in tracked if t.endswith("/.env")], tracked
    example = (COMPOSE / ".env.example").read_text()
    for key in ENV:
        assert f"\n{key}=\n" in example
