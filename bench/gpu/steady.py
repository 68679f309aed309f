"""One engine start of the steady-load benchmark: every point of one :class:`steady_plan.SteadyEngine`.

Run by ``sweep.py`` as a child process (a crash or hang costs only this engine). vLLM's V1 ``LLMEngine`` is
stepped directly, and exactly c requests are kept in flight: after every ``step()`` each finished request is
replaced at once, so the batch the engine sees does not drain and refill as it does with ``LLM.generate``.
Requests: 256 random prompt tokens (one seeded generator per point, the same sequence for every engine), 128
output tokens, greedy, EOS ignored, deltas only; a request's id is ``f"{category}-{n}"`` (the acceptance plugin
reads the category from it) and its ``extra_args`` carry the category for specctl.

Per point: the warm-up (or specctl's learning period) with the load already steady, then ``--rounds`` timed
rounds of ``--round-s`` seconds. A round starts and ends at a fresh snapshot of the worker's dispatch counts
(``accept_plugin.py``), so its target step count is exact to about one step. One JSON row per point is appended
to every ``--out`` file as soon as it is measured.

    python3 -m bench gpu.steady --engine '{"name": "k4", "k": 4}' --points '[...]' --out R.jsonl

Paired rounds (``--pair-engine``, the sweep's ``--pair-with``): a reference engine (plain or a static K) starts
beside the engine under test on the same GPU, each with ``--memory-share`` of its memory, and the two take turns:
while one runs a round, the other is paused with its requests kept in place (vLLM's ``pause_scheduler("keep")``,
so its batch stays steady and nothing of it runs). Rounds go A B, B A, A B ... so that a drift of the host in
time falls on both alike; each pair of rounds gives one ratio, and the engine's row carries their median and
range (``pair``). Both engines' rows are written; the reference's names the engine it was paired with.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

from bench.gpu import steady_plan as plan
from bench.gpu.accept_plugin import DISPATCH_FILE_ENV, snapshot_counts, snapshot_meta
from bench.gpu.shapes import PROMPT_TOKENS, ROLE_OF_METHOD, SHAPES, write_model
from bench.gpu.steady_stats import (
    Round,
    category_of,
    counter_delta,
    full_share,
    model_steps,
    slot_category,
    spec_counters,
    spread_of,
    summarise,
    target_modes,
)

REPO = Path(__file__).resolve().parents[2]
#: Where vLLM's torch profiler writes one trace per point (unset: no profiling). Each point, after its timed
#: rounds and outside them, steps the same load ``SPECCTL_BENCH_PROFILE_STEPS`` times under the profiler
#: (``gpu.trace_summary`` reads the traces: device busy time per step, idle gaps, syncs, kernels). Keep the
#: folder outside a session's results: a trace is megabytes.
PROFILE_DIR_ENV = "SPECCTL_BENCH_PROFILE_DIR"
PROFILE_STEPS_ENV = "SPECCTL_BENCH_PROFILE_STEPS"
DEFAULT_PROFILE_STEPS = 40
#: Longest wait for the worker's next dispatch snapshot at a round boundary (it writes every ~0.5 s under load).
SNAPSHOT_WAIT_S = 3.0
PIN_ACTOR = "steady-bench"


# -- the engine ---------------------------------------------------------------------------------------------------
def build_engine(engine: plan.SteadyEngine, args: argparse.Namespace):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    models = Path(args.models_dir)
    target, draft = model_dirs(models, args.shape, engine.drafter or args.draft_method)
    kwargs = plan.engine_kwargs(engine, target, draft, method=args.draft_method, synthetic=args.synthetic,
                                eager=args.eager)
    if getattr(args, "memory_share", None):
        kwargs["gpu_memory_utilization"] = args.memory_share
    return LLMEngine.from_engine_args(EngineArgs(**kwargs, **profiler_kwargs(engine.name))), kwargs


@contextlib.contextmanager
def environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """``os.environ`` with ``changes`` applied (None: unset) for the block: an engine core process started in it
    inherits them (its plugins, the patch's settings, where its dispatch counts go)."""
    saved = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def pause(llm) -> None:
    """Stop the engine stepping, its running requests kept where they are (vLLM's ``keep`` pause)."""
    llm.engine_core.call_utility("pause_scheduler", "keep", False)


def resume(llm) -> None:
    llm.engine_core.call_utility("resume_scheduler")


def profile_dir(engine_name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    root = (os.environ if environ is None else environ).get(PROFILE_DIR_ENV)
    return Path(root) / engine_name if root else None


def profile_steps(environ: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if environ is None else environ).get(PROFILE_STEPS_ENV, "")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else DEFAULT_PROFILE_STEPS


def profiler_kwargs(engine_name: str) -> dict:
    """vLLM's own torch profiler, started and stopped by the driver (no schedule), CPU and CUDA activity, no
    stacks (they would cost host time in the steps profiled)."""
    folder = profile_dir(engine_name)
    if folder is None:
        return {}
    from vllm.config import ProfilerConfig

    folder.mkdir(parents=True, exist_ok=True)
    return {"profiler_config": ProfilerConfig(profiler="torch", torch_profiler_dir=str(folder.resolve()),
                                              torch_profiler_with_stack=False, torch_profiler_use_gzip=True,
                                              torch_profiler_dump_cuda_time_total=False)}


def profile_point(llm, load: SteadyLoad, point: plan.Point, steps: int) -> None:
    """``steps`` steps of the point's load under the profiler, after its timed rounds (never inside them)."""
    llm.start_profile(profile_prefix=f"{point.label}_{point.profile}_c{point.concurrency}")
    try:
        for _ in range(steps):
            load.step()
    finally:
        llm.stop_profile()


def model_dirs(models: Path, shape: str, method: str) -> tuple[Path, Path]:
    """(target, drafter) folders of a proposal method: native MTP's drafter is the target's own MTP layer."""
    if method == "mtp":
        target = write_model(models, shape, ROLE_OF_METHOD["mtp"])
        return target, target
    return write_model(models, shape, "target"), write_model(models, shape, ROLE_OF_METHOD[method])


def engine_meta(llm, engine: plan.SteadyEngine, kwargs: dict, startup_s: float, args: argparse.Namespace) -> dict:
    import torch
    import vllm

    conf = llm.vllm_config
    comp = conf.compilation_config
    spec = conf.speculative_config
    return {
        "engine": engine.name,
        "vllm": vllm.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "shape": args.shape,
        "model": str(kwargs.get("model") or ""),
        "startup_s": startup_s,
        "async_scheduling": bool(conf.scheduler_config.async_scheduling),
        "scheduler_cls": kwargs.get("scheduler_cls"),
        "cudagraph_mode": str(getattr(comp, "cudagraph_mode", "")),
        "capture_sizes": list(getattr(comp, "cudagraph_capture_sizes", None) or []),
        "max_capture_size": getattr(comp, "max_cudagraph_capture_size", None),
        "use_v2_model_runner": bool(getattr(conf, "use_v2_model_runner", False)),
        "spec": None if spec is None else {
            "method": str(spec.method),
            "num_speculative_tokens": spec.num_speculative_tokens,
            "k_table": getattr(spec, "num_speculative_tokens_per_batch_size", None),
            "rejection_sample_method": getattr(spec, "rejection_sample_method", None),
            "synthetic_acceptance_rates": getattr(spec, "synthetic_acceptance_rates", None),
        },
        "engine_config": json.loads(engine.to_json()),
        "env": {k: os.environ.get(k) for k in ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_PLUGINS", "SPECCTL_BACKPORTS",
                                               "SPECCTL_BENCH_ACCEPT", "SPECCTL_DRAFT_AT_ZERO")},
        "code": plan.code_digest(REPO),
        "bench_code": plan.code_digest(REPO, ("bench/gpu/*.py",)),
    }


# -- the dispatch snapshots ---------------------------------------------------------------------------------------
class DispatchWatch:
    """The worker's latest dispatch-count snapshot (written atomically by the plugin)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.latest: dict | None = None
        self.stamp: int | None = None
        #: no snapshot ever arrived after one full wait: the plugin is not counting here (CPU, stock vLLM)
        self.absent = not path

    def poll(self) -> bool:
        """True when a new snapshot arrived since the last poll."""
        if self.absent:
            return False
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except OSError:
            return False
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        try:
            with open(self.path) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return False
        fresh = self.latest is None or snapshot_meta(data).get("seq") != self.seq
        self.latest = data
        return fresh

    @property
    def seq(self) -> int | None:
        return snapshot_meta(self.latest).get("seq") if self.latest is not None else None

    @property
    def counts(self) -> dict[str, int]:
        return snapshot_counts(self.latest) if self.latest is not None else {}

    @property
    def t_mono(self) -> float | None:
        return snapshot_meta(self.latest).get("t_mono") if self.latest is not None else None

    @property
    def managers(self) -> list | None:
        return snapshot_meta(self.latest).get("managers") if self.latest is not None else None

    def wait_fresh(self, load: SteadyLoad, max_s: float = SNAPSHOT_WAIT_S) -> bool:
        """Keep the load stepping until a new snapshot arrives (or ``max_s`` passed)."""
        if self.absent:
            return False
        self.poll()  # whatever is there now is not fresh
        start = time.perf_counter()
        while time.perf_counter() - start < max_s:
            load.step()
            if self.poll():
                return True
        if self.latest is None:
            print(f"no dispatch snapshot in {self.path} after {max_s:.0f} s: step counts off", flush=True)
            self.absent = True
        return False


# -- the load -----------------------------------------------------------------------------------------------------
def sampling_params(category: str, max_tokens: int):
    """Greedy, ``max_tokens`` tokens, EOS ignored, no detokenizing, deltas (the new token ids of each step)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                          output_kind=RequestOutputKind.DELTA, extra_args={"specctl_category": category})


