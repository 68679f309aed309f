"""Faults between the real engine and the controller, applied in sequence on one patched vLLM CPU engine.

A mixed workload runs without pause through every fault. For each fault:
  * zero failed requests, and greedy tokens identical to the run without any controller (float32);
  * the engine keeps the controller's policy until its TTL, then runs its static config (ngram, k=4):
    fallback within ``POLICY_TTL_S`` plus one observation window;
  * once the controller is healthy again the engine re-attaches (telemetry says it applies a controller
    policy again, vLLM's counters show every draft back at the pinned k=1) within the engine's backoff cap
    plus its request timeout plus one window.

The controller pins every workload category to k=1 (operator overrides, kept in SQLite), so "follows the
controller" and "static config" are told apart by vLLM's own counters (see :mod:`tests.faults.harness`).
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.faults.harness import (
    ContinuousLoad,
    PhaseReport,
    Sampler,
    Window,
    beyond,
    child_pids,
    compare,
    process_name,
    rss_mb,
    step_walls,
    wait_for_pinned_run,
    wait_for_window,
)
from tests.faults.stack import (
    BACKOFF_MAX_S,
    CONCURRENCY,
    K_MAX,
    POLICY_TTL_S,
    QUEUE_STEPS,
    REQUEST_TIMEOUT_S,
    SNAPSHOT_INTERVAL_S,
    FaultSuite,
)
from tests.support.faultproxy import Fault, Hostile
from tests.support.workload import run_workload

pytestmark = pytest.mark.faults

#: Observation slack: the fallback is seen at the next draft of 2+ tokens after it (a request drafts only
#: when its n-gram lookup matches: every 0.2-1.5 s in this workload), in 0.2 s sampling windows.
WINDOW_SLACK_S = 2.0
#: Single-token drafts in a row that show the pinned k=1 is applied (the static config makes short drafts
#: too, near the end of a match, but rarely several in a row).
PINNED_RUN = 6
FALLBACK_BOUND_S = POLICY_TTL_S + WINDOW_SLACK_S
REATTACH_BOUND_S = BACKOFF_MAX_S + REQUEST_TIMEOUT_S + WINDOW_SLACK_S
#: The engine's own step durations (telemetry ``wall_s``, schedule() to update_from_output()) during the
#: fault: a step that waited on a post to a hung or slow controller would last a whole request timeout.
STEP_BOUND_S = REQUEST_TIMEOUT_S
#: Generation seen from outside (vLLM's token counter, 0.2 s samples) must not freeze either; the bound is
#: loose because other work on a shared 2-core host also pauses it.
FREEZE_BOUND_S = 3 * REQUEST_TIMEOUT_S


def _measure_stall(suite: FaultSuite, report: PhaseReport, t0: float, t1: float) -> None:
    report.max_progress_gap_s = suite.sampler.max_progress_gap(t0, t1)
    report.notes["stall_window"] = (t0, t1)


def _assert_no_stall(suite: FaultSuite, report: PhaseReport) -> None:
    """Call after re-attachment: the steps queued during the fault have been delivered by then."""
    t0, t1 = report.notes.pop("stall_window")
    walls = step_walls(suite.proxy.seen_since(t0 - 5.0), t0, t1)
    report.notes["steps_reported_during_fault"] = len(walls)
    report.notes["max_step_wall_s"] = max(walls, default=None)
    assert walls, f"no step of the fault window reached the controller: {report}"
    assert report.notes["max_step_wall_s"] < STEP_BOUND_S, report
    assert report.max_progress_gap_s < FREEZE_BOUND_S, report


def _override_all(suite: FaultSuite, k: int) -> None:
    for category in sorted(suite.categories):
        response = httpx.put(f"{suite.controller.url}/v1/overrides/{category}", headers=suite.controller.headers("admin"),
                             json={"k": k, "reason": "fault suite pin", "actor": "faults"}, timeout=10)
        assert response.status_code == 200, response.text


def _ensure_attached(suite: FaultSuite, timeout_s: float = 20.0) -> float:
    """Wait until drafts are at the pinned k=1; return when that run of drafts started."""
    seen = wait_for_pinned_run(suite.sampler, time.monotonic(), 1, PINNED_RUN, timeout_s)
    assert seen is not None, f"engine does not follow the controller's policy; sampler: {suite.sampler.errors[-3:]}"
    return seen[0]


def _reattached_at(suite: FaultSuite, since: float, timeout_s: float) -> float | None:
    """When the first telemetry batch built under a controller policy was posted after ``since``."""
    deadline = since + timeout_s
    while time.monotonic() <= deadline:
        for seen in suite.proxy.seen_since(since):
            if seen.policy_version is not None and seen.fault is Fault.PASS:
                return seen.at
        time.sleep(0.05)
    return None


def _last_ack_before(suite: FaultSuite, t: float) -> float | None:
    """Seconds before ``t`` of the last telemetry post that went through to the controller."""
    passed = [s.at for s in list(suite.proxy.seen) if s.at < t and s.fault is Fault.PASS]
    return round(t - passed[-1], 3) if passed else None


def _check_requests(suite: FaultSuite, report: PhaseReport, since: float) -> None:
    results = suite.load.since(since)
    report.requests = len(results)
    report.failed, report.mismatched = compare(results, suite.reference)


def _mean_k(suite: FaultSuite, t0: float, t1: float) -> float | None:
    ws = [w for w in suite.sampler.windows(t0) if w.t1 <= t1]
    drafts = sum(w.drafts for w in ws)
    return sum(w.draft_tokens for w in ws) / drafts if drafts else None


def _run_fault(suite: FaultSuite, name: str, apply, heal, *, holds_policy: bool = True,
               static: bool = True, hostile_k: int | None = None) -> PhaseReport:
    """Apply a fault under load, observe the fallback, heal, observe the re-attachment.

    ``static``: the engine must end up on its static config (drafts deeper than any policy here);
    ``hostile_k``: a well-formed hostile policy whose k the engine applies, clamped: no draft deeper.
    ``heal`` returns once the controller is reachable again; re-attachment is timed from then.
    """
    report = suite.reports.add(PhaseReport(name))
    following_since = _ensure_attached(suite)
    control = [w for w in suite.sampler.windows(following_since) if beyond(w, 1)]
    assert not control, "drafts deeper than the pinned k=1 before the fault: the observation is not valid"

    t_fault = time.monotonic()
    apply()
    try:
        window = _observe_fault(suite, report, t_fault, static)
    finally:
        heal()  # whatever was observed, the next fault starts from a healthy controller
    t_heal = time.monotonic()
    attached = _reattached_at(suite, t_heal, REATTACH_BOUND_S + 5)
    report.reattach_s = None if attached is None else attached - t_heal
    again = wait_for_pinned_run(suite.sampler, t_heal, 1, PINNED_RUN, REATTACH_BOUND_S + 10)
    report.pinned_again_s = None if again is None else again[1] - t_heal
    _check_requests(suite, report, t_fault)

    assert window is not None, f"{name}: the engine never left the controller's policy; {report}"
    assert not report.failed, report.failed
    assert not report.mismatched, report.mismatched
    assert report.fallback_s <= FALLBACK_BOUND_S, report
    if holds_policy:  # a failing controller does not make the engine drop a valid policy early
        assert window.t0 - t_fault >= POLICY_TTL_S - 1.0, report
    if static:  # the static config (k=4) drafts deeper than every policy in this suite
        assert report.notes["deepest_mean_k"] > 2, f"{name}: not the static k={K_MAX}: {report}"
    if hostile_k is not None:
        assert report.notes["deepest_mean_k"] <= hostile_k, f"{name}: drafts deeper than k={hostile_k}: {report}"
    assert report.reattach_s is not None and report.reattach_s <= REATTACH_BOUND_S, report
    assert report.pinned_again_s is not None, report
    _assert_no_stall(suite, report)
    return report


def _observe_fault(suite: FaultSuite, report: PhaseReport, t_fault: float, static: bool) -> Window | None:
    """Wait for the first draft deeper than the pinned k=1, then watch a little longer; fill ``report``."""
    window = wait_for_window(suite.sampler, t_fault, lambda w: beyond(w, 1), FALLBACK_BOUND_S + 3)
    if window is not None:
        report.fallback_s = window.t1 - t_fault
        if static:  # until a draft deeper than any policy of this suite shows the static k=4
            wait_for_window(suite.sampler, window.t0, lambda w: beyond(w, 2), 5)
        time.sleep(1.0)
    t_end = time.monotonic()
    after = [w for w in suite.sampler.windows(window.t0 if window else t_fault) if w.t1 <= t_end and w.drafts]
    report.mean_k_during = _mean_k(suite, window.t0, t_end) if window else None
    _measure_stall(suite, report, t_fault, t_end)
    report.notes["deepest_mean_k"] = max((w.mean_k for w in after), default=None)
    report.notes["last_ack_before_fault_s"] = _last_ack_before(suite, t_fault)
    report.notes["windows"] = [(round(w.t0 - t_fault, 2), w.drafts, w.draft_tokens)
                               for w in suite.sampler.windows(t_fault - 1.0) if w.t1 <= t_end and w.drafts]
    report.notes["sampler_errors"] = list(suite.sampler.errors[-3:])
    report.notes["requests_running_min_max"] = suite.sampler.running_range(t_fault, t_end)
    report.notes["samples"] = len([x for x in suite.sampler.snapshot() if t_fault <= x.t <= t_end])
    return window


# -- the run without a controller, then attachment ------------------------------------------------

def test_reference_run_without_controller(suite):
    """The engine has never reached a controller: it runs its static config; these are the reference outputs."""
    report = suite.reports.add(PhaseReport("no controller (reference)"))
    sampler = Sampler(suite.engine.url)
    sampler.start()
    t0 = time.monotonic()
    results = run_workload(suite.engine.url, suite.prompts, concurrency=CONCURRENCY)
    time.sleep(0.5)
    report.mean_k_during = _mean_k_from(sampler, t0)
    sampler.stop()
    report.requests = len(results)
    report.failed = [f"{r.prompt.id}: {r.status} {r.error[:200]}" for r in results if not r.ok]
    suite.reference = {r.prompt.id: r for r in results}
    assert not report.failed
    assert all(r.token_ids for r in results)
    assert report.mean_k_during is not None and report.mean_k_during > 2, "expected the static ngram k=4"
    assert not suite.proxy.seen  # nothing reached even the proxy: the port refused


def _mean_k_from(sampler: Sampler, t0: float) -> float | None:
    ws = sampler.windows(t0)
    drafts = sum(w.drafts for w in ws)
    return sum(w.draft_tokens for w in ws) / drafts if drafts else None


def test_attaches_and_follows_the_controller(suite):
    _override_all(suite, 1)
    suite.sampler = Sampler(suite.engine.url)
    suite.sampler.start()
    suite.load = ContinuousLoad(suite.engine.url, suite.client_prompts())
    report = suite.reports.add(PhaseReport("attach (controller up)"))
    t0 = time.monotonic()
    suite.proxy.set_fault(Fault.PASS)
    suite.load.start()
    attached = _reattached_at(suite, t0, REATTACH_BOUND_S + 5)
    assert attached is not None, "the engine never applied a controller policy"
    report.reattach_s = attached - t0
    seen = wait_for_pinned_run(suite.sampler, t0, 1, PINNED_RUN, 30)
    assert seen is not None, "drafts never came down to the pinned k=1"
    report.pinned_again_s = seen[1] - t0
    time.sleep(3)
    seen_categories = {c for s in suite.proxy.seen_since(t0) for c in s.draft_tokens_by_category}
    assert seen_categories <= suite.categories, seen_categories - suite.categories
    _check_requests(suite, report, t0)
    assert not report.failed and not report.mismatched, (report.failed, report.mismatched)


# -- the faults -------------------------------------------------------------------------------------

def test_controller_killed_then_restarted_from_sqlite(suite):
    """kill -9; the port refuses; after the restart the pins come back from SQLite, not from a new PUT."""
    ctl, proxy = suite.controller, suite.proxy
    notes: dict = {"learned_request_steps_before_kill": _request_steps(suite)}
    time.sleep(SNAPSHOT_INTERVAL_S + 1.0)  # everything learned up to the read above is in a snapshot now

    def apply():
        ctl.kill(signal.SIGKILL)
        proxy.set_fault(Fault.REFUSE)

    def heal():
        ctl.start()
        notes["learned_request_steps_restored"] = _request_steps(suite)  # before the engine reaches it again
        notes["overrides_restored"] = sorted(o["category"] for o in httpx.get(ctl.url + "/v1/overrides").json())
        proxy.set_fault(Fault.PASS)

    report = _run_fault(suite, "controller killed (kill -9)", apply, heal)
    report.notes.update(notes)
    assert notes["learned_request_steps_restored"] >= notes["learned_request_steps_before_kill"] > 0, notes
    assert set(notes["overrides_restored"]) == suite.categories, notes


def _request_steps(suite: FaultSuite) -> int:
    categories = httpx.get(suite.controller.url + "/v1/categories", timeout=10).json()
    return sum(c["request_steps"] for c in categories if c["category"] in suite.categories)


def test_controller_hung(suite):
    _run_fault(suite, "controller hung", lambda: suite.proxy.set_fault(Fault.HANG),
               lambda: suite.proxy.set_fault(Fault.PASS))


def test_controller_answers_500(suite):
    _run_fault(suite, "controller answers 500", lambda: suite.proxy.set_fault(Fault.HTTP500),
               lambda: suite.proxy.set_fault(Fault.PASS))


@pytest.mark.parametrize(
    ("hostile", "holds_policy", "static", "hostile_k"),
    [
        # invalid on the wire: refused by the engine, the last valid policy runs out, static config
        (Hostile.K_OUT_OF_RANGE, True, True, None),
        (Hostile.NEGATIVE_K, True, True, None),
        (Hostile.MALFORMED_JSON, True, True, None),
        (Hostile.WRONG_SHAPE, True, True, None),
        (Hostile.HUGE_PAYLOAD, True, True, None),
        # well-formed: k=32 is clamped to the engine's k_max=4 at once
        (Hostile.K_ABOVE_MAX, False, True, K_MAX),
        # well-formed, unknown drafter: the engine's own drafter at the policy's k=2
        (Hostile.UNKNOWN_METHOD, False, False, 2),
    ],
)
def test_hostile_policy(suite, hostile, holds_policy, static, hostile_k):
    _run_fault(suite, f"hostile policy: {hostile.value}", lambda: suite.proxy.set_fault(Fault.HOSTILE, hostile=hostile),
               lambda: suite.proxy.set_fault(Fault.PASS), holds_policy=holds_policy, static=static,
               hostile_k=hostile_k)


def test_controller_2s_latency(suite):
    """2 s added to every answer: beyond the engine's 1 s request timeout, so every post fails."""
    _run_fault(suite, "2 s added latency", lambda: suite.proxy.set_fault(Fault.LATENCY, latency_s=2.0),
               lambda: suite.proxy.set_fault(Fault.PASS))


