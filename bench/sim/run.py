"""Trace-driven simulator benchmark: specctl against static and adaptive baselines, batch 1..256.

For every batch size, on the same request stream (common random numbers), it runs: no speculation; each
fixed k in {1,2,3,4,6,8}; a vLLM-style batch-size k table; SGLang-style acceptance-EMA tiers; specctl
(the real Brain and goodput policy, fed with the simulated telemetry, applied per request with the real
adaptation rule); and the per-category hindsight oracle (the best static k and drafter per category,
ranked analytically from the true workload and cost, the top candidates simulated, the best kept).

Goodput = committed tokens / simulated time. Each run admits the same request sequence (common random
numbers) and is measured after a warm-up (the first ``warmup`` share of the requests, for every strategy
alike: specctl starts knowing nothing). Results go to bench/results/sim.json
and PNG plots beside it; the ratio table is printed.

    python -m bench sim                         # full run, H200 preset, built-in mixed trace
    python -m bench sim --quick                 # fewer steps and batch sizes (smoke)
    python -m bench sim --trace my.json --preset mi300x --mismatch 1.3
    python -m bench sim --engine-only --out bench/results/sim_engine_only.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.sim import oracle
from bench.sim.engine import SimEngine
from bench.sim.profiles import Trace, builtin_mixed, load, parse
from bench.sim.strategies import BatchTable, FixedK, NoSpec, SglangTiers, Specctl, Static, Strategy
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.kernel.cost import PRESETS, CostCoefficients

FIXED_KS = (1, 2, 3, 4, 6, 8)
TABLE_RANGES = ((1, 2), (3, 8), (9, 32), (33, 128), (129, 1024))
TARGETS = {"vs_oracle": 0.97, "vs_best_fixed": 1.00, "vs_table": 1.00, "vs_no_spec_at_256": 0.97}


def mismatched(cost: CostCoefficients, factor: float) -> CostCoefficients:
    """A machine unlike the preset: drafting ``factor`` x dearer, the knee earlier, per-request cost higher."""
    if factor == 1.0:
        return cost
    return replace(cost, draft_fixed=cost.draft_fixed * factor, draft_pass=cost.draft_pass * factor,
                   per_request=cost.per_request * factor, knee=cost.knee / factor,
                   per_token_above_knee=cost.per_token_above_knee * factor)


def run_one(trace: Trace, truth: CostCoefficients, batch: int, strategy: Strategy, requests: int, warmup: float,
            seed: int) -> dict:
    """Run until ``requests`` requests were admitted; measure from the admission of request warmup*requests.

    Every strategy admits the same request sequence (same seed), so the measured window covers nearly the
    same requests for all of them: the comparison is paired, not two samples of a noisy workload.
    """
    eng = SimEngine(trace, truth, batch, seed)
    now = measured_t = 0.0
    tokens = steps = 0
    per_cat = np.zeros(len(trace.categories))
    warm_id = int(requests * warmup)
    drafted = accepted = 0
    while eng.next_id < requests:
        k, m = strategy.choose(eng, now)
        res = eng.step(k, m)
        now += res.wall_s
        steps += 1
        strategy.observe(res, now)
        if eng.next_id > warm_id:
            tokens += int(res.committed.sum())
            measured_t += res.wall_s
            per_cat += np.bincount(res.cat, weights=res.committed, minlength=len(per_cat))
            drafted += int(res.k.sum())
            accepted += int(res.accepted.sum())
    return {
        "goodput": tokens / measured_t,
        "per_category": {c.name: float(v / measured_t) for c, v in zip(trace.categories, per_cat)},
        "sim_seconds": now, "measured_seconds": measured_t, "steps": steps, "tokens": tokens,
        "draft_tokens": drafted, "accepted_tokens": accepted,
    }


def requests_for(batch: int, per_slot: int, least: int) -> int:
    return max(least, per_slot * batch)


def batch_table(trace: Trace, exp: np.ndarray, cost: CostCoefficients, ks: list[int]) -> list[tuple[int, int, int]]:
    """The table an operator would configure after profiling: best single k at each range's middle."""
    table = []
    for lo, hi in TABLE_RANGES:
        mid = round(math.sqrt(lo * min(hi, 256)))
        table.append((lo, hi, oracle.best_common_k(trace, exp, cost, mid, ks)))
    return table


def brain_config(preset: str) -> BrainConfig:
    return BrainConfig(LearnerSettings(), PolicySettings(cost_preset=preset))