class SteadyLoad:
    """Exactly c requests in flight; each finished one is replaced by the next prompt of the point."""

    def __init__(self, llm, vocab: int, seed: int, workload: plan.Workload | None = None,
                 params=sampling_params, prompt_type=None) -> None:
        import numpy as np

        self.np = np
        self.llm = llm
        self.vocab = vocab
        self.seed = seed
        self.workload = workload or plan.WORKLOADS[plan.DEFAULT_WORKLOAD]
        self._params_of = params
        self._params: dict[tuple[str, int], object] = {}
        if prompt_type is None:
            from vllm.inputs import TokensPrompt as prompt_type
        self.prompt_type = prompt_type
        self.next_id = 0  # ids stay unique across the engine's points
        self.active: dict[str, int] = {}  # request id -> slot
        self.generation: list[int] = []
        self.point: plan.Point | None = None
        self.rng = None
        self.lengths = None  # the output lengths' own stream: prompts stay those of the fixed workload
        self.steps = 0
        self.tokens: dict[str, int] = {}

    def begin(self, point: plan.Point) -> None:
        """Drop the previous point's requests and fill c slots with this point's."""
        if self.active:
            self.llm.abort_request(list(self.active))
            self.active.clear()
        self.point = point
        profile_index = plan.STEADY_PROFILES.index(point.profile)
        self.rng = self.np.random.default_rng([self.seed, point.concurrency, profile_index])
        self.lengths = self.np.random.default_rng([self.seed, point.concurrency, profile_index, 1])
        self.generation = [0] * point.concurrency
        self.reset_counts()
        for slot in range(point.concurrency):
            self._add(slot)

    def _add(self, slot: int) -> None:
        assert self.point is not None and self.rng is not None
        cat = slot_category(self.point.profile, slot, self.generation[slot], self.point.concurrency)
        self.generation[slot] += 1
        request_id = f"{cat}-{self.next_id}"
        self.next_id += 1
        prompt = self.rng.integers(16, self.vocab - 16, size=PROMPT_TOKENS).tolist()
        self.llm.add_request(request_id, self.prompt_type(prompt_token_ids=prompt), self.params(cat))
        self.active[request_id] = slot

    def params(self, category: str):
        w = self.workload
        n = w.output_min if w.output_min == w.output_max else int(self.lengths.integers(w.output_min,
                                                                                        w.output_max + 1))
        key = (category, n)
        if key not in self._params:
            self._params[key] = self._params_of(category, n)
        return self._params[key]

    def reset_counts(self) -> None:
        self.tokens = {cat: 0 for cat in (self.point.categories if self.point else ())}

    def step(self) -> None:
        for out in self.llm.step():
            slot = self.active.get(out.request_id)
            if slot is None:  # an aborted request of the previous point
                continue
            cat = category_of(out.request_id)
            self.tokens[cat] = self.tokens.get(cat, 0) + sum(len(o.token_ids) for o in out.outputs)
            if out.finished:
                del self.active[out.request_id]
                self._add(slot)
        self.steps += 1

    def run_for(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.step()


# -- the controller -----------------------------------------------------------------------------------------------
def controller_url() -> str | None:
    url = os.environ.get("SPECCTL_CONTROLLER_URL", "")
    return None if not url or url == "off" else url.rstrip("/")


def _request(method: str, path: str, **kwargs):
    import httpx

    url = controller_url()
    if url is None:
        return None
    try:
        response = httpx.request(method, url + path, timeout=5.0, **kwargs)
    except httpx.HTTPError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if "json" not in response.headers.get("content-type", ""):
        return {"status": response.status_code}
    body = response.json()
    return body if response.status_code < 300 else {"status": response.status_code, "body": body}


def set_pins(pins: tuple[tuple[str, int], ...]) -> None:
    """Operator overrides (the controller runs ``--insecure-dev`` on the loopback: no admin token)."""
    for cat, k in pins:
        answer = _request("PUT", f"/v1/overrides/{cat}",
                          json={"k": int(k), "ttl_s": 3600.0, "reason": "steady benchmark pin", "actor": PIN_ACTOR})
        if not isinstance(answer, dict) or "override" not in answer:
            print(f"override {cat} k={k} not set: {answer}", flush=True)


def clear_pins(categories: tuple[str, ...]) -> None:
    for cat in categories:
        _request("DELETE", f"/v1/overrides/{cat}", params={"actor": PIN_ACTOR, "reason": "point done"})


def controller_view(categories: tuple[str, ...], model: str | None = None) -> dict | None:
    """The controller's current view (decision and estimates per category, engines, overrides) for the row.
    ``model``: the engine's served model; the controller keeps its categories per model, and without it the
    view is the first model's (session 13's MTP rows showed the EAGLE-3 engine's categories)."""
    if controller_url() is None:
        return None
    params = {"model": model} if model else None
    return {
        "categories": {cat: _request("GET", f"/v1/categories/{cat}", params=params) for cat in categories},
        "engines": _request("GET", "/v1/engines"),
        "overrides": _request("GET", "/v1/overrides"),
    }


# -- one point ----------------------------------------------------------------------------------------------------
def timed_round(llm, load: SteadyLoad, watch: DispatchWatch, round_s: float,
                aligned: bool = False) -> tuple[Round, bool]:
    """One round from a fresh dispatch snapshot to the first one after ``round_s``; ``aligned``: the previous
    round just ended on one, so this one starts there. Returns the round and whether it ended on a snapshot."""
    if not aligned:
        watch.wait_fresh(load)
    counts0, t0_worker = watch.counts, watch.t_mono
    spec0 = spec_counters(llm.get_metrics())
    load.reset_counts()
    steps0 = load.steps
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < round_s:
        load.step()
    fresh = watch.wait_fresh(load)
    seconds = time.perf_counter() - t0
    spec = counter_delta(spec_counters(llm.get_metrics()), spec0)
    dispatch, window = {}, None
    if fresh and t0_worker is not None and watch.t_mono is not None:
        dispatch = {k: v for k, v in counter_delta(watch.counts, counts0).items() if v}
        window = watch.t_mono - t0_worker
    rnd = Round(seconds=seconds, tokens=sum(load.tokens.values()), tokens_by_category=dict(load.tokens),
                driver_steps=load.steps - steps0, model_steps=model_steps(dispatch) if dispatch else None,
                window_s=window, spec=spec, dispatch=dispatch)
    return rnd, fresh


def measure(llm, load: SteadyLoad, watch: DispatchWatch, point: plan.Point, args: argparse.Namespace,
            point_index: int = 0) -> dict:
    t_load = time.perf_counter()
    load.begin(point)
    load.run_for(point.warmup_s)
    warm_s = time.perf_counter() - t_load
    # the warm-up's own rate: on a specctl engine's first point it is the cold start (a controller with no
    # evidence) beside a static engine's warm-up over the same load
    warm_tokens = sum(load.tokens.values())
    rounds, aligned = [], False
    for i in range(args.rounds):
        measured, aligned = timed_round(llm, load, watch, args.round_s, aligned)
        rnd = measured.record()
        rounds.append(rnd)
        print_round(args.name, point, rnd, f"round {i + 1}/{args.rounds}")
    return point_row(point, load, warm_s, warm_tokens, rounds, args, point_index)


def print_round(name: str, point: plan.Point, rnd: dict, label: str) -> None:
    step_ms = f"{rnd['mean_step_ms']:.2f} ms/step" if rnd["mean_step_ms"] else "step time n/a"
    share = full_share(rnd["dispatch"])
    full = f", full graphs {share:.0%}" if share is not None else ""
    cats = "".join(f", {c} {v:.0f}" for c, v in rnd["tok_per_s_by_category"].items()) if len(point.categories) > 1 \
        else ""
    print(f"[{name}] {point.label} {point.profile} c={point.concurrency} {label}: {rnd['tok_per_s']:.0f} tok/s{cats}, "
          f"{rnd['model_steps'] or 'n/a'} steps, {step_ms}{full}", flush=True)


def point_row(point: plan.Point, load: SteadyLoad, warm_s: float, warm_tokens: int, rounds: list[dict],
              args: argparse.Namespace, point_index: int) -> dict:
    summary = summarise(rounds)
    return {
        "kind": "row",
        "engine": point.label,
        "profile": point.profile,
        "concurrency": point.concurrency,
        "pins": dict(point.pins),
        "workload": load.workload.name,
        "warmup_s": warm_s,
        "warmup_tokens": warm_tokens,
        "warmup_tok_per_s": warm_tokens / warm_s if warm_s > 0 else None,
        "point_index": point_index,
        "round_s": args.round_s,
        "rounds": rounds,
        **summary,
        "target_modes": target_modes(summary["dispatch"]),
        "full_share": full_share(summary["dispatch"]),
    }


# -- paired rounds ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Side:
    """One of two engines measured in turns: its engine, its load and its dispatch counts."""

    engine: plan.SteadyEngine
    llm: object
    load: SteadyLoad
    watch: DispatchWatch
    meta: dict


def round_order(i: int) -> tuple[int, int]:
    """Which side runs first in pair ``i``: A B, B A, A B ... (a linear drift falls on both sides alike)."""
    return (0, 1) if i % 2 == 0 else (1, 0)


def pair_summary(test: list[dict], reference: list[dict], reference_name: str) -> dict:
    """The test engine's goodput over the reference's, pair by pair of rounds: median, range, each ratio."""
    ratios = [a["tok_per_s"] / b["tok_per_s"] for a, b in zip(test, reference, strict=True) if b["tok_per_s"] > 0]
    s = spread_of(ratios)
    return {"engine": reference_name, "ratios": ratios, "ratio_median": s.median if s else None,
            "ratio_min": s.min if s else None, "ratio_max": s.max if s else None}


def measure_pair(sides: list[Side], point: plan.Point, args: argparse.Namespace, point_index: int) -> list[dict]:
    """Both engines on ``point`` in turns; returns (test row, reference row)."""
    points = [point, dataclasses.replace(point, label=sides[1].engine.name, pins=())]
    warm: list[tuple[float, int]] = []
    for side, pt in zip(sides, points, strict=True):  # each warms up alone, the other paused
        resume(side.llm)
        t = time.perf_counter()
        side.load.begin(pt)
        side.load.run_for(pt.warmup_s)
        warm.append((time.perf_counter() - t, sum(side.load.tokens.values())))
        pause(side.llm)
    rounds: list[list[dict]] = [[], []]
    for i in range(args.rounds):
        for which in round_order(i):
            side = sides[which]
            resume(side.llm)
            measured, _ = timed_round(side.llm, side.load, side.watch, args.round_s)
            pause(side.llm)
            rnd = measured.record()
            rounds[which].append(rnd)
            print_round(args.name, points[which], rnd, f"pair {i + 1}/{args.rounds}")
    rows = [point_row(pt, side.load, w_s, w_tokens, rnds, args, point_index)
            for side, pt, (w_s, w_tokens), rnds in zip(sides, points, warm, rounds, strict=True)]
    rows[0]["pair"] = pair_summary(rounds[0], rounds[1], sides[1].engine.name)
    rows[1]["paired_with"] = point.label
    for side, pt, row in zip(sides, points, rows, strict=True):  # after the rounds, each alone, as unpaired
        if profile_dir(side.engine.name) is not None:
            resume(side.llm)
            profile_point(side.llm, side.load, pt, profile_steps())
            pause(side.llm)
            row["profiled_steps"] = profile_steps()
    return rows


def run_pair(sides: list[Side], points: list[plan.Point], args: argparse.Namespace) -> None:
    timing = plan.Timing(round_s=args.round_s, rounds=args.rounds)
    test = sides[0].engine
    if test.specctl:
        clear_pins(("high", "low"))
    for index, point in enumerate(points):
        if time.time() + 2 * plan.point_seconds(point, timing) > args.deadline:
            print(f"[{args.name}] {point.label} {point.profile} c={point.concurrency}: not started, deadline", flush=True)
            break
        if point.pins:
            set_pins(point.pins)
        try:
            rows = measure_pair(sides, point, args, index)
            if test.specctl:
                rows[0]["controller"] = controller_view(point.categories, sides[0].meta.get("model"))
        finally:
            if point.pins:
                clear_pins(tuple(cat for cat, _ in point.pins))
        for side, row in zip(sides, rows, strict=True):
            meta = side.meta if side.watch.managers is None else {**side.meta, "graph_managers": side.watch.managers}
            row["meta"] = meta
            row["time"] = time.time()
        for row in rows[::-1]:  # the reference first: a later test row of the point replaces the earlier one
            append(args.out, row)
        pair = rows[0]["pair"]
        print(f"[{args.name}] {point.label} {point.profile} c={point.concurrency}: median "
              f"{rows[0]['tok_per_s_median']:.0f} tok/s against {pair['engine']}'s "
              f"{rows[1]['tok_per_s_median']:.0f}; paired ratio {pair['ratio_median']:.3f} "
              f"({pair['ratio_min']:.3f}-{pair['ratio_max']:.3f})", flush=True)


def append(paths: list[Path], row: dict) -> None:
    line = json.dumps(row) + "\n"
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(line)


def run_points(llm, engine: plan.SteadyEngine, points: list[plan.Point], meta: dict, args: argparse.Namespace) -> None:
    timing = plan.Timing(round_s=args.round_s, rounds=args.rounds)
    load = SteadyLoad(llm, SHAPES[args.shape]["target"].vocab_size, args.seed, plan.WORKLOADS[args.workload])
    watch = DispatchWatch(os.environ.get(DISPATCH_FILE_ENV))
    if engine.specctl:
        clear_pins(("high", "low"))  # a pinned engine before this one may have left overrides
    for index, point in enumerate(points):
        if time.time() + plan.point_seconds(point, timing) > args.deadline:
            print(f"[{args.name}] {point.label} {point.profile} c={point.concurrency}: not started, deadline", flush=True)
            break
        if point.pins:
            set_pins(point.pins)
        try:
            row = measure(llm, load, watch, point, args, index)
            if engine.specctl:
                row["controller"] = controller_view(point.categories, meta.get("model"))
            if profile_dir(engine.name) is not None:
                profile_point(llm, load, point, profile_steps())
                row["profiled_steps"] = profile_steps()
        finally:
            if point.pins:
                clear_pins(tuple(cat for cat, _ in point.pins))
        if watch.managers is not None:
            meta = {**meta, "graph_managers": watch.managers}
        row["meta"] = meta
        row["time"] = time.time()
        append(args.out, row)
        print(f"[{args.name}] {point.label} {point.profile} c={point.concurrency}: median "
              f"{row['tok_per_s_median']:.0f} tok/s ({row['tok_per_s_min']:.0f}-{row['tok_per_s_max']:.0f}, "
              f"spread {row['tok_per_s_spread']:.1%})", flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", required=True, help="SteadyEngine as JSON")
    p.add_argument("--points", required=True, help="JSON list of Point dicts, in run order")
    p.add_argument("--out", type=Path, action="append", required=True, help="JSONL file to append rows to")
    p.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    p.add_argument("--models-dir", default="/tmp/specctl-steady-models")
    p.add_argument("--deadline", type=float, default=float("inf"), help="unix time after which no point starts")
    p.add_argument("--round-s", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--draft-method", default="eagle3", choices=["eagle3", "draft_model"])
    p.add_argument("--synthetic", default="auto", choices=["auto", "on", "off"],
                   help="vLLM's synthetic rejection sampler (auto: on a CUDA device; it does not run on a CPU)")
    p.add_argument("--eager", action="store_true", help="no torch.compile / CUDA graphs (CPU smoke tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default=plan.DEFAULT_WORKLOAD, choices=sorted(plan.WORKLOADS))
    p.add_argument("--pair-engine", default=None, help="SteadyEngine as JSON: the reference run in turns beside")
    p.add_argument("--pair-env", default="{}", help="JSON object: the reference's environment changes (null: unset)")
    p.add_argument("--pair-dispatch-file", default=None, help="where the reference's worker writes dispatch counts")
    p.add_argument("--memory-share", type=float, default=None,
                   help="gpu_memory_utilization of each engine (two engines share the GPU when paired)")
    args = p.parse_args(argv)
    if args.synthetic == "auto":
        import torch

        args.synthetic = torch.cuda.is_available()
    else:
        args.synthetic = args.synthetic == "on"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    engine = plan.SteadyEngine.from_json(args.engine)
    points = [plan.Point.from_dict(d) for d in json.loads(args.points)]
    args.name = engine.name
    t0 = time.perf_counter()
    try:
        llm, kwargs = build_engine(engine, args)
    except Exception:  # noqa: BLE001 - any start failure is this engine's result (the sweep records it)
        traceback.print_exc()
        print(f"[{engine.name}] engine start failed", flush=True)
        return 3
    startup_s = time.perf_counter() - t0
    meta = engine_meta(llm, engine, kwargs, startup_s, args)
    print(f"[{engine.name}] engine up in {startup_s:.1f} s: v2 runner={meta['use_v2_model_runner']} "
          f"async={meta['async_scheduling']} cudagraph={meta['cudagraph_mode']} spec={meta['spec']}", flush=True)
    if not args.pair_engine:
        run_points(llm, engine, points, meta, args)
        return 0
    reference = plan.SteadyEngine.from_json(args.pair_engine)
    t0 = time.perf_counter()
    try:
        with environment(json.loads(args.pair_env)):
            ref_llm, ref_kwargs = build_engine(reference, args)
            ref_meta = engine_meta(ref_llm, reference, ref_kwargs, time.perf_counter() - t0, args)
    except Exception:  # noqa: BLE001 - the pair's reference failing is this call's result
        traceback.print_exc()
        print(f"[{engine.name}] reference engine {reference.name} start failed", flush=True)
        return 3
    print(f"[{engine.name}] reference {reference.name} up in {ref_meta['startup_s']:.1f} s", flush=True)
    vocab = SHAPES[args.shape]["target"].vocab_size
    workload = plan.WORKLOADS[args.workload]
    sides = [Side(engine=engine, llm=llm, load=SteadyLoad(llm, vocab, args.seed, workload),
                  watch=DispatchWatch(os.environ.get(DISPATCH_FILE_ENV)), meta=meta),
             Side(engine=reference, llm=ref_llm, load=SteadyLoad(ref_llm, vocab, args.seed, workload),
                  watch=DispatchWatch(args.pair_dispatch_file), meta=ref_meta)]
    pause(ref_llm)
    run_pair(sides, points, args)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every row is on disk. Leave without vLLM's orderly shutdown (seconds, and it can hang): the parent kills
    # this process group, EngineCore included, which frees the GPU.
    os._exit(code)
