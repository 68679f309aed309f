"""The steady-load sweep: EAGLE-3 on model runner V2, plain / static k / vLLM's K table / specctl, resumable.

One child process (``steady.py``) per engine start, in ``steady_plan.engines()`` order; each runs every
(concurrency, profile) point of its engine and appends one row per point to ``--results`` (and to every
``--mirror`` folder) as soon as it is measured. A later call skips every (engine, profile, concurrency) already
there and does not start an engine whose remaining points cannot finish before ``--budget-s``, so the same
command finishes the sweep over as many device calls as it needs. An engine that fails to start gets an
``engine_error`` row (not retried without ``--retry-failed``).

specctl engines report to a controller this script starts on the loopback (``processes.Controller``: SQLite in
``--state-dir``, the ``--cost-preset`` cold-start preset, a recording tap in front). Every engine loads the
benchmark plugin (``accept_plugin.py``: per-category acceptance, dispatch counts) through a dist-info folder
on its ``PYTHONPATH``; specctl engines and the K-table engine (for its start-up backport) also load the specctl
plugin.

    python3 -m bench gpu.sweep --results R.jsonl --state-dir D --budget-s 540 [--mirror $OUT] [--only plain,k4]
    python3 -m bench gpu.sweep --results R.jsonl --oracle          # + the mixed-profile hindsight oracle
    python3 -m bench gpu.sweep --results R.jsonl --only oracle     # only the oracle (after the static rows)
    python3 -m bench gpu.sweep --results R.jsonl --premise         # only the pinned-width step-cost check
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.gpu import steady_plan as plan
from bench.gpu.accept_plugin import ACCEPT_ENV, DISPATCH_FILE_ENV
from bench.gpu.plugin_dist import plugins_env, write_plugin_dist
from bench.gpu.processes import Controller, run_engine_process, tail
from bench.gpu.shapes import CONCURRENCY, PROFILES
from bench.gpu.steady_table import render

REPO = Path(__file__).resolve().parents[2]


#: gpu_memory_utilization of each engine when two share the GPU (paired rounds); vLLM's default is 0.9 for one.
PAIR_MEMORY_SHARE = 0.44


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, required=True, help="JSONL results (appended; points already there skipped)")
    p.add_argument("--mirror", type=Path, action="append", default=[], help="folder that gets a copy of every row")
    p.add_argument("--state-dir", type=Path, default=Path("/tmp/specctl-steady"), help="models, logs, controller DB")
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds from now after which nothing new starts")
    p.add_argument("--grace-s", type=float, default=20.0, help="seconds past the budget before a child is killed")
    p.add_argument("--only", default="", help="comma-separated engine names (default: every engine)")
    p.add_argument("--profiles", default=",".join(plan.STEADY_PROFILES))
    p.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    p.add_argument("--round-s", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workload", default=plan.DEFAULT_WORKLOAD, choices=sorted(plan.WORKLOADS),
                   help="requests' output lengths (steady_plan.WORKLOADS); one results file holds one workload")
    p.add_argument("--warmup-s", type=float, default=plan.Timing.warmup_s, help="static engines: warm-up of each point")
    p.add_argument("--learn-s", type=float, default=plan.Timing.learn_s,
                   help="specctl: learning period of its first point")
    p.add_argument("--relearn-s", type=float, default=plan.Timing.relearn_s,
                   help="specctl: learning period of every later point")
    p.add_argument("--pin-warmup-s", type=float, default=4.0, help="oracle/premise: warm-up after pinning")
    p.add_argument("--oracle", action="store_true", help="after the other engines: the mixed-profile oracle rows")
    p.add_argument("--premise", action="store_true", help="only the premise check (specctl pinned at K=0,2,4,7)")
    p.add_argument("--premise-profile", default=plan.PREMISE_PROFILE,
                   help="premise: comma-separated profiles whose categories are pinned (one engine start)")
    p.add_argument("--premise-ks", default=",".join(map(str, plan.PREMISE_KS)), help="premise: pinned widths")
    p.add_argument("--premise-concurrency", default=",".join(map(str, plan.PREMISE_CONCURRENCY)),
                   help="premise: concurrencies")
    p.add_argument("--allow-partial", action="store_true",
                   help="start an engine when at least its next point fits the budget (the rest resumes later)")
    p.add_argument("--retry-failed", action="store_true", help="start engines that have an engine_error row again")
    p.add_argument("--shape", default="8b")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--draft-method", default="eagle3", choices=["eagle3", "draft_model"])
    p.add_argument("--model-runner", default="v2", choices=["v2", "v1", "default"],
                   help="VLLM_USE_V2_MODEL_RUNNER for the engines (default: leave vLLM's choice)")
    p.add_argument("--cost-preset", default="h200", help="controller's cold-start step-cost preset")
    p.add_argument("--ktable-backports", default="1",
                   help="SPECCTL_BACKPORTS of the K-table engine (1: every backport that applies; "
                        "drafter_graphs: only its start-up fix)")
    p.add_argument("--pair-with", default="",
                   help="a static engine (plain, k1 ...) started beside each engine of the call and measured in "
                        "turns with it, round by round (steady.py: paired rounds)")
    p.add_argument("--memory-share", type=float, default=PAIR_MEMORY_SHARE,
                   help="--pair-with: gpu_memory_utilization of each of the two engines")
    args = p.parse_args(argv)
    if not 0.05 <= args.memory_share <= 0.5:
        p.error(f"--memory-share: each of two engines on one GPU takes 0.05-0.5 of its memory, got {args.memory_share}")
    return args


def pair_reference(name: str) -> plan.SteadyEngine | None:
    """The reference engine ``--pair-with`` names: a static engine (no controller, so its points need no pins)."""
    if not name:
        return None
    found = [e for e in (*plan.engines(), *plan.optional_engines()) if e.name == name]
    if not found or found[0].specctl:
        static = sorted(e.name for e in (*plan.engines(), *plan.optional_engines()) if not e.specctl)
        raise SystemExit(f"--pair-with: one of the static engines {', '.join(static)}, got {name!r}")
    return found[0]


def env_changes(base: dict[str, str], wanted: dict[str, str]) -> dict[str, str | None]:
    """What turns environment ``base`` into ``wanted`` (None: unset)."""
    changes: dict[str, str | None] = {k: v for k, v in wanted.items() if base.get(k) != v}
    changes.update({k: None for k in base if k not in wanted})
    return changes


def timing_of(args: argparse.Namespace) -> plan.Timing:
    return plan.Timing(round_s=args.round_s, rounds=args.rounds, warmup_s=args.warmup_s, learn_s=args.learn_s,
                       relearn_s=args.relearn_s, pin_warmup_s=args.pin_warmup_s)


def csv_ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def csv_names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def sweep_plan(args: argparse.Namespace, rows: dict) -> list[tuple[plan.SteadyEngine, list[plan.Point]]]:
    """(engine, its points in run order) for this call; the oracle's points come from the static rows so far."""
    timing = timing_of(args)
    concurrency = csv_ints(args.concurrency)
    wanted = csv_names(args.only)
    if args.premise or plan.PREMISE in wanted:
        ks = csv_ints(args.premise_ks)
        if not ks or any(not 0 <= k <= plan.SPECCTL_K_MAX for k in ks):
            raise SystemExit(f"--premise-ks: widths between 0 and {plan.SPECCTL_K_MAX}, got {args.premise_ks!r}")
        profiles = csv_names(args.premise_profile)
        unknown = [p for p in profiles if p not in plan.PROFILE_CATEGORIES]
        if not profiles or unknown:
            raise SystemExit(f"--premise-profile: one or more of {sorted(plan.PROFILE_CATEGORIES)}, "
                             f"got {args.premise_profile!r}")
        cs = csv_ints(args.premise_concurrency)
        points = [pt for profile in profiles
                  for pt in plan.premise_points(timing, ks=ks, profile=profile, concurrency=cs)]
        return [(plan.PREMISE_ENGINE, points)]
    chosen = ([e for e in plan.engines() if not wanted or e.name in wanted]
              + [e for e in plan.optional_engines() if e.name in wanted])
    out = [(e, plan.engine_points(e, csv_names(args.profiles), concurrency, timing)) for e in chosen]
    if args.oracle or plan.ORACLE in wanted:
        out.append((plan.ORACLE_ENGINE, plan.oracle_points(rows, concurrency, timing)))
    return out


