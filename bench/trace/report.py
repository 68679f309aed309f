"""The day trace's report: tables (markdown), the figures as JSON, and PNGs of goodput and k over time.

    python -m bench trace.report R.jsonl --out-dir bench/results/trace

Per (trace, profile, duration) in the results file: ``<stem>.json`` (``stats.analyse``), ``<stem>.md`` (the
tables), ``<stem>_goodput.png`` (committed tokens/s over time per configuration, median over repeats, 5 s
windows, phases shaded) and ``<stem>_k.png`` (specctl's k per category over time, first repeat, and the mean
width of the engine's steps between two samples: on graph-shaped engines the width rule, not the category's
starting k, decides what a step verifies, so the two can differ).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

from specctl_vllm.controller.trace_stats import analyse, groups, load_rows, phase_table, table

SMOOTH_S = 5


def goodput_series(rows: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """config -> (t, median tokens/s over repeats in SMOOTH_S windows)."""
    out = {}
    by_config: dict[str, list[dict]] = {}
    for r in rows:
        by_config.setdefault(r["config"], []).append(r)
    for config, runs in by_config.items():
        per_run = []
        for r in runs:
            buckets: dict[int, int] = {}
            for s in r["samples"]:
                buckets[int(s["t"] // SMOOTH_S)] = buckets.get(int(s["t"] // SMOOTH_S), 0) + s["tokens"]
            per_run.append(buckets)
        keys = sorted(set().union(*per_run))
        ts = [(k + 0.5) * SMOOTH_S for k in keys]
        vals = [statistics.median(b.get(k, 0) for b in per_run) / SMOOTH_S for k in keys]
        out[config] = (ts, vals)
    return out


def phase_bounds(row: dict) -> list[tuple[str, float, float]]:
    out, t = [], 0.0
    for p in row["phases"]:
        out.append((p["name"], t, t + p["seconds"]))
        t += p["seconds"]
    return out


def plot(rows: list[dict], stem: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return []
    written = []
    bounds = phase_bounds(rows[0])
    fig, ax = plt.subplots(figsize=(11, 4.5))
    for i, (name, a, b) in enumerate(bounds):
        if i % 2:
            ax.axvspan(a, b, color="0.93", lw=0)
        ax.text((a + b) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
    for config, (ts, vals) in sorted(goodput_series(rows).items()):
        ax.plot(ts, vals, label=config, lw=2.0 if config == "specctl" else 1.0,
                color="black" if config == "specctl" else None)
    ax.set_xlabel("trace time (s)")
    ax.set_ylabel(f"committed tokens/s ({SMOOTH_S} s windows, median of repeats)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    path = stem.with_name(stem.name + "_goodput.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    spec = sorted((r for r in rows if r["config"] == "specctl"), key=lambda r: r["repeat"])
    if spec and spec[0].get("decisions"):
        decisions = spec[0]["decisions"]
        cats = sorted({c for d in decisions for c in d["k"]} - {"*"})
        for d in decisions:  # a category the policy does not list runs the default
            for c in cats:
                d["k"].setdefault(c, d["k"].get("*", [None, None]))
        fig, ax = plt.subplots(figsize=(11, 3.8))
        for i, (name, a, b) in enumerate(bounds):
            if i % 2:
                ax.axvspan(a, b, color="0.93", lw=0)
            ax.text((a + b) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                    fontsize=7)
        graph = any(d.get("width_steps") for d in decisions)
        if graph and not all(d.get("served") for d in decisions):
            cats = []  # older rows: k asked without the engine's widths, an answer the engine never applied
        for j, cat in enumerate(cats):
            ts = [d["t"] for d in decisions if cat in d["k"] and d["k"][cat][0] is not None]
            ks = [d["k"][cat][0] + 0.06 * (j - len(cats) / 2) for d in decisions
                  if cat in d["k"] and d["k"][cat][0] is not None]
            ax.step(ts, ks, where="post", label=cat)
        ts, means = mean_widths(decisions)
        if ts:
            ax.step(ts, means, where="post", color="black", ls="--", lw=1.2, label="engine: mean step width")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("specctl: k, or cap (graph widths)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        fig.tight_layout()
        path = stem.with_name(stem.name + "_k.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def mean_widths(decisions: list[dict]) -> tuple[list[float], list[float]]:
    """Mean width of the steps the engine ran between consecutive samples (``width_steps`` are cumulative
    counts per width), placed at the earlier sample; intervals without steps are left out."""
    ts, means = [], []
    for before, after in itertools.pairwise(decisions):
        a, b = before.get("width_steps") or {}, after.get("width_steps") or {}
        delta = {int(w): b[w] - a.get(w, 0) for w in b if b[w] > a.get(w, 0)}
        steps = sum(delta.values())
        if steps:
            ts.append(before["t"])
            means.append(sum(w * n for w, n in delta.items()) / steps)
    return ts, means


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench trace.report", description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, nargs="+")
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)
    rows = [r for path in args.results for r in load_rows(path)]
    if not rows:
        print("error: no trace runs in " + ", ".join(map(str, args.results)), file=sys.stderr)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for (trace, profile, duration), group in sorted(groups(rows).items()):
        stem = args.out_dir / f"{trace}_{profile or 'profile'}_{duration:.0f}s"
        result = analyse(group)
        result.update({"trace": trace, "profile": profile, "duration_s": duration})
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        text = f"## {trace}, profile {profile}, {duration:.0f} s\n\n{table(result)}\n\n{phase_table(result)}\n"
        stem.with_suffix(".md").write_text(text)
        print(text)
        for path in plot(group, stem):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
