"""Tables of the steady-load sweep: goodput per profile, its spread, and the premise check.

Per profile, rows are engines and columns concurrencies; a cell is ``median (min-max) r_plain / r_best``: the
median of the timed rounds' tok/s, their range, and the ratios of the median to plain decoding's and to the best
static setting's (plain or static k, chosen per cell in hindsight) of the same run. The mixed profile also
shows the oracle (each category pinned to its own best static k). Ratios only ever compare rows of one results
file (one machine, one session).

    python3 -m bench gpu.steady_table RESULTS.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from bench.gpu.shapes import CONCURRENCY
from bench.gpu.steady_plan import (
    ORACLE,
    PLAIN,
    PREMISE,
    PREMISE_CONCURRENCY,
    PREMISE_KS,
    PREMISE_PROFILE,
    PROFILE_CATEGORIES,
    SPECCTL_K_MAX,
    STATIC_CHOICES,
    STEADY_PROFILES,
    engines,
    load_results,
    share_plain_rows,
    static_name,
)

ROW_ORDER = tuple(e.name for e in engines())
#: a point whose rounds differ by more than this share of their median is called out
SPREAD_NOTE = 0.05


def best_static(rows: dict, profile: str, c: int) -> tuple[str, float] | None:
    """(engine, median tok/s) of the best static setting of one point."""
    found = [(rows[(name, profile, c)]["tok_per_s_median"], name) for name in STATIC_CHOICES
             if (name, profile, c) in rows and rows[(name, profile, c)].get("tok_per_s_median")]
    if not found:
        return None
    tps, name = max(found)
    return name, tps


def cell(rows: dict, engine: str, profile: str, c: int) -> str:
    row = rows.get((engine, profile, c))
    if row is None or row.get("tok_per_s_median") is None:
        return "-"
    med = row["tok_per_s_median"]
    text = f"{med:.0f} ({row['tok_per_s_min']:.0f}-{row['tok_per_s_max']:.0f})"
    plain = rows.get((PLAIN, profile, c), {}).get("tok_per_s_median")
    best = best_static(rows, profile, c)
    ratios = [f"{med / plain:.2f}" if plain else "-", f"{med / best[1]:.2f}" if best else "-"]
    return f"{text} {ratios[0]} / {ratios[1]}"


def engine_order(rows: dict, profile: str) -> list[str]:
    present = {name for (name, p, _) in rows if p == profile}
    order = [name for name in ROW_ORDER if name in present]
    if profile == "mixed" and ORACLE in present:
        order.append(ORACLE)
    return order + sorted(present - set(order) - {n for n in present if n.startswith(PREMISE)})


def profile_table(rows: dict, profile: str, concurrency: tuple[int, ...] = CONCURRENCY) -> str:
    header = "| engine | " + " | ".join(f"c={c}" for c in concurrency) + " |"
    lines = [header, "|---|" + "---|" * len(concurrency)]
    for name in engine_order(rows, profile):
        lines.append(f"| {name} | " + " | ".join(cell(rows, name, profile, c) for c in concurrency) + " |")
    best = []
    for c in concurrency:
        found = best_static(rows, profile, c)
        best.append(found[0] if found else "-")
    lines.append("| best static | " + " | ".join(best) + " |")
    return "\n".join(lines)


def category_table(rows: dict, concurrency: tuple[int, ...] = CONCURRENCY) -> str:
    """The mixed profile's goodput split by category: median tok/s of high / low requests."""
    cats = PROFILE_CATEGORIES["mixed"]
    lines = ["| engine | " + " | ".join(f"c={c}" for c in concurrency) + " |", "|---|" + "---|" * len(concurrency)]
    for name in engine_order(rows, "mixed"):
        cells = []
        for c in concurrency:
            by_cat = (rows.get((name, "mixed", c)) or {}).get("tok_per_s_by_category") or {}
            meds = [by_cat.get(cat, {}).get("median") if by_cat.get(cat) else None for cat in cats]
            cells.append("-" if all(m is None for m in meds) else " / ".join("-" if m is None else f"{m:.0f}"
                                                                             for m in meds))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def oracle_pins(rows: dict, concurrency: tuple[int, ...] = CONCURRENCY) -> str:
    pins = []
    for c in concurrency:
        row = rows.get((ORACLE, "mixed", c))
        if row and row.get("pins"):
            pins.append(f"c={c}: " + ", ".join(f"{cat} k={k}" for cat, k in sorted(row["pins"].items())))
    return "oracle pins: " + "; ".join(pins) if pins else ""


