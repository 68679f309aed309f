"""One engine start of the trace benchmark: every (configuration, repeat) run it is given, one after another.

Run by ``bench.trace.run`` as a child process (a crash or hang costs this engine only). The engine is the patched
specctl engine; every configuration runs on it, so all of them bear the same engine and hook:

- ``specctl``: no pins, the controller's own policy;
- ``kN``: every category of the trace pinned to k = N through the controller's operator overrides
  (``k0``: speculation off for every request);

Before each run the controller is restarted with an empty store on the same port (the engine's reporter keeps
its URL), the pins of the configuration are set, and the trace starts: learning and switching count. What the
engine itself measured (its width rule's cell table) stays with the engine across runs; runs alternate in order
across repeats so that no configuration always comes first.

Each run appends one JSON row to every ``--out`` file as soon as it ends: per phase committed tokens and seconds,
per-second samples, and the controller's k per category sampled every second.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from bench.harness import start_controller, wait_http
from bench.trace.load import TraceLoad
from bench.trace.spec import Trace, parse_trace

PIN_ACTOR = "trace-bench"
POLL_S = 1.0


class ControllerProc:
    """``specctl serve --insecure-dev`` on a fixed loopback port; :meth:`fresh` restarts it with an empty store."""

    def __init__(self, port: int, state_dir: Path, preset: str, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.state_dir = state_dir
        self.preset = preset
        self.log = log
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def fresh(self, record_dir: Path | None = None) -> None:
        """Restart with an empty store; ``record_dir``: record what it ingests there (``--record-dir``)."""
        self.stop()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for f in self.state_dir.glob("specctl.db*"):
            f.unlink()
        env = {**os.environ, "SPECCTL_DB": str(self.state_dir / "specctl.db"),
               "SPECCTL_POLICY_COST_PRESET": self.preset}
        # in this process's group: the parent's kill at its deadline takes the controller too
        extra = ("--record-dir", str(record_dir)) if record_dir is not None else ()
        self.proc = start_controller(self.port, "--insecure-dev", *extra, env=env, stdout=self.log,
                                     new_session=False)
        wait_http(self.url + "/readyz", self.proc, timeout_s=30, interval_s=0.2, request_timeout_s=5.0,
                  what="controller")

    def request(self, method: str, path: str, **kwargs):
        import httpx

        try:
            r = httpx.request(method, self.url + path, timeout=5.0, **kwargs)
        except httpx.HTTPError as exc:
            return {"error": str(exc)}
        try:
            return r.json()
        except ValueError:
            return {"status": r.status_code}

    def engine(self) -> dict | None:
        """This benchmark's engine as the controller sees it (by ``SPECCTL_ENGINE_ID``), or None."""
        engines = self.request("GET", "/v1/engines")
        wanted = os.environ.get("SPECCTL_ENGINE_ID")
        if isinstance(engines, list):
            for e in engines:
                if isinstance(e, dict) and e.get("engine_id") == wanted:
                    return e
        return None

    def wait_attached(self, timeout_s: float = 20.0) -> float:
        """Seconds until this engine has reported to the fresh controller (its reporter retries with backoff)."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout_s:
            if self.engine() is not None:
                return time.perf_counter() - t0
            time.sleep(0.2)
        raise RuntimeError(f"engine {os.environ.get('SPECCTL_ENGINE_ID')} did not attach within {timeout_s:.0f} s")

    def pin(self, categories: tuple[str, ...], k: int) -> None:
        for cat in categories:
            body = {"k": int(k), "ttl_s": 7200.0, "reason": "trace benchmark pin", "actor": PIN_ACTOR}
            if k == 0:
                body = {"off": True, "ttl_s": 7200.0, "reason": "trace benchmark pin", "actor": PIN_ACTOR}
            answer = self.request("PUT", f"/v1/overrides/{cat}", json=body)
            if not isinstance(answer, dict) or "override" not in answer:
                raise RuntimeError(f"override {cat} k={k} not set: {answer}")


def served_policy(controller: ControllerProc, engine: dict) -> dict:
    """category -> [k, method] of the policy the controller serves this engine (``GET /v1/policy``, a read);
    ``"*"``: the default for categories the policy does not list."""
    params = {"model": engine.get("model"), "k_max": engine.get("spec_k_max"), "method": engine.get("spec_method"),
              "model_free": list(engine.get("model_free_methods") or ()),
              "full_cuda_graphs": "true" if engine.get("full_cuda_graphs") or engine.get("graph_widths") else "false"}
    if engine.get("graph_widths"):  # what a graph-shaped engine is served: caps per category, not a per-request k
        params["graph_widths"] = [int(w) for w in engine["graph_widths"]]
        if engine.get("token_budget"):
            params["token_budget"] = int(engine["token_budget"])
    policy = controller.request("GET", "/v1/policy", params=params)
    if not isinstance(policy, dict) or "default" not in policy:
        return {}
    out = {"*": [policy["default"].get("k"), policy["default"].get("method")]}
    for cat, p in (policy.get("categories") or {}).items():
        out[cat] = [p.get("k"), p.get("method")]
    return out


class Poller(threading.Thread):
    """Every second: the controller's k per category and the engine's width counts (a read: changes nothing)."""

    def __init__(self, controller: ControllerProc, t0: float) -> None:
        super().__init__(daemon=True)
        self.controller = controller
        self.t0 = t0
        self.rows: list[dict] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.wait(POLL_S):
            t = time.perf_counter() - self.t0
            engine = self.controller.engine()
            cats, widths = {}, {}
            if engine is not None:
                widths = engine.get("width_steps") or {}
                cats = served_policy(self.controller, engine)
            # "served": k is what this engine is served (rows before that fix asked without a graph engine's widths)
            self.rows.append({"t": round(t, 2), "k": cats, "width_steps": widths, "served": True})


#: Configurations of an engine started with vLLM's adaptive verification (``bench trace --adaptive-verification``):
#: ``av`` pins every category at the engine's k (vLLM's budget decides each request's drafts inside it),
#: ``specctl_av`` lets specctl's policy set the category's k, drafter and off switch around that budget.
ADAPTIVE_CONFIGS = ("av", "specctl_av")


def config_k(config: str, k_max: int = 7) -> int | None:
    """``kN`` -> N; ``av`` -> k_max; ``specctl`` and ``specctl_av`` -> None (the policy decides)."""
    if config in ("specctl", "specctl_av"):
        return None
    if config == "av":
        return k_max
    if config.startswith("k") and config[1:].isdigit():
        return int(config[1:])
    raise ValueError(f"unknown configuration {config!r} (specctl, kN, av or specctl_av)")


def one_run(engine, trace: Trace, controller: ControllerProc, config: str, repeat: int, make_request,
            seed: int, record_root: Path | None = None) -> dict:
    controller.fresh(record_root / f"{config}-r{repeat}" if record_root is not None else None)
    attach_s = controller.wait_attached()
    k = config_k(config)
    if k is not None:
        controller.pin(trace.categories, k)
    t0 = time.perf_counter()
    poller = Poller(controller, t0)
    poller.start()
    load = TraceLoad(engine, trace, make_request, seed=seed)
    try:
        record = load.run()
    finally:
        poller.stop_flag.set()
        poller.join(5)
    seen = controller.engine() or {}
    if seen.get("id_conflicts") or not seen.get("steps"):
        # another engine under this id, or no step reached the controller: the policy under test was not applied
        raise RuntimeError(f"{config} r{repeat}: the controller saw {seen.get('steps')} steps and "
                           f"{seen.get('id_conflicts')} id conflicts of this engine; the run is not recorded")
    record.update({"engine_batches": seen.get("batches"), "engine_steps": seen.get("steps")})
    record.update({"kind": "trace_run", "config": config, "repeat": repeat, "trace": trace.name,
                   "profile": os.environ.get("SPECCTL_TRACE_PROFILE", ""),
                   "duration_s": float(os.environ.get("SPECCTL_TRACE_DURATION_S", trace.duration_s)),
                   "decisions": poller.rows, "attach_s": round(attach_s, 2), "wall_s": round(time.perf_counter() - t0, 3), "time": time.time()})
    return record


def append(paths: list[Path], row: dict) -> None:
    line = json.dumps(row) + "\n"
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(line)


def token_requests(vocab: int, prompt_tokens: int):
    """GPU: random-token prompts (dummy weights), greedy, EOS ignored, the category in ``extra_args``."""
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    def make(category: str, n: int, length: int, rng):
        prompt = [rng.randrange(16, vocab - 16) for _ in range(prompt_tokens)]
        params = SamplingParams(temperature=0.0, max_tokens=length, ignore_eos=True, detokenize=False,
                                output_kind=RequestOutputKind.DELTA, extra_args={"specctl_category": category})
        return TokensPrompt(prompt_token_ids=prompt), params

    return make


#: The trace's categories on the real CPU engine: the project's own prompts of the closest workload category.
CHAT_CATEGORIES = {"chat": "prose", "json": "structured", "tool_call": "tool_call", "code_edit": "code_edit"}


def chat_requests(model_dir: str, categories: tuple[str, ...], per_category: int = 24):
    """CPU: the project's real prompts (bench.cpu.workload), chat-templated, greedy; JSON requests carry their
    schema as a structured-output constraint and tool calls their tools, as the OpenAI server would pass them."""
    from transformers import AutoTokenizer
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    from bench.cpu.workload import bench_workload

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    wanted = tuple(sorted({CHAT_CATEGORIES.get(c, c) for c in categories}))
    pool: dict[str, list] = {}
    for p in bench_workload(per_category, seed=11, categories=wanted):
        pool.setdefault(p.category, []).append(p)

    def make(category: str, n: int, length: int, rng):
        prompts = pool[CHAT_CATEGORIES.get(category, category)]
        p = prompts[rng.randrange(len(prompts))]
        tools = p.extra.get("tools")
        text = tokenizer.apply_chat_template(p.messages, tools=tools, add_generation_prompt=True, tokenize=False)
        structured = None
        fmt = p.extra.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            structured = StructuredOutputsParams(json=fmt["json_schema"]["schema"])
        elif fmt.get("type") == "json_object":
            structured = StructuredOutputsParams(json_object=True)
        params = SamplingParams(temperature=0.0, max_tokens=length, structured_outputs=structured,
                                output_kind=RequestOutputKind.DELTA, extra_args={"specctl_category": category})
        return {"prompt": text}, params

    return make


def build_engine(args: argparse.Namespace, trace: Trace):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    kwargs = json.loads(args.engine_kwargs)
    return LLMEngine.from_engine_args(EngineArgs(**kwargs))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace-json", required=True, help="the trace, already scaled (JSON text)")
    p.add_argument("--runs", required=True, help='JSON list of ["config", repeat] in run order')
    p.add_argument("--engine-kwargs", required=True, help="EngineArgs as JSON")
    p.add_argument("--requests", default="tokens", choices=["tokens", "chat"],
                   help="tokens: random-token prompts (GPU, dummy weights); chat: the project's prompts (CPU)")
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--controller-port", type=int, required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--cost-preset", default="h200")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, required=True, help="unix time: no run starts that cannot end by it")
    p.add_argument("--out", type=Path, action="append", required=True)
    p.add_argument("--record-dir", type=Path, default=None, help="the controller records each run's telemetry here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    trace = parse_trace(json.loads(args.trace_json))
    runs = [tuple(r) for r in json.loads(args.runs)]
    controller = ControllerProc(args.controller_port, args.state_dir / "controller", args.cost_preset,
                                args.state_dir / "controller.log")
    try:
        return run_all(args, trace, runs, controller)
    except Exception:  # noqa: BLE001 - the row of what failed goes to the log; the parent sees the exit status
        traceback.print_exc()
        return 1
    finally:
        controller.stop()


def run_all(args: argparse.Namespace, trace: Trace, runs: list, controller: ControllerProc) -> int:
    controller.fresh()  # the engine's reporter attaches while it starts
    t_start = time.time()
    engine = build_engine(args, trace)
    startup_s = time.time() - t_start
    print(f"[trace] engine ready in {startup_s:.0f} s", flush=True)
    if args.requests == "chat":
        make = chat_requests(json.loads(args.engine_kwargs)["model"], trace.categories)
    else:
        make = token_requests(args.vocab, args.prompt_tokens)
    # a warm-up at the trace's largest load (graphs, allocator, the n-gram JIT) before the first measured run
    warm = parse_trace({"name": "warmup", "phases": [{"name": "warm", "duration_s": 10,
                                                       "concurrency": trace.max_concurrency(),
                                                       "mix": {c: 1 for c in trace.categories}}]})
    TraceLoad(engine, warm, make, seed=10_000).run()
    for config, repeat in runs:
        if time.time() + trace.duration_s + 15 > args.deadline:
            print(f"[trace] {config} r{repeat}: not started, deadline", flush=True)
            break
        row = one_run(engine, trace, controller, config, repeat, make, args.seed, args.record_dir)
        row["startup_s"] = round(startup_s, 1)
        append(args.out, row)
        print(f"[trace] {config} r{repeat}: {row['tokens'] / row['seconds']:.0f} tok/s over "
              f"{row['seconds']:.0f} s", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