def test_controller_restarted_mid_load(suite):
    """A graceful restart under load: final snapshot on SIGTERM, state and pins back from SQLite."""
    ctl = suite.controller
    report = suite.reports.add(PhaseReport("controller restarted (SIGTERM)"))
    _ensure_attached(suite)
    learned_before = _request_steps(suite)
    t0 = time.monotonic()
    ctl.restart(signal.SIGTERM)
    ready = time.monotonic()
    report.notes["downtime_s"] = ready - t0
    report.notes["learned_request_steps_before"] = learned_before
    report.notes["learned_request_steps_after"] = _request_steps(suite)
    attached = _reattached_at(suite, ready, REATTACH_BOUND_S + 5)
    report.reattach_s = None if attached is None else attached - ready
    again = wait_for_pinned_run(suite.sampler, ready, 1, PINNED_RUN, REATTACH_BOUND_S + 10)
    report.pinned_again_s = None if again is None else again[1] - ready
    report.mean_k_during = _mean_k(suite, t0, ready)
    _check_requests(suite, report, t0)
    assert report.notes["learned_request_steps_after"] >= learned_before > 0
    assert not report.failed and not report.mismatched, (report.failed, report.mismatched)
    assert report.reattach_s is not None and report.reattach_s <= REATTACH_BOUND_S
    assert report.pinned_again_s is not None
    _measure_stall(suite, report, t0, ready)
    _assert_no_stall(suite, report)