def spread_table(rows: dict, profile: str, concurrency: tuple[int, ...] = CONCURRENCY) -> str:
    lines = ["| engine | " + " | ".join(f"c={c}" for c in concurrency) + " |", "|---|" + "---|" * len(concurrency)]
    for name in engine_order(rows, profile):
        cells = []
        for c in concurrency:
            row = rows.get((name, profile, c))
            spread = row.get("tok_per_s_spread") if row else None
            cells.append("-" if spread is None else f"{spread:.1%}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread_statement(rows: dict) -> str:
    """One sentence on run-to-run spread over every point: (max - min) / median of its rounds."""
    spreads = [(r["tok_per_s_spread"], key) for key, r in rows.items() if r.get("tok_per_s_spread") is not None]
    if not spreads:
        return "spread: no rows"
    values = [s for s, _ in spreads]
    worst, (name, profile, c) = max(spreads)
    noted = sorted((key for s, key in spreads if s > SPREAD_NOTE), key=lambda k: (k[1], k[0], k[2]))
    rounds = {len(r.get("rounds", [])) for r in rows.values()}
    text = (f"spread (max-min)/median of each point's {'/'.join(map(str, sorted(rounds)))} timed rounds, over "
            f"{len(values)} points: median {statistics.median(values):.1%}, largest {worst:.1%} "
            f"({name}, {profile}, c={c})")
    if noted:
        text += f"; above {SPREAD_NOTE:.0%}: " + ", ".join(f"{n} {p} c={cc}" for n, p, cc in noted)
    return text + "."


def premise_table(rows: dict) -> str:
    """Pinned width K in the specctl engine against the static-K engine: mean step ms, full-graph shares and
    the pinned row's tok/s; one table per profile the premise rows cover, a column per concurrency."""
    points = {(name, profile, c) for (name, profile, c) in rows if name.startswith(f"{PREMISE}-k")}
    profiles = sorted({p for _, p, _ in points}, key=lambda p: (p != PREMISE_PROFILE, p)) or [PREMISE_PROFILE]
    tables = []
    for profile in profiles:
        cs = sorted({c for _, p, c in points if p == profile}) or list(PREMISE_CONCURRENCY)
        ks = sorted({int(n.split("-k")[1]) for n, p, _ in points if p == profile}) or list(PREMISE_KS)
        lines = [f"{profile}:", "",
                 "| K | " + " | ".join(f"c={c}: pinned / static ms (ratio), full graphs; tok/s" for c in cs) + " |",
                 "|---|" + "---|" * len(cs)]
        for k in ks:
            lines.append(f"| {k} | " + " | ".join(_premise_cell(rows, profile, c, k) for c in cs) + " |")
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def _premise_cell(rows: dict, profile: str, c: int, k: int) -> str:
    pinned = rows.get((f"{PREMISE}-k{k}", profile, c), {})
    static = rows.get((static_name(k), profile, c), {})
    a, b = pinned.get("mean_step_ms_median"), static.get("mean_step_ms_median")
    if a is None:
        return "-"
    ratio = f" ({a / b:.2f})" if b else ""
    shares = "/".join("-" if r.get("full_share") is None else f"{r['full_share']:.0%}" for r in (pinned, static))
    tok = pinned.get("tok_per_s_median")
    tok_text = f"; {tok:.0f}" if tok is not None else ""
    return (f"{a:.2f} / {b:.2f}{ratio}, {shares}" if b else f"{a:.2f} / -, {shares}") + tok_text


def cold_start_text(rows: dict) -> str | None:
    """Each specctl engine's first point of its run (its controller fresh when the run was the session's first
    sweep), warm-up rate beside the static engine it was started as (K = k_max) over the same point's warm-up."""
    static = static_name(SPECCTL_K_MAX)
    lines = []
    for (name, profile, c), row in sorted(rows.items()):
        if not name.startswith("specctl") or row.get("point_index") != 0 or not row.get("warmup_tok_per_s"):
            continue
        ref = rows.get((static, profile, c), {})
        ref_rate = ref.get("warmup_tok_per_s")
        versus = (f"{static} {ref_rate:.0f} over {ref['warmup_s']:.1f} s: {row['warmup_tok_per_s'] / ref_rate:.2f}x"
                  if ref_rate else f"no {static} warm-up at this point")
        lines.append(f"- {name} {profile} c={c}: warm-up {row['warmup_tok_per_s']:.0f} tok/s over "
                     f"{row['warmup_s']:.1f} s; {versus}; timed median {row['tok_per_s_median']:.0f}")
    return "cold start (first point of each specctl run)\n" + "\n".join(lines) if lines else None


def reference_rows(path: Path) -> dict[tuple[str, str, int, str], dict]:
    """Reference rows keyed by (engine, profile, concurrency, the engine they were paired with): one reference
    (plain) may be measured beside several engines at one point, each pairing its own rows."""
    out: dict[tuple[str, str, int, str], dict] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:  # a line cut short by a killed call
            continue
        if isinstance(row, dict) and row.get("kind") == "row" and row.get("paired_with"):
            out[(row["engine"], row["profile"], int(row["concurrency"]), str(row["paired_with"]))] = row
    return out


def shared_references(references: dict[tuple[str, str, int, str], dict]) -> str | None:
    """Points where one reference engine was paired with several engines: the profile tables show its last
    pairing's median, so their ratios there compare rounds of different pairings."""
    partners: dict[tuple[str, str, int], list[str]] = {}
    for (name, profile, c, partner) in sorted(references):
        partners.setdefault((name, profile, c), []).append(partner)
    lines = [f"- {name} at {profile} c={c} was measured beside {', '.join(with_)}: the tables above use the last "
             f"pairing's median; the paired table gives each pairing's own"
             for (name, profile, c), with_ in sorted(partners.items()) if len(with_) > 1]
    return "\n".join(lines) if lines else None


def paired_table(rows: dict, references: dict[tuple[str, str, int, str], dict] | None = None) -> str | None:
    """Rows measured in turns with a reference engine: the median of the per-pair ratios and their range, with
    the two medians (the pair's own figures: drift between the rounds of one pair falls on both engines)."""
    references = references or {}
    paired = sorted(((name, profile, c), row) for (name, profile, c), row in rows.items() if row.get("pair"))
    if not paired:
        return None
    lines = [("| engine | profile | c | reference | paired ratio, median (min-max) | engine / reference tok/s "
              "| pairs | min-max holds the median with | pair sd | pairs for ±2 % |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (name, profile, c), row in paired:
        pair = row["pair"]
        if pair.get("ratio_median") is None:
            continue
        ratios = [float(r) for r in pair.get("ratios") or []]
        n, sd, need = pair_noise(ratios)
        ref = references.get((pair["engine"], profile, c, name)) or rows.get((pair["engine"], profile, c), {})
        ref_tok = ref.get("tok_per_s_median") if ref.get("paired_with") == name else None
        ref_text = f"{ref_tok:.0f}" if ref_tok is not None else "-"
        lines.append(f"| {name} | {profile} | {c} | {pair['engine']} | {pair['ratio_median']:.3f} "
                     f"({pair['ratio_min']:.3f}-{pair['ratio_max']:.3f}) | {row['tok_per_s_median']:.0f} / "
                     f"{ref_text} | {n or '-'} | {f'{median_coverage(n):.1%}' if n >= 2 else '-'} | "
                     f"{f'{sd:.3f}' if sd is not None else '-'} | {need if need is not None else '-'} |")
    return "\n".join(lines)


def median_coverage(n: int) -> float:
    """Chance that the smallest and largest of n independent pair ratios hold their median between them:
    1 - 2 * 0.5^n (all n on one side of it happens with 0.5^n each way). With 6 pairs 96.9 %."""
    return 1.0 - 2.0 * 0.5 ** n if n > 0 else 0.0


#: Half-width of the interval a point should reach, and its normal quantile (95 %, two-sided).
RESOLVE = 0.02
Z95 = 1.96


def pair_noise(ratios: list[float]) -> tuple[int, float | None, int | None]:
    """(pairs, standard deviation of the per-pair ratios, pairs a 95 % interval of ±``RESOLVE`` on their mean
    would need at that deviation): what a point's pairs say about the next run's length."""
    n = len(ratios)
    if n < 2:
        return n, None, None
    sd = statistics.stdev(ratios)
    return n, sd, max(2, math.ceil((Z95 * sd / RESOLVE) ** 2))


#: vLLM's adaptive verification alone, the reference of the 0.34 peer rows (steady_plan.adaptive_engines)
AV = "av"


def av_table(rows: dict, concurrency: tuple[int, ...] = CONCURRENCY) -> str:
    """Median tok/s of every other engine over ``av``'s at the same point, per profile; '' without av rows."""
    lines = []
    for profile in STEADY_PROFILES:
        others = [n for n in engine_order(rows, profile) if n != AV]
        if not any((AV, profile, c) in rows for c in concurrency) or not others:
            continue
        for name in others:
            cells = []
            for c in concurrency:
                a = (rows.get((AV, profile, c)) or {}).get("tok_per_s_median")
                b = (rows.get((name, profile, c)) or {}).get("tok_per_s_median")
                cells.append(f"{b / a:.3f}" if a and b else "-")
            if any(x != "-" for x in cells):
                lines.append(f"| {profile} | {name} | " + " | ".join(cells) + " |")
    if not lines:
        return ""
    head = "| profile | engine / av | " + " | ".join(f"c={c}" for c in concurrency) + " |"
    return "\n".join([head, "|---|---|" + "---|" * len(concurrency), *lines])


def failures_text(failures: dict) -> str:
    return "\n".join(f"{name}: did not start (exit {row.get('rc')}): {row.get('error', '')[:300]}"
                     for name, row in sorted(failures.items()))


def render(path: Path) -> str:
    rows, failures = load_results(path)
    measured_plain = {p for (name, p, _c) in rows if name == PLAIN}
    shared = share_plain_rows(rows)
    parts = []
    if measured_plain and measured_plain != set(STEADY_PROFILES):
        parts.append(f"plain decoding measured on the {', '.join(sorted(measured_plain))} profile only; its "
                     "throughput does not depend on acceptance, so those rows stand for every profile")
    for profile in STEADY_PROFILES:
        if not engine_order(rows, profile):
            continue
        parts.append(f"**{profile}** output tok/s: median of the timed rounds (min-max), ratio to plain / to the "
                     "best static setting measured at that point")
        parts.append(profile_table(shared, profile))
        if profile == "mixed":
            if oracle_pins(rows):
                parts.append(oracle_pins(rows))
            parts.append("**mixed** by category: median tok/s of " + " / ".join(PROFILE_CATEGORIES["mixed"])
                         + " requests")
            parts.append(category_table(rows))
    if rows:
        parts.append(spread_statement(rows))
        for profile in STEADY_PROFILES:
            if engine_order(rows, profile):
                parts.append(f"spread per point, {profile}")
                parts.append(spread_table(rows, profile))
    versus_av = av_table(shared)
    if versus_av:
        parts.append("against vLLM's adaptive verification (``av``): median tok/s over av's at the same point")
        parts.append(versus_av)
    cold = cold_start_text(rows)
    if cold:
        parts.append(cold)
    if any(name.startswith(PREMISE) for (name, _, _) in rows):
        parts.append("premise: mean target step ms, specctl pinned at K / static-K engine")
        parts.append(premise_table(rows))
    references = reference_rows(path)
    paired = paired_table(rows, references)
    if paired:
        parts.append("paired rounds: each engine measured in turns with its reference on one GPU (A B, B A ...), "
                     "one ratio per pair of rounds")
        parts.append(paired)
        shared_note = shared_references(references)
        if shared_note:
            parts.append(shared_note)
    if failures:
        parts.append(failures_text(failures))
    return "\n\n".join(parts) if parts else f"no rows in {path}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    args = p.parse_args(argv)
    print(render(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
