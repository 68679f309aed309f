"""Ingest load benchmark: many simulated engines posting telemetry to one real ``specctl serve``.

Default shape (issue target): 64 engines x 20 batches/s for 60 s on loopback, each batch a realistic
100 ms-scale report (a few steps, 4 categories, histograms up to k_max = 4). The load generator runs in
its own processes (``--procs``), the controller in another, started here from the installed CLI unless
``--url`` points at a running one.

Measured and written to ``bench/results/load.json`` (and printed):
  * ingest latency per POST (client side, send to ack): p50, p90, p99, max;
  * achieved batch rate against the target rate (a slow server makes the simulated engines fall behind);
  * server CPU (cores used, from ``/proc/<pid>/stat`` utime+stime) and RSS (``/proc/<pid>/status``
    VmRSS sampled every 0.5 s, and the kernel's VmHWM peak);
  * reconciliation with the controller's own counters after the run: every batch the server acknowledged
    is counted once (``specctl_telemetry_batches_total{outcome="accepted"}`` per engine), deliberate
    retries of acknowledged batches come back as ``duplicate`` and are not double-counted (steps and
    draft tokens per category equal the client's totals over unique batches).

Targets: p99 <= 50 ms and RSS <= 200 MB. Exit status 0 whether or not targets are met (the JSON says);
1 only when acknowledged batches were lost or double-counted, since that is a correctness failure.

    python -m bench load                    # full run (60 s)
    python -m bench load --duration 10      # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import RssSampler, free_port, proc_cpu_seconds, proc_status_kb, start_controller, wait_http
from specctl_vllm.kernel.protocol import TelemetryBatch

CATEGORIES = ("prose", "structured", "code", "tool_call")
MODEL_NAME = "bench-load-model"
TARGET_P99_MS = 50.0
TARGET_RSS_MB = 200.0
DEFAULT_OUT = Path(__file__).parent / "results" / "load.json"


@dataclass(frozen=True)
class LoadConfig:
    engines: int = 64
    rate_hz: float = 20.0
    duration_s: float = 60.0
    procs: int = 1  # one asyncio process drives 64 connections with ~0.4 core; the rest stays with the server
    steps_per_batch: int = 3
    k_max: int = 4
    retry_share: float = 0.02
    timeout_s: float = 5.0
    seed: int = 0


@dataclass
class WorkerResult:
    """What one generator process saw; merged by the parent."""

    latencies_ms: list[float] = field(default_factory=list)
    sent: int = 0  # POSTs, including retries
    acked_unique: dict[str, int] = field(default_factory=dict)  # engine -> batches acknowledged (either outcome)
    accepted_acks: dict[str, int] = field(default_factory=dict)  # engine -> acks with outcome "accepted"
    duplicate_acks: int = 0
    deliberate_retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # plain dict: asdict() mangles a Counter
    steps: dict[str, int] = field(default_factory=dict)  # engine -> steps in acknowledged unique batches
    draft_tokens: dict[str, int] = field(default_factory=dict)  # category -> draft tokens (acked unique batches)
    accepted_tokens: dict[str, int] = field(default_factory=dict)
    unacked: int = 0  # batches given up at the end of the run (never acknowledged)
    cpu_s: float = 0.0  # CPU time of this generator process


# ---- batch synthesis (pure) ------------------------------------------------------------------
def make_batch(engine_id: str, seq: int, cfg: LoadConfig, rng: random.Random, t0: float) -> dict:
    """One telemetry batch as plain JSON data (validated against the protocol once at start)."""
    steps = []
    for i in range(cfg.steps_per_batch):
        cats, drafted_tokens, scheduled = [], 0, 0
        for category in CATEGORIES:
            requests = rng.randint(1, 8)
            hists = []
            remaining = requests
            for k in range(1, cfg.k_max + 1):
                if remaining == 0 or rng.random() < 0.5:
                    continue
                n = rng.randint(1, remaining)
                remaining -= n
                buckets = [0] * (k + 1)
                for _ in range(n):
                    buckets[rng.randint(0, k)] += 1
                hists.append({"k": k, "accepted": buckets})
                drafted_tokens += k * n
            cats.append({"category": category, "method": "ngram", "requests": requests, "hists": hists})
            scheduled += requests
        steps.append({
            "t": round(t0 + seq * 0.05 + i * 0.015, 6),
            "wall_s": round(rng.uniform(0.004, 0.02), 6),
            "batch_size": scheduled,
            "scheduled_tokens": scheduled + drafted_tokens,
            "draft_tokens": drafted_tokens,
            "draft_depth": cfg.k_max,
            "categories": cats,
        })
    return {
        "protocol": 1, "engine_id": engine_id, "boot_id": "b0", "model_name": MODEL_NAME, "seq": seq,
        "sent_at": time.time(), "spec": {"method": "ngram", "k_max": cfg.k_max}, "policy_version": None,
        "dropped_steps": 0, "steps": steps,
    }


def batch_totals(batch: dict) -> tuple[int, Counter, Counter]:
    drafted, accepted = Counter(), Counter()
    for step in batch["steps"]:
        for cat in step["categories"]:
            for h in cat["hists"]:
                drafted[cat["category"]] += h["k"] * sum(h["accepted"])
                accepted[cat["category"]] += sum(j * n for j, n in enumerate(h["accepted"]))
    return len(batch["steps"]), drafted, accepted


# ---- generator process -----------------------------------------------------------------------
class EngineConnection:
    """One simulated engine's keep-alive HTTP/1.1 connection, kept deliberately cheap.

    A general-purpose async client costs about as much CPU per request as the server under test; on a
    small host the generator would then measure itself. The request is one pre-built byte string and
    the answer is read by its Content-Length; any error closes the connection and the next call redials.
    """

    def __init__(self, host: str, port: int, token: str, timeout_s: float):
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.head = (f"POST /v1/telemetry HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: ").encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        return await asyncio.wait_for(self._post(body), self.timeout_s)

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.transport.abort()
        self.reader = self.writer = None


async def _post(conn: EngineConnection, body: bytes, res: WorkerResult) -> dict | None:
    t = time.perf_counter()
    res.sent += 1
    try:
        status, data = await conn.post(body)
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
        res.errors[type(exc).__name__] = res.errors.get(type(exc).__name__, 0) + 1
        conn.close()
        return None
    res.latencies_ms.append((time.perf_counter() - t) * 1000)
    if status != 200:
        res.errors[f"http_{status}"] = res.errors.get(f"http_{status}", 0) + 1
        return None
    return json.loads(data)


async def _engine(index: int, conn: EngineConnection, cfg: LoadConfig, start: float, end: float,
                  res: WorkerResult) -> None:
    engine_id = f"load-{index:03d}"
    rng = random.Random(cfg.seed * 1000 + index)
    period = 1.0 / cfg.rate_hz
    next_at = start + rng.uniform(0, period)  # spread the engines over the period
    seq = 0
    try:
        while True:
            now = time.monotonic()
            if now >= end:
                return
            if next_at > now:
                await asyncio.sleep(next_at - now)
            batch = make_batch(engine_id, seq, cfg, rng, start)
            body = json.dumps(batch, separators=(",", ":")).encode()
            ack = None
            while ack is None and time.monotonic() < end + cfg.timeout_s:  # retry the same seq until acknowledged
                ack = await _post(conn, body, res)
            if ack is None:
                res.unacked += 1
                return
            _count_ack(engine_id, batch, ack, res)
            if rng.random() < cfg.retry_share:  # an engine that lost the ack resends: must come back duplicate
                res.deliberate_retries += 1
                again = await _post(conn, body, res)
                if again is not None and again.get("outcome") == "duplicate":
                    res.duplicate_acks += 1
            seq += 1
            next_at += period
    finally:
        conn.close()


def _count_ack(engine_id: str, batch: dict, ack: dict, res: WorkerResult) -> None:
    res.acked_unique[engine_id] = res.acked_unique.get(engine_id, 0) + 1
    if ack.get("outcome") == "accepted":
        res.accepted_acks[engine_id] = res.accepted_acks.get(engine_id, 0) + 1
    else:  # an earlier attempt reached the server but its ack was lost (timeout)
        res.duplicate_acks += 1
    steps, drafted, accepted = batch_totals(batch)
    res.steps[engine_id] = res.steps.get(engine_id, 0) + steps
    for c, n in drafted.items():
        res.draft_tokens[c] = res.draft_tokens.get(c, 0) + n
    for c, n in accepted.items():
        res.accepted_tokens[c] = res.accepted_tokens.get(c, 0) + n


async def _worker_main(indices: list[int], url: str, token: str, cfg: LoadConfig, start_wall: float) -> WorkerResult:
    res = WorkerResult()
    cpu0 = time.process_time()  # imports excluded
    # Align every process on one wall-clock start, then run on the monotonic clock.
    delay = start_wall - time.time()
    start = time.monotonic() + max(0.0, delay)
    end = start + cfg.duration_s
    target = httpx.URL(url)
    conns = [EngineConnection(target.host, target.port, token, cfg.timeout_s) for _ in indices]
    await asyncio.gather(*(_engine(i, c, cfg, start, end, res) for i, c in zip(indices, conns)))
    res.cpu_s = time.process_time() - cpu0
    return res


def _worker(indices: list[int], url: str, token: str, cfg: LoadConfig, start_wall: float, out) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    res = asyncio.run(_worker_main(indices, url, token, cfg, start_wall))
    out.send(asdict(res))
    out.close()


# ---- server process and /proc sampling (bench.harness; the names stay importable from here) --------
_free_port = free_port


def start_server(db: Path, port: int, ingest_token: str, admin_token: str, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, SPECCTL_DB=str(db), SPECCTL_INGEST_TOKEN=ingest_token, SPECCTL_ADMIN_TOKEN=admin_token,
               SPECCTL_LOG_LEVEL="warning", SPECCTL_ACCESS_LOG="false")  # as advised for many engines
    log_path.write_bytes(b"")
    return start_controller(port, env=env, stdout=log_path)


def wait_ready(url: str, proc: subprocess.Popen | None, timeout_s: float = 60) -> None:
    wait_http(url + "/readyz", proc, timeout_s=timeout_s, what="controller")


# ---- reconciliation --------------------------------------------------------------------------
def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    values: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return values


def _sum(metrics: dict, name: str, **match: str) -> dict[tuple, float]:
    """Values of ``name`` whose labels include ``match``, keyed by their full label set."""
    return {labels: v for (n, labels), v in metrics.items()
            if n == name and all((k, v2) in labels for k, v2 in match.items())}


def _by_label(series: dict[tuple, float], label: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for labels, v in series.items():
        out[dict(labels).get(label, "")] += v
    return dict(out)


def reconcile(metrics: dict, merged: dict) -> dict:
    """Compare the controller's counters with what the generators had acknowledged."""
    accepted = _by_label(_sum(metrics, "specctl_telemetry_batches_total", outcome="accepted"), "engine")
    duplicate = _by_label(_sum(metrics, "specctl_telemetry_batches_total", outcome="duplicate"), "engine")
    steps = _by_label(_sum(metrics, "specctl_steps_total", model_name=MODEL_NAME), "engine")
    draft_tokens = _by_label(_sum(metrics, "specctl_draft_tokens_total", model_name=MODEL_NAME), "category")
    accepted_tokens = _by_label(_sum(metrics, "specctl_accepted_tokens_total", model_name=MODEL_NAME), "category")
    acked = merged["acked_unique"]
    lost = {e: n - accepted.get(e, 0) for e, n in acked.items() if accepted.get(e, 0) < n}
    double = {e: accepted.get(e, 0) - n for e, n in acked.items() if accepted.get(e, 0) > n}
    return {
        "metrics_present": bool(accepted),
        "acked_batches": sum(acked.values()),
        "server_accepted_batches": int(sum(v for e, v in accepted.items() if e in acked)),
        "server_duplicate_batches": int(sum(v for e, v in duplicate.items() if e in acked)),
        "client_duplicate_acks": merged["duplicate_acks"],
        # every duplicate ack the client got is a duplicate the server counted; the server may count more
        # (a retry whose answer timed out too), but never more than the posts beyond each batch's first
        "duplicates_consistent": merged["duplicate_acks"]
        <= int(sum(v for e, v in duplicate.items() if e in acked))
        <= merged["sent"] - sum(acked.values()),
        "lost_acked_batches": int(sum(lost.values())),
        "engines_with_loss": sorted(lost),
        "server_counted_more_than_acked": int(sum(double.values())),
        "steps_match": {e: steps.get(e, 0) for e in acked} == {e: merged["steps"].get(e, 0) for e in acked},
        "draft_tokens_match": {c: int(draft_tokens.get(c, 0)) for c in CATEGORIES}
        == {c: merged["draft_tokens"].get(c, 0) for c in CATEGORIES},
        "accepted_tokens_match": {c: int(accepted_tokens.get(c, 0)) for c in CATEGORIES}
        == {c: merged["accepted_tokens"].get(c, 0) for c in CATEGORIES},
        "server_draft_tokens": {c: int(draft_tokens.get(c, 0)) for c in CATEGORIES},
        "client_draft_tokens": {c: merged["draft_tokens"].get(c, 0) for c in CATEGORIES},
    }


