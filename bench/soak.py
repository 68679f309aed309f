"""Soak: one real ``specctl serve`` under a mixed attack, beside a well-behaved fleet of engines.

The fleet: ``--engines`` engines (default 64) posting small batches at ``--hz`` (default 20) each over kept-open
connections, and probing ``/healthz`` and ``/readyz`` every second. Beside it, all the time:

- idle sockets: ``--idle`` connections opened and left silent (re-opened when the server closes them);
- flooders: two clients posting maximal (~4 MB) batches back to back;
- a new-id storm: empty batches under fresh engine ids;
- huge headers: requests with 1 MiB of headers;
- an override storm: PUT/DELETE of overrides; every acknowledged write is remembered;
- kill -9 and restart of the server every ``--kill-every`` seconds (the fleet's posts while it is down do not
  count as answers; they are counted as ``unreachable``);
- a full disk: every file of the server is capped by the process's ``RLIMIT_FSIZE`` (writes beyond it fail as on
  a full disk): the recorder's, and the SQLite store's, whose WAL reaches the cap as the state grows.

Reported (``bench/results/soak.json``): the fleet's post latency p50/p99/max seen by the engines and the same
posts' handling time inside the server (``specctl_http_telemetry_seconds``, scraped before each kill and at the
end), the post rate offered and achieved, how late the engines sent (their own scheduling on a shared host), the
CPU seconds of the server and of this generator, its 5xx and the probes' 5xx, the server's largest RSS, the
series at the end, and acknowledged override writes lost (the last acknowledged state of every category,
compared with what the server answers at the end, after the restarts).

    nice python -m bench soak --minutes 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.harness import free_port, wait_http
from bench.ingest import Profile, make_batch
from bench.load import EngineConnection
from specctl_vllm.controller.service.timing import BOUNDS, quantile

RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
ADMIN, INGEST = "soak-admin-token-0123456789", "soak-ingest-token-0123456789"
FLEET = Profile("fleet", requests_per_step=16, steps_per_batch=2, categories=4, k_max=4, step_ms=50.0)
FLOOD = Profile("flood", requests_per_step=256, steps_per_batch=1500, categories=6, k_max=8, step_ms=25.0)
FSIZE_LIMIT = 8 * 1024 * 1024  # bytes any one file of the server may reach


class Server:
    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        self.proc = None
        self.rss_max_kib = 0
        self.up = False
        self.timing = [0] * (len(BOUNDS) + 1)  # telemetry handling time per bucket, summed over the server's lives
        self.cpu_s = 0.0  # CPU seconds of the server's past lives
        self.start_failures: list[str] = []

    async def end_of_life(self, metrics: str | None = None) -> None:
        """Add this life's ``specctl_http_telemetry_seconds{body="small"}`` buckets (a restart starts them from
        zero) and CPU seconds, before it ends."""
        if metrics is None:
            try:
                async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as client:
                    metrics = (await client.get(self.url + "/metrics")).text
            except httpx.HTTPError:
                metrics = ""
        cumulative = [float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith('specctl_http_telemetry_seconds_bucket{body="small"')]
        for i, (below, upto) in enumerate(itertools.pairwise([0.0, *cumulative])):
            self.timing[i] += int(upto - below)
        self.cpu_s += self.cpu_now()

    def cpu_now(self) -> float:
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCTL_")}
        env.update({"SPECCTL_ADMIN_TOKEN": ADMIN, "SPECCTL_INGEST_TOKEN": INGEST, "SPECCTL_ACCESS_LOG": "false",
                    "SPECCTL_DB": str(self.folder / "specctl.db"), "SPECCTL_RECORD_DIR": str(self.folder / "rec"),
                    "SPECCTL_RECORD_FILE_BYTES": str(64 * 1024 * 1024), "SPECCTL_SNAPSHOT_INTERVAL_S": "10"})

        def limit_files() -> None:  # the recorder's file fills a "disk" of FSIZE_LIMIT bytes
            resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

        self.proc = _start_limited(self.port, env, self.folder, limit_files)
        wait_http(self.url + "/readyz", self.proc, timeout_s=120,
                  detail=lambda: (self.folder / "serve.log").read_text(errors="replace")[-600:])
        self.up = True

    def kill9(self) -> None:
        self.up = False
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def sample_rss(self) -> None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.rss_max_kib = max(self.rss_max_kib, int(line.split()[1]))
        except OSError:
            pass


def _start_limited(port: int, env: dict[str, str], folder: Path, preexec: Any):
    log = open(folder / "serve.log", "ab")  # noqa: SIM115 -- the child keeps its own copy
    cmd = [sys.executable, "-m", "specctl_vllm.controller", "serve", "--host", "127.0.0.1", "--port", str(port)]
    try:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec,  # noqa: PLW1509 -- setrlimit only
                                start_new_session=True)
    finally:
        log.close()


class Tally:
    def __init__(self) -> None:
        self.fleet_ms: list[float] = []
        self.fleet_late_ms: list[float] = []  # how late each post was sent, against the engine's schedule
        self.fleet_5xx = self.fleet_other = self.fleet_unreachable = 0
        self.probe_5xx = self.probe_ok = self.probe_unreachable = 0
        self.attack: dict[str, dict[str, int]] = {}
        self.acked_overrides: dict[str, Any] = {}

    def count(self, what: str, status: str) -> None:
        row = self.attack.setdefault(what, {})
        row[status] = row.get(status, 0) + 1


async def engine(i: int, srv: Server, tally: Tally, stop: float, hz: float) -> None:
    """One engine of the fleet: a batch every ``1 / hz`` s on a kept-open connection, the next one after the answer.

    Posted through :class:`bench.load.EngineConnection` (pre-built request bytes, the answer read by its length):
    a general-purpose client took ~1.8 ms of this generator's CPU per post, as much as the server's own work, on
    the cores the server runs on."""
    rng = np.random.default_rng(i)
    seq = 0
    conn = EngineConnection("127.0.0.1", srv.port, INGEST, timeout_s=5.0)
    await asyncio.sleep(random.random() / hz)
    due = time.monotonic()
    try:
        while time.monotonic() < stop:
            body = make_batch(FLEET, seq, rng, engine_id=f"fleet-{i}")
            body["boot_id"] = "soak"
            raw = json.dumps(body, separators=(",", ":")).encode()
            t0 = time.monotonic()
            tally.fleet_late_ms.append((t0 - due) * 1000)
            try:
                status, _ = await conn.post(raw)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
                conn.close()  # the next post redials
                tally.fleet_unreachable += 1
            else:
                if status == 200:
                    tally.fleet_ms.append((time.monotonic() - t0) * 1000)
                    seq += 1
                else:
                    conn.close()  # an error answer may close the connection: start the next post on a fresh one
                    if status >= 500:
                        tally.fleet_5xx += 1
                    else:
                        tally.fleet_other += 1
            due = max(due + 1 / hz, time.monotonic())  # a late engine does not burst to catch up
            await asyncio.sleep(due - time.monotonic())
    finally:
        conn.close()


async def probes(srv: Server, tally: Tally, stop: float) -> None:
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.monotonic() < stop:
            for path in ("/healthz", "/readyz"):
                try:
                    r = await client.get(srv.url + path)
                    if r.status_code >= 500:
                        tally.probe_5xx += 1
                    else:
                        tally.probe_ok += 1
                except httpx.HTTPError:
                    tally.probe_unreachable += 1
            srv.sample_rss()
            await asyncio.sleep(1.0)


async def idle_sockets(srv: Server, n: int, stop: float) -> None:
    held: list[socket.socket] = []
    while time.monotonic() < stop:
        held = [s for s in held if _open(s)]
        while len(held) < n and srv.up:
            try:
                s = socket.create_connection(("127.0.0.1", srv.port), timeout=1)
                s.setblocking(False)
                held.append(s)
            except OSError:
                break
        await asyncio.sleep(1.0)
    for s in held:
        s.close()


def _open(s: socket.socket) -> bool:
    try:
        if s.recv(1) != b"":
            return True
    except BlockingIOError:
        return True
    except OSError:
        pass
    s.close()  # the server closed it
    return False


async def flooder(k: int, srv: Server, tally: Tally, stop: float) -> None:
    raw = json.dumps(make_batch(FLOOD, 0, np.random.default_rng(100 + k), engine_id=f"flood-{k}")).encode()
    headers = {"Authorization": f"Bearer {INGEST}", "content-type": "application/json"}
    seq = 0
    async with httpx.AsyncClient(headers=headers, timeout=30.0) as client:
        while time.monotonic() < stop:
            body = raw.replace(b'"seq": 0', b'"seq": %d' % seq, 1)
            try:
                r = await client.post(srv.url + "/v1/telemetry", content=body)
                tally.count("flood", str(r.status_code))
                seq += 1
                if r.status_code == 429:
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")))
            except httpx.HTTPError:
                tally.count("flood", "unreachable")
                await asyncio.sleep(0.5)


async def new_ids(srv: Server, tally: Tally, stop: float) -> None:
    headers = {"Authorization": f"Bearer {INGEST}"}
    n = 0
    async with httpx.AsyncClient(headers=headers, timeout=10.0) as client:
        while time.monotonic() < stop:
            body = {"protocol": 1, "engine_id": f"storm-{n}", "boot_id": "b", "model_name": f"storm-model-{n % 50}",
                    "seq": 0, "sent_at": 0.0, "spec": {"method": "ngram", "k_max": 4}, "steps": []}
            try:
                r = await client.post(srv.url + "/v1/telemetry", json=body)
                tally.count("new_id", str(r.status_code))
            except httpx.HTTPError:
                tally.count("new_id", "unreachable")
            n += 1
            await asyncio.sleep(0.02)


async def huge_headers(srv: Server, tally: Tally, stop: float) -> None:
    pad = b"X-Pad: " + b"a" * (1024 * 1024) + b"\r\n"
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n")
            await asyncio.wait_for(writer.drain(), 5)
            line = await asyncio.wait_for(reader.readline(), 5)
            tally.count("huge_headers", line.split(b" ")[1].decode() if line.count(b" ") >= 1 else "closed")
            writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            tally.count("huge_headers", "closed")
        await asyncio.sleep(0.5)


async def override_storm(srv: Server, tally: Tally, stop: float) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    cats = [f"storm{i}" for i in range(8)]
    async with httpx.AsyncClient(headers=headers, timeout=10.0) as client:
        while time.monotonic() < stop:
            cat = random.choice(cats)
            try:
                if random.random() < 0.7:
                    k = random.randint(0, 6)
                    r = await client.put(srv.url + f"/v1/overrides/{cat}",
                                         json={"k": k, "reason": "soak", "actor": "soak"})
                    if r.status_code == 200:
                        tally.acked_overrides[cat] = k
                else:
                    r = await client.delete(srv.url + f"/v1/overrides/{cat}", params={"reason": "soak",
                                                                                      "actor": "soak"})
                    if r.status_code in (200, 204, 404):
                        tally.acked_overrides[cat] = None
                tally.count("override", str(r.status_code))
            except httpx.HTTPError:
                tally.count("override", "unreachable")  # not acknowledged: the state is unknown, checked below
                tally.acked_overrides.pop(cat, None)
            await asyncio.sleep(0.05)


async def killer(srv: Server, every_s: float, stop: float, restarts: list[float]) -> None:
    while time.monotonic() + every_s < stop:
        await asyncio.sleep(every_s)
        await srv.end_of_life()
        t0 = time.monotonic()
        srv.kill9()
        while not srv.up and time.monotonic() < stop:  # a start that fails (the store on the full disk) is
            try:                                         # reported, and tried again until the end
                await asyncio.to_thread(srv.start)
            except RuntimeError as exc:
                srv.start_failures.append(str(exc)[-600:])
                await asyncio.sleep(1.0)
        restarts.append(round(time.monotonic() - t0, 2))


async def soak(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    srv = Server(folder)
    srv.start()
    tally, restarts = Tally(), []  # restarts: seconds each kill -9 left the server down
    stop = time.monotonic() + args.minutes * 60
    own = resource.getrusage(resource.RUSAGE_SELF)
    attacks = {"idle": lambda: [idle_sockets(srv, args.idle, stop)],
               "flood": lambda: [flooder(0, srv, tally, stop), flooder(1, srv, tally, stop)],
               "new-id": lambda: [new_ids(srv, tally, stop)], "headers": lambda: [huge_headers(srv, tally, stop)],
               "override": lambda: [override_storm(srv, tally, stop)],
               "kill": lambda: [killer(srv, args.kill_every, stop, restarts)]}
    tasks = [engine(i, srv, tally, stop, args.hz) for i in range(args.engines)] + [probes(srv, tally, stop)]
    for name in args.attacks.split(","):
        tasks += attacks[name]() if name else []
    await asyncio.gather(*tasks)
    now, metrics = None, ""  # a server that did not start again cannot be asked: lost writes unchecked (None)
    if srv.up:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30) as client:
            now = {o["category"]: o["k"] for o in (await client.get(srv.url + "/v1/overrides")).json()}
            metrics = (await client.get(srv.url + "/metrics")).text
        await srv.end_of_life(metrics)
    done = resource.getrusage(resource.RUSAGE_SELF)
    lost = None if now is None else sorted(c for c, k in tally.acked_overrides.items() if now.get(c) != k)
    series = next((float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("specctl_series ")),
                  None)
    srv.sample_rss()
    srv.proc.send_signal(signal.SIGTERM)  # exited already if it did not start
    srv.proc.wait(30)
    ms = np.array(tally.fleet_ms) if tally.fleet_ms else np.array([np.nan])
    late = np.array(tally.fleet_late_ms) if tally.fleet_late_ms else np.array([np.nan])
    seconds = args.minutes * 60
    return {
        "fleet": {"engines": args.engines, "hz": args.hz, "answered": len(tally.fleet_ms),
                  "offered_posts_per_s": args.engines * args.hz,
                  "achieved_posts_per_s": round(len(tally.fleet_ms) / seconds, 1),
                  # seen by the engines: includes this generator's own scheduling on the host's shared cores
                  "p50_ms": round(float(np.percentile(ms, 50)), 1), "p99_ms": round(float(np.percentile(ms, 99)), 1),
                  "max_ms": round(float(np.max(ms)), 1),
                  "sent_late_p50_ms": round(float(np.percentile(late, 50)), 1),
                  "sent_late_p99_ms": round(float(np.percentile(late, 99)), 1),
                  "5xx": tally.fleet_5xx, "other_4xx": tally.fleet_other,
                  "unreachable_during_restarts": tally.fleet_unreachable},
        # inside the server (specctl_http_telemetry_seconds{body="small"}): the fleet's posts and the new-id
        # storm's, first byte read to first byte of the answer written; a bucket's upper bound
        "server_side": {"small_posts_timed": sum(srv.timing),
                        **{f"p{q}_ms_at_most": None if v is None else round(v * 1000, 1)
                           for q, v in ((50, quantile(BOUNDS, srv.timing, 0.5)), (99, quantile(BOUNDS, srv.timing, .99)))},
                        "buckets_ms": {("+Inf" if i == len(BOUNDS) else f"<={BOUNDS[i] * 1000:g}"): n
                                       for i, n in enumerate(srv.timing) if n}},
        "cpu": {"server_s": round(srv.cpu_s, 1), "server_cores": round(srv.cpu_s / seconds, 2),
                "generator_s": round(done.ru_utime + done.ru_stime - own.ru_utime - own.ru_stime, 1),
                "generator_cores": round((done.ru_utime + done.ru_stime - own.ru_utime - own.ru_stime) / seconds, 2)},
        "probes": {"ok": tally.probe_ok, "5xx": tally.probe_5xx, "unreachable_during_restarts": tally.probe_unreachable},
        "server": {"rss_max_mb": round(srv.rss_max_kib / 1024, 1), "series_at_end": series,
                   "restarts_s": restarts, "start_failures": srv.start_failures},
        "attack": tally.attack,
        "acknowledged_override_writes_lost": lost,
        "recorder_lines": [line for line in metrics.splitlines() if line.startswith("specctl_recorder_")],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--engines", type=int, default=64)
    p.add_argument("--hz", type=float, default=20.0)
    p.add_argument("--idle", type=int, default=300, help="idle sockets held open")
    p.add_argument("--kill-every", type=float, default=60.0, help="seconds between kill -9 and restart")
    p.add_argument("--attacks", default="idle,flood,new-id,headers,override,kill",
                   help="the attacks run beside the fleet, comma-separated (one alone measures what it costs)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--notes", default="", help="free text stored with the result (the host's conditions)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="specctl-soak-") as tmp:
        result = asyncio.run(soak(args, Path(tmp)))
    fleet, server = result["fleet"], result["server"]
    result["verdict"] = {
        "fleet_p99_under_250_ms": fleet["p99_ms"] < 250, "rss_at_most_256_mb": server["rss_max_mb"] <= 256,
        "no_5xx_to_fleet_or_probes": fleet["5xx"] == 0 and result["probes"]["5xx"] == 0,
        "no_lost_acknowledged_writes": result["acknowledged_override_writes_lost"] == [],
    }
    result["command"] = "python -m bench soak " + " ".join(argv or [])
    result["host"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg": os.getloadavg()}
    result["notes"] = args.notes
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if all(result["verdict"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
