"""What each section of the graph-shaped hook costs per step under churn, and the same against another checkout.

The H200's busiest point is 256 requests with finished requests replaced all the time: every step carries a
few prompts, the widest width fills the token budget, and the width rule prices the widths with the
steady-step model (:mod:`specctl_vllm.kernel.model.budget`). There the patch's own log line put the hook
at 1.30-1.44 % of step time while it drafted (session 17; target 1 %), split into before / after (width
rule) / observe / finish. This benchmark rebuilds that regime without a GPU:

* :class:`bench.support.engine_sim.SimEngine` drives :class:`~specctl_vllm.engine_patch.hook.SpecHook` on real
  ``vllm.v1.request.Request`` objects, as the runtime does on model runner V2 (async scheduling, drafts
  counted in vLLM's own update loop through the patch's counting call);
* each request finishes after a length drawn from ``--length`` / 2 to 3 ``--length`` / 2 tokens (128: the
  H200 benchmark's ``spread`` workload, 32-224) and is replaced by a new one (a 64-token prompt), so steps
  carry prompts; the token budget is ``requests x (1 + k_max)``, which the widest
  width fills;
* a buffer of ``--evict-mb`` is written where the model runs, so the hook meets the requests out of cache,
  and the engine's clock (which the hook's meters read) advances by a modelled H200-like step time, so the
  widths the rule runs do not depend on this host's speed;
* after the warm-up the heap is collected and frozen, as vLLM's engine core does once it is up: collections
  while measuring scan only what was allocated since (their pauses are reported per step);
* the cells are the H200-like table of ``bench overhead`` (``--cells h200``) or flat ones on which every
  width costs what K = 0 does (``--cells flat``: the rule drafts);
* every ``--reprice-every`` steps a new policy version arrives whose cells moved and whose rules did not, as
  the controller's learning sends them (on the H200 at 256 requests one reached the engine every 8.5 steps).

Each section is timed around the hook's own methods with ``perf_counter_ns``; the counting calls inside
vLLM's loop are timed one by one. Per run: the median over steps of each section and of their total.

``--baseline PATH`` runs the same measurement from another checkout of the project (its ``specctl_vllm``
first on ``sys.path``) and this one (or ``--this PATH``) in turns, ``--rounds`` pairs (A B, B A, ...), each run in a fresh process:
per size, both sides' medians over rounds, and the median (min-max) of the per-pair ratios this / baseline.

Usage: ``python -m bench hook_sections [--sizes 64,256] [--steps 400] [--cells flat|h200] [--reprice-every 8]
[--baseline PATH [--this PATH] [--rounds 5]] [--out FILE]``; results JSON (default ``bench/results/hook_sections.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.overhead import GRAPH_ENGINE_WIDTHS, graph_policy, request_sizes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "hook_sections.json"
SECTIONS = ("before", "after", "rule", "observe", "counting", "finish")
#: Sections that add up to the hook's cost per step ("rule" is part of "after").
SUMMED = ("before", "after", "observe", "counting", "finish")
PROMPT_TOKENS = 64
WARMUP_STEPS = 60
#: Bounds on the arguments: every run holds each request's script in memory and times every step.
MAX_REQUESTS = 4096
MAX_STEPS = 20_000
MAX_LENGTH = 65_536
MAX_ROUNDS = 100


class ModelClock:
    """The engine's clock as the hook reads it (its meters time steps with it): advanced by the modelled
    device time of each step, so the widths the rule runs follow an H200-like step cost and not the speed of
    the host running the benchmark (both sides of a comparison see the same device)."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def modelled_step_s(output: Any) -> float:
    """An H200-like step of an 8B model: (6 ms + 65 µs a request) x (1 + 0.12 K), plus 2 µs a prompt token
    (23 ms at 256 requests and K = 0, 34 ms at K = 4: the shape of ``bench overhead``'s H200-like cells)."""
    batch = len(output.num_scheduled_tokens)
    drafts = output.scheduled_spec_decode_tokens
    width = max(map(len, drafts.values()), default=0)
    prompt = max(output.total_num_scheduled_tokens - batch * (1 + width), 0)
    return (6e-3 + 6.5e-5 * batch) * (1.0 + 0.12 * width) + 2e-6 * prompt


def repriced(policy: Any, version: int) -> Any:
    """``policy`` under a new version whose cells moved by a few tenths of a percent and whose rules did not:
    what the controller sends as its learning moves the cells (on the H200 at 256 requests a new version
    reached the engine on 12 % of the steps, session 17)."""
    cells = policy.step_cells
    scale = 1.0 + 1e-3 * (version % 5)
    moved = cells.model_copy(update={"step_s": [[x * scale for x in row] for row in cells.step_s]})
    return policy.model_copy(update={"version": version, "step_cells": moved})


