"""Per category and per draft position, the conditional acceptance real drafters reached on the real CPU engine.

Reads recorded telemetry (``specctl serve --record-dir``: gzip JSONL batches of the wire protocol) and counts,
per (category, method), every draft histogram: a draft of k tokens with exactly j accepted reached positions
0..min(j, k-1) and was accepted at positions 0..j-1. The conditional rate at position i is
``accepted_i / reached_i``. Counterfactual histograms (model-free drafters scored beside the running one) count
for their own method. Positions with fewer than ``min_reached`` judged drafts repeat the previous rate.

    python -m bench trace.measured bench/results/user_recording_cpu --map prose=chat,structured=json \
        --name measured-cpu --out bench/trace/profiles.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

POSITIONS = 7


def count(batches, positions: int = POSITIONS) -> dict[tuple[str, str], list[list[int]]]:
    """(category, method) -> [reached per position, accepted per position]."""
    out: dict[tuple[str, str], list[list[int]]] = defaultdict(lambda: [[0] * positions, [0] * positions])

    def add(cat: str, method: str, hist: dict) -> None:
        k, acc = int(hist["k"]), hist["accepted"]
        reached, accepted = out[(cat, method)]
        for j, n in enumerate(acc):
            if not n:
                continue
            for i in range(min(j + 1, k, positions)):
                reached[i] += n
            for i in range(min(j, positions)):
                accepted[i] += n

    for batch in batches:
        for step in batch.get("steps", ()):
            for c in step.get("categories", ()):
                for h in c.get("hists", ()):
                    add(c["category"], c["method"], h)
                for method, hists in (c.get("counterfactual") or {}).items():
                    for h in hists:
                        add(c["category"], method, h)
    return dict(out)


def rates(reached: list[int], accepted: list[int], min_reached: int = 20) -> list[float] | None:
    out: list[float] = []
    for r, a in zip(reached, accepted, strict=True):
        if r >= min_reached:
            out.append(round(a / r, 4))
        elif out:
            out.append(out[-1])
        else:
            return None
    return out


def read_batches(folder: Path):
    for path in sorted(folder.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench trace.measured", description=__doc__.split("\n\n")[0])
    p.add_argument("recordings", type=Path, nargs="+")
    p.add_argument("--map", default="", help="recorded=trace category renames, comma-separated")
    p.add_argument("--method", default=None, help="keep one drafter (default: each drafter its own profile)")
    p.add_argument("--name", default="measured", help="profile name prefix")
    p.add_argument("--min-reached", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="profiles file to add the profiles to")
    args = p.parse_args(argv)
    rename = dict(pair.split("=", 1) for pair in args.map.split(",") if "=" in pair)
    counts: dict = defaultdict(lambda: [[0] * POSITIONS, [0] * POSITIONS])
    for folder in args.recordings:
        if not folder.is_dir():
            print(f"error: {folder} is not a folder of recordings", file=sys.stderr)
            return 2
        for (cat, method), (reached, accepted) in count(read_batches(folder)).items():
            dst = counts[(rename.get(cat, cat), method)]
            for i in range(POSITIONS):
                dst[0][i] += reached[i]
                dst[1][i] += accepted[i]
    profiles: dict = {}
    for (cat, method), (reached, accepted) in sorted(counts.items()):
        if args.method and method != args.method:
            continue
        r = rates(reached, accepted, args.min_reached)
        print(f"{method:8} {cat:12} reached {reached} accepted {accepted} -> {r}")
        if r is None:
            continue
        prof = profiles.setdefault(f"{args.name}-{method}", {"categories": {}, "evidence": {}})
        prof["categories"][cat] = r
        prof["evidence"][cat] = {"reached": reached, "accepted": accepted}
    if args.out is not None:
        data = json.loads(args.out.read_text()) if args.out.exists() else {"profiles": {}}
        for name, prof in profiles.items():
            prof["source"] = (f"measured: vLLM 0.32 CPU, SmolLM2-135M-Instruct, {name.rsplit('-', 1)[-1]} drafting, "
                              f"recordings {', '.join(str(f) for f in args.recordings)} (bench trace.measured)")
            data["profiles"][name] = prof
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
