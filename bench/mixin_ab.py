"""The engine patch's cost per step through the real scheduler mixin, against the same scheduler unpatched.

Both arms are one scheduler stand-in whose per-drafted-request call is vLLM's own
``Scheduler.make_spec_decoding_stats`` (counting into a real ``SpecDecodingStats``) and whose
``update_from_output`` calls it as vLLM 0.26 does, keyword for keyword; the patched arm is
``SpecctlMixin`` over it with a graph-shaped runtime (EAGLE-3, widths 0/1/2/4/7, an H200-like cell table,
four categories), wired as the runtime wires it on a GPU engine. A step is ``schedule()`` ->
``_update_after_schedule()`` -> (the model's place: a buffer of ``--evict-mb`` written, untimed, so the patch meets
the requests out of cache) -> ``update_from_output()``; each arm's step is timed from outside with
``perf_counter_ns``, so the patch's cost is what it adds to the step whatever the hook's own accounting says.
The hook's self-reported cost (the engine log's overhead line) is reported beside it: the two should agree.

Rounds alternate which arm runs first; per arm the median over rounds of each run's median step time; the
patch's cost per step is the median of the paired differences, with min and max.

Usage: ``python -m bench mixin_ab [--sizes 64,256] [--rounds 7] [--steps 300] [--evict-mb 64] [--out F]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.overhead import GRAPH_ENGINE_WIDTHS, graph_policy, median, request_sizes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "mixin_ab.json"


def scheduler_classes() -> tuple[type, type]:
    """(unpatched, patched) stand-ins of vLLM's scheduler: vLLM's own per-request stats call, vLLM's loop."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from bench.support.engine_sim import SimOutput, SimRunnerOutput
    from specctl_vllm.engine_patch.runtime import SpecctlMixin

    class StandIn:
        make_spec_decoding_stats = Scheduler.make_spec_decoding_stats

        def __init__(self, requests: list[Any], accepted: list[list[int]], k_max: int) -> None:
            self.log_stats = True
            self.num_spec_tokens = k_max
            self.num_sampled_tokens_per_step = 1
            self.running = list(requests)
            self.requests = {r.request_id: r for r in requests}
            self.accepted = accepted  # per step, per request: drafts the target accepts
            self.step_index = 0
            self.stats_seen = 0
            self.vllm_config = SimpleNamespace()  # the runtime is wired by hand below (no engine config here)
            self.structured_output_manager = SimpleNamespace(validate_tokens=None)

        def schedule(self) -> Any:
            num_sched = {r.request_id: 1 + len(r.spec_token_ids) for r in self.running}
            spec = {r.request_id: r.spec_token_ids for r in self.running if r.spec_token_ids}
            output = SimOutput(num_scheduled_tokens=num_sched, scheduled_spec_decode_tokens=spec,
                               total_num_scheduled_tokens=sum(num_sched.values()), scheduled_new_reqs=[],
                               num_spec_tokens_to_schedule=self.num_spec_tokens)
            self._update_after_schedule(output)
            return output

        def _update_after_schedule(self, output: Any) -> None:
            return None

        def update_from_output(self, output: Any, runner_output: Any) -> dict:
            stats = None
            sampled = runner_output.sampled_token_ids
            for req_id in output.num_scheduled_tokens:
                generated = sampled[runner_output.req_id_to_index[req_id]]
                drafts = output.scheduled_spec_decode_tokens.get(req_id)
                if drafts and generated:
                    stats = self.make_spec_decoding_stats(
                        stats, num_draft_tokens=len(drafts), num_accepted_tokens=max(len(generated) - 1, 0),
                        num_invalid_spec_tokens=output.num_invalid_spec_tokens, request_id=req_id)
            self.stats_seen += stats.num_drafts if isinstance(stats, SpecDecodingStats) else 0
            return {}

        def runner_output(self, output: Any) -> Any:
            row = self.accepted[self.step_index % len(self.accepted)]
            self.step_index += 1
            index = {rid: i for i, rid in enumerate(output.num_scheduled_tokens)}
            sampled = []
            for i, rid in enumerate(output.num_scheduled_tokens):
                width = len(output.scheduled_spec_decode_tokens.get(rid, ()))
                sampled.append([7] * (1 + min(row[i], width)))
            return SimRunnerOutput(index, sampled)

        def set_drafts(self, width: int) -> None:
            """What vLLM's async scheduler leaves on a request: the next step's placeholder drafts."""
            for r in self.running:
                if len(r.spec_token_ids) != width:
                    r.spec_token_ids = [-1] * width

    class Patched(SpecctlMixin, StandIn):
        pass

    return StandIn, Patched


