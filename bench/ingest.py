"""Ingest throughput and policy-decision latency of the controller, measured on this machine.

Throughput is counted in request-steps (one request in one engine step: what an engine's telemetry
describes) per CPU-second of the measuring process, i.e. per core. Three layers, side by side:

  * ``brain``  -- :meth:`Brain.ingest` of already-validated batches (the learning itself);
  * ``parse``  -- ``TelemetryBatch.model_validate_json`` + ingest + the tailored policy for the ack
                  (everything the service does per POST except HTTP);
  * ``http``   -- POST /v1/telemetry to a real ``specctl serve`` (uvicorn) on loopback, one keep-alive
                  client posting sequentially; CPU is the server process's own (``/proc/<pid>/stat``), so
                  the client's work is not counted. Also: server CPU per POST and client-side latency.

Batches are realistic 100 ms reports (profiles below): several steps, 4 categories, histograms at the
proposal lengths per-request adaptation produces (k = 1..k_max), acceptance drawn per category from a
fixed geometric profile with a seeded RNG, so runs are reproducible.

Decision latency: :meth:`Brain.policy_for` with the decision cache defeated (the clock advances past
``interval_s`` before each call), after the model learned ``n`` categories; reported per call and per
category (call / n), median and p99, as thread CPU time (the verdict: this machine is shared, so wall
time also counts other processes' load) and as wall time; the cached call (what most posts cost) too.

Targets (issue 2): >= 200k request-steps/s per core; <= 1 ms decision per category.

    python -m bench ingest            # full run, writes bench/results/ingest.json
    python -m bench ingest --quick    # fewer batches (smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness import free_port, proc_cpu_seconds, start_controller, wait_http
from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.kernel.protocol import SpecConfig, TelemetryBatch

RESULTS = Path(__file__).resolve().parent / "results" / "ingest.json"
TARGET_REQUEST_STEPS_PER_CORE = 200_000
TARGET_DECISION_MS_PER_CATEGORY = 1.0

#: Conditional acceptance per category (same at every position: a geometric acceptance length).
BETAS = {"json": 0.9, "tool_call": 0.85, "code": 0.7, "chat": 0.45, "math": 0.6, "summary": 0.55}


@dataclass(frozen=True)
class Profile:
    name: str
    requests_per_step: int
    steps_per_batch: int
    categories: int
    k_max: int
    step_ms: float


PROFILES = [
    Profile("gpu-large-batch", requests_per_step=256, steps_per_batch=4, categories=4, k_max=4, step_ms=25.0),
    Profile("gpu-medium-batch", requests_per_step=64, steps_per_batch=6, categories=4, k_max=4, step_ms=16.0),
    Profile("gpu-small-batch", requests_per_step=16, steps_per_batch=10, categories=4, k_max=5, step_ms=10.0),
    Profile("cpu-demo", requests_per_step=4, steps_per_batch=2, categories=4, k_max=4, step_ms=50.0),
]


def _hists(rng: np.random.Generator, n: int, beta: float, k_max: int) -> list[dict[str, Any]]:
    """``n`` requests spread over k = 1..k_max, accepted lengths drawn from the geometric profile."""
    ks = rng.integers(1, k_max + 1, size=n)
    out = []
    for k in sorted(set(ks.tolist())):
        count = int((ks == k).sum())
        # accepted length: first rejection among k positions, each accepted with prob beta
        draws = rng.random((count, k)) < beta
        lengths = np.where(draws.all(axis=1), k, draws.argmin(axis=1))
        out.append({"k": int(k), "accepted": np.bincount(lengths, minlength=k + 1).tolist()})
    return out


def make_batch(profile: Profile, seq: int, rng: np.random.Generator, engine_id: str = "bench-engine") -> dict:
    names = list(BETAS)[: profile.categories]
    steps = []
    for i in range(profile.steps_per_batch):
        shares = rng.multinomial(profile.requests_per_step, [1 / len(names)] * len(names))
        cats = []
        for name, n in zip(names, shares.tolist()):
            if n:
                cats.append({"category": name, "method": "ngram", "requests": n,
                             "hists": _hists(rng, n, BETAS[name], profile.k_max)})
        drafts = sum(h["k"] * sum(h["accepted"]) for c in cats for h in c["hists"])
        steps.append({"t": seq * 0.1 + i * profile.step_ms / 1000, "wall_s": profile.step_ms / 1000,
                      "batch_size": profile.requests_per_step,
                      "scheduled_tokens": profile.requests_per_step + drafts, "draft_tokens": drafts,
                      "draft_depth": profile.k_max, "categories": cats})
    return {"protocol": 1, "engine_id": engine_id, "boot_id": "bench", "model_name": "bench-model", "seq": seq,
            "sent_at": 1_700_000_000.0 + seq * 0.1, "spec": {"method": "ngram", "k_max": profile.k_max},
            "steps": steps}


def _cpu_timed(fn: Callable[[], int]) -> tuple[int, float, float]:
    """Run ``fn`` (returns request-steps done); (request-steps, CPU seconds, wall seconds)."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    done = fn()
    return done, time.process_time() - cpu0, time.perf_counter() - wall0


