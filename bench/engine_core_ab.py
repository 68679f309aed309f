"""The engine core's host cost per step: vLLM's own scheduler, plain beside speculative, with and without the patch.

On a GPU the engine core (``schedule()`` and ``update_from_output()``) runs on the host while the device runs
the step before; when it takes longer than the device's step, the device waits. Session 17's H200 trace of a
pinned K = 0 step (``gpu.trace_summary``) showed the model runner's thread waiting on something untraced: is it
the engine core of a speculative engine, dearer than a plain one's even when no draft is verified?

Arms, each vLLM's real ``AsyncScheduler`` (the installed vLLM; the H200 runs 0.26) on one fake KV cache, N
running requests that never finish, the model's place taken by a runner output with one sampled token per
request (plus the accepted drafts where drafts were scheduled), driven as vLLM's engine core drives it with
async scheduling (step N + 1 scheduled before step N's output is read):

* ``plain``: no speculative config;
* ``static_k7``: speculative, K = 7 every step, unpatched (every request carries 7 placeholder drafts);
* ``patched_k0``: speculative with the patch's ``SpecctlMixin``, wired as on a graph-shaped GPU engine
  (EAGLE-3, widths 0/1/2/4/7), every category pinned at K = 0: what the H200's ``premise-k0`` engine runs;
* ``patched_adaptive``: the same with the bench policy's per-category E(K) and an H200-like cell table.

The speculative config is ``ngram_gpu`` (the one async-capable method a CPU build accepts without a drafter
model); it schedules no lookahead slots where EAGLE schedules k_max, so the KV cache manager's share is
understated by a little. Rounds alternate the arm order; per arm the median over rounds of each run's median
step time, with min and max; ratios to ``plain`` are per round.

    python -m bench engine_core_ab [--sizes 64,256] [--rounds 5] [--steps 300] [--out F]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "engine_core_ab.json"
MODEL_DIR = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"
CONTROLLER_URL_ENV = "SPECCTL_CONTROLLER_URL"
ARMS = ("plain", "static_k7", "patched_k0", "patched_adaptive")
K_MAX = 7
PROMPT_TOKENS = 64
WARMUP_STEPS = 20
BLOCK_SIZE = 16
MAX_MODEL_LEN = 4096
#: A request grows by at most 1 + K_MAX tokens a step: past this many timed steps it would reach the model
#: length and finish, and the batch would no longer hold N requests.
MAX_STEPS = (MAX_MODEL_LEN - PROMPT_TOKENS) // (1 + K_MAX) - WARMUP_STEPS - 32


def vllm_config(spec_k: int, max_seqs: int, model_dir: Path) -> Any:
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig

    scheduler = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=8192, max_model_len=MAX_MODEL_LEN,
                                enable_chunked_prefill=True, async_scheduling=True, is_encoder_decoder=False)
    model = ModelConfig(model=str(model_dir), dtype="float32", seed=0)
    cache = CacheConfig(block_size=BLOCK_SIZE, cache_dtype="auto")
    spec = SpeculativeConfig(method="ngram_gpu", num_speculative_tokens=spec_k, prompt_lookup_max=4,
                             prompt_lookup_min=2) if spec_k else None
    return VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache, speculative_config=spec)


def pinned_policy(width: int) -> Any:
    """Every category at K = ``width`` (the override a premise engine runs under)."""
    from bench.overhead import graph_policy

    base = graph_policy()
    pinned = {name: cp.model_copy(update={"k": width, "adapt": cp.adapt.model_copy(update={"k_min": width,
                                                                                              "k_max": width}),
                                          "source": "override"})
              for name, cp in base.categories.items()}
    return base.model_copy(update={"categories": pinned, "default": pinned["json"]})


def build_scheduler(arm: str, n: int, model_dir: Path) -> Any:
    import torch
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from specctl_vllm.engine_patch.runtime import SpecctlMixin

    config = vllm_config(0 if arm == "plain" else K_MAX, n, model_dir)
    blocks = n * (PROMPT_TOKENS + MAX_MODEL_LEN) // BLOCK_SIZE + 64
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    config.cache_config.num_gpu_blocks = blocks
    cls = AsyncScheduler
    if arm.startswith("patched"):
        class Patched(SpecctlMixin, AsyncScheduler):
            pass
        cls = Patched
    with controller_off():
        scheduler = cls(vllm_config=config, kv_cache_config=kv, log_stats=True, block_size=BLOCK_SIZE,
                        structured_output_manager=StructuredOutputManager(config))
    if arm.startswith("patched"):
        wire_graph_shaped(scheduler, 0 if arm == "patched_k0" else None)
    return scheduler


@contextlib.contextmanager
def controller_off() -> Iterator[None]:
    """The patch's runtime starts no reporter thread while the scheduler is built (nothing to report to), and the
    process's environment is left as it was."""
    held = os.environ.get(CONTROLLER_URL_ENV)
    os.environ[CONTROLLER_URL_ENV] = "off"
    try:
        yield
    finally:
        if held is None:
            os.environ.pop(CONTROLLER_URL_ENV, None)
        else:
            os.environ[CONTROLLER_URL_ENV] = held