def child_env(engine: plan.SteadyEngine, base: dict[str, str], *, dist_dir: Path, dispatch_file: Path,
              controller_url: str | None, model_runner: str, backports: str = "1") -> dict[str, str]:
    env = dict(base)
    env["PYTHONUNBUFFERED"] = "1"
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # the child may touch CUDA before vLLM starts EngineCore
    env["PYTHONPATH"] = os.pathsep.join([str(dist_dir), str(REPO)] + ([base["PYTHONPATH"]] if base.get("PYTHONPATH")
                                                                      else []))
    if model_runner != "default":
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if model_runner == "v2" else "0"
    env["VLLM_PLUGINS"] = plugins_env(engine.plugins)
    env[ACCEPT_ENV] = json.dumps(PROFILES)
    env[DISPATCH_FILE_ENV] = str(dispatch_file)
    if engine.backports:
        env["SPECCTL_BACKPORTS"] = backports
    if engine.specctl:
        assert controller_url is not None
        env["SPECCTL_CONTROLLER_URL"] = controller_url
        env.setdefault("SPECCTL_ENGINE_ID", f"gpu-steady-{engine.name}")
        # the synthetic sampler accepts any draft at the profile's rate: model-free drafters would score the same
        # and the policy would switch to them (bench/gpu/README.md, first H200 run, cause 4)
        env["SPECCTL_COUNTERFACTUAL_SHARE"] = "0"
    else:
        env["SPECCTL_CONTROLLER_URL"] = "off"
    env.update(engine.env)
    return env


