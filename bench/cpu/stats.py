"""How sure the CPU engine benchmark's headline ratios are: per-chunk pairs, bootstrap intervals, and a
best-static / oracle choice that does not pick its own winner's luck.

Every configuration X ran its measured prompts in chunks, each chunk once on X and once on specctl in the
same minutes (bench/cpu_engine.py). A chunk pair ``j`` is ``(tokens, wall)`` on each side, and the paired
ratio over a set of pairs J is

    r(J) = (sum_J tokens_S / sum_J wall_S) / (sum_J tokens_X / sum_J wall_X)      (specctl over X)

Two things the plain table cannot say:

* **Interval.** A percentile bootstrap over X's chunk pairs (resampled with replacement, ``draws`` times)
  gives the interval of ``r``; with 4-8 pairs per configuration it is wide, and says so.
* **Selection bias.** "The best static k" and "the oracle" are the configurations that measured best, so
  their measurement carries the luck that made them best: with six static runs each off by a few percent,
  the maximum is biased upward and specctl / best is biased downward. The split estimate removes that: the
  pairs are split in two halves by position (even, odd); the best configuration is chosen on one half (the
  one specctl beats by the least there) and specctl / it measured on the other half, and the other way
  round; both evaluation halves are summed into one ratio. Nothing is chosen on the pairs that measure it.

Input: benchmark results with per-chunk figures (``phases[c]["chunks"]``: ``[[tokens, wall_s], ...]``), one
or several runs of the same code; configurations pool across runs as in :mod:`bench.cpu.pool` (oracle runs
stay apart per run: their pins were chosen per run). ``--add-chunks CHECKPOINT RESULTS`` writes the chunk
figures of an earlier run into its results from the run's checkpoint.

    python -m bench cpu.stats bench/results/cpu_engine_run1.json bench/results/cpu_engine.json \\
        --out bench/results/cpu_engine_stats.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.cpu.oracle import static_k
from bench.cpu.workload import chunk_size

Pair = tuple[tuple[float, float], tuple[float, float]]  # ((tokens_X, wall_X), (tokens_S, wall_S))
DRAWS = 4000
LEVEL = 0.90
SEED = 0


def chunk_figures(records: Sequence, size: int) -> list[list[float]]:
    """``[tokens, wall_s]`` per chunk of a merged phase (records in chunk order, ``size`` prompts a chunk).

    A chunk's wall time is first request sent to last answer received, from the records' own clocks.
    """
    out = []
    for i in range(0, len(records), size):
        chunk = [r for r in records[i : i + size]]
        ok = [r for r in chunk if r.ok]
        if not ok:
            continue
        wall = max(r.ended for r in chunk) - min(r.started for r in chunk)
        out.append([sum(len(r.token_ids) for r in ok), wall])
    return out


def paired_ratio(pairs: Sequence[Pair]) -> float:
    """specctl over X on these chunk pairs (goodput sums, see the module docstring)."""
    tx = sum(p[0][0] for p in pairs)
    wx = sum(p[0][1] for p in pairs)
    ts = sum(p[1][0] for p in pairs)
    ws = sum(p[1][1] for p in pairs)
    if not (tx and wx and ws):
        return float("nan")
    return (ts / ws) / (tx / wx)


def bootstrap(pairs: Sequence[Pair], draws: int = DRAWS, level: float = LEVEL, seed: int = SEED
              ) -> tuple[float, float]:
    """Percentile interval of :func:`paired_ratio`, resampling chunk pairs with replacement."""
    if len(pairs) < 2:
        return float("nan"), float("nan")
    arr = np.asarray([[p[0][0], p[0][1], p[1][0], p[1][1]] for p in pairs], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(pairs), size=(draws, len(pairs)))
    s = arr[idx].sum(axis=1)  # draws x 4: tokens_X, wall_X, tokens_S, wall_S
    ratios = (s[:, 2] / s[:, 3]) / (s[:, 0] / s[:, 1])
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def split_best(pairs_by_name: dict[str, Sequence[Pair]]) -> dict:
    """specctl over the best of ``pairs_by_name``, chosen on one half of the pairs and measured on the other.

    Returns the pooled ratio, the choice made on each half and the ratio measured on the other.
    """
    halves = []
    for pick, judge in ((0, 1), (1, 0)):
        on = {n: [p for i, p in enumerate(ps) if i % 2 == pick] for n, ps in pairs_by_name.items()}
        on = {n: ps for n, ps in on.items() if ps}
        if not on:
            continue
        best = min(on, key=lambda n: paired_ratio(on[n]))  # the one specctl beats by the least
        held = [p for i, p in enumerate(pairs_by_name[best]) if i % 2 == judge]
        if held:
            halves.append({"chosen_on": "even" if pick == 0 else "odd", "best": best, "pairs": held,
                           "ratio": paired_ratio(held)})
    pooled = [p for h in halves for p in h["pairs"]]
    return {"ratio": paired_ratio(pooled) if pooled else float("nan"),
            "halves": [{k: v for k, v in h.items() if k != "pairs"} for h in halves],
            "pairs": len(pooled)}


def pairs_of(docs: Sequence[dict], c: str) -> dict[str, list[Pair]]:
    """Configuration -> its chunk pairs at concurrency ``c``, pooled over runs (oracles kept per run)."""
    out: dict[str, list[Pair]] = {}
    for i, doc in enumerate(docs, 1):
        for name, run in doc["runs"].items():
            if name == "specctl":
                continue
            x = (run.get("phases") or {}).get(c) or {}
            s = (run.get("paired_specctl") or {}).get(c) or {}
            if "chunks" not in x or "chunks" not in s:
                continue
            key = f"{name}@{i}" if name.startswith("oracle") else name
            out.setdefault(key, []).extend(zip(map(tuple, x["chunks"]), map(tuple, s["chunks"]), strict=False))
    return out


def analyse(docs: Sequence[dict], c: str, draws: int = DRAWS, level: float = LEVEL) -> dict:
    """Every configuration's ratio and interval at ``c``, and the split best-static and oracle estimates."""
    pairs = pairs_of(docs, c)
    rows = {n: {"ratio": paired_ratio(ps), "interval": bootstrap(ps, draws, level), "pairs": len(ps)}
            for n, ps in pairs.items()}
    statics = {n: ps for n, ps in pairs.items() if (static_k(n) or 0) > 0}
    oracles = {n: ps for n, ps in pairs.items() if n.startswith("oracle") or (static_k(n) or 0) > 0}
    out: dict = {"level": level, "draws": draws, "configurations": rows}
    if statics:
        out["split_best_static"] = split_best(statics)
    if any(n.startswith("oracle") for n in oracles):
        out["split_oracle"] = split_best(oracles)
    return out


