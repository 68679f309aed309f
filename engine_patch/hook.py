"""What the patch does inside the engine loop, independent of vLLM's classes (duck-typed requests).

:class:`SpecHook` is the one object vLLM's scheduler talks to (:mod:`specctl_vllm.engine_patch.runtime` binds
its four sections to vLLM's methods). Each section is timed and charged to the step; the work is done by the
concerns it is composed of, each called once per step:

* :class:`~specctl_vllm.engine_patch.request_rules.RequestRules` -- per-request rules: resolve a request's rule
  (cached on the request, re-resolved only when the table changed) and trim its drafts to its k;
* :class:`~specctl_vllm.engine_patch.model_free.ModelFree` -- model-free drafting and counterfactual scoring
  within the overhead budget;
* :class:`~specctl_vllm.engine_patch.graph_steps.GraphSteps` -- graph-shaped engines: every request of a step
  verifies the width :class:`~specctl_vllm.engine_patch.widths.WidthChooser` picks;
* :class:`~specctl_vllm.engine_patch.step_accounting.StepAccounting` -- drafted and accepted tokens per
  (category, method) into telemetry, and the width rule's meters.

Per step, each section is O(1) per request, no I/O, no locks:

``before_schedule(running)`` -- before vLLM's ``Scheduler.schedule()``: read the policy table once (expired:
the engine's static config); a graph-shaped engine pads every request to the step's width, any other resolves
and trims each request (model-free rules draft here, synchronous scheduling only); then counterfactual scoring
on a few requests, within its credit.

``after_schedule(output)`` -- at the start of vLLM's ``_update_after_schedule`` (still inside ``schedule()``,
before the async scheduler sizes its placeholders): set ``output.num_spec_tokens_to_schedule`` -- the depth the
engine's drafter drafts for the next step -- to the step's width (graph-shaped) or to the largest k any request
of the batch can use (requests drafted by the patch need none). Left untouched on the static config.

``observe(output, runner_output)`` / ``finish(output)`` -- around vLLM's ``update_from_output``: count the
step's drafts and acceptances (the patch's own pass, or vLLM's loop through :func:`counting_call` on
graph-shaped engines: on the GPU the patch's own second pass over a cache-cold batch was two thirds of the
hook's cost at 256 requests, a class-level override with ``*args``/``super()`` cost 1.4 us per drafted request
on the CPU), advance each request's k, push one :class:`~specctl_vllm.engine_patch.telemetry.StepRow`.

Placeholder padding (vLLM pads a request admitted with exactly one new token to ``1 + num_spec_tokens`` with
placeholder drafts, ignoring any cap) is disabled by the scheduler at start-up, see
:mod:`specctl_vllm.engine_patch.scheduler`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from specctl_vllm.engine_patch.graph_steps import GraphSteps
from specctl_vllm.engine_patch.hook_stats import CPU_SAMPLE_EVERY, HookStats, Step, no_cpu
from specctl_vllm.engine_patch.model_free import ModelFree
from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder, PolicyTable
from specctl_vllm.engine_patch.request_rules import RequestRules, RequestState
from specctl_vllm.engine_patch.step_accounting import StepAccounting
from specctl_vllm.engine_patch.telemetry import CODE_BITS, KEY_SHIFT, StepQueue, pack
from specctl_vllm.engine_patch.widths import WidthChooser
from specctl_vllm.kernel import protocol

logger = logging.getLogger("vllm.specctl.engine")
#: Seconds of engine clock between two overhead log lines (the GPU benchmark reads them from the engine log).
OVERHEAD_LOG_EVERY_S = 30.0


class SpecHook:
    def __init__(
        self,
        engine: EngineSpec,
        holder: PolicyHolder,
        queue: StepQueue,
        *,
        async_mode: bool = False,
        max_categories: int = 24,
        overhead_budget: float = 0.005,
        min_draft_depth: int = 0,
        search_window: int = 4096,
        num_sampled_per_step: int = 1,
        validate_drafts: Callable[[Any, list[int]], list[int]] | None = None,
        token_budget: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        perf_ns: Callable[[], int] = time.perf_counter_ns,
        cpu_ns: Callable[[], int] = time.thread_time_ns,
        cpu_sample_every: int = CPU_SAMPLE_EVERY,
    ) -> None:
        self.engine = engine
        self.holder = holder
        self.queue = queue
        self.async_mode = async_mode
        self.min_draft_depth = min(min_draft_depth, engine.k_max)
        self.clock = clock
        self.perf_ns = perf_ns
        self.cpu_ns = cpu_ns
        self.cpu_sample_every = max(int(cpu_sample_every), 1)
        self._cpu_ticks = 0  # steps begun: every cpu_sample_every-th reads the thread-CPU clock
        self._stats = HookStats()
        self.widths = (WidthChooser(engine.graph_widths, engine.k_max, token_budget=token_budget)
                       if engine.graph_widths else None)
        self.rules = RequestRules(engine, max_categories, graph=self.widths is not None)
        self.model_free = ModelFree(engine, self._stats, overhead_budget=overhead_budget,
                                    search_window=search_window, validate_drafts=validate_drafts, perf_ns=perf_ns)
        self.graph = (GraphSteps(self.widths, self.rules, async_mode=async_mode, perf_ns=perf_ns)
                      if self.widths is not None else None)
        self.accounting = StepAccounting(self.rules, self.widths, num_sampled_per_step=num_sampled_per_step,
                                         clock=clock)
        self._next: Step | None = None  # built by before_schedule, claimed by after_schedule
        self._inflight: deque[Step] = deque()
        self._current: Step | None = None  # claimed by observe, finished by finish
        #: The step's drafted requests as vLLM's ``make_spec_decoding_stats`` calls count them, tallied by
        #: :func:`counting_call` while vLLM's loop holds each request hot: packed (key, drafts, accepted) code ->
        #: requests. A dict only between ``observe`` and ``finish`` of an engine-loop step.
        self.spec_sink: dict[int, int] | None = None
        #: (request id, drafts, accepted) of the step's drafted requests whose id the key table lacks (the
        #: accounting's list, shared: the counting call appends to it).
        self.spec_unkeyed = self.accounting.unkeyed
        #: What one :func:`counting_call` costs beyond vLLM's own call, ns (:func:`counting_call_ns` measures it
        #: at start-up): the calls run outside the hook's sections, so each is charged at this price.
        self.spec_call_ns = 0.0
        #: request id -> key code of its drafted requests (the rules' table, shared: the counting call reads it)
        self.keys = self.rules.keys
        self._last_log = clock()

    @property
    def drafts_from_engine_loop(self) -> bool:
        """Graph-shaped engines whose scheduler calls ``make_spec_decoding_stats`` per drafted request (every
        supported vLLM; the runtime checks it at start-up and sets this): the drafted requests are counted
        there, inside vLLM's own pass over the batch, and ``observe`` makes no pass of its own."""
        return self.rules.keyed

    @drafts_from_engine_loop.setter
    def drafts_from_engine_loop(self, value: bool) -> None:
        self.rules.keyed = bool(value)

    @property
    def stats(self) -> HookStats:
        return self._stats

    @stats.setter
    def stats(self, value: HookStats) -> None:
        """A new tally (the overhead benchmark's, per run) for every concern that counts into it."""
        self._stats = self.model_free.stats = value

    @property
    def validate_drafts(self) -> Callable[[Any, list[int]], list[int]] | None:
        return self.model_free.validate_drafts

    def state_of(self, request: Any, table: PolicyTable) -> RequestState:
        return self.rules.state_of(request, table)

    # -- before schedule() -----------------------------------------------------------------------------

    def before_schedule(self, running: Sequence[Any]) -> None:
        cpu = self.cpu_ns if self._cpu_ticks % self.cpu_sample_every == 0 else no_cpu
        self._cpu_ticks += 1
        c0 = cpu()
        t0 = self.perf_ns()
        table = self.holder.current(self.clock())
        step = Step(t0, table, cpu)
        if self.graph is not None:
            self.graph.before(running, table, step)
        else:
            self.rules.trim(running, table, step, None if self.async_mode else self.model_free.draft)
            self.model_free.score(running, step)
        self._close(step, 0, t0, c0)
        self._next = step

    # -- inside schedule(), before the placeholders are sized -------------------------------------------

    def after_schedule(self, output: Any, requests: Mapping[str, Any]) -> None:
        step = self._next
        self._next = None
        if step is None:
            return
        c = step.cpu()
        t = self.perf_ns()
        step.output = output
        table = step.table
        if self.graph is not None:
            self.graph.after(step, output, requests)
        elif not table.is_static and self.engine.k_max > 0:
            depth = self.rules.admitted_depth(output, requests, table, step.depth)
            depth = min(max(depth, self.min_draft_depth), self.engine.k_max)
            step.depth = depth
            output.num_spec_tokens_to_schedule = depth
        else:
            step.depth = getattr(output, "num_spec_tokens_to_schedule", self.engine.k_max)
        self._inflight.append(step)
        self._close(step, 1, t, c)

    # -- around update_from_output() --------------------------------------------------------------------

    def observe(self, output: Any, runner_output: Any, requests: Mapping[str, Any]) -> None:
        t = self.perf_ns()
        step = None
        while self._inflight:  # steps complete in the order they were scheduled
            candidate = self._inflight.popleft()
            if candidate.output is output:
                step = candidate
                break
        self._current = step
        if step is None:
            return
        c = step.cpu()  # the step's clock, so read once it is found (the lookup is a few pointer compares)
        if self.rules.keyed and step.mix is not None:
            step.engine_loop = True
            sched_spec = output.scheduled_spec_decode_tokens
            step.output = sum(map(len, sched_spec.values())) if sched_spec else 0
            self.spec_sink = {}
            self.spec_unkeyed.clear()
        else:
            self.accounting.observe(step, output, runner_output, requests)
        self._close(step, 2, t, c)

    def finish(self, output: Any, requests: Mapping[str, Any] | None = None) -> None:
        sink = self.spec_sink
        self.spec_sink = None
        calls = len(self.spec_unkeyed) + (sum(sink.values()) if sink else 0)
        step = self._current
        self._current = None
        if step is None:
            return
        c = step.cpu()
        t = self.perf_ns()
        row, interval, now = self.accounting.finish(step, output, sink, calls, self.spec_call_ns, requests, t)
        if row is not None:
            self.queue.push(row)
        end = self.perf_ns()
        step.sections[3] = end - t
        step.cpu_ns += step.cpu() - c
        wall_ns = end - step.t0
        hook_ns = step.hook_ns + (end - t)
        self.model_free.settle(step, wall_ns, hook_ns)
        batch = len(output.num_scheduled_tokens)
        stats = self._stats
        stats.record(batch, hook_ns, wall_ns)
        if interval is not None:
            stats.record_busy(batch, hook_ns, interval, step.cpu_ns, step.sections, step.rule_ns,
                              cpu_sampled=step.cpu is not no_cpu)
            if batch >= 128 and step.mix is not None:
                stats.batch_passes_large[0] += 1
                stats.batch_passes_large[1] += step.batch_pass
        if now - self._last_log >= OVERHEAD_LOG_EVERY_S:
            self._last_log = now
            self._log_overhead()

    def _log_overhead(self) -> None:
        logger.info("specctl: overhead since start: %s", self._stats.overhead_line())
        if self.widths is not None and self.widths.verdict is not None:
            v = self.widths.verdict
            blocks = "-" if v.block_margin is None else f"{100 * min(v.block_margin, 9.99):.1f} %"
            logger.info("specctl: width check: %s (gain %+.1f %%, margin %.1f %%, from blocks %s), probes %d",
                        v.state, 100 * v.gain, 100 * min(v.margin, 9.99), blocks, self.widths.probes)

    def _close(self, step: Step, section: int, t: int, c: int) -> None:
        """Charge one section (started at perf ``t``, thread CPU ``c``) to the step."""
        spent = self.perf_ns() - t
        step.hook_ns += spent
        step.sections[section] += spent
        step.cpu_ns += step.cpu() - c

    # -- helpers for tests and the benchmark -----------------------------------------------------------

    def categories(self) -> Iterable[str]:
        return tuple(self.rules.categories)


