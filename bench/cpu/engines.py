"""The configurations the CPU benchmark compares, and the processes each one needs.

* plain vLLM (no patch, no plugin): ``no_spec``; ``k=N`` (vLLM's static n-gram config, one engine per N);
  ``batch_table`` (vLLM's ``num_speculative_tokens_per_batch_size``);
* the patched engine (``--scheduler-cls``, ``--middleware``) with n-gram k_max = 8, reporting through a
  :class:`~bench.cpu.record.RecordingProxy` to a fresh ``specctl serve`` (its own SQLite file, default
  policy settings): ``specctl`` (the controller's policy), ``ema_tiers`` (overrides from
  :class:`~bench.cpu.ema_driver.EmaOverrideDriver`), ``oracle*`` (per-category pins set through the
  overrides API).

Every engine: float32, eager, 1 GiB KV cache, seed 0, n-gram prompt lookup 2..4, and
``--per-request-spec-decode-metrics detailed`` whenever speculation is configured (per-step drafted and
accepted counts in each response).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.support.specctl_serve import ADMIN_TOKEN, INGEST_TOKEN, SpecctlServe
from bench.support.stack import wait_attached
from bench.support.vllm_server import VllmServer

K_MAX = 8
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}
MAX_NUM_SEQS = 256
SPEC_METRICS = ["--per-request-spec-decode-metrics", "detailed"]


def ngram(k: int, table: list[list[int]] | None = None) -> dict:
    spec = {"method": "ngram", "num_speculative_tokens": k, **NGRAM_LOOKUP}
    if table is not None:
        spec["num_speculative_tokens_per_batch_size"] = table
    return spec


@dataclass(frozen=True)
class RunConfig:
    name: str
    patched: bool
    speculative: dict | None
    role: str = "static"  # static | table | specctl | ema_tiers | oracle | reference
    pins: dict[int, dict[str, tuple[int, str]]] = field(default_factory=dict)  # concurrency -> cat -> (k, method)
    concurrencies: tuple[int, ...] = ()  # measured concurrencies (default: all the benchmark's)
    controller_env: dict[str, str] = field(default_factory=dict)  # extra settings of its specctl serve


def no_spec() -> RunConfig:
    return RunConfig("no_spec", False, None)


def static(k: int) -> RunConfig:
    return RunConfig(f"k={k}", False, ngram(k))


def batch_table(table: list[list[int]]) -> RunConfig:
    return RunConfig("batch_table", False, ngram(max(1, max(k for _, _, k in table)), table), role="table")


def patched(name: str, role: str, pins: dict[int, dict[str, tuple[int, str]]] | None = None,
            controller_env: dict[str, str] | None = None) -> RunConfig:
    return RunConfig(name, True, ngram(K_MAX), role=role, pins=pins or {}, controller_env=controller_env or {})


@dataclass
class Stack:
    """What one configuration runs on."""

    engine: VllmServer
    controller: SpecctlServe | None = None
    proxy: object | None = None  # RecordingProxy

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the engine's process tree (API server, EngineCore, worker)."""
        return _tree_cpu_seconds(self.engine.proc)

    def controller_cpu_seconds(self) -> float:
        """User + system CPU seconds of the controller process (0 without one)."""
        return _tree_cpu_seconds(self.controller.proc if self.controller is not None else None)

    def restart_engine(self) -> None:
        """A fresh engine process on the same port, attached to the same controller (its learned state kept).

        Why: in run 2 of the CPU benchmark the always-on engine's decode steps took 3-4 % longer than a fresh
        patched engine's at the same batch and token counts, in the same minutes; restarting it takes engine
        age out of a pairing. The controller is what is under test, and it keeps running.
        """
        self.engine.stop()
        self.engine.start()
        if self.controller is not None:
            wait_attached(self.controller.url, self.engine.engine_id, timeout_s=60.0)


