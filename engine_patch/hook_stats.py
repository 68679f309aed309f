"""What one engine step carries through the hook's sections, and what the hook's sections cost.

:class:`Step` is built by ``before_schedule`` and handed from section to section (``schedule()`` to
``update_from_output()``); :class:`HookStats` sums the sections' wall and thread-CPU time for the overhead log
line and the overhead benchmark. Both are plain records: every concern of the hook writes its part of a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specctl_vllm.engine_patch.policy_table import PolicyTable
from specctl_vllm.engine_patch.telemetry import Aggregate

#: The hook's four sections, in the order they run in a step (per-section totals in the overhead log line).
SECTIONS = ("before", "after", "observe", "finish")
#: Steps between two steps whose sections read the thread-CPU clock (1: every step). That clock is a system call
#: (0.6 us on this project's CPU, more where system calls are dear), read twice per section: on every step it was
#: 5 us of the hook's 50-70 us a step at one request. It only splits the logged overhead into the hook's own work
#: and its waits for the GIL, which a sample of the steps measures as well.
CPU_SAMPLE_EVERY = 8


def no_cpu() -> int:
    """The thread-CPU clock of a step that does not sample it."""
    return 0


@dataclass
class HookStats:
    """Cost of the patch in the engine loop, for the overhead benchmark and logs."""

    steps: int = 0
    hook_ns: int = 0
    wall_ns: int = 0
    cf_ns: int = 0
    cf_scored: int = 0
    draft_ns: int = 0  # model-free drafting for categories that use it (a drafter's cost, not overhead)
    #: batch size -> [steps, hook ns, wall ns]
    by_batch: dict[int, list[int]] = field(default_factory=dict)
    #: busy back-to-back steps: [steps, hook ns, seconds between step ends, hook thread-CPU ns, seconds between
    #: step ends of the steps that sampled the thread-CPU clock] (the step's cost under async scheduling). Wall
    #: ns include the time the engine thread waited for the GIL inside the hook (vLLM's own I/O threads take it
    #: mid-step); thread-CPU ns are the work the hook itself did, over the steps that read that clock
    #: (CPU_SAMPLE_EVERY).
    busy: list[float] = field(default_factory=lambda: [0, 0, 0.0, 0, 0.0])
    busy_large: list[float] = field(default_factory=lambda: [0, 0, 0.0, 0, 0.0])  # the same for batches of 128+
    #: batches of 128+: wall ns per section (SECTIONS order), to say where the hook's time goes
    sections_large: list[int] = field(default_factory=lambda: [0] * len(SECTIONS))
    rule_large_ns: int = 0  # batches of 128+: the width rule's part of the after section
    #: graph-shaped steps of batches of 128+: [steps, of which passed over the batch's requests]
    batch_passes_large: list[int] = field(default_factory=lambda: [0, 0])

    def record_busy(self, batch: int, hook_ns: int, interval_s: float, cpu_ns: int = 0,
                    sections: list[int] | None = None, rule_ns: int = 0, cpu_sampled: bool = True) -> None:
        for acc in (self.busy, self.busy_large) if batch >= 128 else (self.busy,):
            acc[0] += 1
            acc[1] += hook_ns
            acc[2] += interval_s
            if cpu_sampled:
                acc[3] += cpu_ns
                acc[4] += interval_s
        if batch >= 128 and sections is not None:
            for i, ns in enumerate(sections):
                self.sections_large[i] += ns
            self.rule_large_ns += rule_ns

    def overhead_line(self) -> str:
        def share(acc: list[float]) -> str:
            if acc[2] <= 0:
                return "no steps"
            cpu = f"{100 * acc[3] / 1e9 / acc[4]:.2f} %" if acc[4] > 0 else "not sampled"
            return f"{100 * acc[1] / 1e9 / acc[2]:.2f} % of {int(acc[0])} steps (thread CPU {cpu})"

        line = f"hook {share(self.busy)}; at batch >= 128: {share(self.busy_large)}"
        steps = self.busy_large[0]
        if steps > 0:
            per_step = [f"{name} {ns / steps / 1e3:.0f}" for name, ns in zip(SECTIONS, self.sections_large)]
            per_step[1] += f" (width rule {self.rule_large_ns / steps / 1e3:.0f})"
            line += f"; us per step there: {', '.join(per_step)}"
        graph_steps, passes = self.batch_passes_large
        if graph_steps > 0:
            line += f"; batch passes {100 * passes / graph_steps:.0f} % of those steps"
        return line

    def record(self, batch: int, hook_ns: int, wall_ns: int) -> None:
        self.steps += 1
        self.hook_ns += hook_ns
        self.wall_ns += wall_ns
        row = self.by_batch.get(batch)
        if row is None:
            row = self.by_batch[batch] = [0, 0, 0]
        row[0] += 1
        row[1] += hook_ns
        row[2] += wall_ns


class Step:
    """What one step carries from ``schedule()`` to ``update_from_output()``."""

    __slots__ = ("agg", "batch_pass", "cf_ns", "cpu", "cpu_ns", "decoding", "depth", "draft_ns", "engine_loop",
                 "hook_ns", "mix", "output", "rule_ns", "sections", "spec_ns", "t0", "table", "width")

    def __init__(self, t0: int, table: PolicyTable, cpu: Callable[[], int]) -> None:
        self.output: Any = None
        self.t0 = t0
        self.hook_ns = 0
        self.cpu = cpu  # the thread-CPU clock of this step's sections (a zero clock on the steps not sampled)
        self.cpu_ns = 0  # thread CPU time of the hook's sections
        self.sections = [0] * len(SECTIONS)  # wall ns per section
        self.cf_ns = 0  # counterfactual scoring, within hook_ns
        self.draft_ns = 0  # model-free drafting, within hook_ns
        self.depth = 0
        self.table = table
        self.agg: Aggregate = {}
        self.width: int | None = None  # graph-shaped: the width this step verifies
        self.mix: dict[str, int] | None = None  # graph-shaped: requests per category
        self.engine_loop = False  # drafted requests are counted in vLLM's own update loop (counting_call)
        self.spec_ns = 0  # the step's counting calls at their measured price, charged to observe in finish
        self.rule_ns = 0  # graph-shaped: the width rule's share of the after section
        self.decoding = True  # graph-shaped: at least half the step's requests decode (not a prompt burst)
        self.batch_pass = False  # graph-shaped: before_schedule passed over the batch's requests
