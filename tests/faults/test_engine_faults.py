"""Faults between the real engine and the controller, applied in sequence on one patched vLLM CPU engine.

A mixed workload runs without pause through every fault. For each fault:
  * zero failed requests, and greedy tokens identical to the run without any controller (float32);
  * the engine keeps the last valid policy until its TTL runs out, then runs its static config (n-gram,
    k=4) from its next step on; invalid answers never replace the policy; well-formed hostile ones are
    clamped to what the engine can do;
  * once the controller is healthy again the engine re-attaches within its backoff cap plus its request
    timeout, and its steps are back at the controller's k;
  * the engine's steps never wait on the controller.

Two independent views of the engine: its own step records (delivered as telemetry once the controller is
back: start and end on CLOCK_MONOTONIC, and the drafting depth it applied, i.e. the k), and vLLM's
counters (``draft_tokens / drafts``). The controller pins every workload category to k=1 (operator
overrides in SQLite), so k=1 means "follows the controller" and k=4 "static config".
"""

from __future__ import annotations

import collections
import itertools
import os
import signal
import time

import httpx
import pytest

from bench.support.workload import run_workload
from tests.faults.harness import (
    ContinuousLoad,
    EngineStep,
    PhaseReport,
    Sampler,
    beyond,
    child_pids,
    compare,
    engine_steps,
    process_name,
    rss_mb,
    uncovered,
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

pytestmark = pytest.mark.faults

PINNED_K = 1
#: From the proxy writing the controller's answer to the engine applying it: parsing, thread scheduling.
RECEIPT_SLACK_S = 1.0
REATTACH_BOUND_S = BACKOFF_MAX_S + REQUEST_TIMEOUT_S + RECEIPT_SLACK_S
#: Single-token drafts in a row (vLLM's counters) that show the pinned k=1 is applied. The static n-gram
#: config also proposes short drafts near the end of a match, but rarely several in a row.
PINNED_RUN = 6
#: How long the fault is kept after vLLM's counters showed the static config.
HOLD_AFTER_FALLBACK_S = 1.0


# -- helpers -----------------------------------------------------------------------------------------

def _override_all(suite: FaultSuite, k: int) -> None:
    # the method is pinned too: an override that sets only k keeps the policy's method, and once the policy
    # moves a category to a model-free drafter (suffix) the engine's drafting depth no longer shows the pin
    for category in sorted(suite.categories):
        response = httpx.put(f"{suite.controller.url}/v1/overrides/{category}", headers=suite.controller.headers("admin"),
                             json={"k": k, "method": "ngram", "reason": "fault suite pin", "actor": "faults"},
                             timeout=10)
        assert response.status_code == 200, response.text


def _ensure_attached(suite: FaultSuite, timeout_s: float = 30.0) -> float:
    """Wait until vLLM's counters show the pinned k=1; return when that run of drafts started."""
    seen = wait_for_pinned_run(suite.sampler, time.monotonic(), PINNED_K, PINNED_RUN, timeout_s)
    assert seen is not None, f"engine does not follow the controller's policy; sampler: {suite.sampler.errors[-3:]}"
    return seen[0]


#: An answer written this close to the engine's request timeout (counted by the proxy from when it read the
#: request) may or may not have reached the engine in time: its own clock started when it sent the request,
#: earlier by however long the host took to deliver it (hundreds of ms on a loaded 2-CPU host). Such an answer
#: widens the expiry window instead of deciding it.
AMBIGUOUS_S = 0.5


def _outage(suite: FaultSuite, t_fault: float, healed: float, timeout_s: float = REATTACH_BOUND_S + 5
            ) -> tuple[float, float, float, float]:
    """(last answer surely used, last answer possibly used) before, and (first answer possibly used, first
    answer surely used) after, the engine's longest wait that ends after ``t_fault``, once an answer after
    ``healed`` that is surely used exists.

    A usable answer is a 200 the proxy passed through and wrote within the engine's request timeout of the
    post's start (the engine's send, from its batch's ``sent_at``, where the proxy read it later); it is surely
    used when written more than :data:`AMBIGUOUS_S` inside that timeout. The engine's policy was last
    renewed between the first two times, and it applies the controller's policy again from somewhere between
    the last two on: a controller just restarted answers its first post slowly, and an answer the engine
    timed out on does not end the wait. Answers to posts already in flight when a fault began, or while a
    controller shut down gracefully, count: they did renew the policy.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        answers = sorted((done, done - got < REQUEST_TIMEOUT_S - AMBIGUOUS_S)
                         for got, done, status, fault in list(suite.proxy.answers)
                         if done >= t_fault - 2.0 and fault is Fault.PASS and status == 200
                         and done - got < REQUEST_TIMEOUT_S)
        times = [done for done, _ in answers]
        if any(sure and done > healed for done, sure in answers) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    gaps = [pair for pair in itertools.pairwise(times) if pair[1] > t_fault]
    assert gaps and gaps[-1][1] > healed, (
        "the engine got no controller answer on one side of the fault\n" + _exchange_report(suite, t_fault, healed))
    possibly, back_at = max(gaps, key=lambda pair: pair[1] - pair[0])
    surely = max((done for done, sure in answers if sure and done <= possibly), default=possibly)
    back_surely = min((done for done, sure in answers if sure and done >= back_at), default=back_at)
    return surely, possibly, back_at, back_surely


def _exchange_report(suite: FaultSuite, t_fault: float, healed: float) -> str:
    """What passed between engine and controller around a fault, for a failure message: which of the
    engine's posts reached the proxy, what came back and how late, the proxy's counters and the ends of the
    controller's and the engine's logs. A wait that finds no usable answer has several causes (the reporter
    stopped posting, the controller answered late or with an error, the proxy lost its upstream); this tells
    them apart after the fact."""
    def phase(t: float) -> str:
        return "before" if t < t_fault else "during" if t < healed else "after"

    posts = collections.Counter((phase(s.at), str(s.fault)) for s in suite.proxy.seen_since(t_fault - 2.0))
    answers: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
    for got, done, status, fault in list(suite.proxy.answers):
        if done >= t_fault - 2.0:
            answers[(phase(done), str(fault), status)].append(done - got)
    answered = {f"{key}": f"{len(lat)} answers, latency max {max(lat):.3f} s" for key, lat in sorted(answers.items())}
    stats = suite.proxy.stats
    return "\n".join([
        f"fault at {t_fault:.3f}, healed at {healed:.3f}, now {time.monotonic():.3f} (monotonic)",
        f"host load average (1, 5, 15 min) {os.getloadavg()}, {os.cpu_count()} CPUs",
        f"posts read by the proxy (phase, fault in force): {dict(sorted(posts.items()))}",
        f"answers written (phase, fault, status): {answered}",
        (f"proxy: statuses {dict(stats.statuses)}, upstream errors {stats.upstream_errors}, "
         f"connections {stats.connections}"),
        "controller log, last lines:", suite.controller.log_text()[-1500:],
        "engine log, last specctl lines:",
        *[line[-300:] for line in suite.engine.log_text().splitlines() if "specctl" in line][-12:],
    ])


def _reattached_at(suite: FaultSuite, since: float, timeout_s: float) -> float | None:
    """When the first telemetry batch built under a controller policy was posted after ``since``."""
    deadline = since + timeout_s
    while time.monotonic() <= deadline:
        for seen in suite.proxy.seen_since(since):
            if seen.policy_version is not None and seen.fault is Fault.PASS:
                return seen.at
        time.sleep(0.05)
    return None


def _steps_delivered(suite: FaultSuite, t0: float, t1: float, timeout_s: float = 15.0) -> list[EngineStep]:
    """Engine steps started in [t0, t1], once a step started after ``t1`` has been reported (the backlog is in)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if engine_steps(suite.proxy.seen_since(t0 - 30), t1, float("inf")):
            break
        time.sleep(0.1)
    return engine_steps(suite.proxy.seen_since(t0 - 30), t0, t1)


def _check_requests(suite: FaultSuite, report: PhaseReport, since: float) -> None:
    results = suite.load.since(since)
    report.requests = len(results)
    report.failed, report.mismatched = compare(results, suite.reference)


def _mean_k(suite: FaultSuite, t0: float, t1: float) -> float | None:
    ws = [w for w in suite.sampler.windows(t0) if w.t1 <= t1]
    drafts = sum(w.drafts for w in ws)
    return sum(w.draft_tokens for w in ws) / drafts if drafts else None


def _record_step_times(report: PhaseReport, during: list[EngineStep], baseline: list[EngineStep]) -> None:
    """Engine step durations during the fault, and the bounds they are held to (see :func:`_assert_not_blocked`)."""
    walls, base = sorted(s.wall_s for s in during), sorted(s.wall_s for s in baseline)
    report.notes.update(
        steps_recorded=len(walls),
        max_step_wall_s=walls[-1] if walls else None,
        median_step_wall_s=walls[len(walls) // 2] if walls else None,
        # A step that waited on a post to a hung or slow controller would last a whole request timeout more
        # than usual, and with posts retried every 1-2 s about half the steps would: the median tells. The
        # maximum only guards against a frozen engine: a busy shared host stretches single steps past a
        # second. Both bounds follow the healthy steps of the 20 s before the fault on a slow host.
        max_step_bound_s=max(2 * REQUEST_TIMEOUT_S, 4 * base[-1]) if base else 2 * REQUEST_TIMEOUT_S,
        median_step_bound_s=max(REQUEST_TIMEOUT_S / 2, 2 * base[len(base) // 2]) if base else REQUEST_TIMEOUT_S / 2,
    )


def _assert_not_blocked(report: PhaseReport) -> None:
    n = report.notes
    assert n["steps_recorded"], f"no engine step of the fault reached the controller: {report}"
    assert n["max_step_wall_s"] < n["max_step_bound_s"], report
    assert n["median_step_wall_s"] < n["median_step_bound_s"], report


# -- one fault -------------------------------------------------------------------------------------------

def _run_fault(suite: FaultSuite, name: str, apply, heal, *, applied_k: int | None = None) -> PhaseReport:
    """Apply a fault under load until vLLM's counters show its effect, heal, check what the engine did.

    ``applied_k=None``: the controller's answers are unusable, so the last valid policy must hold until it
    expires and the static config (k=4) must follow. ``applied_k=k``: a well-formed hostile policy that the
    engine applies at once, clamped to ``k``.
    """
    report = suite.reports.add(PhaseReport(name))
    following_since = _ensure_attached(suite)
    assert not [w for w in suite.sampler.windows(following_since) if beyond(w, PINNED_K)], \
        "drafts deeper than the pinned k=1 before the fault: the observation is not valid"
    baseline = engine_steps(suite.proxy.seen_since(following_since - 30), following_since - 20, time.monotonic())

    t_fault = time.monotonic()
    apply()
    try:
        seen = wait_for_window(suite.sampler, t_fault, lambda w: beyond(w, PINNED_K), POLICY_TTL_S + 8)
        report.notes["counters_left_k1_s"] = None if seen is None else round(seen.t1 - t_fault, 3)
        if seen is not None:
            # the window that first left k=1 may straddle the change; on a loaded host the sampler's windows
            # grow, so wait (bounded) for one that lies wholly after it before healing
            wait_for_window(suite.sampler, seen.t1, lambda w: w.drafts > 0, HOLD_AFTER_FALLBACK_S + 5)
        time.sleep(HOLD_AFTER_FALLBACK_S)
    finally:
        heal()  # whatever was observed, the next fault starts from a healthy controller
    t_heal = time.monotonic()
    report.mean_k_during = _mean_k(suite, t_fault, t_heal)
    report.notes["deepest_window_mean_k"] = max((w.mean_k for w in suite.sampler.windows(t_fault)
                                                 if w.drafts and w.t1 <= t_heal), default=None)
    attached = _reattached_at(suite, t_heal, REATTACH_BOUND_S + 5)
    report.reattach_s = None if attached is None else attached - t_heal
    # the engine applies the controller's policy again from its first usable answer after the heal
    last_answer, last_possible, back_at, back_surely = _outage(suite, t_fault, t_heal)
    steps = _steps_delivered(suite, t_fault - 1.0, back_surely + 3.0)
    _check_requests(suite, report, t_fault)

    during = [s for s in steps if t_fault <= s.start < back_at]
    report.notes["last_answer_s"] = round(last_answer - t_fault, 3)
    report.notes["last_possible_answer_s"] = round(last_possible - t_fault, 3)
    report.notes["back_at_s"] = round(back_at - t_fault, 3)
    report.notes["back_surely_s"] = round(back_surely - t_fault, 3)
    _record_step_times(report, during, baseline)
    if applied_k is None:
        _check_hold_then_static(report, steps, t_fault, last_answer, last_possible, back_at)
    else:
        _check_clamped(suite, report, steps, t_fault, back_at, applied_k)
    back = [s for s in steps if s.start > back_at and s.depth == PINNED_K]
    report.pinned_again_s = back[0].start - t_heal if back else None

    assert not report.failed, report.failed
    assert not report.mismatched, report.mismatched
    assert report.reattach_s is not None and report.reattach_s <= REATTACH_BOUND_S, report
    assert report.pinned_again_s is not None, f"no engine step back at k={PINNED_K}: {report}"
    followed, late = _held_to_fresh_policy(suite, report, steps, back_surely + RECEIPT_SLACK_S, back_surely + 3.0)
    assert followed, f"no engine step after re-attaching while its policy was surely fresh: {report}"
    assert not late, f"steps not at the controller's k after re-attaching: {late[:3]}; {report}"
    _assert_not_blocked(report)
    return report


def _held_to_fresh_policy(suite: FaultSuite, report: PhaseReport, steps: list[EngineStep], t0: float, t1: float
                          ) -> tuple[list[EngineStep], list[EngineStep]]:
    """(steps started in [t0, t1] while the engine surely held a fresh controller policy, those of them not at
    the pinned k).

    A policy is surely fresh from :data:`RECEIPT_SLACK_S` after the proxy wrote an answer the engine surely
    used (see :func:`_outage`) until :data:`POLICY_TTL_S` after it: the engine received it later than it was
    written and counts the TTL from receipt. Outside those spans the engine may rightly run its static config:
    on a 2-CPU host a controller or a reporter thread starved for longer than the TTL lets the policy expire,
    which is the fallback the suite checks elsewhere, not a failure to follow. How long that happened after
    re-attaching is recorded in the report.
    """
    spans = _fresh_spans(suite, t0, t1, Fault.PASS)
    fresh = [s for s in steps if t0 <= s.start <= t1 and any(a <= s.start < b for a, b in spans)]
    report.notes["stale_after_reattach_s"] = round(uncovered(spans, t0, t1), 3)
    return fresh, [s for s in fresh if s.depth != PINNED_K]


def _fresh_spans(suite: FaultSuite, t0: float, t1: float, fault: Fault) -> list[tuple[float, float]]:
    """Where the engine surely holds a policy the proxy answered under ``fault`` between ``t0`` and ``t1``: from
    :data:`RECEIPT_SLACK_S` after each answer it surely used (see :func:`_outage`) to :data:`POLICY_TTL_S`
    after it."""
    sure = sorted(done for got, done, status, answered in list(suite.proxy.answers)
                  if t0 - POLICY_TTL_S <= done <= t1 and answered is fault and status == 200
                  and done - got < REQUEST_TIMEOUT_S - AMBIGUOUS_S)
    return [(done + RECEIPT_SLACK_S, done + POLICY_TTL_S) for done in sure]



def _check_hold_then_static(report: PhaseReport, steps: list[EngineStep], t_fault: float, last_answer: float,
                            last_possible: float, healed: float) -> None:
    """Policy held until it expired (TTL after receipt), static config from the next step on."""
    earliest = last_answer + POLICY_TTL_S  # the engine received the answer after the proxy wrote it
    latest = last_possible + POLICY_TTL_S + RECEIPT_SLACK_S
    report.expiry_s = earliest - t_fault
    static = [s for s in steps if s.start >= t_fault and s.depth == K_MAX]
    report.fallback_s = static[0].start - t_fault if static else None
    early = [s for s in steps if t_fault <= s.start < earliest and s.depth != PINNED_K]
    assert not early, f"policy dropped before its TTL: {early[:3]}"
    after = [s for s in steps if latest <= s.start < healed]
    assert after, f"no engine step recorded between the expiry and the re-attachment: {report}"
    not_static = [s for s in after if s.depth != K_MAX]
    assert not not_static, f"steps after the expiry not on the static k={K_MAX}: {not_static[:3]}"
    # vLLM's own counters agree: drafts deeper than any policy of this suite were verified
    assert report.notes["deepest_window_mean_k"] is not None and report.notes["deepest_window_mean_k"] > 2, report


def _check_clamped(suite: FaultSuite, report: PhaseReport, steps: list[EngineStep], t_fault: float,
                   healed: float, k: int) -> None:
    """Steps while the hostile policy is surely fresh run it, clamped to ``k``; vLLM's counters agree over the
    windows that lie wholly inside those spans (a controller starved past the TTL lets the engine fall back
    to its static config, as designed: see :func:`_held_to_fresh_policy`)."""
    hostile = [s.at for s in suite.proxy.seen_since(t_fault) if s.fault is Fault.HOSTILE]
    assert hostile, "the engine posted nothing while the hostile policy was served"
    start = hostile[0] + RECEIPT_SLACK_S
    spans = _fresh_spans(suite, start, healed, Fault.HOSTILE)
    report.notes["stale_under_hostile_s"] = round(uncovered(spans, start, healed), 3)
    applied = [s for s in steps if start <= s.start < healed and any(a <= s.start < b for a, b in spans)]
    report.fallback_s = next((s.start - t_fault for s in steps if s.start >= t_fault and s.depth == k), None)
    assert applied, f"no engine step recorded under the hostile policy: {report}"
    wrong = [s for s in applied if s.depth != k]
    assert not wrong, f"steps not at the clamped k={k}: {wrong[:3]}"
    deeper = [w for w in suite.sampler.windows(start + 1.0)
              if w.t1 <= healed and beyond(w, k) and uncovered(spans, w.t0, w.t1) < 1e-6]
    assert not deeper, f"vLLM verified drafts deeper than k={k}: {deeper[:3]}"


# -- the run without a controller, then attachment ------------------------------------------------------

def test_reference_run_without_controller(suite):
    """The engine has never reached a controller: it runs its static config; these are the reference outputs."""
    report = suite.reports.add(PhaseReport("no controller (reference)"))
    sampler = Sampler(suite.engine.url)
    sampler.start()
    t0 = time.monotonic()
    results = run_workload(suite.engine.url, suite.prompts, concurrency=CONCURRENCY)
    time.sleep(0.5)
    ws = sampler.windows(t0)
    sampler.stop()
    drafts = sum(w.drafts for w in ws)
    report.mean_k_during = sum(w.draft_tokens for w in ws) / drafts if drafts else None
    report.requests = len(results)
    report.failed = [f"{r.prompt.id}: {r.status} {r.error[:200]}" for r in results if not r.ok]
    suite.reference = {r.prompt.id: r for r in results}
    assert not report.failed
    assert all(r.token_ids for r in results)
    assert report.mean_k_during is not None and report.mean_k_during > 2, "expected the static ngram k=4"
    assert not suite.proxy.seen  # nothing reached even the proxy: the port refused


def test_attaches_and_follows_the_controller(suite):
    _override_all(suite, PINNED_K)
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
    seen = wait_for_pinned_run(suite.sampler, t0, PINNED_K, PINNED_RUN, 30)
    assert seen is not None, "drafts never came down to the pinned k=1"
    report.pinned_again_s = seen[1] - t0
    time.sleep(3)
    steps = engine_steps(suite.proxy.seen_since(t0), attached + RECEIPT_SLACK_S, time.monotonic())
    followed, late = _held_to_fresh_policy(suite, report, steps, attached + RECEIPT_SLACK_S, time.monotonic())
    assert followed, f"no engine step while its policy was surely fresh: {report}"
    assert not late, late[:5]
    seen_categories = {c for s in suite.proxy.seen_since(t0) for c in s.draft_tokens_by_category}
    assert seen_categories <= suite.categories, seen_categories - suite.categories
    _check_requests(suite, report, t0)
    assert not report.failed and not report.mismatched, (report.failed, report.mismatched)


# -- the faults --------------------------------------------------------------------------------------------

def _request_steps(suite: FaultSuite) -> int:
    categories = httpx.get(suite.controller.url + "/v1/categories", timeout=10).json()
    return sum(c["request_steps"] for c in categories if c["category"] in suite.categories)


def test_controller_killed_then_restarted_from_sqlite(suite):
    """kill -9, the port refuses; the controller comes back on the same SQLite file while the engine is
    cut off, and the k=1 pins return from the file (no new PUT) when the engine reaches it again."""
    ctl, proxy = suite.controller, suite.proxy
    notes: dict = {"learned_request_steps_before_kill": _request_steps(suite)}
    time.sleep(SNAPSHOT_INTERVAL_S + 1.0)  # everything learned up to the read above is in a snapshot now

    def apply():
        proxy.set_fault(Fault.REFUSE)  # first, so that no post is in flight to a dying controller
        ctl.kill(signal.SIGKILL)
        ctl.start()  # the engine still cannot reach it: the proxy refuses
        notes["learned_request_steps_restored"] = _request_steps(suite)
        notes["overrides_restored"] = sorted(o["category"] for o in httpx.get(ctl.url + "/v1/overrides").json())

    report = _run_fault(suite, "controller killed (kill -9)", apply, lambda: proxy.set_fault(Fault.PASS))
    report.notes.update(notes)
    assert notes["learned_request_steps_restored"] >= notes["learned_request_steps_before_kill"] > 0, notes
    assert set(notes["overrides_restored"]) == suite.categories, notes


def test_controller_hung(suite):
    _run_fault(suite, "controller hung", lambda: suite.proxy.set_fault(Fault.HANG),
               lambda: suite.proxy.set_fault(Fault.PASS))


def test_controller_answers_500(suite):
    _run_fault(suite, "controller answers 500", lambda: suite.proxy.set_fault(Fault.HTTP500),
               lambda: suite.proxy.set_fault(Fault.PASS))


@pytest.mark.parametrize(
    ("hostile", "applied_k"),
    [
        # invalid on the wire: refused by the engine, the last valid policy runs out, static config
        (Hostile.K_OUT_OF_RANGE, None),
        (Hostile.NEGATIVE_K, None),
        (Hostile.MALFORMED_JSON, None),
        (Hostile.WRONG_SHAPE, None),
        (Hostile.HUGE_PAYLOAD, None),
        # well-formed: k=32 is clamped to the engine's k_max=4 at once
        (Hostile.K_ABOVE_MAX, K_MAX),
        # well-formed, unknown drafter: the engine's own drafter at the policy's k=2
        (Hostile.UNKNOWN_METHOD, 2),
    ],
)
def test_hostile_policy(suite, hostile, applied_k):
    _run_fault(suite, f"hostile policy: {hostile.value}", lambda: suite.proxy.set_fault(Fault.HOSTILE, hostile=hostile),
               lambda: suite.proxy.set_fault(Fault.PASS), applied_k=applied_k)


def test_controller_2s_latency(suite):
    """2 s added to every answer: beyond the engine's 1 s request timeout, so every post fails."""
    _run_fault(suite, "2 s added latency", lambda: suite.proxy.set_fault(Fault.LATENCY, latency_s=2.0),
               lambda: suite.proxy.set_fault(Fault.PASS))


def test_controller_restarted_mid_load(suite):
    """A graceful restart under load: final snapshot on SIGTERM, state and pins back from SQLite."""
    ctl = suite.controller
    report = suite.reports.add(PhaseReport("controller restarted (SIGTERM)"))
    following_since = _ensure_attached(suite)
    baseline = engine_steps(suite.proxy.seen_since(following_since - 30), following_since - 20, time.monotonic())
    learned_before = _request_steps(suite)
    t0 = time.monotonic()
    ctl.restart(signal.SIGTERM)
    ready = time.monotonic()
    report.notes.update(downtime_s=round(ready - t0, 3), learned_request_steps_before=learned_before,
                        learned_request_steps_after=_request_steps(suite))
    attached = _reattached_at(suite, ready, REATTACH_BOUND_S + 5)
    report.reattach_s = None if attached is None else attached - ready
    last_answer, last_possible, back_at, back_surely = _outage(suite, t0, ready)
    steps = _steps_delivered(suite, t0 - 1.0, back_surely + 3.0)
    report.mean_k_during = _mean_k(suite, t0, ready)
    _check_requests(suite, report, t0)
    during = [s for s in steps if t0 <= s.start < back_at]
    _record_step_times(report, during, baseline)
    report.notes.update(last_answer_s=round(last_answer - t0, 3), back_at_s=round(back_at - t0, 3))
    # held until expiry; static only for steps started after it (if the restart outlasted the TTL)
    report.expiry_s = last_answer + POLICY_TTL_S - t0
    early = [s for s in during if s.start < last_answer + POLICY_TTL_S and s.depth != PINNED_K]
    late = [s for s in during if s.start >= last_possible + POLICY_TTL_S + RECEIPT_SLACK_S and s.depth != K_MAX]
    back = [s for s in steps if s.start > back_at and s.depth == PINNED_K]
    report.pinned_again_s = back[0].start - ready if back else None
    report.fallback_s = next((s.start - t0 for s in during if s.depth == K_MAX), None)

    assert report.notes["learned_request_steps_after"] >= learned_before > 0
    assert not report.failed and not report.mismatched, (report.failed, report.mismatched)
    assert report.reattach_s is not None and report.reattach_s <= REATTACH_BOUND_S, report
    assert not early and not late, (early[:3], late[:3])
    assert report.pinned_again_s is not None, report
    _assert_not_blocked(report)


def test_telemetry_queue_overflow(suite):
    """Controller hung until the engine's step queue has overflowed.

    Drops are counted exactly: vLLM's own step count equals the steps delivered to the controller plus the
    engine's ``dropped_steps``; no batch carries more than the queue holds; the engine keeps stepping at
    its usual pace while the reporter is stuck.
    """
    report = suite.reports.add(PhaseReport(f"telemetry queue overflow ({QUEUE_STEPS} steps)"))
    following_since = _ensure_attached(suite)
    baseline = engine_steps(suite.proxy.seen_since(following_since - 30), following_since - 20, time.monotonic())
    before = _quiesce(suite)
    engine_core = [p for p in child_pids(suite.engine.proc.pid) if process_name(p).startswith("VLLM::EngineCor")]
    rss_before = rss_mb(engine_core[0]) if engine_core else None

    suite.load.resume()
    t_fault = time.monotonic()
    suite.proxy.set_fault(Fault.HANG)
    iterations0 = suite.sampler.latest().iterations
    deadline = t_fault + 120
    while suite.sampler.latest().iterations - iterations0 < QUEUE_STEPS + 32 and time.monotonic() < deadline:
        time.sleep(0.2)
    t_heal = time.monotonic()
    report.mean_k_during = _mean_k(suite, t_fault + POLICY_TTL_S + RECEIPT_SLACK_S, t_heal)
    rss_during = rss_mb(engine_core[0]) if engine_core else None
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
    during = engine_steps(list(batches.values()), t_fault, t_heal)
    _record_step_times(report, during, baseline)
    report.notes.update(hang_s=round(t_heal - t_fault, 2), steps_produced=produced, steps_delivered=delivered,
                        steps_dropped=dropped, largest_batch_steps=max((s.steps for s in batches.values()), default=0),
                        engine_core_rss_mb_before=rss_before, engine_core_rss_mb_during_overflow=rss_during)
    assert not report.failed and not report.mismatched, (report.failed, report.mismatched)
    assert dropped > 0, "the queue never overflowed"
    assert delivered + dropped == produced, report.notes
    assert report.notes["largest_batch_steps"] <= QUEUE_STEPS
    _assert_not_blocked(report)
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