def _rate(done: int, cpu_s: float, wall_s: float) -> dict[str, float]:
    return {"request_steps": done, "cpu_s": round(cpu_s, 4), "wall_s": round(wall_s, 4),
            "request_steps_per_cpu_s": round(done / cpu_s) if cpu_s > 0 else None,
            "cores_used": round(cpu_s / wall_s, 2) if wall_s > 0 else None}


def bench_layers(profile: Profile, n_batches: int) -> dict[str, Any]:
    rng = np.random.default_rng(42)
    raws = [json.dumps(make_batch(profile, seq, rng)).encode() for seq in range(n_batches)]
    per_batch = profile.requests_per_step * profile.steps_per_batch
    spec = SpecConfig(method="ngram", k_max=profile.k_max)
    config = BrainConfig()

    models = [TelemetryBatch.model_validate_json(raw) for raw in raws]
    brain = Brain(config)

    def brain_only() -> int:
        for i, batch in enumerate(models):
            brain.ingest(batch, 1_700_000_000.0 + i * 0.1)
        return per_batch * len(models)

    brain2 = Brain(config)

    def parse_ingest_policy() -> int:
        for i, raw in enumerate(raws):
            batch = TelemetryBatch.model_validate_json(raw)
            now = 1_700_000_000.0 + i * 0.1
            brain2.ingest(batch, now)
            brain2.policy_for(batch.model_name, spec, now, engine_id=batch.engine_id)
        return per_batch * len(raws)

    return {
        "request_steps_per_batch": per_batch,
        "batch_bytes_mean": round(sum(map(len, raws)) / len(raws)),
        "brain": _rate(*_cpu_timed(brain_only)),
        "parse": _rate(*_cpu_timed(parse_ingest_policy)),
        "http": bench_http(raws, per_batch),
    }


def bench_http(raws: list[bytes], per_batch: int) -> dict[str, Any]:
    """POST every batch to a real ``specctl serve`` on loopback; CPU measured on the server process only."""
    import subprocess

    import httpx

    token = "bench-ingest-token-0123456789"
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCTL_")}
        env.update({"SPECCTL_INGEST_TOKEN": token, "SPECCTL_ADMIN_TOKEN": "bench-admin-token-0123456789",
                    "SPECCTL_DB": str(Path(tmp) / "bench.db"), "SPECCTL_ACCESS_LOG": "false",
                    "SPECCTL_LOG_LEVEL": "warning"})
        proc = start_controller(port, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                new_session=False)
        url = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, timeout=30,
                              headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as c:
                wait_http("/readyz", proc, client=c, interval_s=0.1, what="specctl serve",
                          detail=lambda: proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "")
                c.post("/v1/telemetry", content=raws[0]).raise_for_status()  # warm-up (first policy)
                latencies = []
                cpu0, wall0 = proc_cpu_seconds(proc.pid), time.perf_counter()
                for raw in raws[1:]:
                    t0 = time.perf_counter()
                    c.post("/v1/telemetry", content=raw).raise_for_status()
                    latencies.append((time.perf_counter() - t0) * 1000)
                cpu, wall = proc_cpu_seconds(proc.pid) - cpu0, time.perf_counter() - wall0
        finally:
            proc.terminate()
            proc.wait(30)
    out = _rate(per_batch * (len(raws) - 1), cpu, wall)
    out["server_cpu_ms_per_post"] = round(cpu * 1000 / (len(raws) - 1), 3)
    out["post_latency_ms"] = {"median": round(statistics.median(latencies), 3),
                              "p99": round(float(np.percentile(latencies, 99)), 3)}
    return out