def wire_graph_shaped(scheduler: Any, pinned: int | None) -> None:
    """The runtime a graph-shaped GPU engine builds (EAGLE-3 on full graphs), in place of the CPU one."""
    from bench.overhead import GRAPH_ENGINE_WIDTHS, graph_policy
    from specctl_vllm.engine_patch import runtime
    from specctl_vllm.engine_patch.hook import SpecHook
    from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
    from specctl_vllm.engine_patch.telemetry import StepQueue

    engine = EngineSpec(method="eagle3", k_max=K_MAX, full_cuda_graphs=True, graph_widths=GRAPH_ENGINE_WIDTHS)
    holder = PolicyHolder(engine)
    holder.install(graph_policy() if pinned is None else pinned_policy(pinned), time.monotonic())
    hook = SpecHook(engine, holder, StepQueue(4096), async_mode=True, overhead_budget=0.0,
                    token_budget=runtime.token_budget_of(scheduler))
    hook.drafts_from_engine_loop = runtime.engine_loop_counts_drafts(type(scheduler))
    old = scheduler._specctl
    if old is not None:
        old.close()
    scheduler._specctl = runtime.SpecctlRuntime(hook, None, 10)
    if hook.drafts_from_engine_loop:
        runtime.install_counting_call(scheduler, scheduler._specctl)


def add_requests(scheduler: Any, n: int, seed: int) -> None:
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from bench.support.workload import CATEGORIES

    hash_fn = get_hash_fn_by_name("sha256")  # vLLM's default; prefix caching on, as in a served engine
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    rng = random.Random(seed)
    for i in range(n):
        params = SamplingParams(max_tokens=10**6, ignore_eos=True,
                                extra_args={"specctl_category": CATEGORIES[i % len(CATEGORIES)]})
        scheduler.add_request(Request(f"r{i}", [rng.randrange(100, 5000) for _ in range(PROMPT_TOKENS)], params,
                                      None, block_hasher=hasher))


