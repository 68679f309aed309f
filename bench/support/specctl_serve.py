"""A real ``specctl serve`` process for the reliability, security and durability tests.

Started from the installed package (``python -m specctl_vllm.controller serve``) with its own environment, its
combined stdout/stderr in a file the tests read (to prove what was, and was not, logged), and the
controls the tests need: ``kill(SIGKILL)`` for crash tests, ``restart()`` on the same port and the
same SQLite file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Self

from bench.harness import controller_command, free_port, start_controller, wait_http

ADMIN_TOKEN = "adm-" + "Q7r2Lx9pVw3Kz8Nd5Hs1"  # >= 16 characters, distinct from the ingest token
INGEST_TOKEN = "ing-" + "Bm4Tc6Yj0Fu2Gh8Ea3Rk"


class SpecctlServe:
    """One controller process; ``start()`` returns once ``/readyz`` answers 200."""

    def __init__(self, workdir: Path, *, env: dict[str, str] | None = None, args: list[str] | None = None,
                 port: int | None = None, admin_token: str | None = ADMIN_TOKEN,
                 ingest_token: str | None = INGEST_TOKEN, db: Path | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.db = db or self.workdir / "specctl.db"
        self.port = port or free_port()
        self.admin_token = admin_token
        self.ingest_token = ingest_token
        self.extra_env = dict(env or {})
        self.args = list(args or [])
        self.log_path = self.workdir / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCTL_")}
        env["SPECCTL_DB"] = str(self.db)
        if self.admin_token is not None:
            env["SPECCTL_ADMIN_TOKEN"] = self.admin_token
        if self.ingest_token is not None:
            env["SPECCTL_INGEST_TOKEN"] = self.ingest_token
        env.update(self.extra_env)
        return env

    def command(self) -> list[str]:
        return controller_command(self.port, *self.args)

    def spawn(self) -> subprocess.Popen:
        """Start the process without waiting for readiness (for start-up failure tests)."""
        self.proc = start_controller(self.port, env=self.env(), stdout=self.log_path, command=self.command())
        self.starts += 1
        return self.proc

    def start(self, timeout_s: float = 60.0) -> SpecctlServe:
        self.spawn()
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        wait_http(self.url + "/readyz", self.proc, timeout_s=timeout_s, interval_s=0.1, what="specctl serve",
                  detail=lambda: self.log_text()[-3000:])

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 15.0) -> int:
        """Send ``sig`` and wait for the exit; SIGTERM falls back to SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout_s)

    def restart(self, sig: int = signal.SIGTERM) -> SpecctlServe:
        self.kill(sig)
        return self.start()

    def stop(self) -> None:
        self.kill(signal.SIGTERM)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def headers(self, scope: str) -> dict[str, str]:
        token = {"admin": self.admin_token, "ingest": self.ingest_token}[scope]
        return {"Authorization": f"Bearer {token}"} if token else {}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def telemetry_batch(engine_id: str, seq: int, categories: dict[str, list[int]], *, k: int = 4,
                    steps: int = 1, model: str = "test-model", boot_id: str = "boot0",
                    method: str = "ngram") -> dict:
    """A valid protocol-v1 batch: ``steps`` steps, each with one histogram ``k -> accepted`` per category.

    ``categories`` maps a category name to its ``accepted`` buckets (length ``k + 1``).
    """
    records = []
    for i in range(steps):
        cats = [{"category": name, "method": method, "requests": sum(buckets),
                 "hists": [{"k": k, "accepted": list(buckets)}]} for name, buckets in categories.items()]
        requests = sum(c["requests"] for c in cats)
        drafted = k * requests
        records.append({"t": seq * 1.0 + i * 0.01, "wall_s": 0.01, "batch_size": requests,
                        "scheduled_tokens": requests + drafted, "draft_tokens": drafted, "draft_depth": k,
                        "categories": cats})
    return {"protocol": 1, "engine_id": engine_id, "boot_id": boot_id, "model_name": model, "seq": seq,
            "sent_at": time.time(), "spec": {"method": method, "k_max": k}, "steps": records}