def simulate(trace: Trace, preset: str, truth: CostCoefficients, batches: list[int], per_slot: int,
             least: int, warmup: float, seed: int, oracle_top: int) -> dict:
    ks = [k for k in FIXED_KS if k <= trace.k_max]
    exp = oracle.category_expectations(trace)
    table = batch_table(trace, exp, truth, ks)
    results: dict[str, dict] = {}
    specctl_policy: dict[str, dict] = {}
    oracle_choice: dict[str, list] = {}
    jobs = [(b, s) for b in batches for s in ["no_spec", *[f"k={k}" for k in ks], "batch_table", "sglang_tiers",
                                              "specctl", "oracle"]]
    bar = tqdm(jobs, desc="sim", unit="run")
    for b, name in bar:
        bar.set_postfix(batch=b, strategy=name)
        n_req = requests_for(b, per_slot, least)
        run_seed = seed * 1000 + b
        if name == "oracle":
            best = None
            for _, choice in oracle.best_static(trace, exp, truth, b, top=oracle_top):
                r = run_one(trace, truth, b, Static("oracle", choice), n_req, warmup, run_seed)
                if best is None or r["goodput"] > best[0]["goodput"]:
                    best = (r, choice)
            r, choice = best
            oracle_choice[str(b)] = [{"category": c.name, "k": k, "method": trace.methods[m]}
                                     for c, (k, m) in zip(trace.categories, choice)]
        else:
            strategy: Strategy
            if name == "no_spec":
                strategy = NoSpec()
            elif name.startswith("k="):
                strategy = FixedK(int(name[2:]))
            elif name == "batch_table":
                strategy = BatchTable(table)
            elif name == "sglang_tiers":
                strategy = SglangTiers(trace.k_max)
            else:
                strategy = Specctl(trace, brain_config(preset), seed=run_seed)
            started = time.perf_counter()
            r = run_one(trace, truth, b, strategy, n_req, warmup, run_seed)
            r["cpu_seconds"] = time.perf_counter() - started
            if isinstance(strategy, Specctl):
                pol = strategy.policy
                specctl_policy[str(b)] = {
                    "versions": strategy.versions,
                    "categories": {c: {"k": p.k, "method": p.method, "adapt": [p.adapt.k_min, p.adapt.k_max],
                                       "probe_rate": p.probe_rate, "source": p.source}
                                   for c, p in pol.categories.items()},
                }
        results.setdefault(str(b), {})[name] = r
    return {"results": results, "table": table, "oracle_choice": oracle_choice, "specctl_policy": specctl_policy,
            "fixed_ks": ks}


def ratios(results: dict, ks: list[int]) -> dict:
    out = {}
    for b, rs in results.items():
        g = {name: r["goodput"] for name, r in rs.items()}
        best_fixed_name = max((f"k={k}" for k in ks), key=lambda n: g[n])
        s = g["specctl"]
        out[b] = {
            "vs_oracle": s / g["oracle"], "vs_best_fixed": s / g[best_fixed_name], "best_fixed": best_fixed_name,
            "vs_table": s / g["batch_table"], "vs_no_spec": s / g["no_spec"], "vs_sglang": s / g["sglang_tiers"],
            "oracle_vs_no_spec": g["oracle"] / g["no_spec"],
        }
    return out


def check_targets(r: dict) -> dict:
    worst = {key: min(v[key] for v in r.values()) for key in ("vs_oracle", "vs_best_fixed", "vs_table")}
    at256 = r.get("256", {}).get("vs_no_spec")
    met = {key: worst[key] >= TARGETS[key] for key in worst}
    if at256 is not None:
        met["vs_no_spec_at_256"] = at256 >= TARGETS["vs_no_spec_at_256"]
    return {"targets": TARGETS, "worst": worst, "vs_no_spec_at_256": at256, "met": met}


def print_table(out: dict) -> None:
    res, rat = out["results"], out["ratios"]
    head = (f"{'batch':>5} {'no_spec':>9} {'best fixed':>15} {'table':>9} {'sglang':>9} {'specctl':>9} {'oracle':>9}"
            f" | {'/oracle':>7} {'/fixed':>7} {'/table':>7} {'/nospec':>7} {'/sglang':>7}")
    print(head)
    print("-" * len(head))
    for b in res:
        g = {n: r["goodput"] for n, r in res[b].items()}
        r = rat[b]
        bf = r["best_fixed"]
        print(f"{b:>5} {g['no_spec']:>9.0f} {bf + ' ' + format(g[bf], '.0f'):>15} {g['batch_table']:>9.0f} "
              f"{g['sglang_tiers']:>9.0f} {g['specctl']:>9.0f} {g['oracle']:>9.0f} | {r['vs_oracle']:>7.3f} "
              f"{r['vs_best_fixed']:>7.3f} {r['vs_table']:>7.3f} {r['vs_no_spec']:>7.3f} {r['vs_sglang']:>7.3f}")
    t = out["targets"]
    print(f"\nworst specctl/oracle {t['worst']['vs_oracle']:.3f} (target >= {TARGETS['vs_oracle']}), "
          f"/best fixed k {t['worst']['vs_best_fixed']:.3f} (>= {TARGETS['vs_best_fixed']}), "
          f"/batch table {t['worst']['vs_table']:.3f} (>= {TARGETS['vs_table']})"
          + (f", /no spec at 256 {t['vs_no_spec_at_256']:.3f} (>= {TARGETS['vs_no_spec_at_256']})"
             if t["vs_no_spec_at_256"] is not None else ""))
    print("targets met:", t["met"])


