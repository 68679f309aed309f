"""Cost of the engine patch per engine step, at 1..256 running requests, as a share of step time.

Two measurements, side by side, into ``bench/results/overhead.json``:

* **engine** -- a real vLLM CPU engine (SmolLM2-135M-Instruct, float32, n-gram k=4) in this process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with ``SpecctlScheduler`` and an active per-category policy
  (adaptive k for most categories, the patch's suffix drafter for one, the default counterfactual budget).
  N requests with ``ignore_eos`` keep the batch at N; the hook times its own sections with
  ``perf_counter_ns`` (:class:`specctl_vllm.engine_patch.hook_stats.HookStats`); step time is ``schedule()`` start to
  ``update_from_output()`` end. Reported per step: the hook's total, its counterfactual scoring and its
  model-free drafting (the suffix method's own cost, like vLLM's n-gram drafter: not overhead), and
  ``overhead = (hook - drafting) / step`` against the 1 % target.
* **micro** -- the same hook on synthetic ``vllm.v1.request.Request`` objects driven by
  :class:`bench.support.engine_sim.SimEngine` (no model), N = 1..256, timed in CPU time of the process
  (``process_time_ns``): the hook's own cost without the noise of a real step or of other processes, divided
  by the engine's measured step time at the same N.

Usage: ``python -m bench overhead [--sizes 1,2,4,...,256] [--tokens 32] [--skip-engine] [--skip-micro]``
(a skipped part keeps its rows from the existing results file).
The reporter thread is off (``SPECCTL_CONTROLLER_URL=off``): it runs beside the engine loop, not in it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "overhead.json"
GRAPH_RESULTS = ROOT / "bench" / "results" / "overhead_graph.json"
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TARGET_SHARE = 0.01


class SampledStats:
    """HookStats that also keeps every step's (batch, hook ns, step ns): medians resist the scheduler noise of
    a shared machine (a descheduled process inflates one step, not the median)."""

    def __new__(cls) -> Any:
        from specctl_vllm.engine_patch.hook_stats import HookStats

        class _Sampled(HookStats):
            def __init__(self) -> None:
                super().__init__()
                self.samples: list[tuple[int, int, int]] = []

            def record(self, batch: int, hook_ns: int, wall_ns: int) -> None:
                super().record(batch, hook_ns, wall_ns)
                self.samples.append((batch, hook_ns, wall_ns))

        return _Sampled()


def request_sizes(parser: argparse.ArgumentParser, raw: str) -> list[int]:
    """``--sizes`` as sorted distinct request counts, each at least 1; anything else is a usage error (exit 2)."""
    try:
        sizes = sorted({int(s) for s in raw.split(",") if s.strip()})
    except ValueError:
        parser.error(f"--sizes takes comma-separated request counts, not {raw!r}")
    if not sizes or sizes[0] < 1:
        parser.error("--sizes needs at least one request count, each at least 1")
    return sizes


def median(values: list[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def bench_policy() -> Any:
    """Adaptive k for every category, the patch's suffix drafter for code edits, speculation off for prose."""
    from specctl_vllm.kernel import protocol as p

    adaptive = p.AdaptRule(k_min=0, k_max=4)
    return p.Policy(
        version=1, issued_at=time.time(), ttl_s=3600.0,
        default=p.CategoryPolicy(k=3, adapt=adaptive),
        categories={
            "code_edit": p.CategoryPolicy(k=4, method="suffix", adapt=adaptive),
            "summarise": p.CategoryPolicy(k=4, adapt=adaptive),
            "json": p.CategoryPolicy(k=2, adapt=p.AdaptRule(k_min=1, k_max=4)),
            "prose": p.CategoryPolicy(k=0, probe_rate=0.05, probe_k=1),
        },
    )


def graph_policy(flat_cells: bool = False) -> Any:
    """A graph-shaped engine's policy: E_c(K) per category and an H200-like cell table for the width rule
    (``flat_cells``: every width costs what K = 0 costs, so every step verifies K = 7)."""
    from specctl_vllm.kernel import protocol as p
    from specctl_vllm.kernel.model.cells import BATCH_EDGES
    from specctl_vllm.kernel.model.widths import geometric_lengths

    base = bench_policy()
    widths = list(GRAPH_ENGINE_WIDTHS)
    curves = {"code_edit": 0.9, "summarise": 0.7, "json": 0.85, "prose": 0.45}
    cells = p.StepCells(
        batch_edges=list(BATCH_EDGES), widths=widths,
        step_s=[[(4.5 + 0.02 * e) * (1 if flat_cells else 1 + 0.12 * w + 0.002 * e * w) / 1e3 for w in widths]
                for e in BATCH_EDGES],
        steps=[[1000.0] * len(widths) for _ in BATCH_EDGES])
    categories = {name: cp.model_copy(update={"expected": list(geometric_lengths(curves[name], 7))})
                  for name, cp in base.categories.items()}
    return base.model_copy(update={"categories": categories, "step_cells": cells})


