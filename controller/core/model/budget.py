"""What an engine measures about its step token budget: the estimator of the steady-step model's inputs.

One estimator for the engine (which applies the model per step) and the controller (which shows what the engine
runs, in its policy and in ``specctl replay``): both feed it every timed step of one engine and read a
:class:`~specctl_vllm.controller.core.model.widths.TokenBudget` from it. No I/O, O(1) per step, decayed per step
(not per second), so the same steps give the same reading wherever they are fed.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import mul

from specctl_vllm.controller.core.model.widths import TokenBudget, fixed_step_s
from specctl_vllm.controller.protocol import StepRecord, TelemetryBatch

#: Per-step decay of the token-budget sums: a half-life of about 140 steps (seconds at 256 requests on a GPU),
#: so a change of prompt lengths or load moves the steady-step model within seconds.
BUDGET_DECAY = 0.995
#: A step that scheduled at least this share of the budget filled it.
FULL_SHARE = 0.97
#: Decayed full steps before the steady-step model is trusted: the mean of a few dozen full steps is stable.
MIN_FULL_STEPS = 20.0
#: Shortest mean full step the meter believes, seconds (a full step verifies thousands of tokens).
MIN_FULL_STEP_S = 1e-6


class BudgetMeter:
    """What the engine measured about its step token budget and its step cost: the decayed mean time of the
    steps that filled it, the line ``a + b * tokens`` through that full step fitted to every step's time, and
    the decayed prompt tokens per committed token. No I/O; O(1) per step."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self._full = [0.0, 0.0]  # seconds, steps
        self._prompt = [0.0, 0.0]  # prompt tokens, committed tokens
        # sums over every timed step of d = B - tokens: sum d^2, sum d, sum d * seconds, steps
        self._line = [0.0, 0.0, 0.0, 0.0]

    def observe(self, scheduled: int, prompt: int, committed: int, interval_s: float | None) -> None:
        full, ratio, line = self._full, self._prompt, self._line
        full[0] *= BUDGET_DECAY
        full[1] *= BUDGET_DECAY
        ratio[0] = ratio[0] * BUDGET_DECAY + max(prompt, 0)
        ratio[1] = ratio[1] * BUDGET_DECAY + max(committed, 0)
        for i in range(4):
            line[i] *= BUDGET_DECAY
        if interval_s is None or interval_s <= 0:
            return
        if scheduled >= FULL_SHARE * self.tokens:
            full[0] += interval_s
            full[1] += 1.0
        d = float(max(self.tokens - scheduled, 0))
        line[0] += d * d
        line[1] += d
        line[2] += d * interval_s
        line[3] += 1.0

    def current(self) -> TokenBudget | None:
        seconds, steps = self._full
        if steps < MIN_FULL_STEPS or seconds <= 0 or self._prompt[1] <= 0:
            return None
        full_s = seconds / steps
        if full_s < MIN_FULL_STEP_S:
            return None  # no step of a real engine is this fast: a clock artefact, not a budget
        return TokenBudget(tokens=self.tokens, capacity=self.tokens / full_s,
                           rho=self._prompt[0] / self._prompt[1], fixed_s=self._fixed_s(full_s),
                           steps=self._line[3])

    def _fixed_s(self, full_s: float) -> float:
        dd, d, dy, _ = self._line
        return fixed_step_s(full_s, self.tokens, dd, d, dy)


def budget_sample(step: StepRecord) -> tuple[int, int, int, float | None]:
    """(scheduled, prompt, committed tokens, interval_s) of a step for the token-budget meter, with the
    engine's count of committed tokens: one per request plus every accepted draft really run."""
    committed = 0
    for cs in step.categories:
        committed += cs.requests
        for h in cs.hists:
            committed += sum(map(mul, range(len(h.accepted)), h.accepted))
    return step.scheduled_tokens, step.prefill_tokens, committed, step.interval_s


def recorded_budget(batches: Sequence[TelemetryBatch]) -> TokenBudget | None:
    """What the recording's steps measured about the engine's token budget, fed to the engine's own meter in
    the order they ran (graph-shaped engines that report their budget; the last budget reported wins)."""
    meters: dict[int, BudgetMeter] = {}
    last = None
    for b in batches:
        tokens = b.spec.token_budget if b.spec.graph_widths else None
        if not tokens:
            continue
        meter = meters.setdefault(tokens, BudgetMeter(tokens))
        last = tokens
        for st in b.steps:
            if st.scheduled_tokens > 0:
                meter.observe(*budget_sample(st))
    return meters[last].current() if last is not None else None
