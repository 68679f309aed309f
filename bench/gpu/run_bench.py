"""specctl against vLLM's own static speculative settings on one GPU (issue 7), resumable within a time budget.

Engine starts, in order (``shapes.plan``): specctl on the high (beta=0.85) and low (beta=0.45) acceptance
profiles, plain decoding, static k in {1, 2, 4, 7} and vLLM's batch-size K table on the high profile. Each engine
runs as a child process (``python -m bench.gpu.engine_run``) and appends one JSON row per concurrency to ``--results`` (and to
every ``--mirror`` folder) as soon as it is measured; a later call skips what is already there, so a sweep
longer than one device call (10 minutes) is finished by the next one.

specctl engines start with k_max=7 and the patch's scheduler, against a controller this script starts on the
loopback (``python -m specctl_vllm.controller serve --insecure-dev``, SQLite in ``--state-dir``). Baseline engines run with
reporting off and vLLM's general plugins disabled, i.e. unpatched vLLM.

    python3 -m bench gpu.run_bench --results R.jsonl --budget-s 540 [--mirror $OUT] [--only base,k4-high]
    python3 -m bench gpu.run_bench --results R.jsonl --shape tiny --eager   # CPU smoke test of the harness
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

from bench.gpu.shapes import EngineConfig, plan
from bench.gpu.table import load, render, targets
from bench.gpu.tap import Tap
from bench.harness import free_port, start_controller, wait_http

#: Seconds assumed for an engine start (8B dummy weights with torch.compile and CUDA graphs took 27-90 s on the H200).
STARTUP_GUESS_S = 90.0
#: Seconds assumed for one full concurrency sweep of one engine (warm-up + 2 timed rounds of 1..256).
SWEEP_GUESS_S = 30.0


def engine_guess_s(rows: dict[tuple[str, int], dict], cfg: EngineConfig) -> float:
    """Seconds one more engine will take: the slowest start seen so far (plus the child's imports) and a sweep."""
    starts = [r["startup_s"] for r in rows.values() if "startup_s" in r]
    startup = max(starts) + 15.0 if starts else STARTUP_GUESS_S
    return startup + SWEEP_GUESS_S * (2 if cfg.specctl else 1)


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


def child_env(cfg: EngineConfig, controller: Controller | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # the child touched CUDA (is_available) before vLLM starts
    # The child runs as ``python -m bench.gpu.engine_run``: the repository root on its path (and its workers').
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                       else []))
    if cfg.specctl:
        assert controller is not None
        env["SPECCTL_CONTROLLER_URL"] = controller.engine_url()
        env.setdefault("SPECCTL_ENGINE_ID", "gpu-bench")
        # vLLM's synthetic sampler accepts drafts at the profile's rate whatever their content, so the patch's
        # model-free drafters (n-gram, suffix) would score that rate too and the policy would switch to them:
        # no counterfactual scoring, the category stays on the engine's draft model (first H200 run: it did not).
        env["SPECCTL_COUNTERFACTUAL_SHARE"] = "0"
    else:
        env["SPECCTL_CONTROLLER_URL"] = "off"
        env["VLLM_PLUGINS"] = ""  # unpatched vLLM: no general plugin is loaded
    return env


def run_engine(cfg: EngineConfig, args: argparse.Namespace, done: set[int], deadline: float,
               controller: Controller | None) -> int:
    outs = [args.results] + [m / args.results.name for m in args.mirror]
    cmd = [sys.executable, "-m", "bench.gpu.engine_run", "--config", cfg.to_json(), "--shape", args.shape,
           "--models-dir", str(args.state_dir / "models"), "--deadline", str(deadline),
           "--warmup", str(args.warmup), "--repeat", str(args.repeat), "--async-scheduling", args.async_scheduling]
    if cfg.specctl:
        cmd += ["--learn-s", str(args.learn_s)]
    for out in outs:
        cmd += ["--out", str(out)]
    if done:
        cmd += ["--skip", *map(str, sorted(done))]
    if args.eager:
        cmd.append("--eager")
    return run_engine_process(cfg.name, cmd, child_env(cfg, controller), args.state_dir / f"{cfg.name}.log",
                              deadline + args.grace_s)


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


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, required=True, help="JSONL results (appended; rows already there are skipped)")
    p.add_argument("--mirror", type=Path, action="append", default=[], help="folder that gets a copy of every row")
    p.add_argument("--state-dir", type=Path, default=Path("/tmp/specctl-gpu-bench"), help="models, logs, controller DB")
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds from now after which nothing new starts")
    p.add_argument("--grace-s", type=float, default=15.0, help="seconds past the budget before a child is killed")
    p.add_argument("--only", default="", help="comma-separated config names (default: the whole plan)")
    p.add_argument("--profiles", default="high,low")
    p.add_argument("--shape", default="8b")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--learn-s", type=float, default=4.0, help="specctl: seconds of each load before timing it")
    p.add_argument("--async-scheduling", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--cost-preset", default="h200", help="controller's cold-start step-cost preset")
    p.add_argument("--concurrency", default="", help="comma-separated override of 1,4,16,64,256")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_end = time.time() + args.budget_s
    args.state_dir.mkdir(parents=True, exist_ok=True)
    configs = plan(tuple(args.profiles.split(",")))
    if args.only:
        wanted = args.only.split(",")
        configs = [c for c in configs if c.name in wanted]
    if args.concurrency:
        cs = tuple(int(x) for x in args.concurrency.split(","))
        configs = [EngineConfig(**{**c.__dict__, "concurrency": cs}) for c in configs]
    for folder in args.mirror:  # the mirror holds every row so far, not only this call's
        folder.mkdir(parents=True, exist_ok=True)
        if args.results.exists():
            shutil.copy(args.results, folder / args.results.name)
    controller = Controller(args.state_dir / "controller", args.cost_preset, args.state_dir / "controller.log")
    failures = []
    try:
        for cfg in configs:
            done = {c for (name, c) in load(args.results) if name == cfg.name}
            if set(cfg.concurrency) <= done:
                continue
            if time.time() + engine_guess_s(load(args.results), cfg) > t_end:
                print(f"== {cfg.name}: not started, budget", flush=True)
                continue
            rc = run_engine(cfg, args, done, t_end, controller if cfg.specctl else None)
            if rc != 0:
                failures.append(cfg.name)
                last = tail(args.state_dir / f"{cfg.name}.log", 60)
                print(f"== {cfg.name}: exit {rc}; last lines of its log:\n{last}", flush=True)
                for folder in args.mirror:  # one file for all failures: few files come back from a device call
                    with (folder / "failures.log").open("a") as fh:
                        fh.write(f"== {cfg.name}: exit {rc}\n{tail(args.state_dir / f'{cfg.name}.log', 400)}\n")
            if cfg.specctl:
                controller.dump([args.results.parent] + args.mirror)
    finally:
        controller.stop([args.results.parent] + args.mirror)
        steps = args.state_dir / "controller" / "steps.jsonl"
        for folder in [args.results.parent] + args.mirror:
            folder.mkdir(parents=True, exist_ok=True)
            if steps.exists():  # every specctl telemetry batch so far (fit_cost.py), compressed: few MiB come back
                with steps.open("rb") as src, gzip.open(folder / "steps.jsonl.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
        for folder in args.mirror:
            if (args.state_dir / "controller.log").exists():
                shutil.copy(args.state_dir / "controller.log", folder / "controller.log")
    rows = load(args.results)
    print(render(rows))
    print("\n".join(targets(rows)))
    if failures:
        print(f"failed: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
