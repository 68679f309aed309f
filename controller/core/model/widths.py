"""The width rule: one proposal width K per step, from the width set the engine captured full graphs for.

    K* = argmax_{K in W}  sum_c n_c * E_c(K) / T(b, K)     subject to   value(K) >= value(0) * (1 + margin(b, K))

``n_c`` the step's requests per category, ``E_c(K)`` the expected tokens a request of category c commits when it
verifies K drafts (1 + the expected accepted drafts), ``T(b, K)`` the step time of the batch bucket b at width
K (:mod:`.cells`), and the margin shrinks with the steps measured in both cells: a width above 0 must beat plain
decoding *by measurement* before it is used. O(categories x widths), one list of values per call.

Where a width would fill the step's token budget ``B`` (vLLM's ``max_num_batched_tokens``), its value is capped
by what the budget lets through (:func:`budget_goodput`): a full step costs about the same whatever its width,
so per committed token the engine spends ``(1 + K) / E(K)`` verifying tokens and ``rho`` prompt tokens, and

    value(K) <= C / ((1 + K) n / sum_c n_c E_c(K) + rho)      when  n (1 + K) + rho sum_c n_c E_c(K) >= B

with ``C`` the tokens per second of a full step and ``rho`` the prompt tokens per committed token, both
measured by the engine (:class:`TokenBudget`). The decode-only cells cannot see this: they spread a step's
fixed cost over more committed tokens the wider the width, while under the budget the fixed cost is the
same for every split of it (on the H200 at 256 requests the cap predicts the static engines' rows within
0.92-1.00: ``python -m bench gpu.budget_model``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specctl_vllm.controller.core.model.cells import CellView

#: Smallest relative gain over K = 0 a width must show in two well-measured cells (measurement noise of a
#: steady step time on one GPU is ~1-2 %).
BASE_MARGIN = 0.02
#: Extra margin for a cell measured over no step: the modelled gain must be large before an unmeasured width
#: is trusted, and shrinks as 1/sqrt(steps).
UNMEASURED_MARGIN = 0.30
#: Conditional acceptance a category is credited with while neither the controller's curve nor the engine's
#: fast sums say anything about it (the engine's cold start; the policy assumes the same for such a category).
COLD_BETA = 0.5


def expected_lengths(betas: Sequence[float], k_max: int) -> tuple[float, ...]:
    """E(K) for K = 0..k_max from per-position conditional acceptance ``betas`` (position 1 first):
    E(K) = 1 + sum_{i=1..K} prod_{j<=i} beta_j. Positions beyond ``betas`` reuse its last value."""
    out = [1.0]
    survive = 1.0
    last = betas[-1] if betas else 0.0
    for i in range(k_max):
        beta = betas[i] if i < len(betas) else last
        survive *= min(max(float(beta), 0.0), 1.0)
        out.append(out[-1] + survive)
    return tuple(out)


def geometric_lengths(beta: float, k_max: int) -> tuple[float, ...]:
    return expected_lengths((beta,), k_max)


def margin(steps_k: float, steps_0: float, base: float = BASE_MARGIN, unmeasured: float = UNMEASURED_MARGIN) -> float:
    n = max(min(steps_k, steps_0), 0.0)
    return base + unmeasured / math.sqrt(1.0 + n)


@dataclass(frozen=True, kw_only=True)
class TokenBudget:
    """What an engine measured about its step token budget (the cap of :func:`budget_goodput`)."""

    tokens: int  # B: tokens one step may schedule (vLLM's max_num_batched_tokens)
    capacity: float  # C: tokens per second of a step that filled the budget
    rho: float  # prompt tokens scheduled per committed token (every finished request brings a prompt)


def budget_binds(mix: Mapping[str, float], curves: Mapping[str, Sequence[float]], k: int, budget: TokenBudget,
                 default_curve: Sequence[float] = (1.0,)) -> bool:
    """Whether a steady step at width ``k`` would need the whole budget: n (1 + K) verifying tokens and the
    prompt tokens of the requests its commits finish, rho per committed token."""
    n = sum(mix.values())
    committed = committed_per_step(mix, curves, k, default_curve) if k else n
    return _fills(n, committed, k, budget)


def _fills(n: float, committed: float, k: int, budget: TokenBudget) -> bool:
    return n * (1 + k) + budget.rho * committed >= budget.tokens


def _through(n: float, committed: float, k: int, budget: TokenBudget) -> float:
    if n <= 0 or committed <= 0:
        return 0.0
    return budget.capacity / ((1 + k) * n / committed + budget.rho)


def budget_goodput(mix: Mapping[str, float], curves: Mapping[str, Sequence[float]], k: int, budget: TokenBudget,
                   default_curve: Sequence[float] = (1.0,)) -> float:
    """Committed tokens per second a budget-bound step at width ``k`` lets through: C / ((1 + K) n / sum_c n_c
    E_c(K) + rho). 0 for an empty mix."""
    n = sum(mix.values())
    committed = committed_per_step(mix, curves, k, default_curve) if k else n
    return _through(n, committed, k, budget)


@dataclass(frozen=True, kw_only=True)
class WidthChoice:
    width: int
    value: float  # modelled committed tokens per second at that width
    plain_value: float  # the same at K = 0


def committed_per_step(mix: Mapping[str, float], curves: Mapping[str, Sequence[float]], k: int,
                       default_curve: Sequence[float] = (1.0,)) -> float:
    """sum_c n_c E_c(K): the tokens a step at width ``k`` commits (a curve shorter than K is extended flat)."""
    tokens = 0.0
    for cat, count in mix.items():
        curve = curves.get(cat, default_curve)
        tokens += count * curve[min(k, len(curve) - 1)]
    return tokens


def width_values(mix: Mapping[str, float], curves: Mapping[str, Sequence[float]], widths: Sequence[int],
                 step_s: Sequence[float], default_curve: Sequence[float] = (1.0,),
                 budget: TokenBudget | None = None) -> list[float]:
    """value(K) = sum_c n_c E_c(K) / T(b, K) per width (``widths[0]`` = 0: n / T(b, 0), every request commits
    one token), capped by :func:`budget_goodput` where the width fills the ``budget``; 0 where a cell has no
    usable step time. The one goodput formula of the width rule: the rule and the controller's goodput table
    (:func:`plan_widths`) both read it from here."""
    n = sum(mix.values())
    out = []
    for i, k in enumerate(widths):
        t = step_s[i]
        if not (t > 0 and math.isfinite(t)) or n <= 0:
            out.append(0.0)
            continue
        committed = n if i == 0 else committed_per_step(mix, curves, k, default_curve)
        value = committed / t
        if budget is not None and _fills(n, committed, k, budget):
            value = min(value, _through(n, committed, k, budget))
        out.append(value)
    return out


def choose_width(
    mix: Mapping[str, float],
    curves: Mapping[str, Sequence[float]],
    widths: Sequence[int],
    step_s: Sequence[float],
    steps: Sequence[float],
    default_curve: Sequence[float] = (1.0,),
    budget: TokenBudget | None = None,
) -> WidthChoice:
    """The width rule for one step. ``widths`` ascending with 0 first; ``step_s[i]``/``steps[i]`` the cell's
    step time and measured steps at ``widths[i]`` for this step's batch bucket; ``curves[c][K]`` = E_c(K)
    (a category without a curve uses ``default_curve``; a curve shorter than K is extended flat); ``budget``
    what the engine measured about its token budget (None: no cap)."""
    return _pick(width_values(mix, curves, widths, step_s, default_curve, budget), widths, steps)


def _pick(values: Sequence[float], widths: Sequence[int], steps: Sequence[float]) -> WidthChoice:
    """The rule on the values of :func:`width_values`: the best width that beats K = 0 by its margin."""
    plain = values[0]
    if plain <= 0:
        return WidthChoice(width=0, value=0.0, plain_value=0.0)
    best, best_value = 0, plain
    for i in range(1, len(widths)):
        value = values[i]
        if value > best_value and value >= plain * (1.0 + margin(steps[i], steps[0])):
            best, best_value = widths[i], value
    return WidthChoice(width=best, value=best_value, plain_value=plain)


@dataclass(frozen=True, kw_only=True)
class WidthRow:
    """One width of the goodput table: the cell's step time and measured steps, the modelled goodput."""

    width: int
    step_s: float
    steps: float
    goodput: float  # sum_c n_c E_c(K) / T(b, K), committed tokens per second (0: the cell has no step time)


