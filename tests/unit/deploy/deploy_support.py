"""Helpers for the deploy tests: paths, kustomize builds (cached), lookups in built manifests."""

import functools
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())


def kustomize_command() -> list[str] | None:
    """The standalone kustomize binary, or the one built into kubectl."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


@functools.cache
def build(overlay: str) -> tuple[dict, ...]:
    command = kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl is installed")
    done = subprocess.run([*command, str(K8S / "overlays" / overlay)], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tuple(yaml.safe_load_all(done.stdout))


def find(docs, kind: str, name: str | None = None) -> list[dict]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def pod_spec(docs, deployment: str) -> dict:
    (dep,) = find(docs, "Deployment", deployment)
    return dep["spec"]["template"]["spec"]


def container(spec: dict, name: str) -> dict:
    (c,) = [c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == name]
    return c


def env(c: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}
