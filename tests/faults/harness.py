"""Observation tools for the fault suite: vLLM counter timeline, engine step records, continuous workload,
phase reports.

The suite pins every workload category to k=1 through controller overrides. Two views tell what the
engine applies: vLLM's own counters (while the engine follows the controller every verified draft is one
token, ``delta draft_tokens == delta drafts``; on its static n-gram k=4 config drafts are longer), and the
engine's step records in the telemetry it posts, seen by the fault proxy (start/end of each step on
CLOCK_MONOTONIC and the drafting depth applied), plus its ``policy_version`` (null = static config) and
``dropped_steps``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.support.workload import Prompt, Result, run_workload

#: vLLM counters read every sample (summed over label sets).
_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:generation_tokens_total": "gen_tokens",
    "vllm:iteration_tokens_total_count": "iterations",
    "vllm:num_requests_running": "running",  # a gauge
}


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # monotonic
    drafts: float = 0.0
    draft_tokens: float = 0.0
    gen_tokens: float = 0.0
    iterations: float = 0.0
    running: float = 0.0


def parse_counters(text: str, t: float) -> Sample:
    values = dict.fromkeys(_COUNTERS.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = _COUNTERS.get(name)
        if key is not None:
            values[key] += float(line.rsplit(" ", 1)[1])
    return Sample(t=t, **values)


@dataclass(frozen=True, slots=True)
class Window:
    """Two consecutive samples: what the engine drafted between them."""

    t0: float
    t1: float
    drafts: float
    draft_tokens: float

    @property
    def mean_k(self) -> float | None:
        return self.draft_tokens / self.drafts if self.drafts else None


class Sampler(threading.Thread):
    """Reads vLLM's /metrics every ``every_s`` (only the few counter lines are parsed)."""

    def __init__(self, url: str, every_s: float = 0.2):
        super().__init__(name="vllm-sampler", daemon=True)
        self.url, self.every_s = url, every_s
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._halt.is_set():
                try:
                    sample = parse_counters(client.get(self.url + "/metrics").text, time.monotonic())
                except Exception as exc:  # noqa: BLE001 - keep observing; errors are reported with the results
                    self.errors.append(f"{time.monotonic():.1f}: {type(exc).__name__}: {exc}"[:300])
                else:
                    with self._lock:
                        self.samples.append(sample)
                self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def snapshot(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def windows(self, since: float) -> list[Window]:
        s = [x for x in self.snapshot() if x.t >= since]
        return [Window(a.t, b.t, b.drafts - a.drafts, b.draft_tokens - a.draft_tokens) for a, b in itertools.pairwise(s)]

    def latest(self) -> Sample:
        with self._lock:
            return self.samples[-1]

    def progress_gaps(self, t0: float, t1: float) -> list[float]:
        """Times between generated-token increments in [t0, t1] (engine stalls show up here)."""
        s = [x for x in self.snapshot() if t0 <= x.t <= t1]
        last_change, gaps = None, []
        for a, b in itertools.pairwise(s):
            if b.gen_tokens > a.gen_tokens:
                if last_change is not None:
                    gaps.append(b.t - last_change)
                last_change = b.t
        return gaps

    def running_range(self, t0: float, t1: float) -> tuple[float, float] | None:
        r = [x.running for x in self.snapshot() if t0 <= x.t <= t1]
        return (min(r), max(r)) if r else None

    def max_progress_gap(self, t0: float, t1: float) -> float:
        return max(self.progress_gaps(t0, t1), default=0.0)


def wait_for_window(sampler: Sampler, since: float, predicate, timeout_s: float) -> Window | None:
    """The first window starting at or after ``since`` that satisfies ``predicate``, waiting up to ``timeout_s``."""
    deadline = since + timeout_s
    while True:
        for w in sampler.windows(since):
            if predicate(w):
                return w
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def wait_for_pinned_run(sampler: Sampler, since: float, k: int, min_drafts: int,
                        timeout_s: float) -> tuple[float, float] | None:
    """(start, end) of the first run of ``min_drafts`` drafts in a row, from ``since`` on, of exactly ``k`` tokens.

    Drafts are sparse (a request drafts only when its n-gram lookup matches), so the evidence is collected
    over consecutive windows; any window with a draft of another length restarts the count. The static
    n-gram config also proposes short drafts near the end of a match, hence several in a row.
    """
    deadline = since + timeout_s
    while True:
        run, start = 0, None
        for w in sampler.windows(since):
            if not w.drafts:
                continue
            if w.draft_tokens != k * w.drafts:
                run, start = 0, None
                continue
            run, start = run + w.drafts, start if start is not None else w.t0
            if run >= min_drafts:
                return start, w.t1
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def beyond(w: Window, k: int) -> bool:
    """Some draft in the window had more than ``k`` tokens."""
    return w.drafts > 0 and w.draft_tokens > k * w.drafts


@dataclass
class TimedResult:
    result: Result
    finished_at: float


class ContinuousLoad:
    """One client per prompt list, each sending its prompts one after another until stopped.

    No round barrier: the engine always has one request per client in flight (steady drafting, so the
    counters show what the engine applies at any moment). Pausable: :meth:`pause` returns once no request
    is in flight.
    """

    def __init__(self, url: str, prompts_per_client: list[list[Prompt]]):
        self.url, self.prompts_per_client = url, prompts_per_client
        concurrency = len(prompts_per_client)
        self.results: list[TimedResult] = []
        self._halt = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._busy = [False] * concurrency
        self._threads = [threading.Thread(target=self._client, args=(i,), name=f"workload-{i}", daemon=True)
                         for i in range(concurrency)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _client(self, index: int) -> None:
        prompts = self.prompts_per_client[index]
        n = index  # clients start at different prompts
        while not self._halt.is_set():
            if not self._running.wait(0.2):
                continue
            self._busy[index] = True
            try:
                if self._halt.is_set() or not self._running.is_set():
                    continue
                [result] = run_workload(self.url, [prompts[n % len(prompts)]], concurrency=1, timeout_s=300)
                self.results.append(TimedResult(result, time.monotonic()))
                n += 1
            finally:
                self._busy[index] = False

    def pause(self, timeout_s: float = 300) -> None:
        """Return once every client finished its request in flight."""
        self._running.clear()
        deadline = time.monotonic() + timeout_s
        while any(self._busy):
            if time.monotonic() > deadline:
                raise TimeoutError("workload requests did not finish")
            time.sleep(0.05)

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._halt.set()
        self._running.set()
        for t in self._threads:
            t.join(300)

    def since(self, t: float) -> list[Result]:
        return [x.result for x in list(self.results) if x.finished_at >= t]


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One engine step as the engine reported it (clock: CLOCK_MONOTONIC, same as ``time.monotonic()``)."""

    start: float
    end: float
    depth: int  # drafting depth the engine asked for: the k it applied (static config: its k_max)

    @property
    def wall_s(self) -> float:
        return self.end - self.start


def engine_steps(seen: list, t0: float, t1: float) -> list[EngineStep]:
    """The engine's steps that started in [t0, t1], from the telemetry it posted, in order.

    Each batch counts once (a retried batch repeats its seq); steps dropped by the engine's queue are absent.
    """
    by_seq = {s.seq: s for s in seen if s.seq is not None}
    steps = {EngineStep(t - wall, t, depth) for s in by_seq.values() for t, wall, depth in s.step_times}
    return sorted((x for x in steps if t0 <= x.start <= t1), key=lambda x: x.start)


def uncovered(spans: list[tuple[float, float]], t0: float, t1: float) -> float:
    """How much of [t0, t1] none of the half-open ``spans`` covers (they may overlap and stick out)."""
    covered, reach = 0.0, t0
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, t1)
        if b > a:
            covered += b - a
            reach = b
    return (t1 - t0) - covered


def compare(results: list[Result], reference: dict[str, Result]) -> tuple[list[str], list[str]]:
    """(failed request descriptions, prompts whose greedy tokens differ from the reference)."""
    failed = [f"{r.prompt.id}: {r.status} {r.error[:200]}" for r in results if not r.ok or not r.finish_reason]
    mismatched = []
    for r in results:
        if r.ok and r.token_ids != reference[r.prompt.id].token_ids:
            ref = reference[r.prompt.id].token_ids
            at = next((i for i, (a, b) in enumerate(zip(r.token_ids, ref)) if a != b), min(len(ref), len(r.token_ids)))
            mismatched.append(f"{r.prompt.id}: first difference at token {at}")
    return failed, mismatched


@dataclass
class PhaseReport:
    fault: str
    requests: int = 0
    failed: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    fallback_s: float | None = None  # fault applied -> first engine step run on the static config
    expiry_s: float | None = None  # fault applied -> last policy received + TTL (earliest expiry)
    reattach_s: float | None = None  # healed -> first telemetry batch built under a controller policy
    pinned_again_s: float | None = None  # healed -> first engine step back at the controller's k=1
    mean_k_during: float | None = None
    max_progress_gap_s: float | None = None
    notes: dict = field(default_factory=dict)


class Reports:
    def __init__(self):
        self.phases: list[PhaseReport] = []

    def add(self, report: PhaseReport) -> PhaseReport:
        self.phases.append(report)
        return report

    def write(self, path: Path, config: dict) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"config": config, "phases": [asdict(p) for p in self.phases]}, indent=2) + "\n")

    def table(self) -> str:
        def f(x):
            return "-" if x is None else f"{x:.2f}"

        lines = [(f"{'fault':<36}{'reqs':>5}{'fail':>5}{'diff':>5}{'expiry s':>10}{'fallback s':>11}"
                  f"{'reattach s':>11}{'k=1 again s':>12}{'mean k':>7}{'max step s':>11}")]
        for p in self.phases:
            lines.append(f"{p.fault:<36}{p.requests:>5}{len(p.failed):>5}{len(p.mismatched):>5}{f(p.expiry_s):>10}"
                         f"{f(p.fallback_s):>11}{f(p.reattach_s):>11}{f(p.pinned_again_s):>12}"
                         f"{f(p.mean_k_during):>7}{f(p.notes.get('max_step_wall_s')):>11}")
        return "\n".join(lines)


def child_pids(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
