"""The steady-step model of a budget-bound point against the static rows: what each width commits per second.

When a step's token budget ``B`` (vLLM's ``max_num_batched_tokens``) can bind, as on the H200 at 256 requests of
the steady load, every step carries prompts and the width rule prices the widths with the steady-step model
(:func:`~specctl_vllm.kernel.model.widths.steady_goodput`) instead of the decode-only cells: a step
at width K costs ``a_K + b_K * tokens`` (each width's line through the full step, ``a_K + b_K B = B / C``,
``a_K = a_0 + p K``); each request of a step verifies ``1 + K`` tokens and brings ``rho E(K)`` prompt tokens,
``rho`` = prompt tokens per output token of the workload (every finished request is replaced by one with a
new prompt); a step holds ``n' = min(c, B / ((1 + K) + rho E(K)))`` requests, so

    goodput(K) = n' E(K) / (a_K + b_K n' ((1 + K) + rho E(K)))

which is ``C / ((1 + K) / E(K) + rho)`` where the width fills the budget. ``E(K)`` comes from the profile's
conditional acceptance per position (:func:`specctl_vllm.kernel.model.widths.geometric_lengths`; the
mixed profile averages its two categories, half the requests each); ``C``, ``a_0`` and ``p`` from the recorded
steps of the specctl engine at the points where the model applies (batches of at least ``--min-batch``), fed to
the engine's own estimator (:class:`~specctl_vllm.kernel.model.budget.BudgetMeter`), undecayed. The
check: predicted against measured for every static row where the engine would use the model, whether the
model ranks the widths of each point as they measured, and the width the rule (with its margin over K = 0)
picks on each profile.

    python3 -m bench gpu.budget_model RESULTS.jsonl [RESULTS2.jsonl ...] --steps STEPS.jsonl.gz [--budget 2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bench.gpu.shapes import K_MAX, PROFILES, PROMPT_TOKENS
from bench.gpu.steady_plan import PROFILE_CATEGORIES, STATIC_CHOICES, WORKLOADS
from bench.gpu.steady_widths import read_batches
from specctl_vllm.engine_patch.backports import DEFAULT_WIDTHS
from specctl_vllm.kernel.model.budget import BudgetMeter, verified_width
from specctl_vllm.kernel.model.widths import (
    TokenBudget,
    budget_binds,
    budget_goodput,
    choose_width,
    geometric_lengths,
    steady_regime,
)

#: vLLM's default ``max_num_batched_tokens`` for the engines of the sweep (the recorded steps top out there).
DEFAULT_BUDGET = 2048
#: Steps of smaller batches come from points where no width fills the budget (their fixed cost is another).
DEFAULT_MIN_BATCH = 128


@dataclass(frozen=True, kw_only=True)
class Prediction:
    engine: str
    profile: str
    concurrency: int
    predicted: float | None  # None: the engine would not use the model there
    measured: float
    binds: bool = False  # the width fills the budget there


def expected_length(profile: str, k: int) -> float:
    """E(K) of a request of the profile, averaged over its categories (each half the in-flight requests)."""
    cats = PROFILE_CATEGORIES[profile]
    return sum(geometric_lengths(PROFILES[cat], k)[k] for cat in cats) / len(cats)


def profile_step(profile: str, concurrency: int) -> tuple[dict[str, float], dict[str, tuple[float, ...]]]:
    """A steady step of the profile as the width rule sees it: requests per category and their E_c(K)."""
    cats = PROFILE_CATEGORIES[profile]
    mix = {cat: concurrency / len(cats) for cat in cats}
    return mix, {cat: geometric_lengths(PROFILES[cat], K_MAX) for cat in cats}


@dataclass(frozen=True, kw_only=True)
class StepCost:
    """The steady-step model's inputs as measured: C, a, and how many steps are behind each."""

    capacity: float  # C, tokens per second of a full step
    fixed_s: float  # a_0, seconds
    pass_s: float = 0.0  # p, seconds per drafted position
    draft_s: float = 0.0  # s, seconds a drafting step pays once
    full_steps: int
    steps: int

    def budget(self, tokens: int, rho: float) -> TokenBudget:
        return TokenBudget(tokens=tokens, capacity=self.capacity, rho=rho, fixed_s=self.fixed_s, pass_s=self.pass_s,
                           draft_s=self.draft_s)


