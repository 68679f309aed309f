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
  a scraper process fetching ``/metrics`` back to back.

Writes ``bench/results/budget.json``.

    python -m bench.budget                     # the default budget (50 000 series)
    python -m bench.budget --budget 200000     # a larger one
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
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
INGEST = "bench-ingest-token-0123456789"
ADMIN = "bench-admin-token-0123456789"
K = 32


def _batch(engine: str, model: str, seq: int, categories: list[str], k: int = K) -> dict:
    cats = []
    for c in categories:
        hist = {"k": k, "accepted": [1] + [0] * (k - 1) + [1]}
        cats.append({"category": c, "method": "eagle3", "requests": 2, "hists": [hist],
                     "counterfactual": {"ngram": [hist], "suffix": [hist]},
                     "counterfactual_attempts": {"ngram": 2, "suffix": 2}})
    n = 2 * len(categories)
    step = {"t": float(seq), "wall_s": 0.02, "batch_size": n, "scheduled_tokens": n * (k + 1),
            "draft_tokens": n * k, "draft_depth": k, "categories": cats}
    return {"protocol": 1, "engine_id": engine, "boot_id": "boot", "model_name": model, "seq": seq,
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


def run(budget: int, scrapes: int, seconds: float, out: Path) -> dict:
    os.environ["SPECCTL_BUDGET_MAX_SERIES"] = str(budget)
    with tempfile.TemporaryDirectory(prefix="specctl-budget-") as tmp:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_server(Path(tmp) / "db", port, INGEST, ADMIN, Path(tmp) / "log")
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
                "host_load_1m": os.getloadavg()[0],
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=50_000, help="SPECCTL_BUDGET_MAX_SERIES (default 50000)")
    parser.add_argument("--scrapes", type=int, default=5, help="scrapes timed after filling (default 5)")
    parser.add_argument("--seconds", type=float, default=15.0, help="each ingest-latency phase (default 15)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"result JSON (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    run(args.budget, args.scrapes, args.seconds, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
