"""What an engine measures about its step token budget: the estimator of the steady-step model's inputs.

One estimator for the engine (which applies the model per step) and the controller (which shows what the engine
runs, in its policy and in ``specctl replay``): both feed it every timed step of one engine and read a
:class:`~specctl_vllm.kernel.model.widths.TokenBudget` from it. No I/O, O(1) per step, decayed per step
(not per second), so the same steps give the same reading wherever they are fed.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import mul

from specctl_vllm.kernel.model.widths import LineSums, TokenBudget, fixed_step_costs
from specctl_vllm.kernel.protocol import MAX_K, StepRecord, TelemetryBatch

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
    """What the engine measured about its step token budget and its step cost: the mean time of the last few
    hundred steps that filled it, each width's line ``a_K + b_K * tokens`` through that full step fitted to every step's
    time (``a_K = a_0 + s + p K`` for K >= 1) over the steps that ran the width of the step before them, and the
    decayed prompt tokens per committed token. No I/O; O(1) per step.
    ``decay`` per step (1: none, for a benchmark that fits a whole recording)."""

    def __init__(self, tokens: int, decay: float = BUDGET_DECAY) -> None:
        self.tokens = tokens
        self.decay = decay
        self._full = [0.0, 0.0]  # seconds, steps
        self._prompt = [0.0, 0.0]  # prompt tokens, committed tokens
        # LineSums' fields in order, then the steps behind them
        self._line = [0.0] * (len(LINE_FIELDS) + 1)
        self._widths: dict[int, float] = {}  # width -> decayed timed steps at it
        self._last_width: int | None = None  # the width of the step observed last

    def observe(self, scheduled: int, prompt: int, committed: int, interval_s: float | None,
                width: int = 0) -> None:
        full, ratio, line, decay = self._full, self._prompt, self._line, self.decay
        ratio[0] = ratio[0] * decay + max(prompt, 0)
        ratio[1] = ratio[1] * decay + max(committed, 0)
        for i in range(len(line)):
            line[i] *= decay
        widths = self._widths
        for w in widths:
            widths[w] *= decay
        previous, self._last_width = self._last_width, width
        if interval_s is None or interval_s <= 0:
            return
        if scheduled >= FULL_SHARE * self.tokens:
            # decayed per full step, not per step: a full step's time is the engine's, and a width that
            # seldom fills the budget (K = 0 at 256 requests) must not forget it while it runs
            full[0] = full[0] * decay + interval_s
            full[1] = full[1] * decay + 1.0
        if previous is not None and width != previous:
            # the first step at a new width: under async scheduling its interval holds the tail of the
            # previous width's step (on the H200 at 256 requests a K = 0 step after a drafting step took 40 ms,
            # after a K = 0 step 23 ms, session 9), so it prices neither width
            return
        u = float(max(self.tokens - scheduled, 0)) / self.tokens
        k = float(max(width, 0))
        key = min(int(k), MAX_K)  # a width past any engine's set is one key: the dict stays small
        widths[key] = widths.get(key, 0.0) + 1.0
        uu = u * u
        line[0] += uu
        line[1] += k * uu
        line[2] += k * k * uu
        line[3] += u
        line[4] += k * u
        line[5] += u * interval_s
        line[6] += k * u * interval_s
        if key > 0:
            line[7] += uu
            line[8] += u
            line[9] += u * interval_s
        line[10] += 1.0

    def current(self) -> TokenBudget | None:
        seconds, steps = self._full
        rho = self.prompt_ratio
        if steps < MIN_FULL_STEPS or seconds <= 0 or rho is None:
            return None
        full_s = seconds / steps
        if full_s < MIN_FULL_STEP_S:
            return None  # no step of a real engine is this fast: a clock artefact, not a budget
        fixed_s, draft_s, pass_s = self.fixed_costs(full_s)
        return TokenBudget(tokens=self.tokens, capacity=self.tokens / full_s, rho=rho, fixed_s=fixed_s,
                           pass_s=pass_s, draft_s=draft_s, steps=self.timed_steps)

    @property
    def prompt_ratio(self) -> float | None:
        """Decayed prompt tokens per committed token (a reading's ``rho``), None before any committed token;
        O(1), no fit."""
        prompt, committed = self._prompt
        return prompt / committed if committed > 0 else None

    def fixed_costs(self, full_s: float) -> tuple[float, float, float]:
        """(a_0, s, p) of the steps fed so far, for a full step of ``full_s`` seconds (:func:`fixed_step_costs`)."""
        fields = dict(zip(LINE_FIELDS, self._line[:len(LINE_FIELDS)], strict=True))
        return fixed_step_costs(full_s, LineSums(**fields))

    @property
    def full_step(self) -> tuple[float, float]:
        """(mean seconds, decayed count) of the timed steps that filled the budget; (0, 0) before any."""
        seconds, steps = self._full
        return (seconds / steps if steps > 0 else 0.0), steps

    @property
    def timed_steps(self) -> float:
        """Decayed timed steps behind the line."""
        return self._line[len(LINE_FIELDS)]

    def width_steps(self, width: int) -> float:
        """Decayed timed steps at ``width``: where all of them ran one width, the fit knows only that width's
        line, and the others' fixed costs come from the prior of :func:`fixed_step_costs`."""
        return self._widths.get(width, 0.0)


#: The order of :class:`LineSums`' fields in the meter's running sums.
LINE_FIELDS = ("uu", "ku", "kk", "u", "k", "us", "ks", "duu", "du", "dus")


def verified_width(draft_tokens: int, batch: int) -> int:
    """The width a step's decoding requests verified, from its draft tokens and requests: on a graph-shaped
    engine every decoding request verifies the step's one width, and the few prompt-chunk requests of a large
    batch none, so the ratio rounded up is that width (on the H200 recordings it matched the engine's own
    width on every step of 128 requests or more)."""
    return -(-max(draft_tokens, 0) // batch) if batch > 0 else 0


def budget_sample(step: StepRecord) -> tuple[int, int, int, float | None, int]:
    """(scheduled, prompt, committed tokens, interval_s, width) of a step for the token-budget meter, with the
    engine's count of committed tokens (one per request plus every accepted draft really run) and its
    :func:`verified_width`."""
    committed = 0
    for cs in step.categories:
        committed += cs.requests
        for h in cs.hists:
            committed += sum(map(mul, range(len(h.accepted)), h.accepted))
    return (step.scheduled_tokens, step.prefill_tokens, committed, step.interval_s,
            verified_width(step.draft_tokens, step.batch_size))


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
