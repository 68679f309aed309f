"""Kubernetes manifests: kustomize builds every overlay; the output validates against the Kubernetes schemas
(built-in kinds, via kubernetes-validate) and this project's Prometheus Operator schemas (CRDs); and the
pieces fit together (ports, probes, sidecar, job labels, GPU resources, scheduler class)."""

import copy
import json
from pathlib import Path

import pytest
import yaml
from deploy_support import K8S, OVERLAYS, build, container, env, find, pod_spec

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed")
jsonschema = pytest.importorskip("jsonschema")

SCHEMAS = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    "PodMonitor": json.loads((SCHEMAS / "podmonitor.schema.json").read_text()),
    "PrometheusRule": json.loads((SCHEMAS / "prometheusrule.schema.json").read_text()),
}
#: Native sidecars (initContainers with restartPolicy: Always) are on by default from 1.29.
K8S_VERSIONS = ["1.29.0", "1.37.0"]
GPU = {"nvidia": "nvidia.com/gpu", "rocm": "amd.com/gpu"}


def platform(overlay: str) -> str:
    return overlay.split("-")[0]


def shared(overlay: str) -> bool:
    return overlay.endswith("-shared-controller")


def test_overlays_exist():
    assert {"nvidia", "rocm", "nvidia-shared-controller", "rocm-shared-controller"} <= set(OVERLAYS)


def test_all_yaml_parses():
    for path in K8S.rglob("*.yaml"):
        assert list(yaml.safe_load_all(path.read_text())), path


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_schema_validation(overlay, version):
    checked = set()
    for doc in build(overlay):
        if doc["kind"] in CRD_SCHEMAS:
            jsonschema.validate(doc, CRD_SCHEMAS[doc["kind"]])
        else:
            kubernetes_validate.validate(doc, version, strict=True)
        checked.add(doc["kind"])
    assert {"Deployment", "Service", "ConfigMap", "PodMonitor", "PrometheusRule"} <= checked


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("restartPolicey", "Always"),
        lambda d: d["spec"]["template"]["spec"].__setitem__("enableServiceLinks", "no"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].__setitem__("containerPort", "http"),
    ],
    ids=["unknown-field", "wrong-type", "port-not-a-number"],
)
def test_schema_validation_rejects_broken_manifests(mutate):
    """The validator is live: a typo or a wrong type in a built Deployment fails."""
    (dep,) = find(build("nvidia"), "Deployment", "vllm-engine")
    broken = copy.deepcopy(dep)
    mutate(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


def test_crd_schema_rejects_unknown_endpoint_field():
    (pm,) = find(build("nvidia"), "PodMonitor", "vllm-engine")
    broken = copy.deepcopy(pm)
    broken["spec"]["podMetricsEndpoints"][0]["targetport"] = 8000
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, CRD_SCHEMAS["PodMonitor"])