def _tree_cpu_seconds(proc) -> float:
    if proc is None:
        return 0.0
    try:
        root = psutil.Process(proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def engine_env(omp_bind: str | None, ld_preload: str | None = None) -> dict[str, str]:
    # tqdm bars of vLLM itself would interleave with the benchmark's own
    env = {"TQDM_DISABLE": "1", "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
    if omp_bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
    if ld_preload:
        env["LD_PRELOAD"] = ld_preload
    return env


def default_ld_preload() -> str:
    """Intel OpenMP from this environment, as vLLM's CPU installation guide asks (vLLM warns that speculative
    decoding on CPU without it "will cause significant performance loss"; measured here: about 2x at k=8)."""
    path = Path(sys.prefix) / "lib" / "libiomp5.so"
    return str(path) if path.exists() else ""


def default_omp_bind() -> str:
    """The last CPU: vLLM's automatic binding puts every engine's worker on the same core (here CPU 0), so a
    benchmark engine bound elsewhere does not fight other engines running on a shared machine."""
    return str((os.cpu_count() or 1) - 1)


def pin(pid: int, cpus: str) -> None:
    """Every thread of process ``pid`` onto ``cpus`` (taskset)."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True)


def default_server_cpus(omp_bind: str | None) -> str | None:
    """Every CPU but the worker's: where the API server and EngineCore of every benchmark engine run."""
    if not omp_bind or not omp_bind.isdigit():
        return None
    others = sorted(set(os.sched_getaffinity(0)) - {int(omp_bind)})
    return ",".join(map(str, others)) or None


@contextmanager
def start(cfg: RunConfig, model_dir: Path, workdir: Path, omp_bind: str | None = None,
          ld_preload: str | None = None, server_cpus: str | None = None) -> Iterator[Stack]:
    """Start what ``cfg`` needs (controller, proxy, engine), stop it all on exit."""
    from bench.cpu.record import RecordingProxy

    workdir.mkdir(parents=True, exist_ok=True)
    extra = SPEC_METRICS if cfg.speculative else []
    extra = extra + ["--max-num-seqs", str(MAX_NUM_SEQS), "--no-enable-prefix-caching"]
    with ExitStack() as stack:
        if not cfg.patched:
            eng = VllmServer(model_dir, workdir, speculative=cfg.speculative, patched=False, extra_args=extra,
                             extra_env=engine_env(omp_bind, ld_preload), log_name="vllm.log", cpus=server_cpus)
            stack.callback(eng.stop)
            eng.start()
            yield Stack(eng)
            return
        db = workdir / "specctl.db"
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        ctl = SpecctlServe(workdir / "controller", db=db, env={"SPECCTL_ACCESS_LOG": "false", **cfg.controller_env})
        stack.callback(ctl.stop)
        ctl.start()
        if server_cpus:  # off the worker's core, like the engine's own server processes
            pin(ctl.pid, server_cpus)
        proxy = RecordingProxy(ctl.url).start()
        stack.callback(proxy.stop)
        engine_id = f"bench-{cfg.name.replace('=', '').replace(' ', '-')}"
        eng = VllmServer(model_dir, workdir, speculative=cfg.speculative, patched=True, controller_url=proxy.url,
                         ingest_token=INGEST_TOKEN, engine_id=engine_id, report_interval_s=0.1, extra_args=extra,
                         extra_env=engine_env(omp_bind, ld_preload), log_name="vllm.log", cpus=server_cpus)
        stack.callback(eng.stop)
        eng.start()
        wait_attached(ctl.url, engine_id, timeout_s=60.0)
        yield Stack(eng, ctl, proxy)


def set_pins(controller_url: str, pins: dict[str, tuple[int, str]], reason: str) -> None:
    """Pin each category to (k, method) through the overrides API (k = 0: speculation off)."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(timeout=10.0, headers=headers) as client:
        for cat, (k, method) in pins.items():
            body = {"k": None, "method": None, "off": True, "ttl_s": None, "reason": reason, "actor": "bench"}
            if k > 0:
                body.update(k=k, method=method, off=False)
            client.put(f"{controller_url.rstrip('/')}/v1/overrides/{cat}", json=body).raise_for_status()


def policy_version(controller_url: str, engine_id: str) -> tuple[int | None, int | None]:
    """(served, reported) policy versions of one engine."""
    for e in httpx.get(f"{controller_url.rstrip('/')}/v1/engines", timeout=10.0).json():
        if e.get("engine_id") == engine_id:
            return e.get("policy_version_served"), e.get("policy_version_reported")
    return None, None