def run_child(engine: plan.SteadyEngine, points: list[plan.Point], args: argparse.Namespace, deadline: float,
              controller: Controller, reference: plan.SteadyEngine | None = None) -> int:
    outs = [args.results] + [m / args.results.name for m in args.mirror]
    dispatch_file = args.state_dir / f"dispatch-{engine.name}.json"
    dispatch_file.unlink(missing_ok=True)  # a new worker starts counting at seq 1
    cmd = [sys.executable, "-m", "bench.gpu.steady", "--engine", engine.to_json(),
           "--points", json.dumps([asdict(p) for p in points]), "--shape", args.shape,
           "--models-dir", str(args.state_dir / "models"), "--deadline", str(deadline),
           "--round-s", str(args.round_s), "--rounds", str(args.rounds), "--draft-method", args.draft_method,
           "--workload", args.workload]
    for out in outs:
        cmd += ["--out", str(out)]
    if args.eager:
        cmd.append("--eager")
    dist_dir = write_plugin_dist(args.state_dir / "plugin_dist")
    env = child_env(engine, dict(os.environ), dist_dir=dist_dir,
                    dispatch_file=dispatch_file, controller_url=controller.engine_url() if engine.specctl else None,
                    model_runner=args.model_runner, backports=args.ktable_backports)
    if reference is not None:
        ref_dispatch = args.state_dir / f"dispatch-{reference.name}-beside-{engine.name}.json"
        ref_dispatch.unlink(missing_ok=True)
        ref_env = child_env(reference, dict(os.environ), dist_dir=dist_dir, dispatch_file=ref_dispatch,
                            controller_url=None, model_runner=args.model_runner, backports=args.ktable_backports)
        cmd += ["--pair-engine", reference.to_json(), "--pair-env", json.dumps(env_changes(env, ref_env)),
                "--pair-dispatch-file", str(ref_dispatch), "--memory-share", str(args.memory_share)]
    print(f"== {engine.name}: {len(points)} points" + (f", in turns with {reference.name}" if reference else ""),
          flush=True)
    return run_engine_process(engine.name, cmd, env, args.state_dir / f"{engine.name}.log", deadline + args.grace_s)


def error_row(engine: plan.SteadyEngine, rc: int, log: Path) -> dict:
    lines = tail(log, 400).splitlines()
    causes = [ln for ln in lines if ("Error" in ln or "error" in ln) and "WARNING" not in ln]
    return {"kind": "engine_error", "engine": engine.name, "rc": rc, "error": causes[-1] if causes else f"exit {rc}",
            "error_lines": causes[-15:], "engine_config": json.loads(engine.to_json()), "time": time.time()}


def append(paths: list[Path], row: dict) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