def test_every_pod_disables_service_links_and_probes_every_container(overlay):
    for dep in find(build(overlay), "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        assert spec["enableServiceLinks"] is False, dep["metadata"]["name"]
        for c in spec["containers"] + spec.get("initContainers", []):
            assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(c), c["name"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]
            named = {p["name"] for p in c["ports"]}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert c[probe]["httpGet"]["port"] in named


def test_controller_sidecar_can_never_take_the_engine_out_of_service(overlay):
    """Pod readiness is the AND of its containers': the controller sidecar's probes must not depend on its store."""
    for dep in find(build(overlay), "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        engine_pod = any(c["name"] != "specctl-controller" for c in spec["containers"])
        for c in spec["containers"] + spec.get("initContainers", []):
            if c["name"] == "specctl-controller" and engine_pod:
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    assert c[probe]["httpGet"]["path"] == "/healthz", (dep["metadata"]["name"], probe)


def test_images_are_tagged(overlay):
    for dep in find(build(overlay), "Deployment"):
        spec = dep["spec"]["template"]["spec"]
        for c in spec["containers"] + spec.get("initContainers", []):
            assert ":" in c["image"] and not c["image"].endswith(":latest"), c["image"]


def test_controller_placement(overlay):
    docs = build(overlay)
    engine = pod_spec(docs, "vllm-engine")
    vllm = container(engine, "vllm")
    if shared(overlay):
        assert "initContainers" not in engine
        (svc,) = find(docs, "Service", "specctl-controller")
        port = svc["spec"]["ports"][0]["port"]
        assert env(vllm)["SPECCTL_CONTROLLER_URL"] == f"http://specctl-controller:{port}"
        controller = container(pod_spec(docs, "specctl-controller"), "specctl-controller")
        volumes = {v["name"]: v for v in pod_spec(docs, "specctl-controller")["volumes"]}
        assert "persistentVolumeClaim" in volumes["specctl-data"]
        assert find(docs, "PersistentVolumeClaim", volumes["specctl-data"]["persistentVolumeClaim"]["claimName"])
        (dep,) = find(docs, "Deployment", "specctl-controller")
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"  # one SQLite writer
        assert find(docs, "Deployment", "vllm-engine")[0]["spec"]["replicas"] > 1
    else:
        controller = container(engine, "specctl-controller")
        assert controller in engine["initContainers"] and controller["restartPolicy"] == "Always"  # native sidecar
        assert env(vllm)["SPECCTL_CONTROLLER_URL"] == "http://127.0.0.1:8081"
    assert {p["containerPort"] for p in controller["ports"]} == {8081}
    assert controller["args"][:1] == ["serve"] and "0.0.0.0" in controller["args"]
    for token in ("SPECCTL_INGEST_TOKEN", "SPECCTL_ADMIN_TOKEN"):
        assert env(controller)[token]["secretKeyRef"]["name"] == "specctl-tokens"
    assert env(vllm)["SPECCTL_INGEST_TOKEN"] == env(controller)["SPECCTL_INGEST_TOKEN"]
    assert controller["securityContext"]["readOnlyRootFilesystem"] is True


def test_monitors_scrape_real_ports_with_fixed_jobs(overlay):
    """Every PodMonitor endpoint names a port of a selected pod; jobs are the ones the alerts expect."""
    docs = build(overlay)
    jobs = {}
    for pm in find(docs, "PodMonitor"):
        selected = [
            d for d in find(docs, "Deployment")
            if pm["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, pm["metadata"]["name"]
        spec = selected[0]["spec"]["template"]["spec"]
        ports = {p["name"] for c in spec["containers"] + spec.get("initContainers", []) for p in c["ports"]}
        for ep in pm["spec"]["podMetricsEndpoints"]:
            assert ep["port"] in ports and ep["path"] == "/metrics"
            (job,) = [r["replacement"] for r in ep["relabelings"] if r["targetLabel"] == "job"]
            jobs[job] = ep["port"]
    assert jobs == {"vllm": "http", "specctl-controller": "specctl"}


def test_services_target_existing_ports(overlay):
    docs = build(overlay)
    for svc in find(docs, "Service"):
        selected = [
            d for d in find(docs, "Deployment")
            if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1
        spec = selected[0]["spec"]["template"]["spec"]
        ports = {p["name"] for c in spec["containers"] + spec.get("initContainers", []) for p in c["ports"]}
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports


def test_gpu_platform_settings(overlay):
    vllm = container(pod_spec(build(overlay), "vllm-engine"), "vllm")
    assert vllm["resources"]["limits"][GPU[platform(overlay)]] == 1
    assert not set(vllm["resources"]["limits"]) & (set(GPU.values()) - {GPU[platform(overlay)]})
    # GPU engines run async scheduling, which needs the async scheduler subclass.
    assert "--async-scheduling" in vllm["args"]
    assert env(vllm)["SPECCTL_SCHEDULER_CLS"] == "specctl_vllm.engine_patch.scheduler.SpecctlAsyncScheduler"
    assert "--scheduler-cls=$(SPECCTL_SCHEDULER_CLS)" in vllm["args"]
    assert "--middleware=specctl_vllm.engine_patch.middleware.CategoryMiddleware" in vllm["args"]
    assert ("VLLM_ROCM_USE_AITER" in env(vllm)) == (platform(overlay) == "rocm")
    if platform(overlay) == "rocm":
        assert env(vllm)["VLLM_ROCM_USE_AITER"] == "1"
    # ROCm: speculation on the AITER flash-attention backend (vLLM 0.26-0.33 default to ROCM_ATTN).
    rocm = platform(overlay) == "rocm"
    assert ("--attention-backend=$(ATTENTION_BACKEND)" in vllm["args"]) == rocm
    assert (env(vllm).get("ATTENTION_BACKEND") == "ROCM_AITER_FA") == rocm
    assert sum(a.startswith("--attention-backend") for a in vllm["args"]) == int(rocm)


def test_args_only_reference_defined_env(overlay):
    """``$(VAR)`` in args expands only from the container's env; an undefined one stays literal."""
    import re

    vllm = container(pod_spec(build(overlay), "vllm-engine"), "vllm")
    for arg in vllm["args"]:
        for name in re.findall(r"\$\((\w+)\)", arg):
            assert name in env(vllm), name


def test_dashboards_and_rules_shipped(overlay):
    docs = build(overlay)
    dashboards = [d for d in find(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert {next(iter(d["data"])) for d in dashboards} == {
        "specctl_categories.json", "specctl_engines.json", "specctl_controller.json"
    }
    (rule,) = find(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((K8S.parent / "prometheus" / "specctl-alerts.yml").read_text())


PRESET = {"nvidia": "h200", "rocm": "mi300x"}


def test_controller_config_resolves_and_fits_the_platform(overlay):
    docs = build(overlay)
    configmaps = {d["metadata"]["name"]: d for d in find(docs, "ConfigMap")}
    deployment = "specctl-controller" if shared(overlay) else "vllm-engine"
    controller = container(pod_spec(docs, deployment), "specctl-controller")
    (ref,) = [e["configMapRef"]["name"] for e in controller["envFrom"]]
    assert configmaps[ref]["data"]["SPECCTL_POLICY_COST_PRESET"] == PRESET[platform(overlay)]