def test_telemetry_queue_overflow(suite):
    """Controller hung long enough for the engine's 16-step queue to overflow.

    Drops are counted exactly: vLLM's own step count equals the steps delivered to the controller plus
    the engine's ``dropped_steps``; no batch ever carries more than the queue holds; generation never
    stalls while the reporter is stuck.
    """
    report = suite.reports.add(PhaseReport(f"telemetry queue overflow ({QUEUE_STEPS} steps)"))
    _ensure_attached(suite)
    before = _quiesce(suite)
    engine_core = [p for p in child_pids(suite.engine.proc.pid) if process_name(p).startswith("VLLM::EngineCor")]
    rss_before = rss_mb(engine_core[0]) if engine_core else None

    suite.load.resume()
    t_fault = time.monotonic()
    suite.proxy.set_fault(Fault.HANG)
    time.sleep(POLICY_TTL_S + 4.0)
    t_heal = time.monotonic()
    report.mean_k_during = _mean_k(suite, t_fault + POLICY_TTL_S + 1.0, t_heal)
    rss_during = rss_mb(engine_core[0]) if engine_core else None
    _measure_stall(suite, report, t_fault, t_heal)
    suite.proxy.set_fault(Fault.PASS)
    attached = _reattached_at(suite, t_heal, REATTACH_BOUND_S + 5)
    report.reattach_s = None if attached is None else attached - t_heal
    after = _quiesce(suite)
    suite.load.resume()
    _check_requests(suite, report, t_fault)

    batches = {s.seq: s for s in suite.proxy.seen_since(before["beat_at"]) if s.seq is not None}
    delivered = sum(s.steps for seq, s in batches.items() if before["seq"] < seq <= after["seq"])
    dropped = after["dropped"] - before["dropped"]
    produced = after["iterations"] - before["iterations"]
    report.notes.update(steps_produced=produced, steps_delivered=delivered, steps_dropped=dropped,
                        largest_batch_steps=max((s.steps for s in batches.values()), default=0),
                        engine_core_rss_mb_before=rss_before, engine_core_rss_mb_during_overflow=rss_during)
    assert not report.failed and not report.mismatched, (report.failed, report.mismatched)
    assert dropped > 0, "the queue never overflowed"
    assert delivered + dropped == produced, report.notes
    assert report.notes["largest_batch_steps"] <= QUEUE_STEPS
    _assert_no_stall(suite, report)
    assert report.reattach_s is not None and report.reattach_s <= REATTACH_BOUND_S
    assert report.mean_k_during is not None and report.mean_k_during > 2  # static config while hung