def counting_call(hook: SpecHook, original: Callable[..., Any], failed: Callable[[str], None]) -> Callable[..., Any]:
    """vLLM's ``make_spec_decoding_stats`` (its bound method ``original``, with the parameters the runtime checked
    at start-up) that also tallies each drafted request into the hook's open sink, while vLLM's loop holds the
    request hot (a second pass over a cache-cold batch cost 0.16 ms a step at 256 requests on the H200 host):
    one lookup of the request's key code, one dict update; nothing but vLLM's own call where no sink is open.
    Nothing raises into vLLM's loop."""
    keys = hook.keys
    unkeyed = hook.spec_unkeyed
    max_k = protocol.MAX_K

    def make_spec_decoding_stats(spec_decoding_stats: Any, num_draft_tokens: int, num_accepted_tokens: int,
                                 num_invalid_spec_tokens: Any, request_id: str) -> Any:
        sink = hook.spec_sink
        if sink is not None:
            try:
                drafted = num_draft_tokens - num_invalid_spec_tokens.get(request_id, 0) if num_invalid_spec_tokens \
                    else num_draft_tokens
                if 0 <= num_accepted_tokens <= drafted <= max_k:
                    code = keys[request_id] + (drafted << CODE_BITS) + num_accepted_tokens
                else:
                    code = keys[request_id] + pack(drafted, num_accepted_tokens)
                sink[code] = sink.get(code, 0) + 1
            except KeyError:
                unkeyed.append((request_id, drafted, num_accepted_tokens))
            except Exception:  # noqa: BLE001 - nothing may raise into vLLM's loop (failed logs it)
                failed("observe")
        return original(spec_decoding_stats, num_draft_tokens, num_accepted_tokens, num_invalid_spec_tokens,
                        request_id)

    return make_spec_decoding_stats


