"""One engine start of the GPU benchmark: time the concurrency sweep of one :class:`shapes.EngineConfig`.

Run by ``run_bench.py`` as a child process, ``python -m bench.gpu.engine_run`` (a crash or hang of one engine costs
only that engine). For each concurrency c: ``warmup`` untimed rounds (specctl: repeated until ``learn_s`` seconds of
that load have passed, so the controller has seen it), then ``repeat`` timed rounds of c fresh random 256-token prompts submitted together
(offline ``LLM.generate``, 128 output tokens, EOS ignored); the best round is kept. Each concurrency's row is
appended to every ``--out`` file as soon as it is measured, so a call cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.gpu.shapes import (
    OUTPUT_TOKENS,
    PROFILES,
    PROMPT_TOKENS,
    SHAPES,
    EngineConfig,
    acceptance_rates,
    write_models,
)

SPECCTL_SCHEDULER = "specctl_vllm.engine_patch.scheduler.SpecctlScheduler"
SPECCTL_ASYNC_SCHEDULER = "specctl_vllm.engine_patch.scheduler.SpecctlAsyncScheduler"


def speculative_config(cfg: EngineConfig, draft_dir: Path, synthetic: bool) -> dict | None:
    if cfg.k == 0:
        return None
    spec: dict = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": cfg.k}
    if synthetic:
        spec["rejection_sample_method"] = "synthetic"
        spec["synthetic_acceptance_rates"] = acceptance_rates(PROFILES[cfg.profile], cfg.k)
    if cfg.k_table is not None:
        spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in cfg.k_table]
    return spec


def scheduler_cls(cfg: EngineConfig, resolved_async: bool) -> str | None:
    if not cfg.specctl:
        return None
    return SPECCTL_ASYNC_SCHEDULER if resolved_async else SPECCTL_SCHEDULER


#: First vLLM release checked to turn async scheduling on by default with a draft_model drafter (config/vllm.py:
#: 0.26 leaves it off for draft_model, 0.32 turns it on; releases between were not checked and count as off).
DRAFT_MODEL_AUTO_ASYNC_FROM = (0, 32)


def resolve_async(cfg: EngineConfig, mode: str, vllm_version: str) -> bool:
    """What vLLM resolves ``async_scheduling=None`` to for this config, or the forced mode."""
    if mode != "auto":
        return mode == "on"
    if cfg.k == 0:
        return True
    major, minor = (int(x) for x in vllm_version.split(".")[:2])
    return (major, minor) >= DRAFT_MODEL_AUTO_ASYNC_FROM


def build_llm(cfg: EngineConfig, args: argparse.Namespace):
    import vllm
    from vllm import LLM

    target, draft = write_models(Path(args.models_dir), args.shape)
    resolved_async = resolve_async(cfg, args.async_scheduling, vllm.__version__)
    if not args.cuda:
        resolved_async = False  # the CPU platform forces it off
    kwargs = {
        "model": str(target),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "max_model_len": PROMPT_TOKENS + OUTPUT_TOKENS + 64,
        "max_num_seqs": max(cfg.concurrency),
        "seed": 0,
        "disable_log_stats": False,  # spec-decode counters come from the stats loggers
        "speculative_config": speculative_config(cfg, draft, synthetic=args.cuda),
        "enforce_eager": args.eager,
    }
    if args.cuda:
        # Explicit, so that the scheduler class below always matches the mode vLLM runs (same value as its default
        # under "auto").
        kwargs["async_scheduling"] = resolved_async
    sched = scheduler_cls(cfg, resolved_async)
    if sched:
        kwargs["scheduler_cls"] = sched
    return LLM(**kwargs), kwargs


def spec_counters(llm) -> dict:
    """vLLM's own spec-decode counters (summed over label sets), the per-position vector as a list."""
    out: dict = {}
    for metric in llm.get_metrics():
        if not metric.name.startswith("vllm:spec_decode"):
            continue
        if hasattr(metric, "values"):
            prev = out.get(metric.name, [])
            vals = list(metric.values)
            out[metric.name] = [a + b for a, b in zip(vals, prev + [0] * (len(vals) - len(prev)))] if prev else vals
        elif hasattr(metric, "value"):
            out[metric.name] = out.get(metric.name, 0) + metric.value
    return out


def counter_delta(after: dict, before: dict) -> dict:
    delta = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old or [0] * len(value)
            delta[name] = [a - b for a, b in zip(value, old + [0] * (len(value) - len(old)))]
        else:
            delta[name] = value - (old or 0)
    return delta


class Rounds:
    """Fresh random prompts per round (no prefix-cache hits between rounds), one SamplingParams per config."""

    def __init__(self, llm, cfg: EngineConfig, vocab: int, seed: int) -> None:
        from vllm import SamplingParams

        self.llm = llm
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        extra = {"specctl_category": cfg.category} if cfg.specctl else None
        self.params = SamplingParams(
            temperature=0.0, max_tokens=OUTPUT_TOKENS, ignore_eos=True, detokenize=False, extra_args=extra
        )

    def run(self, concurrency: int) -> tuple[float, int]:
        from vllm.inputs import TokensPrompt

        ids = self.rng.integers(16, self.vocab - 16, size=(concurrency, PROMPT_TOKENS))
        prompts = [TokensPrompt(prompt_token_ids=row.tolist()) for row in ids]
        t0 = time.perf_counter()
        outputs = self.llm.generate(prompts, self.params, use_tqdm=False)
        seconds = time.perf_counter() - t0
        return seconds, sum(len(o.outputs[0].token_ids) for o in outputs)


