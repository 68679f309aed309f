"""The GPU benchmarks' child processes: the specctl controller on the loopback with its recording tap, and an
engine child in its own process group with its output relayed to a log (``sweep.py``, ``premise.py`` and
``bench/trace/run.py`` start theirs through these).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

from bench.gpu.tap import Tap
from bench.harness import free_port, start_controller, wait_http

REPO = Path(__file__).resolve().parents[2]


class Controller:
    """The specctl controller as a child process on the loopback, started on first use."""

    def __init__(self, state_dir: Path, preset: str, log: Path) -> None:
        self.state_dir = state_dir
        self.preset = preset
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.tap: Tap | None = None

    def engine_url(self) -> str:
        """What specctl engines report to: the recording tap in front of the controller."""
        url = self.ensure()
        if self.tap is None:
            self.tap = Tap(url, self.state_dir / "steps.jsonl")
            self.tap.start()
        return self.tap.url

    def ensure(self) -> str:
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "SPECCTL_DB": str(self.state_dir / "specctl.db"), "SPECCTL_POLICY_COST_PRESET": self.preset}
        self.proc = start_controller(port, "--insecure-dev", env=env, cwd=REPO, stdout=self.log)
        wait_http(self.url + "/readyz", self.proc, timeout_s=30, interval_s=0.3, request_timeout_s=5.0,
                  what="controller", detail=lambda: f"see {self.log}")
        print(f"controller ready at {self.url} (preset {self.preset})", flush=True)
        return self.url

    def get(self, path: str, quiet: bool = False):
        import httpx

        try:
            response = httpx.get(self.url + path, timeout=5.0)
        except httpx.HTTPError as exc:
            if not quiet:
                print(f"GET {path}: {exc}", flush=True)
            return None
        if response.status_code != 200:
            return None
        ctype = response.headers.get("content-type", "")
        return response.json() if "json" in ctype else response.text

    def dump(self, folders: list[Path]) -> None:
        """What the controller learned (categories, engines and their step-cost fit, metrics) for the record."""
        if self.proc is None or self.proc.poll() is not None:
            return
        state = {path: self.get(path) for path in ("/v1/categories", "/v1/engines", "/v1/audit")}
        metrics = self.get("/metrics")
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "controller_state.json").write_text(json.dumps(state, indent=1))
            if isinstance(metrics, str):
                (folder / "controller_metrics.txt").write_text(metrics)

    def stop(self, folders: list[Path]) -> None:
        """Stop the tap and the controller (a clean stop writes a snapshot of the learned state), then export
        the newest snapshot: it holds the controller's online cost-model statistics (fit_cost.py reads them)."""
        if self.tap is not None:
            self.tap.stop()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        db = self.state_dir / "specctl.db"
        if not db.exists():
            return
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT ts, data FROM snapshots ORDER BY id DESC LIMIT 1").fetchone()
        if row is None:
            return
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "controller_snapshot.json").write_text(json.dumps({"ts": row[0], "state": json.loads(row[1])}))


def run_engine_process(name: str, cmd: list[str], env: dict[str, str], log: Path, kill_at: float) -> int:
    """One engine child in its own process group, its output relayed to ``log``; killed at ``kill_at`` (unix s).
    Returns its exit code (-9 when stopped at the deadline)."""
    print(f"== {name}: starting (log {log})", flush=True)
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    relay = threading.Thread(target=_relay, args=(proc, log, name), daemon=True)
    relay.start()
    try:
        return proc.wait(timeout=max(1.0, kill_at - time.time()))
    except subprocess.TimeoutExpired:
        print(f"== {name}: past the deadline, stopped", flush=True)
        return -9
    finally:
        # The child's EngineCore (same process group) must be gone before the next engine asks for GPU memory.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        relay.join(5)
        _wait_group_gone(proc.pid)


def _wait_group_gone(pgid: int, timeout: float = 20.0) -> None:
    """Until no process of the group is left (killpg is asynchronous)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def _relay(proc: subprocess.Popen, log: Path, name: str) -> None:
    """Child output to its log; its result lines and errors also to our stdout (the device call's output)."""
    assert proc.stdout is not None
    with log.open("a") as fh:
        for line in proc.stdout:
            fh.write(line)
            fh.flush()
            if line.startswith(f"[{name}]") or ("WARNING" not in line and ("Error" in line or "Traceback" in line)):
                print(line.rstrip(), flush=True)


def tail(path: Path, n: int = 25) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return "\n".join(lines[-n:])
