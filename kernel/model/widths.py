"""The width rule: one proposal width K per step, from the width set the engine captured full graphs for.

    K* = argmax_{K in W}  sum_c n_c * E_c(K) / T(b, K)     subject to   value(K) >= value(0) * (1 + margin(b, K))

``n_c`` the step's requests per category, ``E_c(K)`` the expected tokens a request of category c commits when it
verifies K drafts (1 + the expected accepted drafts), ``T(b, K)`` the step time of the batch bucket b at width
K (:mod:`.cells`), and the margin shrinks with the steps measured in both cells: a width above 0 must beat plain
decoding *by measurement* before it is used. O(categories x widths), one list of values per call.

Where the step's token budget ``B`` (vLLM's ``max_num_batched_tokens``) binds, as on a GPU under a load that
keeps every step carrying prompts, the decode-only cells cannot price the widths: they have few or no steps
there, and a width's cost is then set by the tokens it puts through the budget. The rule then values every
width with the steady-step model (:func:`steady_goodput`), measured by the engine (:class:`TokenBudget`): a
step at width K costs ``a_K + b_K * tokens``, and in steady load each request of a step verifies ``1 + K``
tokens and brings ``rho E(K)`` prompt tokens (every finished request is replaced by one with a prompt), so

    n' = min(n, B / ((1 + K) + rho E(K)))          the requests one step can hold
    value(K) = n' E(K) / (a_K + b_K n' ((1 + K) + rho E(K)))

each width's line through the measured full step (``a_K + b_K B = B / C``, ``C`` the tokens per second of a
full step, the same whatever its width), with a fixed cost that jumps once a step drafts at all and grows with
the drafter's passes, ``a_K = a_0 + s + p K`` for K >= 1. Where a width fills the budget this is ``C / ((1 + K) / E(K) + rho)``: the width only
decides how a full step's tokens are split. Where it does not, ``a_K`` is what the width spreads over its
committed tokens, and a narrow width pays less of it. On the H200 at 256 requests a step below the budget
costs close to its width's fixed part (K = 0: 25-30 ms at 512-1023 tokens, K = 2: 37-48 ms, a full step
54-57 ms), so one ``a`` for every width priced K = 0 as a drafting step (session 7; ``python -m bench
gpu.budget_model`` checks the model against every static engine measured), and so did a line ``a_0 + p K``
(session 9: K = 0 about 6 ms, K = 1 and 2 13-21 ms; the jump ``s`` is the drafter's first pass).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specctl_vllm.kernel.model.cells import CellView

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
    """What an engine measured about its step token budget and its step cost under it (:func:`steady_goodput`)."""

    tokens: int  # B: tokens one step may schedule (vLLM's max_num_batched_tokens)
    capacity: float  # C: tokens per second of a step that filled the budget
    rho: float  # prompt tokens scheduled per committed token (every finished request brings a prompt)
    fixed_s: float = 0.0  # a_0: seconds of a K = 0 step that do not grow with its tokens (0: each costs 1 / C)
    pass_s: float = 0.0  # p: seconds the fixed part grows by per drafted position
    draft_s: float = 0.0  # s: seconds a step at K >= 1 pays once for drafting at all (a_K = a_0 + s + p K)
    steps: float = math.inf  # decayed steps behind the fit (the margin's evidence)

    @property
    def full_s(self) -> float:
        """B / C: seconds of a step that fills the budget, whatever its width."""
        return self.tokens / self.capacity if self.capacity > 0 else 0.0

    def fixed_for(self, k: int) -> float:
        """a_K, held to [0, B / C]: a step never costs more than a full one."""
        drafting = self.draft_s + self.pass_s * k if k > 0 else 0.0
        return min(max(self.fixed_s + drafting, 0.0), self.full_s)

    def per_token_for(self, k: int) -> float:
        """b_K: seconds per scheduled token of a step at width ``k``, its line through the full step."""
        return (self.full_s - self.fixed_for(k)) / self.tokens if self.tokens > 0 else 0.0


def steady_regime(batch: int, widest: int, budget: TokenBudget) -> bool:
    """Whether the widest width of the set could fill the budget at this batch (E(K) <= 1 + K bounds its prompt
    tokens): below, no width can, and the decode-only cells price the widths."""
    return could_fill(batch, widest, budget.tokens, budget.rho)


def could_fill(batch: int, widest: int, tokens: int, rho: float) -> bool:
    """:func:`steady_regime` on a budget of ``tokens`` with ``rho`` prompt tokens per committed token, before any
    reading is fitted (an engine asks it first: at a batch no width can fill, the fit would go unused)."""
    return batch * (1 + widest) * (1 + rho) >= tokens


@dataclass(frozen=True, kw_only=True)
class LineSums:
    """Sums over timed steps that fit ``a_0``, ``s`` and ``p``: with ``u = (B - tokens) / B``, K the step's width
    and ``d`` 1 for a step that drafted (K >= 1), ``seconds - full_s (1 - u) = a_0 u + s d u + p K u`` (each
    width's line through the full step). ``uu`` = sum u^2, ``ku`` = sum K u^2, ``kk`` = sum K^2 u^2, ``u`` =
    sum u, ``k`` = sum K u, ``us`` = sum u seconds, ``ks`` = sum K u seconds; ``duu``, ``du``, ``dus`` the
    sums of u^2, u and u seconds over the steps that drafted."""

    uu: float = 0.0
    ku: float = 0.0
    kk: float = 0.0
    u: float = 0.0
    k: float = 0.0
    us: float = 0.0
    ks: float = 0.0
    duu: float = 0.0
    du: float = 0.0
    dus: float = 0.0


#: Seconds per drafted position the fit leans towards where the steps say little about it (every step at one
#: width): the H200 sessions 5-7 fitted 2-10 ms at 256 requests.
PRIOR_PASS_S = 3e-3
#: Weight of that prior in the least squares, in units of (K u)^2: as much as one step at K = 2 half the budget
#: below a full one. Where every step ran one width it alone decides p; a few steps at a second width outweigh it.
PRIOR_PASS_WEIGHT = 1.0
#: Weight, in units of u^2, of the prior s = 0 (drafting costs its passes only). It only makes the fit
#: well-posed: one K = 0 step a third of the budget below a full one (u^2 ~ 0.4) outweighs it eightfold. On
#: the H200 at 256 requests a step below the budget cost a_0 ~ 6 ms at K = 0 and 13-21 ms at K = 1 and 2
#: (session 9): a jump at K = 1 (the drafter's first pass over every scheduled token), then little per pass;
#: a line a_0 + p K through those steps priced K = 0 as a drafting step (low at 256: 0.89x plain).
PRIOR_DRAFT_WEIGHT = 0.05


def fixed_step_costs(full_s: float, sums: LineSums, prior_pass_s: float = PRIOR_PASS_S,
                     prior_weight: float = PRIOR_PASS_WEIGHT,
                     draft_weight: float = PRIOR_DRAFT_WEIGHT) -> tuple[float, float, float]:
    """(a_0, s, p) of the least-squares fit of :class:`LineSums`, ``p`` shrunk towards ``prior_pass_s`` and
    ``s`` towards 0, each held to 0 or more (a_K <= full_s is held where it is read,
    :meth:`TokenBudget.fixed_for`). Where no step was below the budget there is nothing to fit: (0, 0, 0),
    every token costs 1 / C."""
    if sums.uu <= 0 or full_s <= 0:
        return 0.0, 0.0, 0.0
    uy = sums.us - full_s * (sums.u - sums.uu)
    dy = sums.dus - full_s * (sums.du - sums.duu)
    ky = sums.ks - full_s * (sums.k - sums.ku)
    # normal equations of (a_0, s, p) with the two priors; d K = K, so sum d K u^2 is ku
    matrix = ((sums.uu, sums.duu, sums.ku),
              (sums.duu, sums.duu + draft_weight, sums.ku),
              (sums.ku, sums.ku, sums.kk + prior_weight))
    rhs = (uy, dy, ky + prior_weight * prior_pass_s)
    fit = nonnegative_solve(matrix, rhs)
    return fit if all(map(math.isfinite, fit)) else (0.0, 0.0, 0.0)


def nonnegative_solve(matrix: Sequence[Sequence[float]], rhs: Sequence[float]) -> tuple[float, ...]:
    """x >= 0 minimising x'Mx - 2 r'x for a symmetric positive semi-definite M of at most 3 x 3: the unconstrained
    solution where it is nonnegative (the usual case: one solve), else the best of the solutions with some
    components held at 0. Pure Python: it runs in the engine's step loop."""
    n = len(rhs)
    full = _solve_on(matrix, rhs, tuple(range(n)))
    if full is not None and min(full) >= 0:
        return full
    best, best_value = (0.0,) * n, 0.0
    for free in _FREE_SETS[n]:
        if len(free) == n:
            continue
        x = _solve_on(matrix, rhs, free)
        if x is None or min(x) < 0:
            continue
        value = sum(x[i] * matrix[i][j] * x[j] for i in free for j in free) - 2 * sum(rhs[i] * x[i] for i in free)
        if value < best_value:
            best, best_value = x, value
    return best


def _free_sets(n: int) -> list[tuple[int, ...]]:
    """Index sets of the components left free, largest first."""
    return sorted((tuple(i for i in range(n) if mask >> i & 1) for mask in range(1, 1 << n)), key=len,
                  reverse=True)


_FREE_SETS = {n: _free_sets(n) for n in (1, 2, 3)}


def _solve_on(matrix: Sequence[Sequence[float]], rhs: Sequence[float], free: Sequence[int]) -> tuple[float, ...] | None:
    """M x = r over the ``free`` components (the others 0; at most 3) by Cramer's rule; None where singular."""
    out = [0.0] * len(rhs)
    if len(free) == 1:
        (i,) = free
        if abs(matrix[i][i]) < 1e-12:
            return None
        out[i] = rhs[i] / matrix[i][i]
        return tuple(out)
    if len(free) == 2:
        i, j = free
        det = matrix[i][i] * matrix[j][j] - matrix[i][j] * matrix[j][i]
        if abs(det) < 1e-12:
            return None
        out[i] = (rhs[i] * matrix[j][j] - matrix[i][j] * rhs[j]) / det
        out[j] = (matrix[i][i] * rhs[j] - rhs[i] * matrix[j][i]) / det
        return tuple(out)
    i, j, k = free
    (a, b, c), (d, e, f), (g, h, m) = ((matrix[r][i], matrix[r][j], matrix[r][k]) for r in (i, j, k))
    r0, r1, r2 = rhs[i], rhs[j], rhs[k]
    det = a * (e * m - f * h) - b * (d * m - f * g) + c * (d * h - e * g)
    if abs(det) < 1e-12:
        return None
    out[i] = (r0 * (e * m - f * h) - b * (r1 * m - f * r2) + c * (r1 * h - e * r2)) / det
    out[j] = (a * (r1 * m - f * r2) - r0 * (d * m - f * g) + c * (d * r2 - r1 * g)) / det
    out[k] = (a * (e * r2 - r1 * h) - b * (d * r2 - r1 * g) + r0 * (d * h - e * g)) / det
    return tuple(out)


def budget_binds(mix: Mapping[str, float], curves: Mapping[str, Sequence[float]], k: int, budget: TokenBudget,
                 default_curve: Sequence[float] = (1.0,)) -> bool:
    """Whether a steady step at width ``k`` would need the whole budget: n (1 + K) verifying tokens and the
    prompt tokens of the requests its commits finish, rho per committed token."""
    n = sum(mix.values())
    committed = committed_per_step(mix, curves, k, default_curve) if k else n
    return _fills(n, committed, k, budget)


def _fills(n: float, committed: float, k: int, budget: TokenBudget) -> bool:
    return n * (1 + k) + budget.rho * committed >= budget.tokens


def budget_goodput(mix: Mapping[str, float], curves: Mapping[str, Sequence[float]], k: int, budget: TokenBudget,
                   default_curve: Sequence[float] = (1.0,)) -> float:
    """Committed tokens per second of a steady step at width ``k`` under the measured ``budget``
    (:func:`steady_goodput`; where the width fills the budget, C / ((1 + K) n / sum_c n_c E_c(K) + rho)).
    0 for an empty mix."""
    n = sum(mix.values())
    committed = committed_per_step(mix, curves, k, default_curve) if k else n
    return steady_goodput(n, committed, k, budget)


def steady_goodput(n: float, committed: float, k: int, budget: TokenBudget) -> float:
    """The steady-step model of the module docstring for ``n`` requests that commit ``committed`` tokens a
    step at width ``k`` (0 where either is 0)."""
    if n <= 0 or committed <= 0 or budget.capacity <= 0 or budget.tokens <= 0:
        return 0.0
    per_commit = committed / n
    per_request = (1 + k) + budget.rho * per_commit
    held = min(n, budget.tokens / per_request)
    step_s = budget.fixed_for(k) + budget.per_token_for(k) * held * per_request
    value = held * per_commit / step_s if step_s > 0 else 0.0
    return value if math.isfinite(value) else 0.0


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
    """value(K) per width: sum_c n_c E_c(K) / T(b, K) from the cells (``widths[0]`` = 0: n / T(b, 0), every
    request commits one token), or, given a measured ``budget``, the steady-step model :func:`steady_goodput`;
    0 either way where a cell has no usable step time. The one goodput formula of the width rule: the
    rule and the controller's goodput table (:func:`plan_widths`) both read it from here."""
    n = sum(mix.values())
    out = []
    for i, k in enumerate(widths):
        t = step_s[i]
        if not (t > 0 and math.isfinite(t)) or n <= 0:
            out.append(0.0)  # a width the cells do not price (not in the controller's set) is not run
            continue
        committed = n if i == 0 else committed_per_step(mix, curves, k, default_curve)
        out.append(committed / t if budget is None else steady_goodput(n, committed, k, budget))
    return out


def margin_steps(steps: Sequence[float], budget: TokenBudget | None) -> Sequence[float]:
    """The evidence behind each width's value: its cell's steps, or under the steady-step model the steps of
    the engine's fit (one fit prices every width)."""
    return steps if budget is None else (budget.steps,) * len(steps)


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
    what the engine measured about its token budget and step cost (None: the cells price every width)."""
    return _pick(width_values(mix, curves, widths, step_s, default_curve, budget), widths,
                 margin_steps(steps, budget))


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
    goodput: float  # committed tokens per second (width_values; 0: the cell has no step time)


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
    its fast acceptance blend aside), not one of their own; ``budget`` is what they measured of the
    engine's token budget with its own estimator (:class:`~specctl_vllm.kernel.model.budget.BudgetMeter`)
    where :func:`steady_regime` holds, else None."""
    b = max(int(batch), 1)
    step_s, steps = view.row(b)
    values = width_values(mix, curves, view.widths, step_s, default_curve, budget)
    choice = _pick(values, view.widths, margin_steps(steps, budget))
    rows = tuple(WidthRow(width=k, step_s=step_s[i], steps=steps[i], goodput=values[i])
                 for i, k in enumerate(view.widths))
    return WidthPlan(width=choice.width, batch=b, rows=rows)
