"""Fit the step-cost model's H200 preset from the engine steps a GPU benchmark run recorded (issue 7, item 4).

Inputs (the recording of the first GPU run, before ``sweep.py``, kept in ``bench/gpu/results/``):
``steps.jsonl.gz``, every TelemetryBatch the specctl engines posted (each step's wall time, batch size, scheduled
tokens and drafting depth), and ``controller_snapshot.json``, the controller's learned state at the end of the run
(its online, prior-regularised fit of the same model).

The model is kernel/cost.py's (verify + drafting terms); like bench/sim/fit_presets.py it is a
non-negative least-squares fit of the *relative* error (each step divided by its measured time) on a 16-token
knee grid. Printed and written to ``--out``: the refit coefficients, and the rms relative step-time error on these
steps of (a) the H200 preset in the code, (b) the controller's learned model, (c) the refit. ``--plot`` draws
measured and modelled step time against batch size per drafting depth.

    python3 -m bench gpu.fit_cost bench/gpu/results/steps.jsonl.gz --snapshot bench/gpu/results/controller_snapshot.json \\
        --out bench/gpu/results/h200_cost_fit.json --plot bench/gpu/results/h200_cost_fit.png
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

from bench.sim.fit_presets import _nnls
from specctl_vllm.controller.core.config import LearnerSettings
from specctl_vllm.controller.core.learn.cost_fit import OnlineCostModel, features
from specctl_vllm.kernel.cost import H200, PRESETS, CostCoefficients, step_shape
from specctl_vllm.kernel.protocol import TelemetryBatch


def load_steps(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(shapes [n, tokens, depth, free], wall seconds) of every step with work in it."""
    opener = gzip.open if path.suffix == ".gz" else open
    shapes, walls = [], []
    with opener(path, "rt") as fh:
        for line in fh:
            if not line.strip():
                continue
            batch = TelemetryBatch.model_validate_json(line)
            for step in batch.steps:
                shape = step_shape(step, batch.spec.method)
                if shape[0] > 0 and step.wall_s > 0:
                    shapes.append(shape)
                    walls.append(step.wall_s)
    return np.array(shapes, dtype=float), np.array(walls, dtype=float)


def design(shapes: np.ndarray, knee: float) -> np.ndarray:
    return np.array([features(n, tok, knee, depth, free) for n, tok, depth, free in shapes])


def predict(coef: CostCoefficients, shapes: np.ndarray) -> np.ndarray:
    return np.array([coef.step_time(n, tok, depth, free) for n, tok, depth, free in shapes])


def rel_rms(pred: np.ndarray, wall: np.ndarray) -> float:
    return float(np.sqrt(np.mean((pred / wall - 1.0) ** 2)))


def refit(shapes: np.ndarray, wall: np.ndarray, knees=range(0, 2049, 16)) -> tuple[CostCoefficients, float]:
    best: tuple[float, CostCoefficients] | None = None
    for knee in knees:
        a = design(shapes, knee) / wall[:, None]
        theta = _nnls(a, np.ones(len(wall)))
        coef = CostCoefficients.from_vector(theta, knee)
        err = rel_rms(predict(coef, shapes), wall)
        if best is None or err < best[0]:
            best = (err, coef)
    assert best is not None
    return best[1], best[0]


def learned(snapshot: Path) -> dict[str, CostCoefficients]:
    """The controller's learned cost model per served model, from its exported snapshot."""
    data = json.loads(snapshot.read_text())["state"]
    preset = PRESETS.get(data.get("cost_preset", ""))
    strength = LearnerSettings().cost_prior_strength
    out = {}
    for model, state in (data.get("models") or {}).items():
        cost = state.get("cost")
        if cost and preset is not None:
            out[model] = OnlineCostModel.from_dict(cost, preset, strength).coefficients()
    return out


def plot(path: Path, shapes: np.ndarray, wall: np.ndarray, models: dict[str, CostCoefficients],
         depths: tuple[int, ...] = (0, 3, 7)) -> None:
    """Decode steps (no prefill tokens) of a few drafting depths: colour = depth, line style = model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    decode = shapes[:, 1] <= shapes[:, 0] * (1 + shapes[:, 2])
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = dict(zip(depths, ("tab:blue", "tab:orange", "tab:green", "tab:red")))
    styles = dict(zip(models, ("--", ":", "-", "-.")))
    for depth in depths:
        sel = decode & (shapes[:, 2] == depth) & (shapes[:, 1] == shapes[:, 0] * (1 + depth))
        if not sel.any():
            continue
        ax.scatter(shapes[sel, 0], wall[sel] * 1e3, s=5, alpha=0.3, color=colors[depth])
        ns = np.unique(shapes[sel, 0])
        for name, coef in models.items():
            # every request verifies 1 + depth tokens: the steps selected above
            ax.plot(ns, [coef.step_time(n, n * (1 + depth), depth) * 1e3 for n in ns], styles[name],
                    color=colors[depth], lw=1.2)
    handles = [Line2D([], [], color=colors[d], marker="o", ls="", label=f"measured, {d} drafts per request")
               for d in depths] + [Line2D([], [], color="k", ls=styles[n], label=n) for n in models]
    ax.legend(handles=handles, fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(5, 200)
    ax.set_xlabel("requests in the step")
    ax.set_ylabel("step wall time, ms")
    ax.set_title("H200, vLLM 0.26, 8B-shaped target + 4-layer draft (k_max 7): uniform decode steps")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps", type=Path)
    p.add_argument("--snapshot", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--plot", type=Path)
    args = p.parse_args(argv)
    shapes, wall = load_steps(args.steps)
    if len(wall) == 0:
        print("no steps", file=sys.stderr)
        return 1
    fit, _fit_err = refit(shapes, wall)
    models = {"preset h200 (code)": H200}
    if args.snapshot and args.snapshot.exists():
        models.update({f"controller learned ({Path(m).name})": c for m, c in learned(args.snapshot).items()})
    models["refit"] = fit
    errors = {name: rel_rms(predict(c, shapes), wall) for name, c in models.items()}
    result = {
        "steps": len(wall),
        "batch_sizes": sorted({int(n) for n in shapes[:, 0]})[:64],
        "depths": sorted({int(d) for d in shapes[:, 2]}),
        "refit": fit.to_dict(),
        "rms_rel_error": errors,
        "models": {name: c.to_dict() for name, c in models.items()},
    }
    for name, err in errors.items():
        print(f"{name:>40}: rms relative step-time error {err:.1%}")
    print(json.dumps(fit.to_dict(), indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(args.plot, shapes, wall, models)
    return 0


if __name__ == "__main__":
    sys.exit(main())
