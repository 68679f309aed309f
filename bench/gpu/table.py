"""Ratio tables of the GPU benchmark: tok/s and ratio to plain decoding, measured side by side in one run.

Ratios are always against the ``base`` row of the *same* results file (same machine, same session); the shared
earlier measurement can be shown beside it for reference, never mixed into a ratio.

    python3 -m bench gpu.table RESULTS.jsonl [--reference ../shared/data/h200_vllm026_static_k.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STATIC_HIGH = ("k1-high", "k2-high", "k4-high", "k7-high")
ORDER = ("base", *STATIC_HIGH, "ktable-high", "specctl-high", "specctl-low")
#: Issue 7's targets: (what, threshold).
TARGETS = {
    "specctl-high / best static (high), every c": 1.00,
    "specctl-high / no spec, c=256": 0.97,
    "specctl-low / no spec, every c": 0.98,
}


def load(path: Path) -> dict[tuple[str, int], dict]:
    """(config, concurrency) -> row; a later row replaces an earlier one (re-measurement)."""
    rows: dict[tuple[str, int], dict] = {}
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[(row["config"], int(row["concurrency"]))] = row
    return rows


def concurrencies(rows: dict[tuple[str, int], dict]) -> list[int]:
    return sorted({c for _, c in rows})


def best_static(rows: dict[tuple[str, int], dict], c: int) -> tuple[str, float] | None:
    """Best of plain decoding, every static k and the K table at concurrency c (what an operator could pick)."""
    candidates = [(n, rows[(n, c)]["tok_per_s"]) for n in ("base", *STATIC_HIGH, "ktable-high") if (n, c) in rows]
    return max(candidates, key=lambda x: x[1]) if candidates else None


def render(rows: dict[tuple[str, int], dict]) -> str:
    cs = concurrencies(rows)
    names = [n for n in ORDER if any((n, c) in rows for c in cs)]
    names += sorted({n for n, _ in rows} - set(names))
    lines = ["| config | " + " | ".join(f"c={c}" for c in cs) + " |", "|---|" + "---|" * len(cs)]
    for name in names:
        cells = []
        for c in cs:
            row, base = rows.get((name, c)), rows.get(("base", c))
            if row is None:
                cells.append("–")
            elif base is None:
                cells.append(f"{row['tok_per_s']:.0f}")
            else:
                cells.append(f"{row['tok_per_s']:.0f} ({row['tok_per_s'] / base['tok_per_s']:.2f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    best = [best_static(rows, c) for c in cs]
    lines.append("| best static (high) | " + " | ".join(f"{b[0]}" if b else "–" for b in best) + " |")
    cells = []
    for c, b in zip(cs, best):
        row = rows.get(("specctl-high", c))
        cells.append(f"{row['tok_per_s'] / b[1]:.2f}" if row and b else "–")
    lines.append("| specctl-high / best static | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(rows: dict[tuple[str, int], dict]) -> list[str]:
    """One line per target of issue 7: the measured worst case and whether it is met (or what is missing)."""
    out = []
    cs = concurrencies(rows)
    vs_best = [(c, rows[("specctl-high", c)]["tok_per_s"] / b[1]) for c in cs
               if ("specctl-high", c) in rows and (b := best_static(rows, c))]
    out.append(_target_line("specctl-high / best static (high), every c", vs_best))
    at256 = [(256, rows[("specctl-high", 256)]["tok_per_s"] / rows[("base", 256)]["tok_per_s"])] \
        if ("specctl-high", 256) in rows and ("base", 256) in rows else []
    out.append(_target_line("specctl-high / no spec, c=256", at256))
    low = [(c, rows[("specctl-low", c)]["tok_per_s"] / rows[("base", c)]["tok_per_s"]) for c in cs
           if ("specctl-low", c) in rows and ("base", c) in rows]
    out.append(_target_line("specctl-low / no spec, every c", low))
    return out


def _target_line(what: str, ratios: list[tuple[int, float]]) -> str:
    threshold = TARGETS[what]
    if not ratios:
        return f"- {what} >= {threshold:.2f}: not measured"
    c, worst = min(ratios, key=lambda x: x[1])
    verdict = "met" if worst >= threshold else "MISSED"
    detail = ", ".join(f"c={cc}: {r:.2f}" for cc, r in ratios)
    return f"- {what} >= {threshold:.2f}: {verdict} (worst {worst:.2f} at c={c}; {detail})"


def reference_table(path: Path) -> str:
    """The shared earlier measurement in the same layout (its own base row), for reference only."""
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            name = {"base": "base"}.get(row["config"], row["config"].replace("dm-", ""))
            rows[(name, int(row["concurrency"]))] = row
    return render(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("--reference", type=Path, help="earlier measurement to print beside (not mixed into ratios)")
    args = p.parse_args(argv)
    rows = load(args.results)
    print(f"## {args.results.name}: output tok/s (ratio to plain decoding, same run)\n")
    print(render(rows))
    print("\nTargets (issue 7):")
    print("\n".join(targets(rows)))
    if args.reference and args.reference.exists():
        print(f"\n## reference: {args.reference.name} (earlier run; its own base row)\n")
        print(reference_table(args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