def add_chunks(checkpoint: Path, results: Path, sizes: dict[int, int]) -> int:
    """Write ``chunks`` into every phase of ``results`` from the records kept in the run's checkpoint."""
    with open(checkpoint, "rb") as f:
        state = pickle.load(f)  # the benchmark's own checkpoint file
    doc = json.loads(results.read_text())
    n = 0
    for name, per_c in state["records"].items():
        side, run_name = ("paired_specctl", name.split("@", 1)[1]) if name.startswith("specctl@") else ("phases", name)
        run = doc["runs"].get(run_name)
        if run is None:
            continue
        for c, phase in per_c.items():
            target = (run.get(side) or {}).get(str(c))
            if target is not None and c in sizes:
                target["chunks"] = chunk_figures(phase.records, sizes[c])
                n += 1
    results.write_text(json.dumps(doc, indent=1, default=str))
    return n


def print_report(res: dict[str, dict]) -> None:
    for c, r in res.items():
        print(f"\nconcurrency {c}: specctl / X over chunk pairs, {r['level']:.0%} bootstrap interval")
        for n, row in sorted(r["configurations"].items()):
            lo, hi = row["interval"]
            print(f"  {n:<28} {row['ratio']:.3f}  [{lo:.3f}, {hi:.3f}]  ({row['pairs']} pairs)")
        for key, label in (("split_best_static", "best static k"), ("split_oracle", "oracle")):
            if key in r:
                s = r[key]
                picks = ", ".join(f"{h['best']} (chosen on {h['chosen_on']}: {h['ratio']:.3f})" for h in s["halves"])
                print(f"  specctl / {label}, chosen on the other half: {s['ratio']:.3f} over {s['pairs']} pairs; {picks}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="*", help="cpu_engine.json files (with chunk figures) of runs of the same code")
    ap.add_argument("--add-chunks", nargs=2, metavar=("CHECKPOINT", "RESULTS"), default=None,
                    help="write the chunk figures of a run into its results from its checkpoint.pkl, then stop")
    ap.add_argument("--draws", type=int, default=DRAWS)
    ap.add_argument("--level", type=float, default=LEVEL)
    ap.add_argument("--out", default=None, help="write the analysis here (JSON)")
    args = ap.parse_args(argv)
    if args.add_chunks:
        ck, res = (Path(p) for p in args.add_chunks)
        try:
            n = add_chunks(ck, res, {c: chunk_size(c) for c in (1, 8)})
        except (OSError, ValueError, KeyError, pickle.UnpicklingError) as exc:
            print(f"cannot add chunks: {exc}", file=sys.stderr)
            return 2
        print(f"{res}: chunk figures for {n} phases")
        return 0
    if not args.results:
        ap.error("name at least one results file")
    if not 0 < args.level < 1 or args.draws < 100:
        ap.error("--level must be in (0, 1) and --draws at least 100")
    try:
        docs = [json.loads(Path(p).read_text()) for p in args.results]
    except (OSError, ValueError) as exc:
        print(f"cannot read results: {exc}", file=sys.stderr)
        return 2
    cs = sorted({c for d in docs for r in d["runs"].values() for c in (r.get("phases") or {})}, key=int, reverse=True)
    res = {c: analyse(docs, c, args.draws, args.level) for c in cs}
    if not any(r["configurations"] for r in res.values()):
        print("no chunk figures in these results (add them with --add-chunks)", file=sys.stderr)
        return 2
    print_report(res)
    if args.out:
        Path(args.out).write_text(json.dumps({"benchmark": "specctl CPU engine, chunk-pair statistics",
                                              "sources": args.results, "concurrency": res}, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
