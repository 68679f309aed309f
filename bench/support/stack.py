"""The whole stack as context managers: model folder, controller process, patched vLLM server.

Shared by the e2e tier, the fault-injection and Prometheus tiers, the demo and the benchmarks::

    with controller_process(workdir / "ctl") as ctl, patched_engine(model_dir(), workdir / "vllm", ctl) as eng:
        run_workload(eng.url, build_workload())

``patched_engine`` returns once vLLM answers ``/health`` *and* the controller has seen the engine apply one
of its policies.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.support import controller_api
from bench.support.specctl_serve import INGEST_TOKEN, SpecctlServe
from bench.support.vllm_server import VllmServer

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"
#: Test timings: policies expire 3 s after the last ack, decisions are recomputed every 0.5 s.
FAST_POLICY_ENV = {"SPECCTL_POLICY_TTL_S": "3", "SPECCTL_POLICY_INTERVAL_S": "0.5"}
POLICY_TTL_S = float(FAST_POLICY_ENV["SPECCTL_POLICY_TTL_S"])
POLICY_INTERVAL_S = float(FAST_POLICY_ENV["SPECCTL_POLICY_INTERVAL_S"])
REPORT_INTERVAL_S = 0.1
ENGINE_ID = "e2e-engine"


def model_dir(path: Path | str | None = None) -> Path:
    """The converted test model (``SPECCTL_MODEL_DIR`` or the default cache folder), built on first use."""
    target = Path(path or os.environ.get("SPECCTL_MODEL_DIR") or DEFAULT_MODEL_DIR).resolve()
    spec = importlib.util.spec_from_file_location("prepare_model", ROOT / "scripts" / "prepare_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.prepare(target, "float32")


@contextmanager
def controller_process(workdir: Path, env: dict[str, str] | None = None, **kwargs: Any) -> Iterator[SpecctlServe]:
    """``specctl serve`` with the fast test policy timings (plus ``env``), stopped on exit."""
    server = SpecctlServe(Path(workdir), env={**FAST_POLICY_ENV, **(env or {})}, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_attached(controller_url: str, engine_id: str, timeout_s: float = 30.0) -> dict:
    """The controller's view of the engine once it posts (now) while applying a policy from that controller."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            for engine in controller_api.engines(controller_url):
                if (engine.get("engine_id") == engine_id and engine.get("policy_version_reported") is not None
                        and engine.get("last_seen_age_s", 1e9) < 1.0):
                    return engine
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"engine {engine_id} did not attach to the controller at {controller_url} in {timeout_s} s")


@contextmanager
def patched_engine(model: Path, workdir: Path, controller: SpecctlServe | None, *, engine_id: str = ENGINE_ID,
                   **kwargs: Any) -> Iterator[VllmServer]:
    """The patched vLLM server reporting to ``controller`` (None: static config only), stopped on exit."""
    server = VllmServer(model, Path(workdir), controller_url=controller.url if controller else None,
                        ingest_token=INGEST_TOKEN if controller else None, engine_id=engine_id,
                        report_interval_s=REPORT_INTERVAL_S, **kwargs)
    server.start()
    try:
        if controller is not None:
            wait_attached(controller.url, engine_id)
        yield server
    finally:
        server.stop()


@contextmanager
def plain_engine(model: Path, workdir: Path, speculative: dict | None, **kwargs: Any) -> Iterator[VllmServer]:
    """An unpatched vLLM server (no scheduler class, no middleware, no plugin), stopped on exit."""
    server = VllmServer(model, Path(workdir), speculative=speculative, patched=False, **kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop()
