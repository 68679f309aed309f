"""One entry point for every benchmark: ``python -m bench <name> [args...]``, ``python -m bench --list``.

Run from the repository root (``bench`` and ``specctl_vllm`` are imported as packages from there). ``<name>`` is
one of :data:`BENCHMARKS`; its module's ``main(argv)`` gets the remaining arguments and its return value is the
exit status. ``python -m bench <name> --help`` shows a benchmark's options.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys

#: name -> module; every module has ``main(argv: list[str] | None = None) -> int``.
BENCHMARKS: dict[str, str] = {
    "all": "bench.run_all",
    # controller only
    "ingest": "bench.ingest",
    "load": "bench.load",
    "budget": "bench.budget",
    "fuzz": "bench.fuzz",
    "soak": "bench.soak",
    "sim": "bench.sim.run",
    "sim.decide": "bench.sim.decide_bench",
    "sim.fit_presets": "bench.sim.fit_presets",
    "sim.graph": "bench.sim.graph",
    "reporter_cost": "bench.reporter_cost",
    "reporter_gil": "bench.reporter_gil",
    # the vLLM CPU engine
    "overhead": "bench.overhead",
    "mixin_ab": "bench.mixin_ab",
    "engine_core_ab": "bench.engine_core_ab",
    "hook_sections": "bench.hook_sections",
    "cpu_engine": "bench.cpu_engine",
    "cpu.identical": "bench.cpu.identical",
    "cpu.stats": "bench.cpu.stats",
    "cpu.pool": "bench.cpu.pool",
    "cpu.costfit": "bench.cpu.costfit",
    "cpu.record": "bench.cpu.record",
    # vLLM on a GPU host (bench/gpu/README.md)
    "gpu.fit_cost": "bench.gpu.fit_cost",
    "gpu.sweep": "bench.gpu.sweep",
    "gpu.steady": "bench.gpu.steady",
    "gpu.steady_table": "bench.gpu.steady_table",
    "gpu.steady_widths": "bench.gpu.steady_widths",
    "gpu.budget_model": "bench.gpu.budget_model",
    "gpu.meter_replay": "bench.gpu.meter_replay",
    "gpu.check_noise": "bench.gpu.check_noise",
    "gpu.premise": "bench.gpu.premise",
    "gpu.seed_static": "bench.gpu.seed_static",
    "gpu.dispatch_check": "bench.gpu.dispatch_check",
    "gpu.trace_summary": "bench.gpu.trace_summary",
    # a day of traffic (bench/trace/README.md)
    "trace": "bench.trace.run",
    "trace.report": "bench.trace.report",
    "trace.measured": "bench.trace.measured",
}

USAGE = "usage: python -m bench <name> [args...] | python -m bench --list"


def description(module: str) -> str:
    """The first sentence of the module's docstring, read from its source (nothing imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return "(module not found)"
    with open(spec.origin, encoding="utf-8") as fh:
        doc = ast.get_docstring(ast.parse(fh.read())) or ""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    return paragraph.split(". ", 1)[0].rstrip(".")


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    return "\n".join(f"{name:<{width}}  {description(module)}" for name, module in BENCHMARKS.items())


def run(name: str, argv: list[str]) -> int:
    """Import the benchmark ``name`` and call its ``main(argv)``."""
    module = importlib.import_module(BENCHMARKS[name])
    sys.argv = [f"python -m bench {name}", *argv]  # argparse's prog in usage and --help
    code = module.main(argv)
    return int(code or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{__doc__.splitlines()[0]}\n\n{listing()}", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--list":
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"{USAGE}\npython -m bench: unknown benchmark {name!r}; python -m bench --list shows them",
              file=sys.stderr)
        return 2
    return run(name, rest)


if __name__ == "__main__":
    sys.exit(main())
