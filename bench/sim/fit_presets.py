"""Derive the ``h200`` step-cost preset from measured vLLM runs (and refit any preset from engine steps).

Input: bench/sim/data/h200_vllm026_static_k.jsonl -- 40 offline runs of vLLM 0.26 on one H200
(Llama-3-8B-shaped target, 4-layer draft model, 256-token prompts, 128 output tokens per request,
concurrency c in 1..256, k in {0, 1, 2, 4, 7}), each with total seconds and vLLM's draft counters.

Model of one run (c requests decode in lock-step; S = drafts / c verify steps per request, or 127 without
speculation; every request prefills 256 tokens):

    seconds = S * T(c, N = c(1 + k), d = k) + prefill_per_token * 256 c + run_overhead

with T the step-cost model of kernel/cost.py (verify + drafting terms, free drafting unused).
For each knee on a 16-token grid the coefficients are a non-negative least-squares fit of the relative
error (every row divided by its measured seconds); the knee with the lowest rms wins. Printed: the
coefficients (as in specctl_vllm.kernel.cost.H200), the rms relative error and the per-run residuals.

    python -m bench sim.fit_presets                 # refit and compare with the preset in the code
    python -m bench sim.fit_presets --steps FILE    # fit T directly from recorded engine steps (JSON lines
                                                    # of TelemetryBatch, e.g. from the CPU engine)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from specctl_vllm.kernel.cost import H200, CostCoefficients, step_shape
from specctl_vllm.kernel.protocol import TelemetryBatch

DATA = Path(__file__).parent / "data" / "h200_vllm026_static_k.jsonl"
PROMPT = 256
OUTPUT = 128
NAMES = ("base", "per_request", "per_token", "per_token_above_knee", "draft_fixed", "draft_fixed_per_request",
         "draft_pass", "draft_pass_per_request", "prefill_per_token", "run_overhead")


def _row(r: dict, knee: float) -> tuple[np.ndarray, float]:
    c = r["concurrency"]
    spec = r["spec"]
    if spec:
        drafts = spec["vllm:spec_decode_num_drafts"]
        k = spec["vllm:spec_decode_num_draft_tokens"] // drafts
        s = drafts / c
    else:
        k, s = 0, OUTPUT - 1
    n = c * (1 + k)
    on = 1.0 if k else 0.0
    x = np.array([s, s * c, s * n, s * max(0.0, n - knee), s * on, s * on * c, s * k, s * k * c, PROMPT * c, 1.0])
    return x, float(r["seconds"])


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with coefficients clamped at zero (drop negatives, refit; small problems only)."""
    active = list(range(a.shape[1]))
    while True:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if (sol >= 0).all():
            out = np.zeros(a.shape[1])
            out[active] = sol
            return out
        active = [i for i, v in zip(active, sol) if v > 0]


def fit_runs(rows: list[dict], knees=range(0, 2049, 16)) -> dict:
    best = None
    for knee in knees:
        xs, ys = zip(*(_row(r, knee) for r in rows))
        a = np.array(xs) / np.array(ys)[:, None]  # relative error: divide each run by its seconds
        theta = _nnls(a, np.ones(len(rows)))
        rms = float(np.sqrt(np.mean((a @ theta - 1.0) ** 2)))
        if best is None or rms < best["rms"]:
            best = {"knee": float(knee), "theta": theta, "rms": rms}
    residuals = []
    for r in rows:
        x, y = _row(r, best["knee"])
        residuals.append({"config": r["config"], "concurrency": r["concurrency"], "seconds": y,
                          "fit": float(x @ best["theta"]), "rel_error": float(x @ best["theta"] / y - 1)})
    coef = dict(zip(NAMES, map(float, best["theta"])))
    return {"knee": best["knee"], "coefficients": coef, "rms_rel_error": best["rms"], "residuals": residuals}


def as_preset(fit: dict, free_draft_token: float = 2.0e-6) -> CostCoefficients:
    c = fit["coefficients"]
    return CostCoefficients(**{n: c[n] for n in NAMES[:8]}, free_draft_token=free_draft_token, knee=fit["knee"])


def fit_steps(lines: list[str], knee: float) -> CostCoefficients:
    """Fit T directly from recorded engine steps (no prior: a preset derivation, not online learning)."""
    xs, ys = [], []
    for line in lines:
        b = TelemetryBatch.model_validate_json(line)
        for s in b.steps:
            n, tok, depth, free = step_shape(s, b.spec.method)
            if n > 0 and s.wall_s > 0:
                on = 1.0 if depth > 0 else 0.0
                xs.append([1.0, n, tok, max(0.0, tok - knee), on, on * n, depth, depth * n, free])
                ys.append(s.wall_s)
    theta = _nnls(np.array(xs), np.array(ys))
    return CostCoefficients.from_vector(theta, knee)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="derive step-cost presets")
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--steps", help="TelemetryBatch JSON lines: fit the step model from engine steps instead")
    ap.add_argument("--knee", type=float, default=0.0, help="knee for --steps (0 for a compute-bound CPU)")
    a = ap.parse_args(argv)
    if a.steps:
        coef = fit_steps(Path(a.steps).read_text().splitlines(), a.knee)
        print(json.dumps(coef.to_dict(), indent=1))
        return 0
    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]
    fit = fit_runs(rows)
    for r in fit["residuals"]:
        print(f"{r['config']:>12} c={r['concurrency']:>3}  measured {r['seconds']:.3f} s  fit {r['fit']:.3f} s  "
              f"{r['rel_error']:+.1%}")
    print(f"\nknee {fit['knee']:.0f} tokens, rms relative error {fit['rms_rel_error']:.1%}")
    preset = as_preset(fit)
    for name in NAMES[:8]:
        print(f"  {name:>24} = {getattr(preset, name):.4g}   (in code: {getattr(H200, name):.4g})")
    print(f"  {'prefill_per_token':>24} = {fit['coefficients']['prefill_per_token']:.4g} s/token (prefill, not in T)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
