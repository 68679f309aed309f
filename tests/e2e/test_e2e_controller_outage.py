"""The controller dies mid-workload: every request completes, the engine falls back to its static config when
the policy expires, and re-attaches (same override in force again) when the controller restarts."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.support import controller_api
from bench.support.stack import ENGINE_ID, POLICY_INTERVAL_S, POLICY_TTL_S, REPORT_INTERVAL_S, wait_attached
from bench.support.vllm_server import SpecCounters, spec_counters
from bench.support.workload import build_workload, run_workload

pytestmark = pytest.mark.e2e

PINNED = "json"
APPLY_WITHIN_S = POLICY_INTERVAL_S + 2 * REPORT_INTERVAL_S


def json_only(engine) -> SpecCounters:
    before = spec_counters(engine.metrics())
    results = run_workload(engine.url, build_workload(3, categories=(PINNED,), max_tokens=48), concurrency=3)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return spec_counters(engine.metrics()) - before


def test_engine_falls_back_and_reattaches(engine, controller, admin_token) -> None:
    controller_api.set_override(controller.url, admin_token, PINNED, k=1, reason="e2e outage")
    try:
        time.sleep(APPLY_WITHIN_S)
        attached = json_only(engine)
        print(f"\nattached:    drafts={attached.drafts:.0f} draft tokens={attached.draft_tokens:.0f}")
        assert attached.drafts > 0 and attached.draft_tokens == attached.drafts  # k = 1 from the controller

        mixed = build_workload(per_category=2, max_tokens=64)
        with ThreadPoolExecutor(1) as pool:
            background = pool.submit(run_workload, engine.url, mixed, concurrency=4)
            time.sleep(1.0)
            controller.kill(signal.SIGKILL)  # a crash, mid-workload
            killed_at = time.monotonic()
            results = background.result(timeout=600)
        assert [r.status for r in results] == [200] * len(mixed), [r.error for r in results if not r.ok]

        time.sleep(max(0.0, POLICY_TTL_S + 0.5 - (time.monotonic() - killed_at)))
        fallback = json_only(engine)
        print(f"controller down: drafts={fallback.drafts:.0f} draft tokens={fallback.draft_tokens:.0f}")
        assert fallback.draft_tokens > fallback.drafts  # the static config (k = 4) is back

        controller.start()  # same port, same SQLite file: the override is still there
        wait_attached(controller.url, ENGINE_ID)
        time.sleep(APPLY_WITHIN_S)
        again = json_only(engine)
        print(f"re-attached: drafts={again.drafts:.0f} draft tokens={again.draft_tokens:.0f}")
        assert again.drafts > 0 and again.draft_tokens == again.drafts
        log = engine.log_text()
        assert "specctl: controller" in log and "not usable" in log
        assert log.count("specctl: attached to controller") >= 2
    finally:
        if controller.proc is None or controller.proc.poll() is not None:
            controller.start()
        controller_api.clear_override(controller.url, admin_token, PINNED)