GRAPH_ENGINE_WIDTHS = (0, 1, 2, 4, 7)


# -- real engine -------------------------------------------------------------------------------------------

def engine_run(model_dir: Path, sizes: list[int], tokens: int) -> list[dict[str, Any]]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "3")
    os.environ["SPECCTL_CONTROLLER_URL"] = "off"
    from vllm import LLM, SamplingParams

    from bench.support.vllm_server import NGRAM
    from bench.support.workload import build_workload

    llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, max_model_len=1024,
              max_num_seqs=max(sizes), speculative_config=dict(NGRAM), seed=0,
              scheduler_cls="specctl_vllm.engine_patch.scheduler.SpecctlScheduler")
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    runtime = scheduler._specctl
    hook = runtime.hook
    prompts = build_workload(per_category=max(1, max(sizes) // 8 + 1))
    rows = []
    for n in sizes:
        batch = (prompts * (n // len(prompts) + 1))[:n]
        params = [SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True,
                                 extra_args={"specctl_category": p.category}) for p in batch]
        hook.holder.install(bench_policy(), time.monotonic())
        hook.stats = SampledStats()
        started = time.monotonic()
        llm.chat([p.messages for p in batch], params, use_tqdm=False)
        elapsed = time.monotonic() - started
        stats = hook.stats
        at_n = stats.by_batch.get(n, [0, 0, 0])
        full = [(h, w) for b, h, w in stats.samples if b == n]
        row = {
            "requests": n,
            "steps": stats.steps,
            "steps_at_n": at_n[0],
            "hook_us_per_step": stats.hook_ns / max(stats.steps, 1) / 1e3,
            "counterfactual_us_per_step": stats.cf_ns / max(stats.steps, 1) / 1e3,
            "drafting_us_per_step": stats.draft_ns / max(stats.steps, 1) / 1e3,
            "step_ms": stats.wall_ns / max(stats.steps, 1) / 1e6,
            "hook_us_per_step_at_n": at_n[1] / max(at_n[0], 1) / 1e3,
            "step_ms_at_n": at_n[2] / max(at_n[0], 1) / 1e6,
            "median_hook_us_at_n": median([h / 1e3 for h, _ in full]),
            "median_step_ms_at_n": median([w / 1e6 for _, w in full]),
            "counterfactual_scored": stats.cf_scored,
            "run_s": elapsed,
        }
        row["overhead_share"] = (stats.hook_ns - stats.draft_ns) / max(stats.wall_ns, 1)
        row["hook_errors"] = dict(runtime.errors)
        rows.append(row)
        print(f"engine  N={n:4d}  steps={row['steps']:4d}  step={row['step_ms']:8.2f} ms  "
              f"hook={row['hook_us_per_step']:8.1f} us (cf {row['counterfactual_us_per_step']:6.1f}, "
              f"drafting {row['drafting_us_per_step']:7.1f})  overhead={100 * row['overhead_share']:.3f} %",
              flush=True)
    return rows


# -- synthetic requests ------------------------------------------------------------------------------------

def micro_run(sizes: list[int], steps: int = 200, graph: bool = False, engine_loop: bool = True,
              evict_bytes: int = 0, quiet: bool = False, flat_cells: bool = False,
              perf_ns: Any = time.process_time_ns) -> list[dict[str, Any]]:
    """``engine_loop``: graph-shaped engines count drafted requests in vLLM's own update loop, as the runtime
    does on every supported vLLM (False: the patch's own pass over the batch). ``evict_bytes``: between
    ``after_schedule`` and ``observe`` (where the model runs) write a buffer of that size, so the hook meets
    the engine's requests out of cache, as it does in a real engine process."""
    import numpy as np
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from bench.support.engine_sim import SimEngine, script_drafter
    from bench.support.workload import CATEGORIES
    from specctl_vllm.engine_patch.hook import SpecHook
    from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
    from specctl_vllm.engine_patch.telemetry import StepQueue

    if graph:  # one width per step from the width rule (model runner V2 on a GPU)
        engine = EngineSpec(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=GRAPH_ENGINE_WIDTHS)
    else:
        engine = EngineSpec(method="ngram", k_max=4, model_free_methods=("suffix",))
    rows = []
    for n in sizes:
        rng = random.Random(n)
        holder = PolicyHolder(engine)
        holder.install(graph_policy(flat_cells) if graph else bench_policy(), time.monotonic())
        # CPU time of this process, not wall time: on a shared machine a descheduled process would otherwise
        # charge other processes' work to the hook.
        # graph-shaped: model runner V2 under async scheduling, as on the GPU
        hook = SpecHook(engine, holder, StepQueue(100_000), overhead_budget=0.0, perf_ns=perf_ns, async_mode=graph)
        hook.drafts_from_engine_loop = graph and engine_loop
        if hook.drafts_from_engine_loop:  # as the runtime prices vLLM's counting calls at start-up
            from specctl_vllm.engine_patch.hook import counting_call_ns

            hook.spec_call_ns = counting_call_ns()
        scripts: dict[str, list[int]] = {}
        buffer = np.zeros(max(evict_bytes // 8, 1))

        def evict(_output: Any, buffer: Any = buffer) -> None:
            if evict_bytes:
                buffer += 1.0

        sim = SimEngine(hook, engine.k_max, None, scripts, execute=evict)
        sim.drafter = script_drafter(sim, lambda r, rng=rng: rng.randrange(0, 5))
        for i in range(n):
            rid = f"bench-{n}-{i}"
            category = CATEGORIES[i % len(CATEGORIES)]
            prompt = [rng.randrange(100, 5000) for _ in range(64)]
            scripts[rid] = [rng.randrange(100, 5000) for _ in range(steps * 6 + 64)]
            params = SamplingParams(max_tokens=10**6, extra_args={"specctl_category": category})
            sim.add(Request(rid, prompt, params, None))
        for _ in range(10):  # warm-up: prefill and first drafts
            sim.step()
        hook.stats = SampledStats()
        count = max(20, steps // max(1, n // 16))
        widths = []
        for _ in range(count):
            sim.step()
            widths.append(sim.last_output.num_spec_tokens_to_schedule)
        stats = hook.stats
        row = {"requests": n, "steps": stats.steps,
               "hook_us_per_step": stats.hook_ns / stats.steps / 1e3,
               "median_hook_us_per_step": median([h / 1e3 for _, h, _ in stats.samples]),
               "drafting_us_per_step": stats.draft_ns / stats.steps / 1e3,
               "hook_ns_per_request": (stats.hook_ns - stats.draft_ns) / stats.steps / n}
        rows.append(row)
        row["graph_shaped"] = graph
        row["engine_loop"] = graph and engine_loop
        row["evict_bytes"] = evict_bytes
        row["mean_width"] = sum(widths) / len(widths)
        if quiet:
            continue
        print(f"micro{' graph' if graph else ''}   N={n:4d}  hook={row['hook_us_per_step']:8.1f} us/step "
              f"(drafting {row['drafting_us_per_step']:7.1f})  {row['hook_ns_per_request']:6.0f} ns/request",
              flush=True)
    return rows


def graph_ab(sizes: list[int], rounds: int, evict_bytes: int, steps: int = 400) -> dict[str, Any]:
    """The graph-shaped hook with drafts counted in vLLM's loop against the patch's own pass, side by side:
    per cell table, size and round both variants run back to back (alternating which goes first); per variant
    the median over rounds of each run's median per-step hook time, and the median of the paired ratios.
    Timed with ``perf_counter_ns``, the engine's own clock (the vLLM-loop variant reads it twice per drafted
    request; a CPU-time clock is a system call); per-step medians keep a descheduled step out."""
    out: dict[str, Any] = {"rounds": rounds, "evict_bytes": evict_bytes, "timer": "perf_counter_ns",
                           "cells": {}}
    for cells, flat in (("h200-like", False), ("flat (K = 7)", True)):
        table: dict[str, Any] = {}
        for n in sizes:
            runs: dict[bool, list[float]] = {True: [], False: []}
            widths: dict[bool, float] = {}
            for r in range(rounds):
                for loop in ((True, False) if r % 2 == 0 else (False, True)):
                    row = micro_run([n], steps=steps, graph=True, engine_loop=loop, evict_bytes=evict_bytes,
                                    quiet=True, flat_cells=flat, perf_ns=time.perf_counter_ns)[0]
                    runs[loop].append(row["median_hook_us_per_step"])
                    widths[loop] = row["mean_width"]
            ratios = sorted(a / b for a, b in zip(runs[True], runs[False]))
            entry = {"mean_width": widths[True], "engine_loop_us": median(runs[True]),
                     "patch_pass_us": median(runs[False]), "engine_loop_runs_us": runs[True],
                     "patch_pass_runs_us": runs[False], "ratio_median": median(ratios), "ratio_min": ratios[0],
                     "ratio_max": ratios[-1]}
            table[str(n)] = entry
            print(f"graph A/B {cells:13s} N={n:4d} width {entry['mean_width']:.1f}: vLLM loop "
                  f"{entry['engine_loop_us']:7.1f} us/step, patch pass {entry['patch_pass_us']:7.1f} us/step, "
                  f"ratio {entry['ratio_median']:.2f} ({entry['ratio_min']:.2f}-{entry['ratio_max']:.2f}, "
                  f"{rounds} pairs)", flush=True)
        out["cells"][cells] = table
    return out


def combine(engine_rows: list[dict], micro_rows: list[dict]) -> list[dict[str, Any]]:
    by_n = {r["requests"]: r for r in engine_rows}
    table = []
    for m in micro_rows:
        e = by_n.get(m["requests"])
        row = {"requests": m["requests"], "micro_overhead_us": m["hook_us_per_step"] - m["drafting_us_per_step"]}
        if e is not None:
            row["engine_step_ms"] = e["step_ms"]
            row["engine_overhead_us"] = e["hook_us_per_step"] - e["drafting_us_per_step"]
            row["engine_overhead_share"] = e["overhead_share"]
            row["micro_overhead_share"] = row["micro_overhead_us"] / 1e3 / e["step_ms"]
        table.append(row)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="converted model folder (default: the cache)")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="running requests per run")
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request in the engine runs")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-micro", action="store_true")
    parser.add_argument("--graph", action="store_true",
                        help="micro runs only, of a graph-shaped engine (one width per step, the width rule): "
                             "drafts counted in vLLM's loop against the patch's own pass, side by side")
    parser.add_argument("--rounds", type=int, default=5, help="--graph: pairs of runs per size")
    parser.add_argument("--evict-mb", type=float, default=64.0,
                        help="--graph: MB written between schedule and update each step (the model's place)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",")})

    if args.graph:
        evict = int(args.evict_mb * 2**20)
        ab = graph_ab(sizes, args.rounds, evict)
        GRAPH_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        GRAPH_RESULTS.write_text(json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                             "timer": "process_time_ns (CPU time of the process)",
                                             "load_average": os.getloadavg(), "graph_ab": ab}, indent=1))
        print(f"wrote {GRAPH_RESULTS}")
        return 0

    from bench.support.stack import model_dir

    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    now = {"load_average": os.getloadavg(), "sizes": sizes, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    # A skipped part keeps its rows (and their run's metadata) from the previous results file, so the two parts
    # can be rerun separately.
    if args.skip_engine:
        engine_rows, engine_meta = previous.get("engine", []), previous.get("meta", {}).get("engine")
    else:
        engine_rows = engine_run(model_dir(args.model), sizes, args.tokens)
        engine_meta = {**now, "tokens_per_request": args.tokens, "timer": "perf_counter_ns (wall)"}
    if args.skip_micro:
        micro_rows, micro_meta = previous.get("micro", []), previous.get("meta", {}).get("micro")
    else:
        micro_rows = micro_run(sizes)
        micro_meta = {**now, "timer": "process_time_ns (CPU time of the process)"}
    table = combine(engine_rows, micro_rows)
    worst = max((r.get("engine_overhead_share", 0.0) for r in table), default=None)
    result = {
        "target_share": TARGET_SHARE,
        "worst_engine_overhead_share": worst,
        "meets_target": None if worst is None or not engine_rows else worst <= TARGET_SHARE,
        "engine": engine_rows,
        "micro": micro_rows,
        "side_by_side": table,
        "meta": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "engine": engine_meta, "micro": micro_meta},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("\n requests | engine step ms | overhead us (engine) | share (engine) | overhead us (micro) | share (micro)")
    for r in table:
        print(f" {r['requests']:8d} | {r.get('engine_step_ms', float('nan')):14.2f} | "
              f"{r.get('engine_overhead_us', float('nan')):20.1f} | {100 * r.get('engine_overhead_share', float('nan')):13.3f}% | "
              f"{r['micro_overhead_us']:19.1f} | {100 * r.get('micro_overhead_share', float('nan')):12.3f}%")
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
