"""A day of traffic on a GPU: specctl against every static k on the same trace, from cold, repeats interleaved.

``python -m bench trace`` runs the trace (``bench/trace/day.json`` by default, scaled with ``--duration-s``) on
one patched vLLM engine (EAGLE-3 head on model runner V2, dummy 8B weights, vLLM's synthetic rejection sampler)
whose acceptance per category and per draft position is replayed from an acceptance profile
(``bench/trace/profiles.json``: ``--profile``). Configurations: ``specctl`` and ``kN`` (every category pinned to
N, ``k0`` = speculation off); each runs the whole trace from a cold controller, ``--repeats`` times, interleaved
(repeat r runs the configurations in order, the next one in reverse). The per-phase static oracle is each
phase's best static measured in the same runs (``bench.trace.stats``).

Resumable: a (configuration, repeat) already in ``--results`` is not run again, and no engine starts that cannot
run one trace before ``--budget-s``; the same command finishes a sweep over as many calls as it needs.
``--mirror`` folders get a copy of every row as it is written (the device brings back ``$OUT``).

    python3 -m bench trace --results R.jsonl --state-dir S --budget-s 540 --mirror "$OUT"
    python3 -m bench trace.report R.jsonl --out-dir bench/results/trace     # here: tables and PNGs

CPU smoke test of the harness (vLLM CPU build: no synthetic sampling, no graphs):
    VLLM_CPU_KVCACHE_SPACE=1 .venv/bin/python -m bench trace --shape tiny --eager --model-runner default \
        --cost-preset cpu --duration-s 20 --configs specctl,k2 --repeats 1 --results /tmp/tr/r.jsonl \
        --state-dir /tmp/tr/state --max-concurrency 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from bench.trace.spec import Profile, TraceError, load_profiles, load_trace, unconditional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_TRACE = HERE / "day.json"
DEFAULT_PROFILES = HERE / "profiles.json"
DEFAULT_CONFIGS = ("specctl", "k0", "k1", "k2", "k4", "k7")
STARTUP_GUESS_S = 170.0
WARMUP_S = 10.0
K_MAX = 7


def run_order(configs: tuple[str, ...], repeats: int) -> list[tuple[str, int]]:
    """Repeats interleaved: repeat r runs ``configs`` in order when r is even, reversed when odd."""
    out = []
    for r in range(repeats):
        out += [(c, r) for c in (configs if r % 2 == 0 else configs[::-1])]
    return out


def done_runs(path: Path, trace: str, profile: str, duration_s: float) -> set[tuple[str, int]]:
    """Runs of this trace, profile and duration already in the results file."""
    out = set()
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if (row.get("kind") == "trace_run" and row.get("trace") == trace and row.get("profile") == profile
                and abs(float(row.get("duration_s", -1)) - duration_s) < 1e-6):
            out.add((row["config"], int(row["repeat"])))
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace file (default: %(default)s)")
    p.add_argument("--duration-s", type=float, default=None, help="scale the trace to this many seconds")
    p.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES, help="acceptance profiles file")
    p.add_argument("--profile", default="eagle3-published", help="profile name in --profiles (default: %(default)s)")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="specctl and/or kN, comma-separated (av, specctl_av: with --adaptive-verification)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", type=Path, required=True, help="JSONL file the runs are appended to")
    p.add_argument("--state-dir", type=Path, required=True, help="models, controller store, logs")
    p.add_argument("--mirror", type=Path, action="append", default=[], help="folder that gets a copy of every row")
    p.add_argument("--budget-s", type=float, default=540.0, help="wall time this call may use")
    p.add_argument("--platform", default="gpu", choices=["gpu", "cpu"],
                   help="gpu: dummy 8B + EAGLE-3, synthetic acceptance from --profile; cpu: the real CPU engine "
                        "(SmolLM2-135M, n-gram, the project's prompts; acceptance is what the drafter reaches)")
    p.add_argument("--model-dir", default=os.environ.get("SPECCTL_MODEL_DIR", ""),
                   help="cpu: the served model folder (default: $SPECCTL_MODEL_DIR)")
    p.add_argument("--peak-concurrency", type=int, default=None,
                   help="scale every phase's load so that the trace's peak is this many requests in flight")
    p.add_argument("--shape", default="8b", help="bench.gpu.shapes shape (tiny: CPU smoke test)")
    p.add_argument("--draft-method", default="eagle3", choices=["eagle3", "draft_model"])
    p.add_argument("--model-runner", default="v2", choices=["v2", "v1", "default"])
    p.add_argument("--eager", action="store_true", help="no torch.compile / CUDA graphs (CPU smoke tests)")
    p.add_argument("--cost-preset", default="h200")
    p.add_argument("--max-concurrency", type=int, default=None, help="cap every phase's load (CPU smoke tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--controller-port", type=int, default=18091)
    p.add_argument("--adaptive-verification", action="store_true",
                   help="vLLM >= 0.34: start the engine with enable_adaptive_verification; configurations av "
                        "(every category pinned at k 7) and specctl_av (specctl's policy around vLLM's budget)")
    p.add_argument("--record-dir", type=Path, default=None,
                   help="the controller records every run's telemetry under DIR/<config>-r<repeat> (specctl replay, "
                        "bench trace.measured)")
    return p.parse_args(argv)


def config_problem(configs: tuple[str, ...], adaptive: bool, platform: str) -> str:
    """Why these configurations cannot share one engine ('' when they can): av and specctl_av run on an engine
    started with adaptive verification (GPU only), every other configuration on one without it."""
    from bench.trace.engine_proc import ADAPTIVE_CONFIGS, config_k

    for c in configs:
        try:
            config_k(c)
        except ValueError as exc:
            return str(exc)
    wrong = [c for c in configs if (c in ADAPTIVE_CONFIGS) != adaptive]
    if wrong:
        return (f"{', '.join(wrong)} need{'s' if len(wrong) == 1 else ''} "
                + ("an engine without --adaptive-verification" if adaptive else "--adaptive-verification"))
    if adaptive and platform != "gpu":
        return "--adaptive-verification needs the GPU platform (vLLM >= 0.34 with CUDA graphs)"
    return ""


def engine_kwargs(args: argparse.Namespace, profile, trace) -> dict:
    from bench.gpu import steady_plan as plan
    from bench.gpu.shapes import PROMPT_TOKENS
    from bench.gpu.steady import model_dirs

    engine = plan.SteadyEngine(name="specctl", k=K_MAX, specctl=True)
    target, draft = model_dirs(args.state_dir / "models", args.shape, args.draft_method)
    synthetic = args.shape != "tiny" and not args.eager
    kwargs = plan.engine_kwargs(engine, target, draft, method=args.draft_method, synthetic=synthetic,
                                eager=args.eager)
    if synthetic:  # draft at the envelope of the profile; the plugin lowers each category to its own rates
        kwargs["speculative_config"]["synthetic_acceptance_rates"] = unconditional(profile.envelope()[:K_MAX])
    longest = max(p.output_max for p in trace.phases)
    kwargs["max_model_len"] = PROMPT_TOKENS + longest + 64
    kwargs["max_num_seqs"] = max(8, min(256, trace.max_concurrency()))
    if getattr(args, "adaptive_verification", False):
        kwargs["speculative_config"]["enable_adaptive_verification"] = True
    return kwargs


def capped(trace, cap: int | None, peak: int | None = None):
    """Every phase's load scaled so that the peak is ``peak`` (at least 1 in flight), then capped at ``cap``."""
    if cap is None and peak is None:
        return trace
    from bench.trace.spec import parse_trace

    data = trace.to_json()
    f = peak / trace.max_concurrency() if peak else 1.0
    for ph in data["phases"]:
        if "concurrency" in ph:
            ph["concurrency"] = max(1, round(ph["concurrency"] * f))
            if cap is not None:
                ph["concurrency"] = min(ph["concurrency"], cap)
        else:
            ph["rate_rps"] = ph["rate_rps"] * f
            limit = ph.get("max_in_flight") or (cap or 4096)
            ph["max_in_flight"] = max(1, min(round(limit * f) if "max_in_flight" in ph else limit, cap or 4096))
    return parse_trace(data)


