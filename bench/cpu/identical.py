"""How far apart identical engines measure on this machine: the floor under every CPU benchmark ratio.

N plain vLLM CPU engines with the same configuration (static n-gram k, the benchmark's engine flags) are started one after another and all kept
running, like the benchmark's always-on specctl engine beside each configuration's. The same chunks of the
benchmark workload then run on each engine in turn (round j: start order, reversed on odd rounds, so a steady
drift of the machine cancels), never two at once. Identical engines serving identical requests should
measure the same goodput; the spread between them (max / min, and each engine over the mean of the others)
is what no pairing of two engines can resolve.

    python -m bench cpu.identical [--engines 4] [--rounds 3] [--concurrency 1] [--k 4]

Writes bench/results/cpu_identical_engines.json: goodput per engine (in start order) per round and overall.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from bench.cpu import engines
from bench.cpu.driver import run_phase, touch
from bench.cpu.workload import bench_workload
from bench.support.stack import model_dir
from bench.support.vllm_server import VllmServer
from bench.support.workload import CATEGORIES

RESULTS = ROOT / "bench" / "results" / "cpu_identical_engines.json"


def rotation(names: list[str], j: int) -> list[str]:
    """Round ``j``'s order: start order on even rounds, reversed on odd ones (ABBA over many engines)."""
    return names if j % 2 == 0 else names[::-1]


def spread(goodput: dict[str, float]) -> dict:
    vals = list(goodput.values())
    out = {"max_over_min": max(vals) / min(vals)}
    if len(vals) > 1:
        out["each_over_mean_of_others"] = {n: g / ((sum(vals) - g) / (len(vals) - 1)) for n, g in goodput.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--k", type=int, default=4, help="static n-gram k of every engine (0: no speculation)")
    ap.add_argument("--no-touch", dest="touch", action="store_false",
                    help="no short request to an engine right before its measured chunk (bench/cpu/driver.touch)")
    ap.add_argument("--server-cpus", default="none",
                    help="CPUs for the engines' API server and EngineCore ('auto': all but --omp-bind's; "
                         "default 'none': left to the kernel, as in the CPU benchmark)")
    ap.add_argument("--omp-bind", default=engines.default_omp_bind())
    ap.add_argument("--workdir", default=str(ROOT / "bench" / "results" / "tmp" / "identical"))
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if not 2 <= args.engines <= 6 or args.rounds < 1 or args.concurrency < 1 or not 0 <= args.k <= 8:
        ap.error("--engines 2..6, --rounds >= 1, --concurrency >= 1, --k 0..8")
    cpus = {"none": None, "auto": engines.default_server_cpus(args.omp_bind)}.get(args.server_cpus, args.server_cpus)
    size = len(CATEGORIES) * max(1, args.concurrency // 4)
    prompts = bench_workload(max(1, args.rounds * size // len(CATEGORIES)))
    chunks = [prompts[i : i + size] for i in range(0, len(prompts), size)][: args.rounds]
    warm = bench_workload(1, seed=1)[:4]
    spec = engines.ngram(args.k) if args.k else None
    extra = (engines.SPEC_METRICS if spec else []) + ["--max-num-seqs", str(engines.MAX_NUM_SEQS),
                                                      "--no-enable-prefix-caching"]
    md = model_dir(None)
    figures: dict[str, list[list[float]]] = {}
    with ExitStack() as stack:
        urls = {}
        for i in range(args.engines):
            name = f"engine-{i + 1}"
            eng = VllmServer(md, Path(args.workdir) / name, speculative=spec, patched=False, extra_args=extra,
                             extra_env=engines.engine_env(args.omp_bind, engines.default_ld_preload()),
                             log_name="vllm.log", cpus=cpus)
            stack.callback(eng.stop)
            eng.start()
            urls[name] = eng.url
        for name, url in urls.items():
            run_phase(url, warm, args.concurrency, desc=f"{name} warm-up")
        for j, chunk in enumerate(chunks):
            for name in rotation(list(urls), j):
                if args.touch:
                    touch(urls[name])
                ph = run_phase(urls[name], chunk, args.concurrency, desc=f"{name} round {j + 1}")
                tokens = sum(len(r.token_ids) for r in ph.records if r.ok)
                figures.setdefault(name, []).append([tokens, ph.wall_s])
                print(f"{name} round {j + 1}: {tokens / ph.wall_s:6.2f} tok/s", flush=True)
    goodput = {n: sum(t for t, _ in f) / sum(w for _, w in f) for n, f in figures.items()}
    out = {"benchmark": "identical CPU engines, same requests (bench/cpu/identical.py)",
           "settings": {"engines": args.engines, "rounds": len(chunks), "concurrency": args.concurrency, "k": args.k,
                        "prompts_per_round": size, "omp_bind": args.omp_bind, "server_cpus": cpus, "touch": args.touch},
           "goodput_in_start_order": goodput, "chunks": figures, **spread(goodput)}
    Path(args.out).write_text(json.dumps(out, indent=1))
    for n, g in goodput.items():
        print(f"{n}: {g:.2f} tok/s ({out['each_over_mean_of_others'][n]:.3f} x the mean of the others)")
    print(f"max / min: {out['max_over_min']:.3f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