def merge(results: list[dict]) -> dict:
    merged: dict = {"latencies_ms": [], "sent": 0, "acked_unique": {}, "accepted_acks": {}, "duplicate_acks": 0,
                    "deliberate_retries": 0, "errors": Counter(), "steps": {}, "draft_tokens": Counter(),
                    "accepted_tokens": Counter(), "unacked": 0, "cpu_s": 0.0}
    for r in results:
        merged["latencies_ms"] += r["latencies_ms"]
        for key in ("sent", "duplicate_acks", "deliberate_retries", "unacked", "cpu_s"):
            merged[key] += r[key]
        for key in ("acked_unique", "accepted_acks", "steps"):
            merged[key].update(r[key])  # engines are disjoint across processes
        merged["errors"].update(r["errors"])
        merged["draft_tokens"].update(r["draft_tokens"])
        merged["accepted_tokens"].update(r["accepted_tokens"])
    return merged


# ---- driver ----------------------------------------------------------------------------------
def run(cfg: LoadConfig, url: str | None, out: Path) -> dict:
    sample = make_batch("load-000", 0, cfg, random.Random(0), 0.0)
    TelemetryBatch.model_validate(sample)  # the synthetic batches are valid protocol, checked once
    ingest_token = os.environ.get("SPECCTL_INGEST_TOKEN") or "bench-ingest-token-" + os.urandom(8).hex()
    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="specctl-load-")
    server_log = Path(tmp.name) / "server.log"
    if url is None:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_server(Path(tmp.name) / "load.db", port, ingest_token,
                            "bench-admin-token-" + os.urandom(8).hex(), server_log)
    try:
        wait_ready(url, proc)
        return _measure(cfg, url, ingest_token, proc, out)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.returncode not in (0, -signal.SIGTERM):
                sys.stderr.write(server_log.read_text(errors="replace")[-4000:])
        tmp.cleanup()


