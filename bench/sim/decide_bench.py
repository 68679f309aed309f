"""Micro benchmark of the goodput policy: decide() latency per category (target <= 1 ms per category).

Snapshots with 4, 16 and 64 categories, k_max 8, the engine's drafter plus n-gram and suffix, every drafter
with evidence (the most expensive case: every option is open). Prints median and p99 wall time per
decision and per category, and the median CPU time (process_time: not inflated by waiting for a CPU on a
busy machine); the machine's load average goes into bench/results/decide.json with the figures.

    python -m bench sim.decide
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from specctl_vllm.controller.core.config import PolicySettings
from specctl_vllm.controller.core.policy import goodput
from specctl_vllm.controller.core.policy.types import CategoryInput, MethodProfile, PolicySnapshot
from specctl_vllm.kernel.cost import PRESETS


def snapshot(categories: int, batch: float, k_max: int, seed: int) -> PolicySnapshot:
    rng = np.random.default_rng(seed)
    methods = ("draft_model", "ngram", "suffix")
    cats = []
    for c in range(categories):
        profiles = tuple(MethodProfile(m, tuple(np.clip(rng.uniform(0.1, 0.95) - 0.02 * np.arange(k_max), 0.01, 1)),
                                       1e4, m != "draft_model", m != "draft_model") for m in methods)
        cats.append(CategoryInput(f"c{c}", batch / categories, profiles))
    return PolicySnapshot(tuple(cats), cats[0].profiles, batch, 16.0, PRESETS["h200"], k_max, "draft_model", methods)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="decide() latency")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", default="bench/results/decide.json")
    a = ap.parse_args(argv)
    cfg = PolicySettings(cost_preset="h200")
    rows = []
    cases = [(c, b) for c in (4, 16, 64) for b in (1, 32, 256)]
    for cats, batch in tqdm(cases, desc="decide", unit="case"):
        snap = snapshot(cats, float(batch), 8, seed=cats * 1000 + batch)
        goodput.decide(snap, cfg)  # warm
        times, cpu = [], []
        for _ in range(a.repeats):
            t, c = time.perf_counter(), time.process_time()
            goodput.decide(snap, cfg)
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        times.sort()
        med, p99 = statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))]
        cpu_med = statistics.median(cpu)
        rows.append({"categories": cats, "batch": batch, "median_ms": med * 1e3, "p99_ms": p99 * 1e3,
                     "median_ms_per_category": med * 1e3 / cats, "p99_ms_per_category": p99 * 1e3 / cats,
                     "cpu_median_ms_per_category": cpu_med * 1e3 / cats})
    # wall time includes waiting for a CPU on a busy machine; CPU time (process_time) does not
    print(f"{'cats':>5} {'batch':>5} {'median ms':>10} {'p99 ms':>8} {'ms/cat med':>11} {'ms/cat p99':>11} "
          f"{'cpu ms/cat':>11}")
    for r in rows:
        print(f"{r['categories']:>5} {r['batch']:>5} {r['median_ms']:>10.2f} {r['p99_ms']:>8.2f} "
              f"{r['median_ms_per_category']:>11.3f} {r['p99_ms_per_category']:>11.3f} "
              f"{r['cpu_median_ms_per_category']:>11.3f}")
    worst = max(r["p99_ms_per_category"] for r in rows)
    worst_median = max(r["median_ms_per_category"] for r in rows)
    worst_cpu = max(r["cpu_median_ms_per_category"] for r in rows)
    load = os.getloadavg()[0]
    print(f"worst median per category {worst_median:.3f} ms (CPU {worst_cpu:.3f} ms), worst p99 {worst:.3f} ms "
          f"(target <= 1 ms): "
          f"{'met' if worst <= 1.0 else 'MISSED'}; load average {load:.1f} on {os.cpu_count()} CPUs")
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "goodput decide() latency", "target_ms_per_category": 1.0,
                                "rows": rows, "worst_p99_ms_per_category": worst,
                                "worst_median_ms_per_category": worst_median,
                                "worst_cpu_median_ms_per_category": worst_cpu,
                                "machine": {"cpus": os.cpu_count(), "load_average_1m": load,
                                            "python": platform.python_version(), "processor": platform.machine()}},
                               indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
