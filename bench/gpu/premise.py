"""The premise of graph-shaped speculation, checked on one GPU: a step at width K costs what a static-K step costs.

One engine start per invocation (``--engine specctl`` or ``--engine plain``), model runner V2, EAGLE-3 head,
8B-shaped dummy target, vLLM's synthetic rejection sampler at the high profile. The specctl engine (k_max 7,
the patch's scheduler, the backports) is driven by a controller on the loopback whose operator override pins the
category's k, so every step runs one width K in (7, 4, 2, 1, 0); for each K and concurrency, 3 timed rounds of c
prompts submitted together (offline ``LLM.generate``) after a warm-up round. Rows (JSONL) hold tok/s per round,
vLLM's spec-decode counters and the CUDA-graph dispatch counts of the round (``accept_plugin``'s file).

    python3 -m bench gpu.premise --engine specctl --out $OUT/premise.jsonl
    python3 -m bench gpu.premise --engine plain --out $OUT/premise.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu.plugin_dist import write_plugin_dist
from bench.gpu.shapes import OUTPUT_TOKENS, PROMPT_TOKENS, SHAPES, write_model

K_MAX = 7
BETA_HIGH = 0.85
CATEGORY = "high"
#: The run's work folder (models, controller, dispatch file, the plugins' dist-info), set by the re-exec.
WORK_ENV = "SPECCTL_BENCH_PREMISE_WORK"


def counters(llm) -> dict:
    out: dict = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode") and hasattr(metric, "value"):
            out[metric.name] = out.get(metric.name, 0) + metric.value
    return out


def read_dispatch(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, (int, float)) and v != before.get(k, 0)}


def pin(controller_url: str, k: int) -> None:
    import httpx

    body = {"k": k, "off": k == 0, "reason": "premise check", "actor": "bench"}
    if k == 0:
        body["k"] = None
    response = httpx.put(f"{controller_url}/v1/overrides/{CATEGORY}", json=body, timeout=5.0)
    response.raise_for_status()


def build(engine: str, models: Path):
    from vllm import LLM

    target = write_model(models, "8b", "target")
    kwargs: dict = {"model": str(target), "load_format": "dummy", "skip_tokenizer_init": True, "dtype": "bfloat16",
                    "max_model_len": PROMPT_TOKENS + OUTPUT_TOKENS + 64, "max_num_seqs": 256, "seed": 0,
                    "disable_log_stats": False}
    if engine == "specctl":
        head = write_model(models, "8b", "eagle3")
        kwargs["speculative_config"] = {
            "method": "eagle3", "model": str(head), "num_speculative_tokens": K_MAX,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": [BETA_HIGH ** (i + 1) for i in range(K_MAX)],
        }
        kwargs["scheduler_cls"] = "specctl_vllm.engine_patch.scheduler.SpecctlScheduler"
    return LLM(**kwargs)


def rounds(llm, c: int, n: int, rng, dispatch_file: Path) -> list[dict]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True, detokenize=False,
                            extra_args={"specctl_category": CATEGORY})
    vocab = SHAPES["8b"]["target"].vocab_size
    out = []
    for _ in range(n):
        prompts = [TokensPrompt(prompt_token_ids=rng.integers(16, vocab - 16, PROMPT_TOKENS).tolist())
                   for _ in range(c)]
        c0, d0 = counters(llm), read_dispatch(dispatch_file)
        t0 = time.perf_counter()
        results = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        time.sleep(0.6)  # the dispatch file is written at most every 0.5 s
        tokens = sum(len(r.outputs[0].token_ids) for r in results)
        out.append({"seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds,
                    "spec": delta(counters(llm), c0), "dispatch": delta(read_dispatch(dispatch_file), d0)})
    return out


def reexec_with_plugins(argv: list[str]) -> None:
    """Run this benchmark again in a fresh interpreter that starts with the plugins' dist-info on PYTHONPATH.

    vLLM builds the LLM in this process and discovers its general plugins here too, through importlib.metadata
    entry points, read from the *.dist-info folders inside the sys.path entries an interpreter started with;
    PYTHONPATH set later only reaches child processes (as vLLM's spawned EngineCore). ``os.execve`` keeps the
    process id, so whatever waits on this benchmark waits on the rerun.
    """
    work = Path(tempfile.mkdtemp(prefix="specctl-premise-"))
    dist = write_plugin_dist(work / "dist")
    env = dict(os.environ, PYTHONPATH=f"{dist}:{os.environ.get('PYTHONPATH', '')}", **{WORK_ENV: str(work)})
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "bench", "gpu.premise", *argv], env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--engine", choices=["specctl", "plain"], required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", default="1,64")
    p.add_argument("--widths", default="7,4,2,1,0")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    if WORK_ENV not in os.environ:
        reexec_with_plugins(list(sys.argv[1:] if argv is None else argv))
    import numpy as np

    work = Path(os.environ[WORK_ENV])
    dispatch_file = work / "dispatch.json"
    os.environ.update({"VLLM_USE_V2_MODEL_RUNNER": "1", "SPECCTL_BENCH_DISPATCH_FILE": str(dispatch_file),
                       "SPECCTL_BENCH_ACCEPT": json.dumps({CATEGORY: BETA_HIGH}), "SPECCTL_COUNTERFACTUAL_SHARE": "0"})
    controller = None
    if args.engine == "specctl":
        from bench.gpu.processes import Controller

        controller = Controller(work / "controller", "h200", work / "controller.log")
        os.environ["SPECCTL_CONTROLLER_URL"] = controller.ensure()
        os.environ["VLLM_PLUGINS"] = "specctl,specctl_bench"
    else:
        os.environ["SPECCTL_CONTROLLER_URL"] = "off"
        os.environ["VLLM_PLUGINS"] = "specctl_bench"
    t0 = time.perf_counter()
    llm = build(args.engine, work / "models")
    startup_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    widths = [int(w) for w in args.widths.split(",")] if args.engine == "specctl" else [None]
    for width in widths:
        for c in (int(x) for x in args.concurrency.split(",")):
            if width is not None:
                pin(controller.url, width)
                time.sleep(1.0)  # the engine's reporter fetches the new policy within 0.1-0.2 s
            rounds(llm, c, 1, rng, dispatch_file)  # warm-up, and the policy is in place
            timed = rounds(llm, c, args.rounds, rng, dispatch_file)
            rates = [r["tok_per_s"] for r in timed]
            row = {"engine": args.engine, "width": width, "concurrency": c, "startup_s": startup_s,
                   "tok_per_s_median": statistics.median(rates), "tok_per_s_min": min(rates),
                   "tok_per_s_max": max(rates), "rounds": timed, "time": time.time()}
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"[premise] {args.engine} K={width} c={c}: {row['tok_per_s_median']:.0f} tok/s "
                  f"({min(rates):.0f}-{max(rates):.0f}) dispatch={timed[-1]['dispatch']}", flush=True)
    if controller is not None:
        controller.stop([])
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
