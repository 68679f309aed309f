"""A hook wired to a simulated engine, for the engine-patch unit tests (no vLLM import: the hook is duck-typed)."""

from __future__ import annotations

import random

from bench.support.engine_sim import FakeRequest, SimEngine, script_drafter
from specctl_vllm.engine_patch.hook import SpecHook
from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
from specctl_vllm.engine_patch.telemetry import StepQueue, row_to_wire
from specctl_vllm.kernel import protocol
from specctl_vllm.kernel.model.widths import geometric_lengths

NGRAM4 = EngineSpec(method="ngram", k_max=4, model_free_methods=("suffix",))
CP = protocol.CategoryPolicy
GRAPH = EngineSpec(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=(0, 1, 2, 4, 7))
HIGH = list(geometric_lengths(0.85, 7))
LOW = list(geometric_lengths(0.1, 7))

#: One bucket where K = 2 has 3 measured steps and every other width thousands: exploration's target.
EXPLORE_ROW = protocol.StepCells(batch_edges=[512], widths=[0, 1, 2, 4, 7],
                                 step_s=[[5e-3, 5.6e-3, 6.2e-3, 7.2e-3, 9.5e-3]], steps=[[1e4, 1e4, 3.0, 1e4, 1e4]])


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class StepPerf:
    """A deterministic ``perf_counter_ns``: every call advances 1 µs, and a simulated model execution 10 ms,
    so budgets are exact, not timed."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        self.ns += 1_000
        return self.ns


class Rig:
    """A hook wired to a simulated engine whose drafter is right for the first ``correct`` tokens."""

    def __init__(self, engine: EngineSpec = NGRAM4, *, async_mode: bool = False, budget: float = 0.0,
                 correct: dict[str, int] | None = None, max_categories: int = 24,
                 engine_loop: bool | None = None) -> None:
        self.clock = FakeClock()
        self.perf = StepPerf()
        self.holder = PolicyHolder(engine)
        self.queue = StepQueue(10_000)
        self.hook = SpecHook(engine, self.holder, self.queue, async_mode=async_mode,
                             overhead_budget=budget, max_categories=max_categories, clock=self.clock,
                             perf_ns=self.perf)
        # as the runtime sets it on every supported vLLM: graph-shaped engines count drafts in vLLM's loop
        self.hook.drafts_from_engine_loop = bool(engine.graph_widths) if engine_loop is None else engine_loop
        self.scripts: dict[str, list[int]] = {}
        self.sim = SimEngine(self.hook, engine.k_max, None, self.scripts, execute=self._execute)
        correct = correct or {}
        self.sim.drafter = script_drafter(
            self.sim, lambda r: correct.get((r.sampling_params.extra_args or {}).get("specctl_category", ""), 0))
        self._rng = random.Random(0)

    def _execute(self, output: object) -> None:
        self.perf.ns += 10_000_000

    def add(self, request_id: str, category: str | None = None, *, prompt: list[int] | None = None,
            script: list[int] | None = None, max_tokens: int = 40) -> FakeRequest:
        extra = {"specctl_category": category} if category else None
        request = FakeRequest(request_id, prompt or [self._rng.randrange(100, 200) for _ in range(8)],
                              extra_args=extra, max_tokens=max_tokens)
        self.scripts[request_id] = script or [self._rng.randrange(200, 300) for _ in range(max_tokens + 8)]
        self.sim.add(request)
        return request

    def install(self, ttl: float = 5.0, version: int = 1, default: protocol.CategoryPolicy | None = None,
                **categories: protocol.CategoryPolicy) -> None:
        policy = protocol.Policy(version=version, issued_at=0.0, ttl_s=ttl,
                                 default=default or protocol.CategoryPolicy(k=4), categories=categories)
        self.holder.install(policy, self.clock())


# -- helpers shared by the engine-patch tests ----------------------------------------------------------


def cells(step_ms: list[float], steps: float = 1e4) -> protocol.StepCells:
    return protocol.StepCells(batch_edges=[4, 512], widths=[0, 1, 2, 4, 7], step_s=[[t / 1e3 for t in step_ms]] * 2,
                              steps=[[steps] * 5] * 2)


def install(rig: Rig, cell_table: protocol.StepCells | None, **categories: CP) -> None:
    policy = protocol.Policy(version=1, issued_at=0.0, ttl_s=60.0, default=CP(k=4), categories=categories,
                             step_cells=cell_table)
    rig.holder.install(policy, rig.clock())


def widths_seen(rig: Rig, steps: int) -> list[set[int]]:
    out = []
    for _ in range(steps):
        rig.sim.step()
        out.append({len(d) for d in rig.sim.last_output.scheduled_spec_decode_tokens.values()})
    return out


def totals(rig: Rig) -> dict[tuple[str, str], list[int]]:
    """(category, method) -> [request steps, drafts, draft tokens, accepted tokens] over all queued rows."""
    out: dict[tuple[str, str], list[int]] = {}
    for row in rig.queue.drain(100_000):
        record = protocol.StepRecord.model_validate(row_to_wire(row))  # every row is a valid StepRecord
        for cat in record.categories:
            t = out.setdefault((cat.category, cat.method), [0, 0, 0, 0])
            t[0] += cat.requests
            for h in cat.hists:
                t[1] += h.drafts
                t[2] += h.draft_tokens
                t[3] += h.accepted_tokens
    return out


def run(rig: Rig, steps: int) -> list:
    return [rig.sim.step() for _ in range(steps)]