def controller_view(category: str) -> dict | None:
    """The controller's current view of the category (decision, estimates), for the row; None when unreachable."""
    url = os.environ.get("SPECCTL_CONTROLLER_URL", "")
    if not url or url == "off":
        return None
    try:
        import httpx

        response = httpx.get(f"{url.rstrip('/')}/v1/categories/{category}", timeout=2.0)
        return response.json() if response.status_code == 200 else {"status": response.status_code}
    except Exception as exc:  # noqa: BLE001 (the row is still worth writing without it)
        return {"error": f"{type(exc).__name__}: {exc}"}


def append(paths: list[Path], row: dict) -> None:
    line = json.dumps(row) + "\n"
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as fh:
            fh.write(line)


def sweep(llm, cfg: EngineConfig, args: argparse.Namespace, meta: dict, outs: list[Path]) -> None:
    vocab = SHAPES[args.shape]["target"].vocab_size
    rounds = Rounds(llm, cfg, vocab, seed=args.seed)
    prev_c, prev_s = 1, 2.0  # pessimistic first guess of one round's seconds
    for c in cfg.concurrency:
        if c in args.skip:
            continue
        guess = prev_s * max(1.0, c / prev_c)  # linear in c: pessimistic, steps are cheaper per token at scale
        if time.time() + guess * (args.warmup + args.repeat + 1) + (2 * args.learn_s if cfg.specctl else 0) > args.deadline:
            print(f"[{cfg.name}] c={c}: skipped, deadline", flush=True)
            break
        t_load = time.perf_counter()
        for _ in range(args.warmup):
            rounds.run(c)
        # specctl: keep the load on until the controller has seen it for learn_s (twice at the engine's first
        # load: the controller starts with no evidence at all)
        learn_s = args.learn_s * (2 if c == cfg.concurrency[0] else 1)
        while cfg.specctl and time.perf_counter() - t_load < learn_s:
            rounds.run(c)
        warm_s = time.perf_counter() - t_load
        timed = []
        for _ in range(args.repeat):
            before = spec_counters(llm)
            seconds, tokens = rounds.run(c)
            timed.append((seconds, tokens, counter_delta(spec_counters(llm), before)))
        seconds, tokens, spec = min(timed, key=lambda r: r[0])
        prev_c, prev_s = c, seconds
        row = {
            **meta,
            "concurrency": c,
            "seconds": seconds,
            "out_tokens": tokens,
            "tok_per_s": tokens / seconds,
            "rounds_tok_per_s": [t / s for s, t, _ in timed],
            "warmup_s": warm_s,
            "spec": spec,
        }
        if cfg.specctl:
            row["controller"] = controller_view(cfg.category)
        append(outs, row)
        print(f"[{cfg.name}] c={c}: {row['tok_per_s']:.0f} tok/s (rounds {[round(x) for x in row['rounds_tok_per_s']]})",
              flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, help="EngineConfig as JSON")
    p.add_argument("--out", type=Path, action="append", required=True, help="JSONL file to append rows to (repeatable)")
    p.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    p.add_argument("--models-dir", default="/tmp/specctl-bench-models")
    p.add_argument("--deadline", type=float, default=float("inf"), help="unix time after which no concurrency starts")
    p.add_argument("--skip", type=int, nargs="*", default=[], help="concurrencies already measured")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds per concurrency")
    p.add_argument("--repeat", type=int, default=2, help="timed rounds per concurrency (best kept)")
    p.add_argument("--learn-s", type=float, default=0.0, help="specctl only: seconds of load before timing")
    p.add_argument("--async-scheduling", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--eager", action="store_true", help="no torch.compile / CUDA graphs (CPU smoke tests)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import torch

    args.cuda = torch.cuda.is_available()
    return args


def code_digest() -> str:
    """Content hash of the controller and engine patch sources this run used (the tree may be uncommitted)."""
    repo = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted([*repo.glob("controller/**/*.py"), *repo.glob("engine_patch/**/*.py")]):
        digest.update(str(path.relative_to(repo)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    cfg = EngineConfig.from_json(args.config)
    t0 = time.perf_counter()
    llm, kwargs = build_llm(cfg, args)
    startup_s = time.perf_counter() - t0
    import torch
    import vllm

    vconf = llm.llm_engine.vllm_config
    meta = {
        "config": cfg.name,
        "profile": cfg.profile,
        "k": cfg.k,
        "k_table": cfg.k_table,
        "specctl": cfg.specctl,
        "shape": args.shape,
        "startup_s": startup_s,
        "vllm": vllm.__version__,
        "device": torch.cuda.get_device_name(0) if args.cuda else "cpu",
        "async_scheduling": bool(vconf.scheduler_config.async_scheduling),
        "scheduler_cls": kwargs.get("scheduler_cls"),
        "cudagraph_mode": str(getattr(vconf.compilation_config, "cudagraph_mode", "")),
        "synthetic": bool(kwargs["speculative_config"] and "synthetic_acceptance_rates" in kwargs["speculative_config"]),
        "time": time.time(),
        "code": code_digest(),
    }
    print(f"[{cfg.name}] engine up in {startup_s:.1f} s: async={meta['async_scheduling']} "
          f"scheduler={meta['scheduler_cls']} cudagraph={meta['cudagraph_mode']}", flush=True)
    sweep(llm, cfg, args, meta, args.out)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Every row is on disk. Leave without vLLM's orderly shutdown (seconds, and it can hang on a dead controller
    # connection): the parent kills this process group, EngineCore included, which frees the GPU.
    os._exit(code)