def bench_decisions(n_categories: int, k_max: int, calls: int) -> dict[str, Any]:
    """policy_for latency with the cache defeated, after learning ``n_categories`` categories."""
    config = BrainConfig()
    brain = Brain(config)
    rng = np.random.default_rng(7)
    names = [f"cat{i:03d}" for i in range(n_categories)]
    betas = rng.uniform(0.3, 0.95, size=n_categories)
    now = 1_700_000_000.0
    for seq in range(20):
        cats = [{"category": name, "method": "ngram", "requests": 8, "hists": _hists(rng, 8, float(b), k_max)}
                for name, b in zip(names, betas)]
        drafts = sum(h["k"] * sum(h["accepted"]) for c in cats for h in c["hists"])
        step = {"t": seq * 0.1, "wall_s": 0.02 + 0.0001 * drafts, "batch_size": 8 * n_categories,
                "scheduled_tokens": 8 * n_categories + drafts, "draft_tokens": drafts, "categories": cats}
        body = {"protocol": 1, "engine_id": "dec-engine", "boot_id": "b", "model_name": "m", "seq": seq,
                "sent_at": now, "spec": {"method": "ngram", "k_max": k_max}, "steps": [step] * 4}
        now += 0.1
        brain.ingest(TelemetryBatch.model_validate(body), now)
    spec = SpecConfig(method="ngram", k_max=k_max)
    step_s = config.policy.interval_s + 0.001
    wall, cpu = [], []
    for _ in range(calls):
        now += step_s
        t0, c0 = time.perf_counter(), time.thread_time()
        policy = brain.policy_for("m", spec, now, engine_id="dec-engine")
        cpu.append((time.thread_time() - c0) * 1000)
        wall.append((time.perf_counter() - t0) * 1000)
    assert len(policy.categories) == n_categories
    cached = []
    for _ in range(calls):
        t0 = time.perf_counter()
        brain.policy_for("m", spec, now, engine_id="dec-engine")
        cached.append((time.perf_counter() - t0) * 1000)
    return {"categories": n_categories, "k_max": k_max, "calls": calls,
            "wall_ms": _latency(wall, n_categories), "cpu_ms": _latency(cpu, n_categories),
            "cached_wall_ms": _latency(cached, n_categories)}


def _latency(samples_ms: list[float], n_categories: int) -> dict[str, float]:
    median, p99 = statistics.median(samples_ms), float(np.percentile(samples_ms, 99))
    return {"call_median": round(median, 4), "call_p99": round(p99, 4), "per_category_median": round(
        median / n_categories, 4), "per_category_p99": round(p99 / n_categories, 4)}


