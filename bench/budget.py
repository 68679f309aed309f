"""The learned-state budget at its limit: memory, series and scrape cost, and ingest latency during scrapes.

Starts one real ``specctl serve`` (access log off) with ``SPECCTL_BUDGET_MAX_SERIES`` = ``--budget`` and fills
it the way an attacker holding the ingest token would: many models, 60 categories per batch, three drafters
(one run, two counterfactual) at k_max = 32, until the controller refuses (429) or pools new names into the
overflow category. Then measures:

* the charged series (``specctl_series``) and the series ``/metrics`` really exports, the scrape's size and
  wall time (median and max of ``--scrapes``);
* the controller's RSS (VmRSS after filling, VmHWM peak) and its RSS before filling, and the RSS of its
  /metrics render process;
* ingest latency (client side, one keep-alive connection per engine, 4 engines of a typical model -- 4
  categories, k_max 4 -- at 20 batches/s each) for ``--seconds`` without scrapes, then as long again with
  a scraper process fetching ``/metrics`` back to back (no snapshot falls in these two phases: the
  snapshot interval is an hour), then, after a restart from the snapshot the shutdown wrote (restore timed),
  as long again with back-to-back scrapes and a snapshot of the full budget every ``--snapshot-interval``.

Writes ``bench/results/budget.json``.

``--flood SECONDS`` measures something else: one ``specctl serve`` at the given budget flooded for that long
with batches from engine ids and category names never seen before (every batch a new engine of one of
``--flood-models`` models, 8 new category names each, three drafters at k_max 32), by two keep-alive
clients as fast as they are answered. The idle timeouts are ``--flood-idle`` seconds (engines, categories,
models), so that the state is evicted and taken up again all along (at the hour-long defaults the budget
fills once and every later batch is refused, which tests less). Sampled every ``--sample-every`` s: the
controller's RSS (and the render process's), the charged series; every ``--scrape-every`` s: the /metrics
size and its series. Writes ``bench/results/budget_flood.json``.

    python -m bench.budget                     # the default budget (50 000 series)
    python -m bench.budget --budget 200000     # a larger one
    python -m bench.budget --flood 600         # RSS under a 10-minute flood of new engine ids and categories
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.load import _free_port, proc_status_kb, start_server, wait_ready

DEFAULT_OUT = Path(__file__).parent / "results" / "budget.json"
FLOOD_OUT = Path(__file__).parent / "results" / "budget_flood.json"
INGEST = "bench-ingest-token-0123456789"
ADMIN = "bench-admin-token-0123456789"
K = 32


def _batch(engine: str, model: str, seq: int, categories: list[str], k: int = K, boot: str = "boot") -> dict:
    cats = []
    for c in categories:
        hist = {"k": k, "accepted": [1] + [0] * (k - 1) + [1]}
        cats.append({"category": c, "method": "eagle3", "requests": 2, "hists": [hist],
                     "counterfactual": {"ngram": [hist], "suffix": [hist]},
                     "counterfactual_attempts": {"ngram": 2, "suffix": 2}})
    n = 2 * len(categories)
    step = {"t": float(seq), "wall_s": 0.02, "batch_size": n, "scheduled_tokens": n * (k + 1),
            "draft_tokens": n * k, "draft_depth": k, "categories": cats}
    return {"protocol": 1, "engine_id": engine, "boot_id": boot, "model_name": model, "seq": seq,
            "sent_at": time.time(), "spec": {"method": "eagle3", "k_max": k, "model_free_methods": ["ngram", "suffix"]},
            "steps": [step]}


#: The engines whose ingest latency is measured: a typical model (4 categories, k_max 4) served next to the
#: attacker's state that fills the budget (their own decisions stay cheap, so what is measured is the scrape).
SERVING = [(f"serving-{i}", "serving-model") for i in range(4)]
SERVING_CATEGORIES = ["prose", "structured", "code", "tool_call"]


def _children_rss_kb(pid: int) -> int:
    """VmRSS of the server's child processes (the /metrics render process)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += proc_status_kb(int(child), "VmRSS")
            except OSError:
                continue
    return total


def _series(text: str) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(text))


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return float("nan")


