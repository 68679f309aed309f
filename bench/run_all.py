"""`make bench` (``python -m bench all``): every benchmark in turn, each writing its JSON (and plots) into bench/results/.

Order: the controller-only benchmarks first (ingest, load, simulator, the reporter thread's cost), then the
ones that start the real vLLM CPU engine (patch overhead, the spread between identical engines, the
side-by-side CPU engine comparison; ``python -m bench cpu.stats`` adds intervals to the latter's results). `--quick` runs each in its smoke
mode. A failing benchmark is reported and the others still run; the exit code is non-zero if any failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.__main__ import BENCHMARKS as REGISTRY

BENCHMARKS: list[tuple[str, list[str], list[str]]] = [
    # (name in bench/__main__.py's registry, full-run args, quick-run args)
    ("ingest", [], ["--quick"]),
    ("load", [], ["--duration", "10"]),
    ("budget", [], ["--seconds", "5", "--out", "bench/results/tmp/budget_quick.json"]),
    ("budget", ["--flood", "600"], ["--flood", "20", "--out", "bench/results/tmp/budget_flood_quick.json"]),
    ("fuzz", [], ["--examples", "12", "--steps", "25"]),
    ("soak", ["--minutes", "30"], ["--minutes", "1", "--engines", "16", "--out", "bench/results/tmp/soak_quick.json"]),
    ("sim", [], ["--quick"]),
    ("reporter_cost", [], ["--posts", "30"]),
    ("reporter_gil", [], ["--regimes", "7500:200", "--rounds", "1", "--round-s", "1",
                          "--out", "bench/results/tmp/reporter_gil_quick.json"]),
    ("overhead", [], []),
    ("engine_core_ab", [], ["--sizes", "64", "--rounds", "1", "--steps", "50",
                            "--out", "bench/results/tmp/engine_core_ab_quick.json"]),
    ("hook_sections", [], ["--sizes", "16", "--steps", "40", "--out", "bench/results/tmp/hook_sections_quick.json"]),
    ("cpu.identical", [], ["--engines", "2", "--rounds", "2", "--out", "bench/results/tmp/identical_quick.json"]),
    ("cpu_engine", [], ["--quick"]),
]


def selected(name: str, wanted: set[str]) -> bool:
    """``--only`` matches a registry name, its module (``bench.sim.run``) or the module's last part (``run``)."""
    module = REGISTRY[name]
    return not wanted or bool({name, module, module.split(".")[-1], name.split(".")[-1]} & wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke mode of every benchmark")
    parser.add_argument("--only", default="", help="comma-separated benchmark names to run (default: all)")
    args = parser.parse_args(argv)
    wanted = {name.strip() for name in args.only.split(",") if name.strip()}
    failed: list[str] = []
    for name, full, quick in BENCHMARKS:
        if not selected(name, wanted):
            continue
        cmd = [sys.executable, "-m", "bench", name, *(quick if args.quick else full)]
        print(f"\n=== {' '.join(cmd[2:])}", flush=True)
        started = time.monotonic()
        code = subprocess.call(cmd)  # one process per benchmark, as before
        print(f"=== {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