def binds(profile: str, k: int, concurrency: int, rho: float, budget: int) -> bool:
    """The width rule's own test (:func:`~specctl_vllm.kernel.model.widths.budget_binds`)."""
    mix, curves = profile_step(profile, concurrency)
    return budget_binds(mix, curves, k, TokenBudget(tokens=budget, capacity=1.0, rho=rho))


def goodput(profile: str, k: int, budget: TokenBudget, concurrency: int = 256) -> float:
    """The width rule's own value (:func:`~specctl_vllm.kernel.model.widths.budget_goodput`)."""
    mix, curves = profile_step(profile, concurrency)
    return budget_goodput(mix, curves, k, budget)


def step_cost(batches: Iterable[dict], budget: int, min_batch: int = DEFAULT_MIN_BATCH) -> StepCost:
    """C (the budget over the mean full step), a_0 and p (:func:`fixed_step_costs`) from the timed steps of
    batches of at least ``min_batch`` requests, fed to the engine's own
    :class:`~specctl_vllm.kernel.model.budget.BudgetMeter`, undecayed."""
    meter = BudgetMeter(budget, decay=1.0)
    for b in batches:
        for s in b.get("steps") or []:
            seconds = s.get("interval_s")
            if not seconds or s.get("batch_size", min_batch) < min_batch:
                continue
            width = verified_width(int(s.get("draft_tokens", 0)), int(s.get("batch_size", 0)))
            meter.observe(int(s.get("scheduled_tokens", 0)), 0, 0, float(seconds), width)
    full_s, full_steps = meter.full_step
    n = int(meter.timed_steps)
    if not full_steps:
        return StepCost(capacity=0.0, fixed_s=0.0, full_steps=0, steps=n)
    fixed_s, draft_s, pass_s = meter.fixed_costs(full_s)
    return StepCost(capacity=budget / full_s, fixed_s=fixed_s, pass_s=pass_s, draft_s=draft_s,
                    full_steps=int(full_steps), steps=n)


def predictions(rows: Iterable[dict], cost: StepCost, rho: float, budget: int) -> list[Prediction]:
    model = cost.budget(budget, rho)
    out = []
    for row in rows:
        k = STATIC_CHOICES.get(row.get("engine"))
        if row.get("kind") != "row" or k is None or k == 0 or row.get("tok_per_s_median") is None:
            continue  # plain decoding has no drafter: its steps are another engine's
        profile, c = row["profile"], int(row["concurrency"])
        used = steady_regime(c, K_MAX, model)
        out.append(Prediction(engine=row["engine"], profile=profile, concurrency=c,
                              predicted=goodput(profile, k, model, c) if used else None,
                              measured=float(row["tok_per_s_median"]), binds=binds(profile, k, c, rho, budget)))
    return sorted(out, key=lambda p: (p.concurrency, p.profile, STATIC_CHOICES[p.engine]))


def rankings(preds: list[Prediction]) -> list[str]:
    """Per point: the width the model ranks first against the one that measured best."""
    points: dict[tuple[int, str], list[Prediction]] = {}
    for p in preds:
        if p.predicted is not None:
            points.setdefault((p.concurrency, p.profile), []).append(p)
    out = []
    for (c, profile), ps in sorted(points.items()):
        model, measured = max(ps, key=lambda p: p.predicted), max(ps, key=lambda p: p.measured)
        verdict = "same" if model.engine == measured.engine else (
            f"differs: {model.engine} measured {model.measured / measured.measured:.2f} of the best")
        out.append(f"{profile} c={c}: model {model.engine}, measured {measured.engine} ({verdict})")
    return out


