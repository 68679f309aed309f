"""One engine for the whole fault suite (module scope): see :mod:`tests.faults.stack`."""

from __future__ import annotations

import pytest

from bench.support.specctl_serve import INGEST_TOKEN, SpecctlServe
from bench.support.vllm_server import VllmServer
from bench.support.workload import build_workload
from tests.faults.stack import (
    BACKOFF_MAX_S,
    CONNECT_TIMEOUT_S,
    MAX_TOKENS,
    MODEL_DIR,
    POLICY_TTL_S,
    QUEUE_STEPS,
    REPORT_INTERVAL_S,
    REPORT_PATH,
    REQUEST_TIMEOUT_S,
    SNAPSHOT_INTERVAL_S,
    FaultSuite,
)
from tests.support.faultproxy import Fault, FaultProxy


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    if not (MODEL_DIR / "config.json").exists():
        pytest.fail(f"model not found at {MODEL_DIR}: run `make model` (the fault suite needs the real engine)")
    work = tmp_path_factory.mktemp("faults")
    controller = SpecctlServe(work / "controller", env={
        "SPECCTL_POLICY_TTL_S": str(POLICY_TTL_S),
        "SPECCTL_SNAPSHOT_INTERVAL_S": str(SNAPSHOT_INTERVAL_S),
        "SPECCTL_MAINTENANCE_INTERVAL_S": "0.25",
    }).start()
    proxy = FaultProxy(controller.url).start()
    proxy.set_fault(Fault.REFUSE)  # the engine starts with no controller: the reference run
    engine = VllmServer(MODEL_DIR, work / "engine", controller_url=proxy.url, ingest_token=INGEST_TOKEN,
                        engine_id="faults-engine", report_interval_s=REPORT_INTERVAL_S, extra_env={
                            "SPECCTL_BACKOFF_MAX_S": str(BACKOFF_MAX_S),
                            "SPECCTL_QUEUE_STEPS": str(QUEUE_STEPS),
                            "SPECCTL_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
                            "SPECCTL_CONNECT_TIMEOUT_S": str(CONNECT_TIMEOUT_S),
                        })
    s = FaultSuite(controller, proxy, engine, build_workload(per_category=1, max_tokens=MAX_TOKENS))
    try:
        engine.start()
        yield s
    finally:
        if s.load is not None:
            s.load.stop()
        if s.sampler is not None:
            s.sampler.stop()
        if s.reports.phases:
            s.reports.write(REPORT_PATH, s.config())
            print("\nfault suite:\n" + s.reports.table() + f"\n-> {REPORT_PATH}")
        engine.stop()
        proxy.stop()
        controller.stop()
