"""Refit the ``cpu`` step-cost preset from the CPU benchmark's recorded engine steps, and score both fits.

The fit itself is :func:`bench.sim.fit_presets.fit_steps` (non-negative least squares of the step-cost model
of kernel/cost.py on every recorded step, absolute seconds), the same as
``python -m bench sim.fit_presets --steps FILE``; this module only gathers the telemetry files the benchmark
left (every patched engine: specctl, ema_tiers, oracle pins, specctl variants; warm-ups included), and
reports (with knee 0 the two per-token terms are one feature: the refit's are summed into ``per_token``)
how well the refit and the preset in the code (``specctl_vllm.kernel.cost.PRESETS["cpu"]``) predict the
same steps: rms error in milliseconds, rms and median relative error, and the mean measured vs predicted
step time per batch size and per drafted-token bucket.

    python -m bench cpu.costfit                       # writes bench/results/cpu_cost_fit.json
    python -m bench cpu.costfit --telemetry DIR --knee 0 --out FILE
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

from bench.sim.fit_presets import fit_steps
from specctl_vllm.kernel.cost import PRESETS, CostCoefficients, step_shape
from specctl_vllm.kernel.protocol import TelemetryBatch

TELEMETRY = ROOT / "bench" / "results" / "tmp" / "cpu_engine" / "telemetry"
OUT = ROOT / "bench" / "results" / "cpu_cost_fit.json"


def steps_of(lines: list[str]) -> list[tuple[float, float, float, float, float, float]]:
    """(n, tokens, depth, free draft tokens, draft tokens, measured seconds) of every usable step."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        b = TelemetryBatch.model_validate_json(line)
        for s in b.steps:
            n, tok, depth, free = step_shape(s, b.spec.method)
            if n > 0 and s.wall_s > 0:
                out.append((n, tok, depth, free, float(s.draft_tokens), s.wall_s))
    return out


def score(cost: CostCoefficients, steps) -> dict:
    y = np.array([s[5] for s in steps])
    p = np.array([cost.step_time(s[0], s[1], s[2], s[3]) for s in steps])
    rel = p / y - 1.0
    return {"rms_ms": float(np.sqrt(np.mean((p - y) ** 2)) * 1e3), "rms_rel": float(np.sqrt(np.mean(rel ** 2))),
            "median_abs_rel": float(np.median(np.abs(rel))), "mean_measured_ms": float(y.mean() * 1e3),
            "mean_predicted_ms": float(p.mean() * 1e3)}


def breakdown(costs: dict[str, CostCoefficients], steps, key) -> dict:
    groups: dict[str, list] = defaultdict(list)
    for s in steps:
        groups[key(s)].append(s)
    out = {}
    for g, ss in sorted(groups.items(), key=lambda kv: float(kv[0].split("-")[0])):
        y = float(np.mean([s[5] for s in ss]) * 1e3)
        out[g] = {"steps": len(ss), "measured_ms": round(y, 3),
                  **{f"{name}_ms": round(float(np.mean([c.step_time(s[0], s[1], s[2], s[3]) for s in ss]) * 1e3), 3)
                     for name, c in costs.items()}}
    return out


def _batch_bucket(s) -> str:
    n = int(s[0])
    return str(n) if n <= 8 else "9-16" if n <= 16 else "17-256"


def _draft_bucket(s) -> str:
    d = int(s[4])
    for lo, hi in ((0, 0), (1, 8), (9, 16), (17, 32), (33, 64)):
        if lo <= d <= hi:
            return f"{lo}-{hi}"
    return "65-2048"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--telemetry", default=str(TELEMETRY), help="folder of TelemetryBatch JSON lines files")
    ap.add_argument("--knee", type=float, default=0.0, help="knee (tokens) of the fit; 0 for a compute-bound CPU")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    files = sorted(Path(a.telemetry).glob("*.jsonl"))
    lines = [line for f in files for line in f.read_text().splitlines() if line.strip()]
    steps = steps_of(lines)
    fitted = fit_steps(lines, a.knee)
    if a.knee <= 0:  # knee 0: per_token and per_token_above_knee are one feature; the fit splits it evenly
        fitted = replace(fitted, per_token=fitted.per_token + fitted.per_token_above_knee, per_token_above_knee=0.0)
    preset = PRESETS["cpu"]
    costs = {"fit": fitted, "preset": preset}
    per_file = {}
    for f in files:
        ss = steps_of(f.read_text().splitlines())
        if ss:
            per_file[f.name] = {"steps": len(ss), "fit": score(fitted, ss), "preset": score(preset, ss)}
    doc = {
        "what": "cpu step-cost preset refitted from the CPU engine benchmark's recorded steps "
                "(bench.sim.fit_presets.fit_steps: non-negative least squares, absolute seconds, every step)",
        "command": f"python -m bench.cpu.costfit --knee {a.knee:g}  (== python -m bench.sim.fit_presets --steps "
                   "<all telemetry files concatenated> --knee 0)",
        "telemetry_files": [f.name for f in files],
        "steps": len(steps),
        "fitted": fitted.to_dict(),
        "preset_in_code": preset.to_dict(),
        "score": {"fit": score(fitted, steps), "preset": score(preset, steps)},
        "per_file": per_file,
        "by_batch_size": breakdown(costs, steps, _batch_bucket),
        "by_draft_tokens": breakdown(costs, steps, _draft_bucket),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: doc[k] for k in ("steps", "fitted", "preset_in_code", "score")}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