def measure(n: int, steps: int, length: int, cells: str, evict_mb: float, seed: int = 0,
            reprice_every: int = 0) -> dict[str, Any]:
    """One run in this process: the medians over ``steps`` steps of each section's µs, after a warm-up that
    lets the budget meter see its full steps. ``reprice_every``: a new policy version with moved cells every
    that many steps (0: one policy throughout)."""
    import numpy as np
    from vllm import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    from bench.support.engine_sim import SimEngine, script_drafter
    from bench.support.workload import CATEGORIES
    from specctl_vllm.engine_patch.hook import SpecHook, counting_call_ns
    from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
    from specctl_vllm.engine_patch.telemetry import StepQueue

    rng = random.Random(seed * 1_000_003 + n)
    k_max = max(GRAPH_ENGINE_WIDTHS)
    engine = EngineSpec(method="eagle3", k_max=k_max, full_cuda_graphs=True, graph_widths=GRAPH_ENGINE_WIDTHS)
    holder = PolicyHolder(engine)
    policy = graph_policy(flat_cells=cells == "flat")
    clock = ModelClock(time.monotonic())
    holder.install(policy, clock())
    queue = StepQueue(4096)
    hook = SpecHook(engine, holder, queue, overhead_budget=0.0, perf_ns=time.perf_counter_ns, async_mode=True,
                    clock=clock,
                    token_budget=n * (1 + k_max))
    hook.drafts_from_engine_loop = True
    hook.spec_call_ns = counting_call_ns()
    spent: dict[str, int] = {}

    def timed(owner: Any, name: str, section: str) -> None:
        original = getattr(owner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                spent[section] = spent.get(section, 0) + time.perf_counter_ns() - t

        setattr(owner, name, call)

    for name, section in (("before_schedule", "before"), ("after_schedule", "after"), ("observe", "observe"),
                          ("finish", "finish")):
        timed(hook, name, section)
    timed(hook.widths, "choose", "rule")

    scripts: dict[str, list[int]] = {}
    lengths: dict[str, int] = {}
    buffer = np.zeros(max(int(evict_mb * 2**20) // 8, 1))
    serial = iter(range(10**9))

    def admit() -> None:
        rid = f"r{next(serial)}"
        lengths[rid] = rng.randrange(length // 2, 3 * length // 2 + 1)
        scripts[rid] = [rng.randrange(100, 5000) for _ in range(lengths[rid] + 2 * k_max + 2)]
        params = SamplingParams(max_tokens=10**6,
                                extra_args={"specctl_category": CATEGORIES[rng.randrange(len(CATEGORIES))]})
        sim.add(Request(rid, [rng.randrange(100, 5000) for _ in range(PROMPT_TOKENS)], params, None))

    def execute(output: Any) -> None:
        buffer.__iadd__(1.0)  # the model's place: the requests leave the cache
        clock.t += modelled_step_s(output)
        for rid in output.num_scheduled_tokens:
            request = sim.requests[rid]
            if request.num_output_tokens >= lengths[rid]:
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                admit()

    sim = SimEngine(hook, k_max, None, scripts, execute=execute)
    sim.drafter = script_drafter(sim, lambda r: rng.randrange(0, 5))
    sim._counting_call()  # the patch's counting call, which the simulated update loop calls per drafted request
    timed(sim, "_count", "counting")
    for _ in range(n):
        admit()
    per_step: dict[str, list[float]] = {s: [] for s in (*SECTIONS, "total")}
    widths: list[int] = []
    prompt_steps = 0
    collections = GcTally()
    for i in range(WARMUP_STEPS + steps):
        if i == WARMUP_STEPS:
            collections.start()
        if reprice_every and i and i % reprice_every == 0:
            holder.install(repriced(policy, policy.version + i // reprice_every), clock())
        spent.clear()
        sim.step()
        for rid in [rid for rid, r in sim.requests.items() if r.is_finished()]:
            del sim.requests[rid], scripts[rid], lengths[rid]
        queue.drain(4096)  # the reporter's part, in its own thread on an engine
        if i < WARMUP_STEPS:
            continue
        output = sim.last_output
        widths.append(output.num_spec_tokens_to_schedule)
        prompt_steps += bool(output.scheduled_new_reqs)
        for section in SECTIONS:
            per_step[section].append(spent.get(section, 0) / 1e3)
        per_step["total"].append(sum(spent.get(s, 0) for s in SUMMED) / 1e3)
    collections.stop()
    budget = hook.widths.budget
    graph_steps, passes = hook.stats.batch_passes_large  # counted where the batch holds 128 requests or more
    return {
        "requests": n,
        "steps": steps,
        "cells": cells,
        "reprice_every": reprice_every,
        "median_us": {s: statistics.median(v) for s, v in per_step.items()},
        "mean_us": {s: statistics.fmean(v) for s, v in per_step.items()},
        "mean_width": statistics.fmean(widths),
        "prompt_step_share": prompt_steps / steps,
        "budget_full_steps": budget.full_step[1] if budget is not None else None,
        "counting_call_ns": hook.spec_call_ns,
        # steps whose before-section passed over the batch's requests (the rest reuse the last pass's counts),
        # from the hook's own counter, which covers batches of 128 requests or more (warm-up included)
        "batch_pass_share": passes / graph_steps if graph_steps else None,
        # the collector's pauses over the measured steps (inside whichever section allocated when one fell due)
        "gc_ms_per_step": collections.ms / steps,
        "gc_collections": collections.by_generation,
    }


class GcTally:
    """The garbage collector as a vLLM engine runs it: after warm-up the heap is collected and frozen
    (``vllm.utils.gc_utils.freeze_gc_heap``, called once the engine core is up), so a collection scans only what
    was allocated since; while started, each collection's pause is counted by generation. ``stop`` unfreezes."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.by_generation: dict[str, list[float]] = {}  # generation -> [collections, ms]
        self._began = 0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter_ns()
            return
        ms = (time.perf_counter_ns() - self._began) / 1e6
        tally = self.by_generation.setdefault(str(info["generation"]), [0, 0.0])
        tally[0] += 1
        tally[1] += ms
        self.ms += ms

    def start(self) -> None:
        for generation in (0, 1, 2):
            gc.collect(generation)
        gc.freeze()
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        gc.unfreeze()


def _worker(args: argparse.Namespace) -> int:
    rows = [measure(n, args.steps, args.length, args.cells, args.evict_mb, seed=args.seed,
                    reprice_every=args.reprice_every) for n in args.sizes]
    import specctl_vllm

    code = str(Path(specctl_vllm.__file__).resolve().parents[1])
    print(json.dumps([{**row, "code": code} for row in rows]))
    return 0


def _run_side(checkout: Path, args: argparse.Namespace, seed: int, scratch: Path) -> list[dict[str, Any]]:
    """One run in a fresh process with ``checkout``'s ``specctl_vllm`` and this benchmark's own ``bench`` and
    ``tests`` (a baseline may predate this module): the process starts in a folder that holds only a link to
    that package, ahead of this checkout on the path."""
    link = scratch / "specctl_vllm"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(checkout / "specctl_vllm", target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": f"{scratch}{os.pathsep}{ROOT}", "SPECCTL_CONTROLLER_URL": "off"}
    command = [sys.executable, "-m", "bench.hook_sections", "--worker", "--sizes", ",".join(map(str, args.sizes)),
               "--steps", str(args.steps), "--length", str(args.length), "--cells", args.cells,
               "--evict-mb", str(args.evict_mb), "--seed", str(seed), "--reprice-every", str(args.reprice_every)]
    done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"run from {checkout} failed ({done.returncode}): {done.stderr[-2000:]}")
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    if any(row["code"] != str(checkout.resolve()) for row in rows):
        raise RuntimeError(f"the run imported specctl_vllm from {rows[0]['code']}, not from {checkout}")
    return rows


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds of (baseline, this) or (this, baseline), alternating; per size the medians and paired ratios."""
    sides = {"this": (args.this or ROOT).resolve(), "baseline": args.baseline.resolve()}
    runs: dict[str, list[list[dict[str, Any]]]] = {"this": [], "baseline": []}
    with tempfile.TemporaryDirectory(prefix="hook-sections-") as scratch:
        for r in range(args.rounds):
            order = ("baseline", "this") if r % 2 == 0 else ("this", "baseline")
            for side in order:
                runs[side].append(_run_side(sides[side], args, seed=r, scratch=Path(scratch)))
            print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"N={row['requests']} this {this['median_us']['total']:.0f} us, "
                f"baseline {row['median_us']['total']:.0f} us"
                for row, this in zip(runs["baseline"][-1], runs["this"][-1])), flush=True)
    table = {}
    for i, n in enumerate(args.sizes):
        this = [run[i] for run in runs["this"]]
        base = [run[i] for run in runs["baseline"]]
        # the per-step median says what a typical step costs; the mean is what the engine's overhead share
        # adds up (a batch pass on one step in eight moves the mean, not the median)
        ratios = sorted(a["median_us"]["total"] / b["median_us"]["total"] for a, b in zip(this, base))
        mean_ratios = sorted(a["mean_us"]["total"] / b["mean_us"]["total"] for a, b in zip(this, base))
        table[str(n)] = {
            "this_total_us": statistics.median(r["median_us"]["total"] for r in this),
            "baseline_total_us": statistics.median(r["median_us"]["total"] for r in base),
            "ratio_median": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
            "this_mean_total_us": statistics.median(r["mean_us"]["total"] for r in this),
            "baseline_mean_total_us": statistics.median(r["mean_us"]["total"] for r in base),
            "mean_ratio_median": statistics.median(mean_ratios), "mean_ratio_min": mean_ratios[0],
            "mean_ratio_max": mean_ratios[-1],
            "this_sections_us": {s: statistics.median(r["median_us"][s] for r in this) for s in SECTIONS},
            "baseline_sections_us": {s: statistics.median(r["median_us"][s] for r in base) for s in SECTIONS},
            "this_sections_mean_us": {s: statistics.median(r["mean_us"][s] for r in this) for s in SECTIONS},
            "baseline_sections_mean_us": {s: statistics.median(r["mean_us"][s] for r in base) for s in SECTIONS},
            "this_batch_pass_share": _median_or_none(r["batch_pass_share"] for r in this),
            "baseline_batch_pass_share": _median_or_none(r["batch_pass_share"] for r in base),
            "this_mean_width": statistics.median(r["mean_width"] for r in this),
            "baseline_mean_width": statistics.median(r["mean_width"] for r in base),
            "this_runs": this, "baseline_runs": base,
        }
    return table


def _median_or_none(values: Any) -> float | None:
    """The median of the figures a run has (the hook counts batch passes only at 128 requests or more)."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256", help="running requests, comma-separated")
    parser.add_argument("--steps", type=int, default=400, help="measured steps per run (after a warm-up)")
    parser.add_argument("--length", type=int, default=128,
                        help="mean output tokens of a request (the H200 bench's 'spread' workload: 32-224)")
    parser.add_argument("--cells", choices=("h200", "flat"), default="flat",
                        help="the cell table: H200-like, or flat (every width costs K = 0's: the rule drafts)")
    parser.add_argument("--evict-mb", type=float, default=16.0, help="MB written where the model runs, per step")
    parser.add_argument("--reprice-every", type=int, default=8,
                        help="steps between two policy versions that move only the cells (0: none; the H200 at 256 "
                             "requests saw one every 8.5 steps)")
    parser.add_argument("--rounds", type=int, default=5, help="--baseline: pairs of runs")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of the project to compare")
    parser.add_argument("--this", type=Path, default=None,
                        help="--baseline: the checkout compared with it (default: this one)")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.sizes = request_sizes(parser, args.sizes)
    if not 4 <= args.length <= MAX_LENGTH:
        parser.error(f"--length must be 4 to {MAX_LENGTH} tokens")
    if not (1 <= args.steps <= MAX_STEPS and 1 <= args.rounds <= MAX_ROUNDS and args.reprice_every >= 0):
        parser.error(f"--steps must be 1 to {MAX_STEPS}, --rounds 1 to {MAX_ROUNDS}, --reprice-every at least 0")
    if args.sizes[-1] > MAX_REQUESTS:
        parser.error(f"--sizes: at most {MAX_REQUESTS} requests")
    if args.worker:
        return _worker(args)
    meta = {"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "steps": args.steps, "length": args.length, "cells": args.cells, "evict_mb": args.evict_mb,
            "reprice_every": args.reprice_every,
            "timer": "perf_counter_ns around the hook's methods and each counting call; medians over steps"}
    if args.baseline is not None:
        for flag, path in (("--baseline", args.baseline), ("--this", args.this or ROOT)):
            if not (path / "specctl_vllm").is_dir():
                parser.error(f"{flag} {path} is not a checkout of the project (no specctl_vllm/)")
        result = {**meta, "rounds": args.rounds, "baseline": str(args.baseline), "this": str(args.this or ROOT),
                  "sizes": compare(args)}
        for n, row in result["sizes"].items():
            print(f"N={n:>4}: per-step median: this {row['this_total_us']:.0f} us, baseline "
                  f"{row['baseline_total_us']:.0f} us, ratio {row['ratio_median']:.3f} ({row['ratio_min']:.3f}-"
                  f"{row['ratio_max']:.3f}); per-step mean: this {row['this_mean_total_us']:.0f} us, baseline "
                  f"{row['baseline_mean_total_us']:.0f} us, ratio {row['mean_ratio_median']:.3f} "
                  f"({row['mean_ratio_min']:.3f}-{row['mean_ratio_max']:.3f}); {args.rounds} pairs")
    else:
        rows = [measure(n, args.steps, args.length, args.cells, args.evict_mb, reprice_every=args.reprice_every)
                for n in args.sizes]
        result = {**meta, "runs": rows}
        for row in rows:
            print(f"N={row['requests']:>4} width {row['mean_width']:.1f}: " + ", ".join(
                f"{s} {row['median_us'][s]:.1f}" for s in (*SECTIONS, "total")) + " us (medians)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
