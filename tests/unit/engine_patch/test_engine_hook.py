"""The hook's composition: each section charged its wall and thread-CPU time, the overhead line."""

from __future__ import annotations

import pytest
from engine_rig import CP, GRAPH, HIGH, Rig, cells, install, widths_seen


def test_overhead_share_counts_busy_steps_by_their_interval() -> None:
    from specctl_vllm.engine_patch.hook_stats import HookStats

    stats = HookStats()
    assert stats.overhead_line() == "hook no steps; at batch >= 128: no steps"
    stats.record_busy(4, 10_000, 0.005, 5_000)  # 10 us of hook (5 us of its thread's CPU) in a 5 ms step
    stats.record_busy(256, 100_000, 0.025, 50_000, [40_000, 20_000, 30_000, 10_000], 12_000)
    assert stats.overhead_line() == (
        "hook 0.37 % of 2 steps (thread CPU 0.18 %); at batch >= 128: 0.40 % of 1 steps (thread CPU 0.20 %); "
        "us per step there: before 40, after 20 (width rule 12), observe 30, finish 10")


@pytest.mark.parametrize("engine_loop", [False, True])
def test_hook_charges_each_section_its_wall_and_thread_cpu_time(engine_loop: bool) -> None:
    """Each section reads both clocks once at its start and once at its end: on a wall clock that ticks 1 us
    and a thread-CPU clock that ticks 0.5 us per read, every section of a busy large step costs one tick (after
    three: it also times the width rule). Drafts counted in vLLM's loop run outside every section: each call is
    charged to observe (and to thread CPU) at the price measured at start-up, here 700 ns."""
    from itertools import count

    rig = Rig(GRAPH, correct={"json": 7}, engine_loop=engine_loop)
    cpu = count(0, 500)
    rig.hook.cpu_ns = lambda: next(cpu)
    rig.hook.cpu_sample_every = 1  # every step reads the thread-CPU clock
    rig.hook.spec_call_ns = 700.0
    calls: list[str] = []
    counting = rig.sim._counting_call()

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(str(kwargs["request_id"]))
        return counting(*args, **kwargs)

    rig.sim._count = counted
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    for i in range(130):
        rig.add(f"j{i}", "json")
    seen = widths_seen(rig, 6)
    stats = rig.hook.stats
    steps = stats.busy_large[0]
    assert steps >= 4
    # the steps after the first (prefill) one draft for every request; all but the first step are busy steps
    spec_ticks = 700 * len(calls) if engine_loop else 0
    assert (len(calls) > 0) == engine_loop and all(seen[1:])
    # the after section reads the wall clock twice more around the width rule: one tick of its three
    assert stats.sections_large == [1_000 * steps, 3_000 * steps, 1_000 * steps + spec_ticks, 1_000 * steps]
    assert stats.rule_large_ns == 1_000 * steps
    assert stats.busy_large[3] == 4 * 500 * steps + spec_ticks


def test_the_thread_cpu_clock_is_read_on_one_step_in_cpu_sample_every_and_its_share_is_over_those_steps() -> None:
    """The thread-CPU clock (a system call) is read by the sections of every CPU_SAMPLE_EVERY-th step only; the
    logged thread-CPU share is their CPU over their own intervals, and the wall share still counts every step."""
    from specctl_vllm.engine_patch.hook_stats import CPU_SAMPLE_EVERY, HookStats

    assert CPU_SAMPLE_EVERY > 1
    rig = Rig(GRAPH, correct={"json": 7}, engine_loop=True)
    reads: list[int] = []
    rig.hook.cpu_ns = lambda: (reads.append(rig.hook._cpu_ticks), 1_000 * len(reads))[1]
    rig.hook.cpu_sample_every = 4
    install(rig, cells([5.0, 5.6, 6.2, 7.2, 9.5]), json=CP(k=4, expected=HIGH))
    for i in range(8):
        rig.add(f"j{i}", "json", max_tokens=200)
    widths_seen(rig, 12)
    # 12 steps, of which 0, 4 and 8 sample: each of their four sections reads the clock at its start and end
    assert len(reads) == 3 * 4 * 2 and [t for t in reads[::8]] == [1, 5, 9]
    stats = HookStats()
    stats.record_busy(4, 10_000, 0.005, 5_000)  # sampled: 5 us of CPU in a 5 ms step
    stats.record_busy(4, 10_000, 0.005, 0, cpu_sampled=False)  # its CPU not read
    assert stats.overhead_line().startswith("hook 0.20 % of 2 steps (thread CPU 0.10 %)")
    unsampled = HookStats()
    unsampled.record_busy(4, 10_000, 0.005, 0, cpu_sampled=False)
    assert unsampled.overhead_line().startswith("hook 0.20 % of 1 steps (thread CPU not sampled)")
