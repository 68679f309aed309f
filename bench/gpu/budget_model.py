"""Token-budget model of a steady point: what a static width can commit when every step is full, against the rows.

When a step's token budget ``B`` (vLLM's ``max_num_batched_tokens``) binds, as on the H200 at 256 requests of
the steady load, the step time no longer depends on the width: every step processes about ``B`` tokens in
about ``T_B``. A width K then only decides how those tokens are split. Per committed token the engine spends
``(1 + K) / E(K)`` tokens verifying (every request verifies K drafts and commits ``E(K)`` tokens on average)
and ``rho`` tokens of prompt, ``rho`` = prompt tokens per output token of the workload (every finished request
is replaced by one with a new prompt). So

    goodput(K) = C / ((1 + K) / E(K) + rho),     C = B / T_B   (tokens per second of a full step)

and the budget binds when the steps a width needs without the cap are over it:
``c * ((1 + K) + rho * E(K)) >= B`` for ``c`` requests in flight. Below that the model says nothing (the
step time then depends on the width, as the cell table has it). Both are the width rule's own functions
(:func:`~specctl_vllm.controller.core.model.widths.budget_goodput`, ``budget_binds``), so this check is a
check of the cap the engine applies. ``E(K)`` comes from the profile's conditional
acceptance per position (:func:`specctl_vllm.controller.core.model.widths.geometric_lengths`; the mixed profile
averages its two categories, half the requests each), ``C`` from the recorded steps of the specctl engine that
filled the budget (the budget over their mean time). The check: predicted against measured for every static row where the budget binds.

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
from specctl_vllm.controller.core.model.widths import TokenBudget, budget_binds, budget_goodput, geometric_lengths
from specctl_vllm.engine_patch.widths import FULL_SHARE

#: vLLM's default ``max_num_batched_tokens`` for the engines of the sweep (the recorded steps top out there).
DEFAULT_BUDGET = 2048


@dataclass(frozen=True, kw_only=True)
class Prediction:
    engine: str
    profile: str
    concurrency: int
    predicted: float | None  # None: the budget does not bind there
    measured: float


def expected_length(profile: str, k: int) -> float:
    """E(K) of a request of the profile, averaged over its categories (each half the in-flight requests)."""
    cats = PROFILE_CATEGORIES[profile]
    return sum(geometric_lengths(PROFILES[cat], k)[k] for cat in cats) / len(cats)


def profile_step(profile: str, concurrency: int) -> tuple[dict[str, float], dict[str, tuple[float, ...]]]:
    """A steady step of the profile as the width rule sees it: requests per category and their E_c(K)."""
    cats = PROFILE_CATEGORIES[profile]
    mix = {cat: concurrency / len(cats) for cat in cats}
    return mix, {cat: geometric_lengths(PROFILES[cat], K_MAX) for cat in cats}


def binds(profile: str, k: int, concurrency: int, rho: float, budget: int) -> bool:
    """The width rule's own test (:func:`~specctl_vllm.controller.core.model.widths.budget_binds`)."""
    mix, curves = profile_step(profile, concurrency)
    return budget_binds(mix, curves, k, TokenBudget(tokens=budget, capacity=1.0, rho=rho))


def goodput(profile: str, k: int, capacity: float, rho: float, concurrency: int = 256) -> float:
    """The width rule's own cap (:func:`~specctl_vllm.controller.core.model.widths.budget_goodput`)."""
    mix, curves = profile_step(profile, concurrency)
    return budget_goodput(mix, curves, k, TokenBudget(tokens=1, capacity=capacity, rho=rho))


def full_step_capacity(batches: Iterable[dict], budget: int) -> tuple[float, int]:
    """(tokens per second of the steps that filled the budget, how many there were): the budget over their mean
    time, as the engine's :class:`~specctl_vllm.engine_patch.widths.BudgetMeter` estimates it (undecayed)."""
    seconds = [float(s["interval_s"]) for b in batches for s in b.get("steps") or []
               if s.get("interval_s") and s.get("scheduled_tokens", 0) >= FULL_SHARE * budget]
    if not seconds:
        return 0.0, 0
    return budget * len(seconds) / sum(seconds), len(seconds)


def predictions(rows: Iterable[dict], capacity: float, rho: float, budget: int) -> list[Prediction]:
    out = []
    for row in rows:
        k = STATIC_CHOICES.get(row.get("engine"))
        if row.get("kind") != "row" or k is None or k == 0 or row.get("tok_per_s_median") is None:
            continue  # plain decoding has no drafter: its steps are another engine's
        profile, c = row["profile"], int(row["concurrency"])
        bound = binds(profile, k, c, rho, budget)
        out.append(Prediction(engine=row["engine"], profile=profile, concurrency=c,
                              predicted=goodput(profile, k, capacity, rho, c) if bound else None,
                              measured=float(row["tok_per_s_median"])))
    return sorted(out, key=lambda p: (p.concurrency, p.profile, STATIC_CHOICES[p.engine]))


def render(preds: list[Prediction], capacity: float, full_steps: int, rho: float, budget: int) -> str:
    head = (f"budget {budget} tokens, full-step capacity C = {capacity:.0f} tokens/s (mean of {full_steps} "
            f"full steps), rho = {rho:.2f} prompt tokens per output token")
    lines = [head, "", "| engine | profile | c | predicted tok/s | measured | measured / predicted |",
             "|---|---|---|---|---|---|"]
    bound = [p for p in preds if p.predicted is not None]
    for p in bound:
        lines.append(f"| {p.engine} | {p.profile} | {p.concurrency} | {p.predicted:.0f} | {p.measured:.0f} | "
                     f"{p.measured / p.predicted:.2f} |")
    if bound:
        ratios = [p.measured / p.predicted for p in bound]
        summary = (f"{len(bound)} rows where the budget binds: measured / predicted median "
                   f"{statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
        lines += ["", summary]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--steps", type=Path, required=True, help="the specctl engine's recorded steps (.jsonl.gz)")
    p.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="tokens per step (max_num_batched_tokens)")
    p.add_argument("--workload", default="spread", choices=sorted(WORKLOADS))
    args = p.parse_args(argv)
    if args.budget <= 0:
        p.error("--budget must be positive")
    for path in (*args.results, args.steps):
        if not path.is_file():
            p.error(f"{path}: no such file")
    capacity, full_steps = full_step_capacity(read_batches(args.steps), args.budget)
    if not full_steps:
        p.error(f"{args.steps}: no step filled the {args.budget}-token budget")
    rho = PROMPT_TOKENS / WORKLOADS[args.workload].mean_output
    rows = [json.loads(line) for path in args.results for line in path.read_text().splitlines() if line.strip()]
    print(render(predictions(rows, capacity, rho, args.budget), capacity, full_steps, rho, args.budget))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
