"""A stand-in for vLLM's scheduler loop around :class:`specctl_vllm.engine_patch.hook.SpecHook`, without vLLM.

It drives the hook exactly as :class:`specctl_vllm.engine_patch.runtime.SpecctlMixin` does (``before_schedule`` →
schedule → ``after_schedule`` → execute → ``observe`` → update → ``finish``) on duck-typed requests, with a
deterministic "target model" (each request has a fixed token script) and a "drafter" whose drafts are right
up to a chosen position. Unit tests use it to check caps, depth, histograms and adaptation; the overhead
benchmark uses it (with real vLLM ``Request`` objects) to time the hook at 1..256 requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


class FakeRequest:
    """The attributes of ``vllm.v1.request.Request`` the hook reads."""

    def __init__(self, request_id: str, prompt: list[int], *, extra_args: dict | None = None,
                 structured: bool = False, max_tokens: int = 64) -> None:
        self.request_id = request_id
        self.sampling_params = SimpleNamespace(extra_args=extra_args, structured_outputs=object() if structured else None)
        self.use_structured_output = structured
        self._all_token_ids = list(prompt)
        self.all_token_ids = self._all_token_ids
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.spec_token_ids: list[int] = []
        self.max_tokens = max_tokens
        self.finished = False

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._all_token_ids) - self.num_prompt_tokens

    def is_finished(self) -> bool:
        return self.finished

    def append_output_token_ids(self, tokens: list[int]) -> None:
        self._all_token_ids.extend(tokens)


@dataclass
class SimOutput:
    """The fields of ``SchedulerOutput`` the hook reads and writes."""

    num_scheduled_tokens: dict[str, int]
    scheduled_spec_decode_tokens: dict[str, list[int]]
    total_num_scheduled_tokens: int
    scheduled_new_reqs: list[Any]
    num_spec_tokens_to_schedule: int
    num_invalid_spec_tokens: dict[str, int] | None = None
    #: requests that finished since the previous step was scheduled (vLLM's ``finished_req_ids``)
    finished_req_ids: set[str] = field(default_factory=set)


@dataclass
class SimRunnerOutput:
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]


@dataclass
class StepTruth:
    """What the simulated engine itself counted in one step (vLLM's counters, in effect)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    per_request_drafts: dict[str, int] = field(default_factory=dict)


#: drafter(request, depth) -> drafts for the next step
Drafter = Callable[[FakeRequest, int], list[int]]


class SimEngine:
    """Synchronous engine loop: one request's target output is ``script[request_id]``."""

    def __init__(self, hook: Any, k_engine: int, drafter: Drafter | None, scripts: dict[str, list[int]],
                 invalid: Callable[[str, list[int]], int] | None = None,
                 execute: Callable[[SimOutput], None] | None = None) -> None:
        self.hook = hook
        self.k_engine = k_engine
        self.drafter = drafter
        self.scripts = scripts
        self.invalid = invalid
        self.execute = execute  # called where the model would run (e.g. to advance a fake clock)
        self.requests: dict[str, Any] = {}
        self.running: list[Any] = []
        self.waiting: list[Any] = []
        self.last_output: SimOutput | None = None
        self._finished: set[str] = set()  # finished since the last schedule (the next output reports them)

    def add(self, request: Any) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def _counting_call(self) -> Callable[..., Any]:
        """The patch's wrapper of vLLM's ``make_spec_decoding_stats``, around a method that does nothing."""
        if getattr(self, "_count", None) is None:
            from specctl_vllm.engine_patch.hook import counting_call

            failures = self.counting_failures = []
            self._count = counting_call(self.hook, lambda *args: None, failures.append)
        return self._count

    def target_next(self, request: Any, offset: int) -> int:
        script = self.scripts[request.request_id]
        i = request.num_output_tokens + offset
        return script[i] if i < len(script) else 0

    def step(self) -> StepTruth:
        hook = self.hook
        hook.before_schedule(self.running)
        new = list(self.waiting)
        self.running.extend(new)
        self.waiting.clear()
        num_sched: dict[str, int] = {}
        spec_sched: dict[str, list[int]] = {}
        for r in self.running:
            if r.num_computed_tokens < r.num_tokens - 1 or r.num_output_tokens == 0 and r.num_computed_tokens == 0:
                num_sched[r.request_id] = r.num_tokens - r.num_computed_tokens
                continue
            spec = r.spec_token_ids
            num_sched[r.request_id] = 1 + len(spec)
            if spec:
                spec_sched[r.request_id] = spec
            r.spec_token_ids = []
        invalid = None
        if self.invalid is not None:
            invalid = {rid: n for rid, s in spec_sched.items() if (n := self.invalid(rid, s))}
        output = SimOutput(num_sched, spec_sched, sum(num_sched.values()),
                           [SimpleNamespace(req_id=r.request_id) for r in new], self.k_engine, invalid,
                           finished_req_ids=self._finished)
        self._finished = set()
        hook.after_schedule(output, self.requests)
        if self.execute is not None:
            self.execute(output)
        truth = StepTruth()
        sampled: list[list[int]] = []
        index: dict[str, int] = {}
        for i, (rid, _) in enumerate(num_sched.items()):
            r = self.requests[rid]
            index[rid] = i
            spec = spec_sched.get(rid, [])
            bad = (invalid or {}).get(rid, 0)
            valid = spec[: len(spec) - bad] if bad else spec
            accepted = 0
            while accepted < len(valid) and valid[accepted] == self.target_next(r, accepted):
                accepted += 1
            sampled.append([self.target_next(r, j) for j in range(accepted + 1)])
            if spec:
                truth.drafts += 1
                truth.draft_tokens += len(spec) - bad
                truth.accepted_tokens += accepted
                truth.per_request_drafts[rid] = len(spec)
        runner = SimRunnerOutput(index, sampled)
        hook.observe(output, runner, self.requests)
        if getattr(hook, "drafts_from_engine_loop", False):  # vLLM's update loop: make_spec_decoding_stats
            count = self._counting_call()
            for rid, tokens in zip(num_sched, sampled):
                spec = spec_sched.get(rid)
                if spec and tokens:  # vLLM's call, keyword for keyword
                    count(None, num_draft_tokens=len(spec), num_accepted_tokens=max(len(tokens) - 1, 0),
                          num_invalid_spec_tokens=invalid, request_id=rid)
        for rid, tokens in zip(num_sched, sampled):
            r = self.requests[rid]
            r.append_output_token_ids(tokens)
            r.num_computed_tokens = r.num_tokens - 1
            if r.num_output_tokens >= r.max_tokens and isinstance(r, FakeRequest):
                r.finished = True
        live = {rid: r for rid, r in self.requests.items() if not r.is_finished()}  # vLLM frees finished ones
        hook.finish(output, live)
        self._finished |= {r.request_id for r in self.running if r.is_finished()}
        self.running = [r for r in self.running if not r.is_finished()]
        if self.drafter is not None:
            for r in self.running:
                r.spec_token_ids = self.drafter(r, output.num_spec_tokens_to_schedule)
        self.last_output = output
        return truth


def script_drafter(engine: SimEngine, correct: Callable[[FakeRequest], int]) -> Drafter:
    """Drafts ``depth`` tokens, the first ``correct(request)`` of which match the target's script."""

    def draft(request: FakeRequest, depth: int) -> list[int]:
        good = correct(request)
        return [engine.target_next(request, j) if j < good else 10_000 + j for j in range(depth)]

    return draft