def build_arm(patched: bool, n: int, steps: int, seed: int) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from bench.support.workload import CATEGORIES
    from specctl_vllm.engine_patch import runtime
    from specctl_vllm.engine_patch.hook import SpecHook
    from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
    from specctl_vllm.engine_patch.telemetry import StepQueue

    rng = random.Random(seed)
    requests = []
    for i in range(n):
        params = SamplingParams(max_tokens=10**6, extra_args={"specctl_category": CATEGORIES[i % len(CATEGORIES)]})
        requests.append(Request(f"ab-{i}", [rng.randrange(100, 5000) for _ in range(64)], params, None))
    accepted = [[rng.randrange(0, 8) for _ in range(n)] for _ in range(64)]
    unpatched, patched_cls = scheduler_classes()
    cls = patched_cls if patched else unpatched
    quiet = logging.getLogger("vllm.specctl.engine")
    quiet.disabled = True  # the runtime cannot build from the stand-in's config; it is wired by hand below
    try:
        scheduler = cls(requests, accepted, 7)
    finally:
        quiet.disabled = False
    if patched:
        engine = EngineSpec(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=GRAPH_ENGINE_WIDTHS)
        holder = PolicyHolder(engine)
        holder.install(graph_policy(), time.monotonic())
        hook = SpecHook(engine, holder, StepQueue(steps + 64), overhead_budget=0.0, token_budget=8192)
        hook.drafts_from_engine_loop = True
        rt = runtime.SpecctlRuntime(hook, None, 10)
        scheduler._specctl = rt
        install = getattr(runtime, "install_counting_call", None)
        if install is not None:  # a checkout from before the wrapper counts through the class's override
            install(scheduler, rt)
    return scheduler


def run_arm(patched: bool, n: int, steps: int, evict: Any, seed: int) -> dict[str, Any]:
    from specctl_vllm.engine_patch.telemetry import step_aggregate

    scheduler = build_arm(patched, n, steps, seed)
    times = []
    for i in range(steps + 20):
        width = scheduler._specctl.hook.widths.width if patched else 4
        scheduler.set_drafts(width)
        t = time.perf_counter_ns()
        output = scheduler.schedule()
        spent = time.perf_counter_ns() - t
        evict += 1.0  # the model's place: the requests leave the cache
        runner = scheduler.runner_output(output)
        t = time.perf_counter_ns()
        scheduler.update_from_output(output, runner)
        spent += time.perf_counter_ns() - t
        if i >= 20:  # warm-up: the first policy, the first widths
            times.append(spent)
    row: dict[str, Any] = {"step_us": median([t / 1e3 for t in times]), "drafts_counted_by_vllm": scheduler.stats_seen}
    if patched:
        rt = scheduler._specctl
        stats = rt.hook.stats
        row["hook_reported_us"] = stats.hook_ns / max(stats.steps, 1) / 1e3
        row["overhead_line"] = stats.overhead_line()
        row["errors"] = dict(rt.errors)
        rows = rt.hook.queue.drain(10**6)
        row["drafts_counted_by_patch"] = sum(n for r in rows for e in step_aggregate(r).values()
                                             for counts in e.hists.values() for n in counts)
        row["steps_reported"] = len(rows)
    return row


def ab(n: int, rounds: int, steps: int, evict_mb: float) -> dict[str, Any]:
    import numpy as np

    evict = np.zeros(max(int(evict_mb * 2**20) // 8, 1))
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for r in range(rounds):
        for patched in ((False, True) if r % 2 == 0 else (True, False)):
            runs[patched].append(run_arm(patched, n, steps, evict, seed=r))
    diffs = sorted(p["step_us"] - u["step_us"] for p, u in zip(runs[True], runs[False]))
    reported = sorted(p["hook_reported_us"] for p in runs[True])
    out = {
        "requests": n,
        "unpatched_step_us": median([u["step_us"] for u in runs[False]]),
        "patched_step_us": median([p["step_us"] for p in runs[True]]),
        "patch_us_per_step": median(diffs), "patch_us_min": diffs[0], "patch_us_max": diffs[-1],
        "hook_reported_us_per_step": median(reported), "hook_reported_min": reported[0],
        "hook_reported_max": reported[-1],
        "errors": [p["errors"] for p in runs[True] if p["errors"]],
        "runs": {"unpatched": runs[False], "patched": runs[True]},
    }
    print(f"N={n:4d}: unpatched {out['unpatched_step_us']:7.1f} us/step, patched {out['patched_step_us']:7.1f}: "
          f"the patch adds {out['patch_us_per_step']:6.1f} us ({diffs[0]:.1f}-{diffs[-1]:.1f}, {rounds} pairs), "
          f"{1e3 * out['patch_us_per_step'] / n:5.0f} ns/request; its own overhead line says "
          f"{out['hook_reported_us_per_step']:6.1f} us ({reported[0]:.1f}-{reported[-1]:.1f})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256", help="running requests (all drafted every step)")
    parser.add_argument("--rounds", type=int, default=7, help="pairs of runs per size (arm order alternates)")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run")
    parser.add_argument("--evict-mb", type=float, default=64.0, help="MB written where the model runs")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPECCTL_CONTROLLER_URL", "off")
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    sizes = request_sizes(parser, args.sizes)
    rows = [ab(n, args.rounds, args.steps, args.evict_mb) for n in sizes]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_average": os.getloadavg(),
                                    "timer": "perf_counter_ns around schedule() and update_from_output()",
                                    "rounds": args.rounds, "steps": args.steps, "evict_mb": args.evict_mb,
                                    "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