def plot(out: dict, out_dir: Path, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = out["results"]
    batches = [int(b) for b in res]
    names = list(next(iter(res.values())).keys())
    fig, ax = plt.subplots(figsize=(8, 5))
    for n in names:
        y = [res[str(b)][n]["goodput"] / res[str(b)]["no_spec"]["goodput"] for b in batches]
        style = {"lw": 2.5} if n in ("specctl", "oracle") else {"lw": 1, "alpha": 0.7}
        ax.plot(batches, y, marker="o", label=n, **style)
    ax.set_xscale("log", base=2)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("batch size (concurrent requests)")
    ax.set_ylabel("goodput / no speculation")
    ax.set_title(f"simulated goodput, {out['trace']['name']} on {out['truth']}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    p1 = out_dir / f"{stem}_goodput.png"
    fig.savefig(p1, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    rat = out["ratios"]
    for key, label in (("vs_oracle", "specctl / oracle"), ("vs_best_fixed", "specctl / best fixed k"),
                       ("vs_table", "specctl / batch table"), ("vs_no_spec", "specctl / no spec")):
        ax.plot(batches, [rat[str(b)][key] for b in batches], marker="o", label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.97, color="red", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("ratio")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p2 = out_dir / f"{stem}_ratios.png"
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    return [str(p1), str(p2)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", help="specctl-sim-trace/1 JSON (default: built-in mixed workload)")
    ap.add_argument("--preset", default="h200", choices=sorted(PRESETS), help="cost preset the controller starts from")
    ap.add_argument("--truth", default=None, choices=sorted(PRESETS), help="simulated machine (default: --preset)")
    ap.add_argument("--mismatch", type=float, default=1.0, help="make the machine differ from its preset by this factor")
    ap.add_argument("--engine-only", action="store_true",
                    help="drop the model-free drafters: only per-category k of the engine's own drafter differs")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--per-slot", type=int, default=20, help="requests per run = max(least, per_slot x batch)")
    ap.add_argument("--least", type=int, default=500, help="fewest requests per run (small batches)")
    ap.add_argument("--warmup", type=float, default=0.2, help="share of requests not measured (every strategy)")
    ap.add_argument("--oracle-top", type=int, default=3)
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 batch sizes, few steps")
    ap.add_argument("--out", default="bench/results/sim.json")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.batch_sizes, a.per_slot, a.least = "1,16,256", 4, 120
    trace = load(a.trace) if a.trace else parse(builtin_mixed())
    if a.engine_only:
        trace = replace(trace, name=trace.name + "-engine-only", model_free_methods=(),
                        categories=tuple(replace(c, betas={"engine": c.betas["engine"]}) for c in trace.categories))
    truth_name = a.truth or a.preset
    truth = mismatched(PRESETS[truth_name], a.mismatch)
    batches = [int(x) for x in a.batch_sizes.split(",")]
    started = time.perf_counter()
    sim = simulate(trace, a.preset, truth, batches, a.per_slot, a.least, a.warmup, a.seed, a.oracle_top)
    out = {
        "benchmark": "specctl trace-driven simulator",
        "trace": {"name": trace.name, "source": trace.source, "engine_method": trace.engine_method,
                  "k_max": trace.k_max, "categories": [{"name": c.name, "share": c.share, "output_tokens":
                                                        c.output_tokens, "heterogeneity": c.heterogeneity,
                                                        "betas": {m: [round(float(x), 4) for x in v]
                                                                  for m, v in c.betas.items()}}
                                                       for c in trace.categories]},
        "preset": a.preset, "truth": truth_name + (f" x{a.mismatch} mismatch" if a.mismatch != 1.0 else ""),
        "truth_cost": truth.to_dict(), "batch_sizes": batches, "seed": a.seed, "warmup": a.warmup,
        "requests_per_run": {str(b): requests_for(b, a.per_slot, a.least) for b in batches}, **sim,
    }
    out["ratios"] = ratios(out["results"], sim["fixed_ks"])
    out["targets"] = check_targets(out["ratios"])
    out["wall_seconds"] = time.perf_counter() - started
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not a.no_plots:
        out["plots"] = plot(out, path.parent, path.stem)
    path.write_text(json.dumps(out, indent=1))
    print_table(out)
    print(f"\nwrote {path}" + ("" if a.no_plots else " and " + ", ".join(out["plots"])))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