#: The engine's width set at k_max = 7 (engine_patch/backports.py: the default widths and k_max).
WIDTHS = (*DEFAULT_WIDTHS, K_MAX)
#: Decayed steps behind the engine's fit at most (its meter's decay): the margin the rule applies there.
MARGIN_STEPS = 200.0


def rule_picks(cost: StepCost, rho: float, budget: int, concurrency: int = 256) -> list[str]:
    """Per profile: every width's modelled goodput and the width the rule picks with its margin over K = 0."""
    model = TokenBudget(tokens=budget, capacity=cost.capacity, rho=rho, fixed_s=cost.fixed_s, pass_s=cost.pass_s,
                        draft_s=cost.draft_s, steps=MARGIN_STEPS)
    out = []
    for profile in PROFILE_CATEGORIES:
        mix, curves = profile_step(profile, concurrency)
        values = " ".join(f"K{k} {budget_goodput(mix, curves, k, model):.0f}" for k in WIDTHS)
        # the cells do not matter under the model: any finite row prices every width the same way
        picked = choose_width(mix, curves, WIDTHS, [1.0] * len(WIDTHS), [MARGIN_STEPS] * len(WIDTHS),
                              budget=model).width
        out.append(f"{profile} c={concurrency}: rule K{picked} ({values})")
    return out


def render(preds: list[Prediction], cost: StepCost, rho: float, budget: int) -> str:
    head = (f"budget {budget} tokens, full-step capacity C = {cost.capacity:.0f} tokens/s (mean of "
            f"{cost.full_steps} full steps), fixed step cost a_0 = {cost.fixed_s * 1e3:.1f} ms, a_K = a_0 + "
            f"{cost.draft_s * 1e3:.1f} + {cost.pass_s * 1e3:.2f} K ms for K >= 1 (each width's line through the full step, over {cost.steps} steps), "
            f"rho = {rho:.2f} prompt tokens per output token")
    lines = [head, "", "| engine | profile | c | fills the budget | predicted tok/s | measured | measured / predicted |",
             "|---|---|---|---|---|---|---|"]
    used = [p for p in preds if p.predicted is not None]
    for p in used:
        lines.append(f"| {p.engine} | {p.profile} | {p.concurrency} | {'yes' if p.binds else 'no'} | "
                     f"{p.predicted:.0f} | {p.measured:.0f} | {p.measured / p.predicted:.2f} |")
    if used:
        ratios = [p.measured / p.predicted for p in used]
        lines += ["", (f"{len(used)} rows where the engine prices widths with the model: measured / predicted "
                      f"median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}"), ""]
        lines += rankings(used)
    if cost.capacity > 0:
        lines += [""] + rule_picks(cost, rho, budget)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--steps", type=Path, required=True, help="the specctl engine's recorded steps (.jsonl.gz)")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="tokens per step (max_num_batched_tokens)")
    p.add_argument("--workload", default="spread", choices=sorted(WORKLOADS))
    p.add_argument("--min-batch", type=int, default=DEFAULT_MIN_BATCH,
                   help="requests; only steps of batches this large enter C and a")
    args = p.parse_args(argv)
    if args.budget <= 0:
        p.error("--budget must be positive")
    for path in (*args.results, args.steps):
        if not path.is_file():
            p.error(f"{path}: no such file")
    cost = step_cost(read_batches(args.steps), args.budget, args.min_batch)
    if not cost.full_steps:
        p.error(f"{args.steps}: no step filled the {args.budget}-token budget")
    rho = PROMPT_TOKENS / WORKLOADS[args.workload].mean_output
    rows = [json.loads(line) for path in args.results for line in path.read_text().splitlines() if line.strip()]
    print(render(predictions(rows, cost, rho, args.budget), cost, rho, args.budget))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
