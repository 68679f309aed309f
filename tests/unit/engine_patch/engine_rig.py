"""A hook wired to a simulated engine, for the engine-patch unit tests (no vLLM import: the hook is duck-typed)."""

from __future__ import annotations

import random

from specctl_vllm.engine_patch.hook import SpecHook
from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
from specctl_vllm.engine_patch.telemetry import StepQueue
from specctl_vllm.kernel import protocol
from tests.support.engine_sim import FakeRequest, SimEngine, script_drafter

NGRAM4 = EngineSpec(method="ngram", k_max=4, model_free_methods=("suffix",))


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
