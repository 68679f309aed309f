"""CPU cost of the engine patch's reporter thread per telemetry post, and what it adds up to per second.

The reporter runs beside vLLM's engine loop, in the EngineCore process (bench/overhead.py measures the hook
inside the loop and leaves the reporter off). It shares the process's GIL and, on a small machine, its
cores: every post drains the step queue, serialises the batch, sends it over HTTP, validates the ack and
installs the policy it carries. Here a real ``specctl serve`` answers a real :class:`specctl_vllm.engine_patch.reporter.
Reporter`, fed the step rows a CPU engine produces (8 categories, drafts and counterfactual scores per
step), and each post's CPU time is taken on the posting thread (``time.thread_time_ns``: only this thread's
work, none of the controller's). The share of one core the thread takes at a report interval ``I`` with
``s`` engine steps per second is ``cost(steps per post = s * I) / I``.

    python -m bench reporter_cost [--posts 300] [--steps-per-post 1,5,10,25]

Writes bench/results/reporter_cost.json: median and p90 CPU microseconds per post for each batch size, and
the share of a core at report intervals 0.1-1 s for an engine stepping 10 and 60 times a second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from bench.support.specctl_serve import INGEST_TOKEN, SpecctlServe
from bench.support.workload import CATEGORIES
from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
from specctl_vllm.engine_patch.reporter import Identity, Reporter
from specctl_vllm.engine_patch.settings import EngineSettings
from specctl_vllm.engine_patch.telemetry import (
    StepQueue,
    StepRow,
    add_attempt,
    add_counterfactual,
    add_draft,
    new_entry,
)
from specctl_vllm.kernel import protocol

RESULTS = ROOT / "bench" / "results" / "reporter_cost.json"
INTERVALS = (0.1, 0.25, 0.5, 1.0)
STEP_RATES = (10.0, 60.0)  # steps per second: the CPU engine at batch 8 (~100 ms steps), a GPU engine (~16 ms)


def engine_row(i: int) -> StepRow:
    """One step of 8 requests, one per category: what the CPU benchmark's engine reports at concurrency 8."""
    agg = {}
    for j, cat in enumerate(CATEGORIES):
        entry = agg[(cat, "ngram")] = new_entry()
        entry.requests = 1
        k = 1 + (i + j) % 8
        add_draft(entry.hists, k, (i * 7 + j) % (k + 1))
        add_counterfactual(entry, "suffix", k, (i + 3 * j) % (k + 1))
        add_attempt(entry, "suffix")
    return StepRow(t=float(i), wall_s=0.1, batch_size=8, scheduled_tokens=30, draft_tokens=22, prefill_tokens=0,
                   draft_depth=8, agg=agg)


def measure(url: str, steps_per_post: int, posts: int) -> list[int]:
    settings = EngineSettings(controller_url=url, ingest_token=INGEST_TOKEN, engine_id="bench-reporter")
    engine = EngineSpec("ngram", 8, ("suffix",))
    queue = StepQueue(settings.queue_steps)
    identity = Identity("bench-reporter", f"boot{steps_per_post:04d}", "smollm2", engine.to_protocol())
    reporter = Reporter(settings, queue, PolicyHolder(engine), identity)
    costs = []
    step = 0
    for n in range(posts + 5):  # the first posts attach (policy computed); not timed
        for _ in range(steps_per_post):
            queue.push(engine_row(step))
            step += 1
        t0 = time.thread_time_ns()
        outcome = reporter.run_once()
        spent = time.thread_time_ns() - t0
        if outcome not in ("accepted", "duplicate"):
            raise RuntimeError(f"post {n}: {outcome}")
        if n >= 5:
            costs.append(spent)
    return costs


def summarise(costs_by_size: dict[int, list[int]]) -> dict:
    rows = []
    for size, costs in sorted(costs_by_size.items()):
        us = sorted(c / 1e3 for c in costs)
        rows.append({"steps_per_post": size, "posts": len(us), "median_us": statistics.median(us),
                     "p90_us": us[int(0.9 * (len(us) - 1))]})
    sizes = [r["steps_per_post"] for r in rows]
    med = [r["median_us"] for r in rows]

    def cost_at(steps: float) -> float:  # linear between measured batch sizes, clamped at the ends
        if steps <= sizes[0]:
            return med[0]
        for (s0, c0), (s1, c1) in zip(zip(sizes, med), zip(sizes[1:], med[1:]), strict=False):
            if steps <= s1:
                return c0 + (c1 - c0) * (steps - s0) / (s1 - s0)
        return med[-1] + (med[-1] - med[-2]) * (steps - sizes[-1]) / (sizes[-1] - sizes[-2])

    share = {f"{rate:g}_steps_per_s": {f"{i:g}_s": cost_at(max(1.0, rate * i)) / 1e6 / i for i in INTERVALS}
             for rate in STEP_RATES}
    return {"rows": rows, "core_share": share}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--posts", type=int, default=300)
    ap.add_argument("--steps-per-post", default="1,5,10,25,60")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.steps_per_post.split(",") if s.strip()})
    except ValueError:
        ap.error("--steps-per-post takes comma-separated integers")
    if len(sizes) < 2 or sizes[0] < 1 or args.posts < 10:
        ap.error("need two or more batch sizes >= 1 and --posts >= 10")
    with tempfile.TemporaryDirectory() as tmp:
        ctl = SpecctlServe(Path(tmp), db=Path(tmp) / "specctl.db", env={"SPECCTL_ACCESS_LOG": "false"})
        ctl.start()
        try:
            costs = {s: measure(ctl.url, s, args.posts) for s in sizes}
        finally:
            ctl.stop()
    out = {"benchmark": "reporter thread CPU per telemetry post (engine_patch/reporter.py)",
           "protocol": protocol.PROTOCOL_VERSION, "categories": len(CATEGORIES), **summarise(costs)}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{'steps/post':>10} {'median us':>10} {'p90 us':>8}")
    for r in out["rows"]:
        print(f"{r['steps_per_post']:>10} {r['median_us']:>10.0f} {r['p90_us']:>8.0f}")
    for rate, per in out["core_share"].items():
        print(f"share of one core at {rate.replace('_', ' ')}: "
              + ", ".join(f"{i.replace('_', ' ')} -> {v:.2%}" for i, v in per.items()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
