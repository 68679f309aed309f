"""`make bench`: every benchmark in turn, each writing its JSON (and plots) into bench/results/.

Order: the controller-only benchmarks first (ingest, load, simulator, the reporter thread's cost), then the
ones that start the real vLLM CPU engine (patch overhead, the spread between identical engines, the
side-by-side CPU engine comparison; ``python -m bench.cpu.stats`` adds intervals to the latter's results). `--quick` runs each in its smoke
mode. A failing benchmark is reported and the others still run; the exit code is non-zero if any failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

BENCHMARKS: list[tuple[str, list[str], list[str]]] = [
    # (module, full-run args, quick-run args)
    ("bench.ingest", [], ["--quick"]),
    ("bench.load", [], ["--duration", "10"]),
    ("bench.budget", [], ["--seconds", "5", "--out", "bench/results/tmp/budget_quick.json"]),
    ("bench.budget", ["--flood", "600"], ["--flood", "20", "--out", "bench/results/tmp/budget_flood_quick.json"]),
    ("bench.fuzz", [], ["--examples", "12", "--steps", "25"]),
    ("bench.sim.run", [], ["--quick"]),
    ("bench.reporter_cost", [], ["--posts", "30"]),
    ("bench.overhead", [], []),
    ("bench.cpu.identical", [], ["--engines", "2", "--rounds", "2", "--out", "bench/results/tmp/identical_quick.json"]),
    ("bench.cpu_engine", [], ["--quick"]),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke mode of every benchmark")
    parser.add_argument("--only", default="", help="comma-separated module names to run (default: all)")
    args = parser.parse_args(argv)
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    failed: list[str] = []
    for module, full, quick in BENCHMARKS:
        if wanted and module not in wanted and module.split(".")[-1] not in wanted:
            continue
        cmd = [sys.executable, "-m", module, *(quick if args.quick else full)]
        print(f"\n=== {' '.join(cmd[2:])}", flush=True)
        started = time.monotonic()
        code = subprocess.call(cmd)
        print(f"=== {module}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(module)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
