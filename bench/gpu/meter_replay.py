"""The engine's token-budget meter replayed over a session's recorded steps, in the order they ran.

``budget_model`` fits the whole recording at once (undecayed): what the steps say. The engine decides with
its own meter, decayed per step (:data:`~specctl_vllm.kernel.model.budget.BUDGET_DECAY`), fed from
every step it ran before. This feeds the recorded steps to that meter the same way
(:func:`~specctl_vllm.kernel.model.budget.budget_sample` on each step record) and prints, at the
middle step of each specctl point's timed rounds (``--min-concurrency`` or more), what the meter read there:
``a_0``, ``p``, ``C``, ``rho``, the decayed steps at each width, and the width the rule picks for that point's
profile from it. Session 8 at low c = 256: the meter had timed K = 1 steps only, read p = 0.4 ms, and the rule
kept K = 1, where the undecayed fit (p = 9.45 ms) picks K = 0.

    python3 -m bench gpu.meter_replay RESULTS.jsonl STEPS.jsonl.gz [--min-concurrency 256] [--budget 2048] \\
        [--engine specctl]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from bench.gpu.budget_model import WIDTHS, profile_step
from bench.gpu.steady_widths import load, window_of
from specctl_vllm.kernel.model.budget import BudgetMeter, budget_sample
from specctl_vllm.kernel.model.widths import budget_goodput, choose_width
from specctl_vllm.kernel.protocol import StepRecord


@dataclass(frozen=True, kw_only=True)
class Reading:
    profile: str
    concurrency: int
    measured: float  # tok/s of the point
    fixed_ms: float  # a_0
    pass_ms: float  # p
    draft_ms: float  # s
    capacity: float  # C
    rho: float
    width_steps: dict[int, float]  # decayed timed steps per width
    values: dict[int, float]  # the rule's value per width for the point's profile
    picked: int


def replay(rows: list[dict], times: list[float], steps: list[dict], budget: int,
           min_concurrency: int = 256) -> list[Reading]:
    """One reading per specctl row at ``min_concurrency`` or more whose window holds steps and where the
    meter has a budget by then (too few full steps: no reading)."""
    marks = {}
    for row in rows:
        if int(row["concurrency"]) >= min_concurrency:
            window = window_of(row, times, steps)
            if window:
                marks[id(window[len(window) // 2])] = row
    meter = BudgetMeter(budget)
    out = []
    for step in steps:
        if int(step.get("scheduled_tokens", 0)) > 0:
            meter.observe(*budget_sample(StepRecord.model_validate(step)))
        row = marks.get(id(step))
        if row is None:
            continue
        reading = meter.current()
        if reading is None:
            continue
        c = int(row["concurrency"])
        mix, curves = profile_step(row["profile"], c)
        values = {k: budget_goodput(mix, curves, k, reading) for k in WIDTHS}
        picked = choose_width(mix, curves, WIDTHS, [1.0] * len(WIDTHS), [reading.steps] * len(WIDTHS),
                              budget=reading).width
        out.append(Reading(profile=row["profile"], concurrency=c, measured=float(row["tok_per_s_median"]),
                           fixed_ms=reading.fixed_s * 1e3, pass_ms=reading.pass_s * 1e3,
                           draft_ms=reading.draft_s * 1e3,
                           capacity=reading.capacity, rho=reading.rho,
                           width_steps={k: meter.width_steps(k) for k in WIDTHS}, values=values, picked=picked))
    return out


def render(readings: list[Reading]) -> str:
    head = ("| profile | c | tok/s | a_0 (ms) | s (ms) | p (ms) | C (tok/s) | rho | decayed steps per width | "
            "rule's values | rule |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in readings:
        widths = " ".join(f"K{k} {n:.0f}" for k, n in r.width_steps.items())
        values = " ".join(f"K{k} {v:.0f}" for k, v in r.values.items())
        lines.append(f"| {r.profile} | {r.concurrency} | {r.measured:.0f} | {r.fixed_ms:.1f} | {r.draft_ms:.1f} | {r.pass_ms:.2f} | "
                     f"{r.capacity:.0f} | {r.rho:.2f} | {widths} | {values} | K{r.picked} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path)
    p.add_argument("steps", type=Path)
    p.add_argument("--budget", type=int, default=2048, help="the engine's max_num_batched_tokens")
    p.add_argument("--min-concurrency", type=int, default=256)
    p.add_argument("--engine", default="specctl", help="the specctl engine whose steps were recorded")
    args = p.parse_args(argv)
    if args.budget <= 0:
        p.error("--budget must be a positive number of tokens")
    for path in (args.results, args.steps):
        if not path.is_file():
            p.error(f"no such file: {path}")
    try:
        rows, times, steps = load(args.results, args.steps, args.engine)
        if not rows:
            p.error(f"{args.results}: no {args.engine} rows")
        readings = replay(rows, times, steps, args.budget, args.min_concurrency)
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        p.error(f"not a sweep's results and recorded steps: {type(exc).__name__}: {str(exc)[:200]}")
    print(render(readings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