def _measure(cfg: LoadConfig, url: str, token: str, proc: subprocess.Popen | None, out: Path) -> dict:
    pid = proc.pid if proc is not None else None
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    ctx = mp.get_context("spawn")
    pipes, workers = [], []
    start_wall = time.time() + 3.0  # time for the spawned processes to import
    for p in range(cfg.procs):
        indices = list(range(p, cfg.engines, cfg.procs))
        parent, child = ctx.Pipe(duplex=False)
        w = ctx.Process(target=_worker, args=(indices, url, token, cfg, start_wall, child))
        w.start()
        pipes.append(parent)
        workers.append(w)
    time.sleep(max(0.0, start_wall - time.time()))
    sampler = RssSampler(pid) if pid else None
    cpu0, t0 = (proc_cpu_seconds(pid) if pid else 0.0), time.monotonic()
    if sampler:
        sampler.start()
    results = [p.recv() for p in pipes]
    wall = time.monotonic() - t0
    cpu1 = proc_cpu_seconds(pid) if pid else 0.0
    if sampler:
        sampler.stop()
    for w in workers:
        w.join()
    merged = merge(results)
    lat = np.asarray(merged["latencies_ms"]) if merged["latencies_ms"] else np.zeros(1)
    unique_batches = sum(merged["acked_unique"].values())
    report = {
        "config": asdict(cfg),
        "url": url,
        "wall_s": round(wall, 2),
        "target_batches_per_s": cfg.engines * cfg.rate_hz,
        "achieved_batches_per_s": round(unique_batches / cfg.duration_s, 1),
        "posts": merged["sent"],
        "errors": dict(merged["errors"]),
        "unacked_batches": merged["unacked"],
        "deliberate_retries": merged["deliberate_retries"],
        "latency_ms": {q: round(float(np.percentile(lat, p)), 2)
                       for q, p in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
        "server": {
            "cpu_cores_used": round((cpu1 - cpu0) / wall, 3) if pid else None,
            "rss_mb_max_sampled": round(max(sampler.samples_kb) / 1024, 1) if sampler and sampler.samples_kb else None,
            "rss_mb_end": round(sampler.samples_kb[-1] / 1024, 1) if sampler and sampler.samples_kb else None,
            "rss_mb_peak_hwm": round(proc_status_kb(pid, "VmHWM") / 1024, 1) if pid else None,
        },
        # the generator shares the host: its CPU shows whether it, not the server, was the limit
        "generator_cpu_cores": round(merged["cpu_s"] / wall, 3),
        "reconcile": reconcile(scrape(url), merged),
        "server_settings": {"SPECCTL_LOG_LEVEL": "warning", "SPECCTL_ACCESS_LOG": "false"} if pid else None,
        # other work on the host shares the CPUs: the load average says how quiet the run was
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "loadavg_before": load_before,
                 "loadavg_after": Path("/proc/loadavg").read_text().split()[:3]},
    }
    if pid and merged["sent"]:
        # CPU time per request does not depend on how much CPU other work left to the server: it gives the
        # request rate one fully available core would sustain (the server is one process, one event loop)
        cpu_ms = (cpu1 - cpu0) * 1000 / merged["sent"]
        report["server"]["cpu_ms_per_post"] = round(cpu_ms, 3)
        report["server"]["posts_per_core_s"] = round(1000 / cpu_ms) if cpu_ms else None
    rss = report["server"]["rss_mb_peak_hwm"]
    report["targets"] = {
        "p99_ms": {"target": TARGET_P99_MS, "measured": report["latency_ms"]["p99"],
                   "met": report["latency_ms"]["p99"] <= TARGET_P99_MS},
        "rss_mb": {"target": TARGET_RSS_MB, "measured": rss, "met": rss is not None and rss <= TARGET_RSS_MB},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def print_report(r: dict, out: Path) -> None:
    c, lat, srv, rec = r["config"], r["latency_ms"], r["server"], r["reconcile"]
    print(f"load: {c['engines']} engines x {c['rate_hz']:g} batches/s for {c['duration_s']:g} s, "
          f"{c['procs']} generator processes, {c['steps_per_batch']} steps/batch")
    print(f"  batches/s   target {r['target_batches_per_s']:.0f}   achieved {r['achieved_batches_per_s']:.0f}   "
          f"(ratio {r['achieved_batches_per_s'] / r['target_batches_per_s']:.2f})")
    print(f"  latency ms  p50 {lat['p50']}   p90 {lat['p90']}   p99 {lat['p99']} (target <= {TARGET_P99_MS:g})"
          f"   max {lat['max']}")
    print(f"  generator   cpu {r['generator_cpu_cores']} cores ({c['procs']} processes)")
    print(f"  server      cpu {srv['cpu_cores_used']} cores   rss max {srv['rss_mb_max_sampled']} MB   "
          f"peak {srv['rss_mb_peak_hwm']} MB (target <= {TARGET_RSS_MB:g})")
    if srv.get("cpu_ms_per_post"):
        print(f"              {srv['cpu_ms_per_post']} ms CPU per post -> {srv['posts_per_core_s']} posts/s per "
              f"fully available core (target load {r['target_batches_per_s']:.0f}/s)")
    print(f"  reconcile   acked {rec['acked_batches']}   server accepted {rec['server_accepted_batches']}   "
          f"lost {rec['lost_acked_batches']}   over-counted {rec['server_counted_more_than_acked']}")
    print(f"              duplicates: client acks {rec['client_duplicate_acks']} <= server {rec['server_duplicate_batches']}"
          f" <= retries sent {r['posts'] - rec['acked_batches']}: {rec['duplicates_consistent']}"
          f"   steps match {rec['steps_match']}   draft tokens match {rec['draft_tokens_match']}"
          f"   accepted tokens match {rec['accepted_tokens_match']}")
    print(f"  errors      {r['errors'] or 'none'}   unacked at end {r['unacked_batches']}")
    print(f"  host        {r['host']['cpus']} CPUs, load average before {' '.join(r['host']['loadavg_before'])}"
          f", after {' '.join(r['host']['loadavg_after'])}")
    print(f"  -> {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = LoadConfig()
    ap.add_argument("--engines", type=int, default=d.engines)
    ap.add_argument("--rate", type=float, default=d.rate_hz, help="batches per second per engine")
    ap.add_argument("--duration", type=float, default=d.duration_s, help="seconds of load")
    ap.add_argument("--procs", type=int, default=d.procs, help="load generator processes")
    ap.add_argument("--steps-per-batch", type=int, default=d.steps_per_batch)
    ap.add_argument("--retry-share", type=float, default=d.retry_share, help="share of batches resent once")
    ap.add_argument("--url", default=None, help="use a running controller (its ingest token in SPECCTL_INGEST_TOKEN)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    cfg = LoadConfig(engines=args.engines, rate_hz=args.rate, duration_s=args.duration, procs=args.procs,
                     steps_per_batch=args.steps_per_batch, retry_share=args.retry_share)
    report = run(cfg, args.url, args.out)
    print_report(report, args.out)
    rec = report["reconcile"]
    correct = (rec["metrics_present"] and rec["lost_acked_batches"] == 0 and rec["server_counted_more_than_acked"] == 0
               and rec["steps_match"] and rec["draft_tokens_match"] and rec["accepted_tokens_match"]
               and rec["duplicates_consistent"])
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