def environment() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import fastapi
    import pydantic

    return {"python": sys.version.split()[0], "platform": platform.platform(), "cpu": cpu,
            "cpus_visible": os.cpu_count(), "fastapi": fastapi.__version__, "pydantic": pydantic.VERSION,
            "numpy": np.__version__}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ingest", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and calls (smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    n_batches, calls = (60, 50) if args.quick else (400, 300)

    ingest = {}
    for profile in PROFILES:
        ingest[profile.name] = {"profile": profile.__dict__, **bench_layers(profile, n_batches)}
    decisions = [bench_decisions(n, 4, calls) for n in (4, 16, 64)]
    worst_http = min(v["http"]["request_steps_per_cpu_s"] for v in ingest.values() if not v["profile"]["name"]
                     .startswith("cpu-demo"))
    worst_decision = max(d["cpu_ms"]["per_category_p99"] for d in decisions)
    worst_decision_wall = max(d["wall_ms"]["per_category_p99"] for d in decisions)
    result = {
        "benchmark": "ingest", "environment": environment(), "batches_per_profile": n_batches,
        "targets": {"request_steps_per_core": TARGET_REQUEST_STEPS_PER_CORE,
                    "decision_ms_per_category": TARGET_DECISION_MS_PER_CATEGORY},
        "ingest": ingest, "decisions": decisions,
        "verdict": {
            "http_ratio_to_target_per_profile": {
                name: round(row["http"]["request_steps_per_cpu_s"] / TARGET_REQUEST_STEPS_PER_CORE, 2)
                for name, row in ingest.items()},
            "http_request_steps_per_core_worst_gpu_profile": worst_http,
            "throughput_ratio_to_target": round(worst_http / TARGET_REQUEST_STEPS_PER_CORE, 2),
            "decision_p99_cpu_ms_per_category_worst": worst_decision,
            "decision_p99_wall_ms_per_category_worst": worst_decision_wall,
            "decision_ratio_to_target": round(worst_decision / TARGET_DECISION_MS_PER_CATEGORY, 3),
            "meets_throughput": worst_http >= TARGET_REQUEST_STEPS_PER_CORE,
            "meets_decision": worst_decision <= TARGET_DECISION_MS_PER_CATEGORY,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _print(result)
    print(f"wrote {args.out}")
    return 0


def _print(result: dict[str, Any]) -> None:
    target = result["targets"]["request_steps_per_core"]
    print(f"ingest throughput, request-steps per CPU-second (target {target:,}); http = real server, its CPU only:")
    print(f"  {'profile':<18} {'req-steps/batch':>15} {'brain':>12} {'parse+ack':>12} {'http':>12} {'http/target':>12}"
          f" {'ms CPU/post':>12} {'post p99 ms':>12}")
    for name, row in result["ingest"].items():
        rates = [row[layer]["request_steps_per_cpu_s"] for layer in ("brain", "parse", "http")]
        http = row["http"]
        print(f"  {name:<18} {row['request_steps_per_batch']:>15,} " + " ".join(f"{r:>12,}" for r in rates)
              + f" {rates[2] / target:>11.2f}x {http['server_cpu_ms_per_post']:>12.3f}"
              f" {http['post_latency_ms']['p99']:>12.3f}")
    limit = result["targets"]["decision_ms_per_category"]
    print(f"policy decision latency, cache defeated (target {limit} ms per category); CPU = thread time, "
          "wall = includes other load on this machine:")
    print(f"  {'categories':>10} {'CPU/call med':>13} {'CPU/cat med':>12} {'CPU/cat p99':>12} {'wall/cat p99':>13}"
          f" {'cached call med':>16}")
    for d in result["decisions"]:
        cpu, wall = d["cpu_ms"], d["wall_ms"]
        print(f"  {d['categories']:>10} {cpu['call_median']:>11.3f}ms {cpu['per_category_median']:>10.4f}ms "
              f"{cpu['per_category_p99']:>10.4f}ms {wall['per_category_p99']:>11.4f}ms "
              f"{d['cached_wall_ms']['call_median']:>14.4f}ms")
    v = result["verdict"]
    print(f"verdict: HTTP ingest {v['throughput_ratio_to_target']}x the throughput target (worst GPU profile); "
          f"decision p99 {v['decision_p99_cpu_ms_per_category_worst']} ms CPU per category "
          f"({v['decision_ratio_to_target']}x the limit)")


if __name__ == "__main__":
    sys.exit(main())