def counting_call_ns(calls: int = 4096, repeats: int = 5, perf_ns: Callable[[], int] = time.perf_counter_ns) -> float:
    """What :func:`counting_call` adds to one call of the method it wraps, ns: the best of ``repeats`` timings of
    ``calls`` calls through it with an open sink and every request keyed, minus the same calls made directly
    (measured once at start-up, on the engine's own host, so the per-step overhead line prices calls that no
    section can time)."""

    def original(spec_decoding_stats: Any, num_draft_tokens: int, num_accepted_tokens: int,
                 num_invalid_spec_tokens: Any, request_id: str) -> None:
        return None

    ids = [f"r{i}" for i in range(256)]

    probe = SimpleNamespace(spec_sink=None, spec_unkeyed=[],
                            keys={rid: (i % 4) << KEY_SHIFT for i, rid in enumerate(ids)})
    wrapped = counting_call(probe, original, lambda section: None)  # type: ignore[arg-type]

    def timed(fn: Callable[..., Any]) -> int:
        best = None
        for _ in range(repeats):
            probe.spec_sink = {}
            t = perf_ns()
            for i in range(calls):
                fn(None, num_draft_tokens=4, num_accepted_tokens=i & 3, num_invalid_spec_tokens=None,
                   request_id=ids[i & 255])
            spent = perf_ns() - t
            best = spent if best is None else min(best, spent)
        return best or 0

    return max(timed(wrapped) - timed(original), 0) / calls
