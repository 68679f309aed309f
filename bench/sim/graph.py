"""Graph-shaped simulator: one width per step, the step model is the measured cell table.

What the GPU cannot run every session, replayed on its measurements: every decoding slot of a step verifies the
step's width K (as on a graph-shaped engine), and a step costs its (batch bucket, K) cell of a
:class:`~specctl_vllm.kernel.model.cells.CellTable` filled from recorded telemetry (``--steps``: the specctl
engines' steps of ``bench/gpu/results/steady/``), plus the preset's per-token cost for the prompt tokens it
carries. Cells no recorded step measured come from the same table's calibrated prior: the JSON says per cell
how many steps measured it, and a result that rests on unmeasured cells is a statement about the prior, not
about the GPU.

Strategies: static widths (every step K, as a static-K engine) and ``specctl``: the controller (a fresh
:class:`~specctl_vllm.controller.core.brain.Brain`, cold start) fed the simulated telemetry, and the engine patch's own
:class:`~specctl_vllm.engine_patch.widths.WidthChooser` choosing each step's width from the policy it serves. Profiles
``high`` / ``low`` / ``mixed`` match the GPU benchmark's (conditional acceptance 0.85 / 0.45 at every position).

    python -m bench sim.graph --steps bench/gpu/results/steady/*.jsonl.gz --out bench/results/sim_graph_h200.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

from bench.sim.engine import SimEngine, StepResult
from bench.sim.profiles import FORMAT, Trace, parse
from bench.sim.strategies import Specctl
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.controller.core.learn.learner import cell_samples
from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
from specctl_vllm.engine_patch.telemetry import Aggregate, add_draft, new_entry
from specctl_vllm.engine_patch.widths import WidthChooser
from specctl_vllm.kernel.cost import PRESETS, CostCoefficients
from specctl_vllm.kernel.model.cells import CellTable, CellView
from specctl_vllm.kernel.protocol import StepRecord, TelemetryBatch

WIDTHS = (0, 1, 2, 4, 7)
BATCHES = (1, 4, 16, 64, 256)
PROFILE_SHARES = {"high": (1.0, 0.0), "low": (0.0, 1.0), "mixed": (0.5, 0.5)}
BETAS = {"high": 0.85, "low": 0.45}


def measured_cells(paths: list[Path]) -> CellTable:
    """The cell table of recorded telemetry (JSONL, gzip or plain) as the controller learns it: each engine's
    graph-shaped decode steps in the order they ran, those before a prompt step left out
    (:func:`~specctl_vllm.controller.core.learn.learner.cell_samples`)."""
    table = CellTable()
    for path in paths:
        per_engine: dict[tuple[str, str], list[StepRecord]] = {}
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            for line in fh:
                if line.strip():
                    b = TelemetryBatch.model_validate_json(line)
                    per_engine.setdefault((b.engine_id, b.boot_id), []).extend(b.steps)
        for steps in per_engine.values():
            for sample in cell_samples(steps)[0]:
                table.add(*sample)
    return table


def gpu_profile_trace(profile: str, k_max: int = 7, output_tokens: int = 128) -> Trace:
    shares = PROFILE_SHARES[profile]
    cats = [{"name": name, "share": share, "output_tokens": output_tokens, "heterogeneity": 0.0,
             "acceptance": {"engine": [BETAS[name]] * k_max}}
            for name, share in zip(("high", "low"), shares) if share > 0]
    return parse({"format": FORMAT, "name": f"gpu-{profile}", "engine": {"method": "eagle3", "k_max": k_max},
                  "prompt_tokens": 256, "categories": cats})


class GraphEngine(SimEngine):
    """Every decoding slot verifies the step's width; a step costs its cell plus its prompt tokens."""

    def __init__(self, trace: Trace, cells: CellView, prompt_cost: CostCoefficients, batch: int, seed: int,
                 noise: float = 0.03) -> None:
        super().__init__(trace, prompt_cost, batch, seed, noise)
        self.cells = cells

    def step_seconds(self, batch: int, tokens: int, depth: int, free_tokens: float, prefill_tokens: int) -> float:
        step_s, _ = self.cells.row(batch)
        return step_s[self.cells.widths.index(depth)] + self.truth.per_token * prefill_tokens

    def step_width(self, width: int) -> StepResult:
        res = self.step(np.full(self.batch, width), np.zeros(self.batch, dtype=int))
        res.width = width if res.prefill_tokens == 0 else None
        return res


class StaticWidth:
    def __init__(self, width: int) -> None:
        self.name = f"k{width}" if width else "plain"
        self.fixed = width

    def width(self, eng: GraphEngine, now: float) -> int:
        return self.fixed

    def observe(self, res: StepResult, now: float) -> None:
        pass


