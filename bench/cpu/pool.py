"""Pool several CPU engine benchmark runs of the same code into one side-by-side table.

Every configuration X of a run was measured paired with that run's always-on specctl stack, so runs pool
per configuration: X's tokens and wall time are summed over the runs (goodput = sum tokens / sum wall; per
category sum tokens / sum summed latency), and so are the paired specctl chunks. specctl / X stays a ratio
of goodputs measured in the same minutes, now over more chunks. The hindsight oracle's pins are chosen
per run, so oracle runs are kept apart (``oracle-model@2``); the best of them and of the static runs is the
oracle, as in a single run. Only runs of the same policy code should be pooled: the caller names them.

    python -m bench cpu.pool bench/results/cpu_engine_run1.json bench/results/cpu_engine.json \\
        --out bench/results/cpu_engine_pooled.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.cpu import report


def _latency(phase: dict) -> dict[str, float]:
    """Per category: summed request latency (tokens / per-category goodput)."""
    tokens = phase.get("tokens_per_category", {})
    return {cat: tokens[cat] / g for cat, g in phase.get("per_category", {}).items() if g and cat in tokens}


def pool_phases(phases: list[dict]) -> dict:
    """Phases of one configuration at one concurrency as one (token and time sums)."""
    tokens = sum(p["tokens"] for p in phases)
    wall = sum(p["wall_s"] for p in phases)
    cat_tokens: dict[str, float] = {}
    cat_latency: dict[str, float] = {}
    for p in phases:
        for cat, lat in _latency(p).items():
            cat_tokens[cat] = cat_tokens.get(cat, 0) + p["tokens_per_category"][cat]
            cat_latency[cat] = cat_latency.get(cat, 0.0) + lat
    return {"goodput": tokens / wall if wall else 0.0, "tokens": tokens, "wall_s": wall,
            "per_category": {c: cat_tokens[c] / cat_latency[c] for c in cat_tokens if cat_latency[c]},
            "tokens_per_category": cat_tokens, "runs": len(phases)}


def pool_runs(docs: list[dict]) -> dict:
    """The ``runs`` of several benchmark results as one ``runs`` dict (see the module docstring)."""
    grouped: dict[str, dict[str, dict[str, list[dict]]]] = {}
    for i, doc in enumerate(docs, 1):
        for name, run in doc["runs"].items():
            key = f"{name}@{i}" if name.startswith("oracle") else name
            for side in ("phases", "paired_specctl"):
                for c, phase in (run.get(side) or {}).items():
                    if phase and "tokens" in phase:
                        grouped.setdefault(key, {}).setdefault(side, {}).setdefault(c, []).append(phase)
    return {name: {side: {c: pool_phases(ps) for c, ps in per_c.items()} for side, per_c in sides.items()}
            for name, sides in grouped.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="cpu_engine.json files of runs of the same code")
    ap.add_argument("--out", default=None, help="write the pooled ratios and targets here (JSON)")
    args = ap.parse_args(argv)
    try:
        docs = [json.loads(Path(p).read_text()) for p in args.results]
    except (OSError, ValueError) as exc:
        print(f"cannot read results: {exc}", file=sys.stderr)
        return 2
    runs = pool_runs(docs)
    cs = sorted({c for r in runs.values() for c in r.get("phases", {})}, key=int, reverse=True)
    rat = {c: report.ratios(runs, c) for c in cs}
    report.print_tables(runs, rat, cs)
    if args.out:
        out = {"benchmark": "specctl CPU engine, pooled runs", "sources": args.results, "runs": runs, "ratios": rat,
               "targets": {c: report.check_targets(r) for c, r in rat.items()}}
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
