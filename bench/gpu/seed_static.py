"""Seed a results file with the static engines' rows of earlier sessions: the oracle's pins come from them.

The sweep's oracle pins each category to its best static k among the static rows in its results file
(:mod:`bench.gpu.steady_plan`). A session that does not measure every static engine again seeds that file from
the sessions before. Sources are read newest first: where an engine and point repeat, the first row wins.

    python3 -m bench gpu.seed_static OUT.jsonl NEWEST.jsonl [OLDER.jsonl ...]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from bench.gpu.steady_plan import STATIC_CHOICES


def newest_static_rows(lines_per_source: Iterable[Iterable[str]]) -> list[dict]:
    """The first row of every (static engine, profile, concurrency), sources in the order given."""
    seen: set[tuple] = set()
    out = []
    for lines in lines_per_source:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            key = (row.get("engine"), row.get("profile"), row.get("concurrency"))
            if row.get("kind") == "row" and row.get("engine") in STATIC_CHOICES and key not in seen:
                seen.add(key)
                out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("sources", type=Path, nargs="+", help="results files, newest first")
    args = p.parse_args(argv)
    missing = [str(s) for s in args.sources if not s.is_file()]
    if missing:
        p.error(f"no such file: {', '.join(missing)}")
    rows = newest_static_rows(s.read_text().splitlines() for s in args.sources)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{args.out}: {len(rows)} static rows from {len(args.sources)} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