class GraphSpecctl(Specctl):
    """The controller in the loop, and the engine patch's width chooser picking each step's width."""

    name = "specctl"

    def __init__(self, trace: Trace, config: BrainConfig, seed: int, widths: tuple[int, ...] = WIDTHS) -> None:
        super().__init__(trace, config, seed)
        engine = EngineSpec(method=trace.engine_method, k_max=trace.k_max, full_cuda_graphs=True,
                            graph_widths=widths)
        self.spec = engine.to_protocol()
        self.holder = PolicyHolder(engine)
        self.policy = self.brain.policy_for(self.model, self.spec, 0.0, self.engine_id)
        self.table = self.holder.install(self.policy, 0.0)
        self.chooser = WidthChooser(widths, trace.k_max)

    def width(self, eng: GraphEngine, now: float) -> int:
        mix = Counter(self.names[c] for c in eng.cat)
        return self.chooser.choose(mix, self.table, eng.batch)

    def observe(self, res: StepResult, now: float) -> None:
        record = self._record(res, now).model_copy(update={"width": res.width, "interval_s": res.wall_s})
        self.pending.append(record)
        self.chooser.observe(self._aggregate(res))
        # the engine's measured check, fed as the hook feeds it: every timed step's width and committed tokens,
        # but for a step most of whose requests run prompt chunks
        if 2 * int(res.decoding.sum()) >= res.batch_size:
            width = res.width if res.width is not None else res.depth
            self.chooser.measured.observe(res.batch_size, width, int(res.committed.sum()), res.wall_s,
                                          self.chooser.measured_mix())
        if now - self.last_report >= self.report_s:
            version = self.policy.version
            self._report(now)
            if self.policy.version != version:
                self.table = self.holder.install(self.policy, now)

    def _aggregate(self, res: StepResult) -> Aggregate:
        agg: Aggregate = {}
        for slot in np.flatnonzero(res.k > 0):
            key = (self.names[res.cat[slot]], self.trace.engine_method)
            entry = agg.get(key)
            if entry is None:
                entry = agg[key] = new_entry()
            entry.requests += 1
            add_draft(entry.hists, int(res.k[slot]), int(res.accepted[slot]))
        return agg


def run_graph(trace: Trace, cells: CellView, cost: CostCoefficients, batch: int, strategy, requests: int,
              warmup: float, seed: int) -> dict:
    """Like :func:`bench.sim.run.run_one`: the same request sequence for every strategy (paired)."""
    eng = GraphEngine(trace, cells, cost, batch, seed)
    now = measured_t = 0.0
    tokens = 0
    widths: Counter[int] = Counter()
    warm_id = int(requests * warmup)
    first_pass_t = first_pass_tokens = 0.0
    while eng.next_id < requests:
        res = eng.step_width(strategy.width(eng, now))
        now += res.wall_s
        strategy.observe(res, now)
        committed = int(res.committed.sum())
        if eng.next_id <= warm_id:
            first_pass_t += res.wall_s
            first_pass_tokens += committed
        else:
            tokens += committed
            measured_t += res.wall_s
            if res.width is not None:
                widths[res.width] += 1
    return {"goodput": tokens / measured_t, "first_pass_goodput": first_pass_tokens / max(first_pass_t, 1e-12),
            "widths": {str(w): n for w, n in sorted(widths.items())}}


def cell_report(table: CellTable, view: CellView) -> list[dict]:
    return [{"batch_le": edge, "width": w, "step_ms": round(1000 * view.step_s[i][j], 3),
             "measured_steps": round(view.steps[i][j], 1)}
            for i, edge in enumerate(view.batch_edges) for j, w in enumerate(view.widths)]


def simulate(table: CellTable, preset: str, batches: tuple[int, ...], per_slot: int, warmup: float,
             seed: int) -> dict:
    cost = PRESETS[preset]
    view = table.view(WIDTHS, cost)
    out: dict = {"preset": preset, "widths": list(WIDTHS), "cells": cell_report(table, view), "profiles": {}}
    for profile in PROFILE_SHARES:
        trace = gpu_profile_trace(profile)
        rows = {}
        for b in batches:
            requests = max(400, per_slot * b)
            run_seed = seed * 1000 + b
            row = {}
            for strategy in [StaticWidth(w) for w in WIDTHS] + [None]:
                if strategy is None:
                    strategy = GraphSpecctl(trace, BrainConfig(LearnerSettings(), PolicySettings(cost_preset=preset)),
                                            seed=run_seed)
                row[strategy.name] = run_graph(trace, view, cost, b, strategy, requests, warmup, run_seed)
            best = max((n for n in row if n != "specctl"), key=lambda n: row[n]["goodput"])
            row["best_static"] = best
            row["specctl_vs_best"] = row["specctl"]["goodput"] / row[best]["goodput"]
            row["specctl_vs_plain"] = row["specctl"]["goodput"] / row["plain"]["goodput"]
            row["first_pass_vs_best"] = row["specctl"]["first_pass_goodput"] / row[best]["first_pass_goodput"]
            rows[str(b)] = row
        out["profiles"][profile] = rows
    return out


def render(result: dict) -> str:
    lines = ["profile  batch  best static      specctl/best  /plain  first pass/best  specctl widths"]
    for profile, rows in result["profiles"].items():
        for b, row in rows.items():
            best = row["best_static"]
            lines.append(f"{profile:7s} {b:>6s}  {best:6s} {row[best]['goodput']:8.0f}  {row['specctl_vs_best']:12.3f}"
                         f"  {row['specctl_vs_plain']:6.2f}  {row['first_pass_vs_best']:15.3f}  "
                         f"{row['specctl']['widths']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=Path, nargs="+", required=True, help="recorded telemetry (JSONL, .gz)")
    ap.add_argument("--preset", default="h200", choices=sorted(PRESETS))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--per-slot", type=int, default=12, help="requests admitted per batch slot")
    ap.add_argument("--warmup", type=float, default=0.3, help="share of the requests before the measured window")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    missing = [p for p in args.steps if not p.exists()]
    if missing:
        print(f"no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    table = measured_cells(args.steps)
    if not table.sums:
        print("no graph-shaped decode steps in the recorded telemetry", file=sys.stderr)
        return 2
    batches = tuple(int(x) for x in args.batches.split(",") if x.strip())
    result = simulate(table, args.preset, batches, args.per_slot, args.warmup, args.seed)
    result["steps_files"] = [str(p) for p in args.steps]
    print(render(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