@dataclass(frozen=True, kw_only=True)
class WidthPlan:
    """What a graph-shaped engine's width rule does with one batch: the width it picks and every width's row."""

    width: int
    batch: int  # the batch size whose bucket priced the rows
    rows: tuple[WidthRow, ...]  # one per width of the cell view, ascending; rows[0] is K = 0

    @property
    def plain(self) -> WidthRow:
        return self.rows[0]

    @property
    def chosen(self) -> WidthRow:
        return self.row(self.width)

    def row(self, width: int) -> WidthRow:
        for r in self.rows:
            if r.width == width:
                return r
        raise KeyError(width)


def plan_widths(view: CellView, curves: Mapping[str, Sequence[float]], mix: Mapping[str, float], batch: int,
                default_curve: Sequence[float] = (1.0,), budget: TokenBudget | None = None) -> WidthPlan:
    """The width :func:`choose_width` picks for a step of ``batch`` requests, ``mix`` of them per category, on
    the cell table ``view``, and the goodput table behind it. The controller's policy and ``specctl replay``
    price graph-shaped engines with this, so they show the width the engine runs (its exploration steps and
    its fast acceptance blend aside, and the token-budget cap the engine applies from what it measured
    itself unless ``budget`` is given), not one of their own."""
    b = max(int(batch), 1)
    step_s, steps = view.row(b)
    values = width_values(mix, curves, view.widths, step_s, default_curve, budget)
    choice = _pick(values, view.widths, steps)
    rows = tuple(WidthRow(width=k, step_s=step_s[i], steps=steps[i], goodput=values[i])
                 for i, k in enumerate(view.widths))
    return WidthPlan(width=choice.width, batch=b, rows=rows)