def _quiesce(suite: FaultSuite, timeout_s: float = 120.0) -> dict:
    """Pause the load and wait for an empty heartbeat batch: every step produced so far is reported."""
    suite.load.pause(timeout_s)
    deadline = time.monotonic() + timeout_s
    t_idle = time.monotonic()
    iterations = suite.sampler.latest().iterations
    while time.monotonic() < deadline:
        time.sleep(0.3)
        beats = [s for s in suite.proxy.seen_since(t_idle + 0.3) if s.steps == 0 and s.fault is Fault.PASS]
        if beats and suite.sampler.latest().iterations == iterations:
            last = beats[-1]
            return {"beat_at": last.at, "seq": last.seq, "dropped": last.dropped_steps,
                    "iterations": suite.sampler.latest().iterations}
        iterations = suite.sampler.latest().iterations
    raise TimeoutError("engine telemetry did not settle")


def test_whole_run_no_failed_request_no_changed_output(suite):
    """Everything the workload sent across all faults (including requests spanning two faults)."""
    suite.load.stop()
    results = [x.result for x in suite.load.results]
    failed, mismatched = compare(results, suite.reference)
    suite.reports.add(PhaseReport("whole run", requests=len(results), failed=failed, mismatched=mismatched))
    assert results and not failed and not mismatched
