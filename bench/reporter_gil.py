"""What the reporter thread costs an engine loop that shares its GIL, with and without its pauses.

The reporter runs in the EngineCore process beside vLLM's engine loop (engine_patch/reporter.py). A post is
about 1 ms of Python (``python -m bench reporter_cost``); the loop gives the GIL up only while it waits for the
device, and a loop that wants it back while the reporter is mid-post waits for the rest of that stretch. How much
that costs depends on how much of the loop's step is its own Python (a host-bound engine: the device waits for
the loop) and how much is waiting (a device-bound one).

Here the loop is a stand-in with both parts, in the main thread: ``--busy-us`` of Python, then ``--wait-us`` in
``time.sleep`` (which gives the GIL up, as a device wait does), then a step row of a graph-shaped engine at 60
requests pushed on the reporter's queue. A real ``specctl serve`` answers a real
:class:`~specctl_vllm.engine_patch.reporter.Reporter` posting every ``--interval-s``. Three arms, run in
rotating order in each round (drift cancels in the per-round ratios):

* ``off``: no reporter (the loop alone);
* ``stretch``: the reporter, each post in one stretch (its pauses made no-ops: the reporter before they existed);
* ``paused``: the reporter as it ships (it gives the GIL up between a post's phases).

    python -m bench reporter_gil [--regimes 7500:200,6000:1000,2500:6000] [--rounds 6] [--round-s 4]

Writes bench/results/reporter_gil.json: per regime and arm the mean step time of each round, and each arm's
per-round ratio to ``off`` (median, min, max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

from bench.overhead import GRAPH_ENGINE_WIDTHS
from bench.support.specctl_serve import INGEST_TOKEN, SpecctlServe
from specctl_vllm.engine_patch.policy_table import EngineSpec, PolicyHolder
from specctl_vllm.engine_patch.reporter import Identity, Reporter
from specctl_vllm.engine_patch.settings import EngineSettings
from specctl_vllm.engine_patch.telemetry import KEY_SHIFT, PackedCounts, StepQueue, StepRow, pack

RESULTS = ROOT / "bench" / "results" / "reporter_gil.json"
ARMS = ("off", "stretch", "paused")
CATEGORIES = ("prose", "json", "code")
REQUESTS_PER_CATEGORY = 20
WIDTH = 4
WARMUP_S = 0.5  # the loop runs this long before a round is timed, and until the reporter has attached
ATTACH_TIMEOUT_S = 15.0  # a reporter not attached by then (first policy computed and installed) fails the run
MAX_ROUNDS = 100
MAX_ROUND_S = 60.0
MAX_PHASE_US = 1_000_000
KEYS = tuple((category, "eagle3") for category in CATEGORIES)


def graph_row(i: int, step_s: float) -> StepRow:
    """One step of a graph-shaped engine at width 4 as its hook queues it: 60 requests, 20 per category, every
    acceptance length, the drafted requests as packed codes (vLLM's loop counted them) for the reporter to
    unfold."""
    codes: dict[int, int] = {}
    for j in range(len(CATEGORIES)):
        for r in range(REQUESTS_PER_CATEGORY):
            code = (j << KEY_SHIFT) + pack(WIDTH, (i + r + j) % (WIDTH + 1))
            codes[code] = codes.get(code, 0) + 1
    batch = REQUESTS_PER_CATEGORY * len(CATEGORIES)
    return StepRow(t=time.monotonic(), wall_s=step_s, batch_size=batch, scheduled_tokens=batch * (1 + WIDTH),
                   draft_tokens=batch * WIDTH, prefill_tokens=0, draft_depth=WIDTH, agg={}, width=WIDTH,
                   interval_s=step_s, packed=PackedCounts(codes, KEYS))


def python_for(us: float) -> int:
    """The loop's own Python for ``us`` microseconds (bytecode throughout: the GIL is held and may be taken
    away at the interpreter's switch interval, as in vLLM's scheduler)."""
    end = time.perf_counter_ns() + int(us * 1000)
    n = 0
    while time.perf_counter_ns() < end:
        for _ in range(50):
            n += 1
    return n


def one_round(url: str, arm: str, tag: str, busy_us: float, wait_us: float, round_s: float,
              interval_s: float) -> float:
    """Mean seconds per loop step over ``round_s`` with the reporter of ``arm``."""
    engine = EngineSpec(method="eagle3", k_max=max(GRAPH_ENGINE_WIDTHS), full_cuda_graphs=True,
                        graph_widths=GRAPH_ENGINE_WIDTHS)
    queue = StepQueue(4096)
    reporter = None
    if arm != "off":
        settings = EngineSettings(controller_url=url, ingest_token=INGEST_TOKEN, engine_id=f"gil-{tag}",
                                  report_interval_s=interval_s)
        identity = Identity(f"gil-{tag}", f"boot-{tag}", "bench", engine.to_protocol(token_budget=8192))
        pause = time.sleep if arm == "paused" else (lambda _s: None)
        reporter = Reporter(settings, queue, PolicyHolder(engine), identity, pause=pause)
        reporter.start()
    try:
        start = time.monotonic()
        while (time.monotonic() - start < WARMUP_S
               or (reporter is not None and reporter.counters.policies_installed == 0)):
            if time.monotonic() - start > ATTACH_TIMEOUT_S:
                raise RuntimeError(f"{arm}: the reporter did not attach to {url} in {ATTACH_TIMEOUT_S:g} s")
            python_for(busy_us)
            time.sleep(wait_us / 1e6)
            queue.push(graph_row(0, 0.008))
        steps = 0
        t0 = time.perf_counter()
        deadline = time.monotonic() + round_s
        while time.monotonic() < deadline:
            python_for(busy_us)
            time.sleep(wait_us / 1e6)
            queue.push(graph_row(steps, 0.008))
            steps += 1
        return (time.perf_counter() - t0) / max(steps, 1)
    finally:
        if reporter is not None:
            reporter.stop(flush=False)


def summarise(rounds: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"step_us": {arm: [round(s * 1e6, 1) for s in v] for arm, v in rounds.items()}}
    for arm in ARMS[1:]:
        ratios = [a / b for a, b in zip(rounds[arm], rounds["off"], strict=True)]
        out[f"{arm}_over_off"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                  "rounds": len(ratios)}
    return out


def parse_regimes(raw: str) -> list[tuple[float, float]]:
    regimes = []
    for part in raw.split(","):
        busy, _, wait = part.strip().partition(":")
        b, w = float(busy), float(wait)
        if not (0 < b <= MAX_PHASE_US and 0 <= w <= MAX_PHASE_US):
            raise ValueError(part)
        regimes.append((b, w))
    return regimes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--regimes", default="7500:200,6000:1000,2500:6000",
                    help="busy_us:wait_us per loop step, comma-separated (host-bound to device-bound)")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per regime (each runs every arm once)")
    ap.add_argument("--round-s", type=float, default=4.0, help="timed seconds of one arm in one round")
    ap.add_argument("--interval-s", type=float, default=0.1, help="the reporter's report interval")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    try:
        regimes = parse_regimes(args.regimes)
    except ValueError as exc:
        ap.error(f"--regimes: busy_us:wait_us pairs with 0 < busy <= {MAX_PHASE_US} and 0 <= wait <= "
                 f"{MAX_PHASE_US}, got {exc}")
    if not (1 <= args.rounds <= MAX_ROUNDS and 0.5 <= args.round_s <= MAX_ROUND_S and 0.01 <= args.interval_s <= 60):
        ap.error(f"--rounds 1-{MAX_ROUNDS}, --round-s 0.5-{MAX_ROUND_S:g}, --interval-s 0.01-60")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        ctl = SpecctlServe(Path(tmp), db=Path(tmp) / "specctl.db", env={"SPECCTL_ACCESS_LOG": "false"})
        ctl.start()
        try:
            for busy_us, wait_us in regimes:
                rounds: dict[str, list[float]] = {arm: [] for arm in ARMS}
                for r in range(args.rounds):
                    order = ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]
                    for arm in order:
                        tag = f"{int(busy_us)}-{int(wait_us)}-{r}-{arm}"
                        rounds[arm].append(one_round(ctl.url, arm, tag, busy_us, wait_us, args.round_s,
                                                     args.interval_s))
                row = {"busy_us": busy_us, "wait_us": wait_us, **summarise(rounds)}
                results.append(row)
                print(f"busy {busy_us:g} us, wait {wait_us:g} us: "
                      + "; ".join(f"{arm} {row[f'{arm}_over_off']['median']:.4f}x off "
                                  f"({row[f'{arm}_over_off']['min']:.4f}-{row[f'{arm}_over_off']['max']:.4f})"
                                  for arm in ARMS[1:]), flush=True)
        finally:
            ctl.stop()
    out = {"benchmark": "engine loop step time beside the reporter thread (engine_patch/reporter.py)",
           "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "rounds": args.rounds, "round_s": args.round_s,
           "interval_s": args.interval_s, "switch_interval_s": sys.getswitchinterval(), "regimes": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