CPU_K_MAX = 8
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}


def cpu_engine_kwargs(args: argparse.Namespace, trace) -> dict:
    """The real CPU engine of bench cpu_engine: float32, eager, prefix caching off, n-gram up to k = 8."""
    from bench.gpu.steady_plan import SPECCTL_SCHEDULER

    return {"model": args.model_dir, "dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False,
            "max_num_seqs": max(8, trace.max_concurrency()), "max_model_len": 2048, "seed": 0,
            "speculative_config": {"method": "ngram", "num_speculative_tokens": CPU_K_MAX, **NGRAM_LOOKUP},
            "scheduler_cls": SPECCTL_SCHEDULER}


def main(argv: list[str] | None = None) -> int:
    from bench.gpu.accept_plugin import ACCEPT_ENV
    from bench.gpu.plugin_dist import plugins_env, write_plugin_dist
    from bench.gpu.processes import run_engine_process
    from bench.gpu.shapes import PROMPT_TOKENS, SHAPES

    args = parse(argv)
    t_end = time.time() + args.budget_s
    try:
        trace = load_trace(args.trace)
        profiles = load_profiles(args.profiles)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.platform == "cpu":
        if not args.model_dir or not Path(args.model_dir, "config.json").exists():
            print(f"error: --model-dir {args.model_dir!r} holds no model (make model)", file=sys.stderr)
            return 2
        # acceptance is what the engine's own n-gram drafter reaches on the real prompts
        profile = Profile("real-ngram-cpu", (), "the real CPU engine's own drafter")
    elif args.profile not in profiles:
        print(f"error: no profile {args.profile!r} in {args.profiles} (have: {', '.join(profiles)})", file=sys.stderr)
        return 2
    else:
        profile = profiles[args.profile]
    if args.duration_s:
        trace = trace.scaled(args.duration_s)
    trace = capped(trace, args.max_concurrency, args.peak_concurrency)
    missing = [c for c in trace.categories if profile.of(c) is None]
    if args.platform == "gpu" and missing:
        print(f"error: profile {profile.name} has no rates for {', '.join(missing)}", file=sys.stderr)
        return 2
    configs = tuple(c for c in args.configs.split(",") if c)
    problem = config_problem(configs, args.adaptive_verification, args.platform)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    todo_all = run_order(configs, args.repeats)
    done = done_runs(args.results, trace.name, profile.name, trace.duration_s)
    todo = [r for r in todo_all if r not in done]
    print(f"trace {trace.name}: {len(trace.phases)} phases, {trace.duration_s:.0f} s; profile {profile.name}; "
          f"{len(done)} of {len(todo_all)} runs done, {len(todo)} left; budget {args.budget_s:.0f} s", flush=True)
    for folder in args.mirror:
        folder.mkdir(parents=True, exist_ok=True)
        if args.results.exists():
            shutil.copy(args.results, folder / args.results.name)
    if not todo:
        return 0
    if time.time() + STARTUP_GUESS_S + WARMUP_S + trace.duration_s > t_end:
        print("not started: the budget holds no engine start and one trace", flush=True)
        return 0
    args.state_dir.mkdir(parents=True, exist_ok=True)
    kwargs = engine_kwargs(args, profile, trace) if args.platform == "gpu" else cpu_engine_kwargs(args, trace)
    dist_dir = write_plugin_dist(args.state_dir / "plugin_dist")
    env = dict(os.environ)
    env.update({
        "PYTHONUNBUFFERED": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "PYTHONPATH": os.pathsep.join([str(dist_dir), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                    else [])),
        "SPECCTL_CONTROLLER_URL": f"http://127.0.0.1:{args.controller_port}",
        # unique: a controller refuses batches of a second engine under one id (an engine left over elsewhere)
        "SPECCTL_ENGINE_ID": f"trace-{args.platform}-{os.getpid()}",
    })
    if args.platform == "gpu":
        env.update({
            "VLLM_PLUGINS": plugins_env(("specctl", "specctl_bench")),
            ACCEPT_ENV: json.dumps({c: list(r) for c, r in profile.rates}),
            # the synthetic sampler accepts any draft at the profile's rate: model-free drafters would score the
            # same and the policy would switch to them
            "SPECCTL_COUNTERFACTUAL_SHARE": "0",
        })
    else:
        from bench.cpu.engines import default_ld_preload, default_omp_bind

        env.update({"VLLM_PLUGINS": "specctl", "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "2"),
                    "VLLM_CPU_OMP_THREADS_BIND": default_omp_bind()})
        if default_ld_preload():
            env["LD_PRELOAD"] = default_ld_preload()
    if args.model_runner != "default" and args.platform == "gpu":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.model_runner == "v2" else "0"
    outs = [args.results] + [m / args.results.name for m in args.mirror]
    trace_json = trace.to_json()
    cmd = [sys.executable, "-m", "bench.trace.engine_proc", "--trace-json", json.dumps(trace_json),
           "--runs", json.dumps(todo), "--engine-kwargs", json.dumps(kwargs),
           "--requests", "tokens" if args.platform == "gpu" else "chat",
           "--vocab", str(SHAPES[args.shape]["target"].vocab_size), "--prompt-tokens", str(PROMPT_TOKENS),
           "--controller-port", str(args.controller_port), "--state-dir", str(args.state_dir),
           "--cost-preset", args.cost_preset, "--seed", str(args.seed), "--deadline", str(t_end)]
    for out in outs:
        cmd += ["--out", str(out)]
    if args.record_dir is not None:
        cmd += ["--record-dir", str(args.record_dir)]
    env["SPECCTL_TRACE_PROFILE"] = profile.name
    env["SPECCTL_TRACE_DURATION_S"] = repr(trace.duration_s)
    rc = run_engine_process("trace", cmd, env, args.state_dir / "trace-engine.log", t_end + 20)
    for folder in args.mirror:
        log = args.state_dir / "trace-engine.log"
        if log.exists():
            shutil.copy(log, folder / "trace-engine.log")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