def export_steps(state_dir: Path, folders: list[Path]) -> None:
    """Every specctl telemetry batch the tap recorded (fit_cost.py), compressed."""
    steps = state_dir / "controller" / "steps.jsonl"
    if not steps.exists():
        return
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        with steps.open("rb") as src, gzip.open(folder / "steady_steps.jsonl.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)


def should_start(points: list[plan.Point], rows: dict, timing: plan.Timing, t_end: float,
                 allow_partial: bool, now: float, engines: int = 1) -> bool:
    """Whether the child fits the budget: ``engines`` (2 when paired) starts, and each point that many times."""
    startup = plan.startup_guess(rows)
    if now + engines * plan.engine_seconds(points, timing, startup) <= t_end:
        return True
    return allow_partial and now + engines * plan.engine_seconds(points[:1], timing, startup) <= t_end


def plan_line(full: list, left: list, rows: dict, timing: plan.Timing, budget_s: float, engines: int = 1) -> str:
    """The sweep's plan as designed, with the round-boundary slack, and what is left against the budget. A
    paired child (``engines`` = 2) starts two engines and runs every point's warm-up and rounds on both."""
    starts = sum(1 for _, p in full if p) * engines
    designed = engines * plan.planned_seconds(full, timing)
    slack = engines * plan.planned_seconds(full, timing, slack_s=plan.ROUND_SLACK_S)
    remaining = engines * plan.planned_seconds(left, timing, plan.startup_guess(rows), plan.ROUND_SLACK_S)
    paired = ", paired: both engines' starts and rounds" if engines > 1 else ""
    return (f"planned: full sweep {designed / 60:.1f} min ({sum(len(p) for _, p in full)} points, {starts} engine "
            f"starts at {plan.STARTUP_GUESS_S:.0f} s{paired}; {slack / 60:.1f} min with the round-boundary slack); "
            f"left {remaining / 60:.1f} min ({sum(len(p) for _, p in left)} points); budget {budget_s / 60:.1f} min")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_end = time.time() + args.budget_s
    timing = timing_of(args)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    other = plan.workloads_in(args.results) - {args.workload}
    if other:
        print(f"{args.results} holds rows of the {', '.join(sorted(other))} workload; --workload {args.workload} "
              "needs a results file of its own", file=sys.stderr)
        return 2
    rows, _ = plan.load_results(args.results)
    reference = pair_reference(args.pair_with)
    full = [(e, pts) for e, pts in sweep_plan(args, rows) if reference is None or e.name != reference.name]
    left = [(e, plan.pending(pts, set(rows))) for e, pts in full]
    print(plan_line(full, left, rows, timing, args.budget_s, engines=1 if reference is None else 2), flush=True)
    for folder in args.mirror:  # the mirror holds every row so far, not only this call's
        folder.mkdir(parents=True, exist_ok=True)
        if args.results.exists():
            shutil.copy(args.results, folder / args.results.name)
    controller = Controller(args.state_dir / "controller", args.cost_preset, args.state_dir / "controller.log")
    folders = [args.results.parent] + args.mirror
    failed = []
    try:
        for engine, _ in full:
            rows, failures = plan.load_results(args.results)
            points = dict(sweep_plan(args, rows))[engine] if engine.name == plan.ORACLE else dict(full)[engine]
            todo = plan.pending(points, set(rows))
            if not todo:
                continue
            if engine.name in failures and not args.retry_failed:
                print(f"== {engine.name}: failed before ({failures[engine.name]['error'][:200]}); --retry-failed",
                      flush=True)
                continue
            if not should_start(todo, rows, timing, t_end, args.allow_partial, time.time(),
                                engines=1 if reference is None else 2):
                print(f"== {engine.name}: not started, budget ({len(todo)} points left)", flush=True)
                continue
            rc = run_child(engine, todo, args, t_end, controller, reference)
            after, _ = plan.load_results(args.results)
            produced = [k for k in after if k not in rows]
            if rc != 0:
                failed.append(engine.name)
                log = args.state_dir / f"{engine.name}.log"
                print(f"== {engine.name}: exit {rc}; last lines of its log:\n{tail(log, 40)}", flush=True)
                if not produced:
                    append([args.results] + [m / args.results.name for m in args.mirror], error_row(engine, rc, log))
                for folder in args.mirror:  # one file for all failures: few files come back from a device call
                    with (folder / "failures.log").open("a") as fh:
                        fh.write(f"== {engine.name}: exit {rc}\n{tail(log, 400)}\n")
            if engine.specctl:
                controller.dump(folders)
    finally:
        controller.stop(folders)
        export_steps(args.state_dir, folders)
        for folder in args.mirror:
            if (args.state_dir / "controller.log").exists():
                shutil.copy(args.state_dir / "controller.log", folder / "controller.log")
    print(render(args.results))
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
