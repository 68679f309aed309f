"""The day trace's figures from its runs (pure): goodput per configuration, per phase, the per-phase static oracle.

Goodput is committed tokens per second of trace time. Per configuration: the median over repeats, min, max and
spread = (max - min) / median. The per-phase static oracle picks, for each phase, the static configuration
(``kN``) with the highest median goodput in that phase, and its goodput in repeat r is the sum over phases of
the chosen configuration's tokens in repeat r over the trace's seconds (choosing by medians, not by each
repeat's maximum, so noise does not inflate it). The best single static is the static with the highest median
total. Ratios are per repeat (repeat r of specctl against repeat r of the other: the runs of one repeat ran next
to each other) and summarised as median (min-max).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path


def load_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind") == "trace_run":
            rows.append(row)
    return rows


def groups(rows: Iterable[dict]) -> dict[tuple[str, str, float], list[dict]]:
    """(trace, profile, duration) -> rows; one results file may hold several."""
    out: dict = defaultdict(list)
    for r in rows:
        out[(r["trace"], r.get("profile", ""), round(float(r.get("duration_s", r["seconds"])), 3))].append(r)
    return dict(out)


def summary(values: list[float]) -> dict:
    med = statistics.median(values)
    return {"median": med, "min": min(values), "max": max(values), "n": len(values),
            "spread": (max(values) - min(values)) / med if med else None}


def is_static(config: str) -> bool:
    return config.startswith("k") and config[1:].isdigit()


def analyse(rows: list[dict]) -> dict:
    """Figures of one (trace, profile, duration) group."""
    by_config: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in rows:
        by_config[r["config"]][int(r["repeat"])] = r
    phases = [p["name"] for p in rows[0]["phases"]]
    seconds = {c: {rep: r["seconds"] for rep, r in reps.items()} for c, reps in by_config.items()}
    total = {c: {rep: r["tokens"] / r["seconds"] for rep, r in reps.items()} for c, reps in by_config.items()}
    phase_rate = {c: {rep: [p["tokens"] / p["seconds"] if p["seconds"] else 0.0 for p in r["phases"]]
                      for rep, r in reps.items()} for c, reps in by_config.items()}
    configs = {c: {"goodput": summary(list(total[c].values())),
                   "phases": [summary([v[i] for v in phase_rate[c].values()]) for i in range(len(phases))]}
               for c in by_config}
    statics = [c for c in configs if is_static(c)]
    out: dict = {"phases": phases, "phase_seconds": [p["seconds"] for p in rows[0]["phases"]], "configs": configs}
    if not statics:
        return out
    best_single = max(statics, key=lambda c: configs[c]["goodput"]["median"])
    chosen = [max(statics, key=lambda c: configs[c]["phases"][i]["median"]) for i in range(len(phases))]
    repeats = sorted(set.intersection(*(set(by_config[c]) for c in statics)))
    oracle = {}
    for rep in repeats:
        tokens = sum(by_config[chosen[i]][rep]["phases"][i]["tokens"] for i in range(len(phases)))
        secs = sum(by_config[chosen[i]][rep]["phases"][i]["seconds"] for i in range(len(phases)))
        oracle[rep] = tokens / secs
    out.update({"best_single_static": best_single, "oracle_choice": dict(zip(phases, chosen, strict=True))})
    if oracle:
        out["oracle"] = summary(list(oracle.values()))
        total["oracle"] = oracle

    def ratio(a: str, b: str) -> dict | None:
        common = sorted(set(total.get(a, {})) & set(total.get(b, {})))
        vals = [total[a][r] / total[b][r] for r in common if total[b][r]]
        return summary(vals) if vals else None

    out["ratios"] = {name: ratio(a, b) for name, (a, b) in {
        "specctl/best_single_static": ("specctl", best_single),
        "specctl/oracle": ("specctl", "oracle"),
        "oracle/best_single_static": ("oracle", best_single),
        "specctl/k0": ("specctl", "k0"),
        # beside vLLM's adaptive verification (bench trace --adaptive-verification)
        "specctl/av": ("specctl", "av"),
        "specctl_av/av": ("specctl_av", "av"),
        "av/best_single_static": ("av", best_single),
    }.items() if a in total and b in total}
    out["seconds"] = seconds
    return out


def _spread(g: dict) -> str:
    return "n/a" if g["spread"] is None else f"{g['spread']:.1%}"  # None: a median of 0 (nothing committed)


def table(result: dict) -> str:
    """A markdown table: goodput per configuration, median (min-max), and the ratios."""
    lines = ["| configuration | goodput tok/s, median (min-max) | spread | repeats |", "|---|---|---|---|"]
    names = sorted(result["configs"], key=lambda c: (not c.startswith("specctl"), c))
    for c in names:
        g = result["configs"][c]["goodput"]
        lines.append(f"| {c} | {g['median']:.0f} ({g['min']:.0f}-{g['max']:.0f}) | {_spread(g)} | {g['n']} |")
    if "oracle" in result:
        g = result["oracle"]
        lines.append(f"| per-phase static oracle | {g['median']:.0f} ({g['min']:.0f}-{g['max']:.0f}) | "
                     f"{_spread(g)} | {g['n']} |")
    lines += ["", "| ratio (per repeat) | median (min-max) |", "|---|---|"]
    for name, r in result.get("ratios", {}).items():
        if r:
            lines.append(f"| {name} | {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f}) |")
    if "oracle_choice" in result:
        lines += ["", "per-phase best static: " + ", ".join(f"{p} {c}" for p, c in result["oracle_choice"].items()),
                  f"best single static: {result['best_single_static']}"]
    return "\n".join(lines)


def phase_table(result: dict) -> str:
    names = sorted(result["configs"], key=lambda c: (not c.startswith("specctl"), c))
    head = "| phase | s | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 2)]
    for i, p in enumerate(result["phases"]):
        cells = []
        for c in names:
            v = result["configs"][c]["phases"][i]["median"]
            best = result.get("oracle_choice", {}).get(p) == c
            cells.append(f"**{v:.0f}**" if best else f"{v:.0f}")
        lines.append(f"| {p} | {result['phase_seconds'][i]:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