def runner_output(output: Any, rng: random.Random) -> Any:
    """One sampled token per scheduled request, plus the drafts a target with acceptance ~0.7 would keep."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(output.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        drafts = len(output.scheduled_spec_decode_tokens.get(rid, ()))
        kept = 0
        while kept < drafts and rng.random() < 0.7:
            kept += 1
        sampled.append([7] * (1 + kept))
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def run_arm(arm: str, n: int, steps: int, seed: int, model_dir: Path) -> dict[str, Any]:
    scheduler = build_scheduler(arm, n, model_dir)
    add_requests(scheduler, n, seed)
    rng = random.Random(seed)
    in_flight: list[Any] = []
    times: list[int] = []
    decoding = 0
    for _ in range(steps + WARMUP_STEPS + 64):  # bounded: the batch is all-decode from the third step on
        if len(times) >= steps:
            break
        t = time.perf_counter_ns()
        output = scheduler.schedule()
        spent = time.perf_counter_ns() - t
        in_flight.append(output)
        if len(in_flight) < 2:  # vLLM's batch queue of two: the next step is scheduled before this one is read
            continue
        done = in_flight.pop(0)
        result = runner_output(done, rng)
        t = time.perf_counter_ns()
        scheduler.update_from_output(done, result)
        spent += time.perf_counter_ns() - t
        all_decode = not output.scheduled_new_reqs and len(output.num_scheduled_tokens) == n
        decoding = decoding + 1 if all_decode else 0
        if decoding > WARMUP_STEPS:
            times.append(spent)
    if len(times) < steps:
        raise RuntimeError(f"{arm} at {n} requests: the batch did not stay at {n} decoding requests "
                           f"({len(times)} of {steps} steps timed)")
    row: dict[str, Any] = {"step_us": statistics.median(times) / 1e3, "drafts_last_step": sum(
        len(v) for v in output.scheduled_spec_decode_tokens.values())}
    rt = getattr(scheduler, "_specctl", None)
    if rt is not None:
        row["width_last_step"] = rt.hook.widths.width if rt.hook.widths is not None else None
        row["hook_reported_us"] = rt.hook.stats.hook_ns / max(rt.hook.stats.steps, 1) / 1e3
        row["errors"] = dict(rt.errors)
    return row


def compare(n: int, rounds: int, steps: int, model_dir: Path, arms: tuple[str, ...]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for r in range(rounds):
        order = arms if r % 2 == 0 else tuple(reversed(arms))
        for arm in order:
            runs[arm].append(run_arm(arm, n, steps, seed=r, model_dir=model_dir))
    out: dict[str, Any] = {"requests": n, "arms": {}}
    for arm in arms:
        us = [x["step_us"] for x in runs[arm]]
        entry = {"step_us_median": statistics.median(us), "step_us_min": min(us), "step_us_max": max(us)}
        if arm != "plain" and "plain" in runs:
            ratios = [a["step_us"] / p["step_us"] for a, p in zip(runs[arm], runs["plain"])]
            diffs = [a["step_us"] - p["step_us"] for a, p in zip(runs[arm], runs["plain"])]
            entry |= {"vs_plain_median": statistics.median(ratios), "vs_plain_min": min(ratios),
                      "vs_plain_max": max(ratios), "added_us_median": statistics.median(diffs),
                      "added_us_min": min(diffs), "added_us_max": max(diffs)}
        entry["runs"] = runs[arm]
        out["arms"][arm] = entry
        extra = (f", {entry['added_us_median']:+7.1f} us vs plain ({entry['added_us_min']:+.1f}..."
                 f"{entry['added_us_max']:+.1f}), x{entry['vs_plain_median']:.2f}") if "vs_plain_median" in entry else ""
        print(f"N={n:4d} {arm:17s} {entry['step_us_median']:8.1f} us/step ({entry['step_us_min']:.1f}-"
              f"{entry['step_us_max']:.1f}){extra}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256", help="running requests")
    parser.add_argument("--rounds", type=int, default=5, help="runs per arm and size (arm order alternates)")
    parser.add_argument("--steps", type=int, default=300, help="timed all-decode steps per run")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    parser.add_argument("--model", type=Path, default=MODEL_DIR, help="model folder (its config only is read)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if not arms or any(a not in ARMS for a in arms):
        parser.error(f"--arms takes a comma list of {', '.join(ARMS)}, not {args.arms!r}")
    if args.rounds < 1 or not 1 <= args.steps <= MAX_STEPS:
        parser.error(f"--rounds must be at least 1 and --steps between 1 and {MAX_STEPS} (the requests' room)")
    from bench.overhead import request_sizes

    sizes = request_sizes(parser, args.sizes)
    if not (args.model / "config.json").is_file():
        parser.error(f"no model config at {args.model} (make model)")
    logging.getLogger("vllm").setLevel(logging.WARNING)
    rows = [compare(n, args.rounds, args.steps, args.model, arms) for n in sizes]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    import vllm

    args.out.write_text(json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%S"), "vllm": vllm.__version__,
                                    "load_average": os.getloadavg(), "rounds": args.rounds, "steps": args.steps,
                                    "timer": "perf_counter_ns around schedule() and update_from_output()",
                                    "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