def fill(url: str, budget: int) -> dict:
    headers = {"Authorization": f"Bearer {INGEST}"}
    sent = refused = 0
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        for engine, model in SERVING:  # the measured engines are known before the budget fills
            client.post("/v1/telemetry", json=_batch(engine, model, 0, SERVING_CATEGORIES, k=4))
        for m in range(4096):
            model = f"model-{m}"
            status = client.post("/v1/telemetry", json=_batch(f"fill-{m}", model, 0,
                                                            [f"c{i}" for i in range(60)])).status_code
            sent += 1
            if status == 429:
                refused += 1
                break
            charged = _gauge(client.get("/metrics").text, "specctl_series") if m % 8 == 7 else 0
            if charged >= budget * 0.97:
                break
    return {"batches": sent, "refused": refused}


class Poster(threading.Thread):
    """One engine posting every 50 ms on its own keep-alive connection; latencies in ms."""

    def __init__(self, url: str, engine: str, model: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.engine, self.model, self.stop = url, engine, model, stop
        self.latencies: list[float] = []
        self.errors = 0
        self.seq = 1

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {INGEST}"}, timeout=30) as client:
            while not self.stop.is_set():
                body = _batch(self.engine, self.model, self.seq, SERVING_CATEGORIES, k=4)
                started = time.perf_counter()
                status = client.post("/v1/telemetry", json=body).status_code
                self.latencies.append((time.perf_counter() - started) * 1000)
                self.errors += status != 200
                self.seq += 1
                self.stop.wait(max(0.0, 0.05 - (time.perf_counter() - started)))


def _scraper(url: str, stop, count) -> None:
    """Back-to-back scrapes from their own process (reading 3 MB must not slow the posters' client side)."""
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            client.get("/metrics")
            with count.get_lock():
                count.value += 1


def ingest_latency(url: str, seconds: float, scrape: bool) -> dict:
    stop = threading.Event()
    posters = [Poster(url, engine, model, stop) for engine, model in SERVING]
    ctx = mp.get_context("spawn")
    scrape_stop, count = ctx.Event(), ctx.Value("i", 0)
    scraper = ctx.Process(target=_scraper, args=(url, scrape_stop, count), daemon=True) if scrape else None
    if scraper is not None:
        scraper.start()
        time.sleep(1.0)  # the first scrape under way
    for t in posters:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in posters:
        t.join(130)
    if scraper is not None:
        scrape_stop.set()
        scraper.join(130)
    scrapes = [None] * count.value
    lat = np.array([x for p in posters for x in p.latencies])
    return {"posts": int(lat.size), "errors": sum(p.errors for p in posters),
            "p50_ms": round(float(np.percentile(lat, 50)), 2), "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "max_ms": round(float(lat.max()), 2), "scrapes_during": len(scrapes)}


def _stop(proc) -> float:
    """SIGTERM (the final snapshot is written), the seconds it took to exit."""
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    return round(time.perf_counter() - started, 2)


def _snapshots(db: Path, since: float, until: float) -> tuple[int, int]:
    """Snapshots written between two unix times, and the size of the largest (bytes of JSON)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT length(data) FROM snapshots WHERE ts >= ? AND ts <= ?", (since, until)).fetchall()
    return len(rows), max((r[0] for r in rows), default=0)


def run(budget: int, scrapes: int, seconds: float, snapshot_interval: float, out: Path) -> dict:
    os.environ["SPECCTL_BUDGET_MAX_SERIES"] = str(budget)
    os.environ["SPECCTL_SNAPSHOT_INTERVAL_S"] = "3600"  # the first phases without snapshots, the last with
    with tempfile.TemporaryDirectory(prefix="specctl-budget-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        db = Path(tmp) / "db"
        proc = start_server(db, port, INGEST, ADMIN, Path(tmp) / "log")
        try:
            wait_ready(url, proc)
            rss_empty = proc_status_kb(proc.pid, "VmRSS")
            filled = fill(url, budget)
            times, sizes = [], []
            text = ""
            for _ in range(scrapes):
                started = time.perf_counter()
                text = httpx.get(url + "/metrics", timeout=120).text
                times.append(time.perf_counter() - started)
                sizes.append(len(text.encode()))
            quiet = ingest_latency(url, seconds, scrape=False)
            busy = ingest_latency(url, seconds, scrape=True)
            result = {
                "budget_series": budget,
                "charged_series": int(_gauge(text, "specctl_series")),
                "exported_series": _series(text),
                "fill": filled,
                "scrape_bytes": max(sizes),
                "scrape_s_median": round(statistics.median(times), 3),
                "scrape_s_max": round(max(times), 3),
                "rss_mb_empty": round(rss_empty / 1024, 1),
                "rss_mb_full": round(proc_status_kb(proc.pid, "VmRSS") / 1024, 1),
                "rss_mb_peak": round(proc_status_kb(proc.pid, "VmHWM") / 1024, 1),
                "render_process_rss_mb": round(_children_rss_kb(proc.pid) / 1024, 1),
                "ingest_without_scrapes": quiet,
                "ingest_during_scrapes": busy,
            }
        finally:
            shutdown_s = _stop(proc)
        # the same state restored from the snapshot the shutdown wrote, now snapshotted all along
        os.environ["SPECCTL_SNAPSHOT_INTERVAL_S"] = str(snapshot_interval)
        os.environ["SPECCTL_SNAPSHOTS_KEPT"] = "100"
        started = time.perf_counter()
        proc = start_server(db, port, INGEST, ADMIN, Path(tmp) / "log2")
        try:
            wait_ready(url, proc, timeout_s=120)
            restore_s = time.perf_counter() - started
            charged = int(_gauge(httpx.get(url + "/metrics", timeout=120).text, "specctl_series"))
            since = time.time()
            both = ingest_latency(url, seconds, scrape=True)
            until = time.time()
        finally:
            _stop(proc)
        written, largest = _snapshots(db, since, until)
        both.update(snapshots_during=written, snapshot_interval_s=snapshot_interval, snapshot_bytes=largest)
        result.update({
            "ingest_during_scrapes_and_snapshots": both,
            "shutdown_s": shutdown_s,
            "restart_s": round(restore_s, 2),
            "charged_series_after_restart": charged,
            "host_load_1m": os.getloadavg()[0],
        })
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


# ---- the flood -----------------------------------------------------------------------------------------------

class Flooder(threading.Thread):
    """Posts, as fast as they are answered, batches of engines never seen before with new category names."""

    def __init__(self, url: str, name: str, models: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.name, self.models, self.stop = url, name, models, stop
        self.statuses: dict[int, int] = {}
        self.latencies: list[float] = []
        self.transport_errors = 0

    def run(self) -> None:
        n = 0
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {INGEST}"}, timeout=60) as client:
            while not self.stop.is_set():
                body = _batch(f"{self.name}-{n}", f"flood-model-{n % self.models}", 0,
                              [f"c{self.name}-{n}-{j}" for j in range(8)], boot=f"b{n}")
                started = time.perf_counter()
                try:
                    status = client.post("/v1/telemetry", json=body).status_code
                except httpx.HTTPError:
                    self.transport_errors += 1
                    continue
                self.latencies.append((time.perf_counter() - started) * 1000)
                self.statuses[status] = self.statuses.get(status, 0) + 1
                n += 1


def _summary(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 1), "max": round(max(values), 1), "min": round(min(values), 1)}


def flood(budget: int, seconds: float, idle_s: float, models: int, sample_every: float, scrape_every: float,
          out: Path) -> dict:
    os.environ["SPECCTL_BUDGET_MAX_SERIES"] = str(budget)
    for what in ("ENGINE", "CATEGORY", "MODEL"):
        os.environ[f"SPECCTL_BUDGET_{what}_IDLE_S"] = str(idle_s)
    with tempfile.TemporaryDirectory(prefix="specctl-flood-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_server(Path(tmp) / "db", port, INGEST, ADMIN, Path(tmp) / "log")
        samples: list[dict] = []
        scrapes: list[dict] = []
        stop = threading.Event()
        flooders = [Flooder(url, f"f{i}", models, stop) for i in range(2)]
        try:
            wait_ready(url, proc)
            rss_empty = proc_status_kb(proc.pid, "VmRSS")
            t0 = time.monotonic()
            for f in flooders:
                f.start()
            next_scrape = t0
            with httpx.Client(base_url=url, timeout=120) as reader:
                while (elapsed := time.monotonic() - t0) < seconds:
                    sample = {"t_s": round(elapsed, 1), "rss_mb": round(proc_status_kb(proc.pid, "VmRSS") / 1024, 1),
                              "render_rss_mb": round(_children_rss_kb(proc.pid) / 1024, 1),
                              "posts": sum(len(f.latencies) for f in flooders)}
                    if time.monotonic() >= next_scrape:
                        started = time.perf_counter()
                        text = reader.get("/metrics").text
                        scrapes.append({"t_s": round(elapsed, 1), "bytes": len(text.encode()),
                                        "exported_series": _series(text),
                                        "charged_series": int(_gauge(text, "specctl_series")),
                                        "scrape_s": round(time.perf_counter() - started, 3)})
                        sample["charged_series"] = scrapes[-1]["charged_series"]
                        next_scrape += scrape_every
                    samples.append(sample)
                    time.sleep(max(0.0, sample_every - (time.monotonic() - t0 - elapsed)))
                stop.set()
                for f in flooders:
                    f.join(120)
                final = reader.get("/metrics").text
            statuses: dict[str, int] = {}
            for f in flooders:
                for status, count in f.statuses.items():
                    statuses[str(status)] = statuses.get(str(status), 0) + count
            lat = np.array([x for f in flooders for x in f.latencies])
            result = {
                "budget_series": budget,
                "idle_s": idle_s,
                "seconds": seconds,
                "models": models,
                "posts": int(lat.size),
                "posts_per_s": round(lat.size / seconds, 1),
                "statuses": statuses,
                "transport_errors": sum(f.transport_errors for f in flooders),
                "new_engine_ids": int(lat.size),
                "new_category_names": int(lat.size) * 8,
                "post_ms": {"p50": round(float(np.percentile(lat, 50)), 2),
                            "p99": round(float(np.percentile(lat, 99)), 2), "max": round(float(lat.max()), 2)},
                "rss_mb_empty": round(rss_empty / 1024, 1),
                "rss_mb": _summary([s["rss_mb"] for s in samples]),
                "rss_mb_peak": round(proc_status_kb(proc.pid, "VmHWM") / 1024, 1),
                "rss_mb_last_minute": _summary([s["rss_mb"] for s in samples if s["t_s"] >= seconds - 60]),
                "render_process_rss_mb": _summary([s["render_rss_mb"] for s in samples]),
                "metrics_bytes": _summary([float(s["bytes"]) for s in scrapes]),
                "exported_series": _summary([float(s["exported_series"]) for s in scrapes]),
                "charged_series": _summary([float(s["charged_series"]) for s in scrapes]),
                "evictions": _gauge(final, "specctl_evictions_total"),
                "budget_refusals": _gauge(final, "specctl_budget_refusals_total"),
                "internal_errors": _gauge(final, "specctl_http_internal_errors_total"),
                "host_load_1m": os.getloadavg()[0],
                "samples": samples,
                "scrapes": scrapes,
            }
        finally:
            stop.set()
            _stop(proc)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "scrapes")}, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=50_000, help="SPECCTL_BUDGET_MAX_SERIES (default 50000)")
    parser.add_argument("--scrapes", type=int, default=5, help="scrapes timed after filling (default 5)")
    parser.add_argument("--seconds", type=float, default=15.0, help="each ingest-latency phase (default 15)")
    parser.add_argument("--snapshot-interval", type=float, default=1.0,
                        help="SPECCTL_SNAPSHOT_INTERVAL_S of the last phase, in s (default 1)")
    parser.add_argument("--flood", type=float, default=0.0, metavar="SECONDS",
                        help="flood with new engine ids and category names for this long instead (default: off)")
    parser.add_argument("--flood-idle", type=float, default=30.0,
                        help="idle timeouts of engines, categories and models during the flood, in s (default 30)")
    parser.add_argument("--flood-models", type=int, default=16, help="model names the flood cycles through (default 16)")
    parser.add_argument("--sample-every", type=float, default=5.0, help="flood: RSS sampled every this many s (default 5)")
    parser.add_argument("--scrape-every", type=float, default=30.0, help="flood: /metrics read every this many s (default 30)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"result JSON (default {DEFAULT_OUT}, with --flood {FLOOD_OUT})")
    args = parser.parse_args(argv)
    if args.flood > 0:
        flood(args.budget, args.flood, args.flood_idle, args.flood_models, args.sample_every, args.scrape_every,
              args.out or FLOOD_OUT)
    else:
        run(args.budget, args.scrapes, args.seconds, args.snapshot_interval, args.out or DEFAULT_OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
