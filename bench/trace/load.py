"""Drive one engine through a trace: the phases' load, mix and output lengths, step by step, from the trace's start.

:class:`TraceLoad` steps an engine object with vLLM's ``LLMEngine`` surface (``add_request``, ``step``,
``abort_request``) and keeps, at every step, the phase's load in flight: ``concurrency`` requests (a finished one
is replaced at once; when a phase lowers the load, finished requests are not replaced until it is met), or
Poisson arrivals at ``rate_rps`` up to ``max_in_flight``. The request stream is fixed by the seed: the n-th
request of phase i has the same category, output length and prompt under every configuration, so configurations
differ only in what the engine does with them. Committed tokens are counted per phase (by the time they came
back), per category and per second; the run's record is plain data (:meth:`TraceLoad.record`).

The request id is ``f"{category}-{n}"`` (the benchmark's acceptance plugin reads the category from it) and the
category also travels in ``extra_args`` for specctl. ``make_request(category, n, output_tokens, rng)`` returns
what ``add_request`` takes after the id: ``(prompt, params)``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specctl_vllm.controller.traces import Trace, request_plan

SAMPLE_S = 1.0


@dataclass
class PhaseTally:
    name: str
    seconds: float = 0.0
    tokens: int = 0
    tokens_by_category: dict[str, int] = field(default_factory=dict)
    started: int = 0
    finished: int = 0
    steps: int = 0


class TraceLoad:
    def __init__(self, engine, trace: Trace, make_request: Callable, seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 on_sample: Callable[[float], None] | None = None) -> None:
        self.engine = engine
        self.trace = trace
        self.make_request = make_request
        self.seed = seed
        self.clock = clock
        self.sleep = sleep
        self.on_sample = on_sample
        self.active: dict[str, str] = {}  # request id -> category
        self.tallies = [PhaseTally(p.name) for p in trace.phases]
        self.samples: list[dict] = []
        self._counts = [0] * len(trace.phases)  # requests issued per phase
        self._next_arrival: float | None = None
        self._arrival_rng = random.Random(f"{seed}/arrivals")
        self._serial = 0

    # -- requests ---------------------------------------------------------------------------------------------------
    def _add(self, index: int) -> None:
        phase = self.trace.phases[index]
        n = self._counts[index]
        self._counts[index] += 1
        category, length, rng = request_plan(phase, index, n, self.seed)
        request_id = f"{category}-{index}x{n}x{self._serial}"
        self._serial += 1
        prompt, params = self.make_request(category, n, length, rng)
        self.engine.add_request(request_id, prompt, params)
        self.active[request_id] = category
        self.tallies[index].started += 1

    def _fill(self, index: int, t: float) -> None:
        phase = self.trace.phases[index]
        if phase.concurrency is not None:
            while len(self.active) < phase.concurrency:
                self._add(index)
            return
        if self._next_arrival is None:
            self._next_arrival = t
        while self._next_arrival <= t:
            if len(self.active) < phase.in_flight_cap:
                self._add(index)
            self._next_arrival += self._arrival_rng.expovariate(phase.rate_rps)

    # -- the run ----------------------------------------------------------------------------------------------------
    def run(self) -> dict:
        t0 = self.clock()
        current = None
        next_sample = SAMPLE_S
        window = {"tokens": 0, "by_category": {}}
        last_t = 0.0
        while True:
            t = self.clock() - t0
            index = self.trace.phase_at(t)
            if index is None:
                break
            if index != current:
                if current is not None and self.trace.phases[current].rate_rps is not None:
                    self._next_arrival = None
                current = index
            tally = self.tallies[index]
            tally.seconds += t - last_t
            last_t = t
            self._fill(index, t)
            if not self.active:
                self.sleep(0.002)
            else:
                for out in self.engine.step():
                    category = self.active.get(out.request_id)
                    if category is None:
                        continue
                    n = sum(len(o.token_ids) for o in out.outputs)
                    tally.tokens += n
                    tally.tokens_by_category[category] = tally.tokens_by_category.get(category, 0) + n
                    window["tokens"] += n
                    window["by_category"][category] = window["by_category"].get(category, 0) + n
                    if out.finished:
                        del self.active[out.request_id]
                        tally.finished += 1
                tally.steps += 1
            if t >= next_sample:
                self.samples.append({"t": round(t, 3), "phase": index, "in_flight": len(self.active),
                                     "tokens": window["tokens"], "by_category": window["by_category"]})
                window = {"tokens": 0, "by_category": {}}
                if self.on_sample is not None:
                    self.on_sample(t)
                next_sample += SAMPLE_S
        if self.active:
            self.engine.abort_request(list(self.active))
            self.active.clear()
        return self.record()

    def record(self) -> dict:
        return {"phases": [vars(t) | {"seconds": round(t.seconds, 4)} for t in self.tallies],
                "samples": self.samples,
                "tokens": sum(t.tokens for t in self.tallies),
                "seconds": round(sum(t.seconds for t in self.tallies), 4)}
