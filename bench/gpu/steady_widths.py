"""What the specctl engine ran at each steady-load point: widths, prompt share and batch, from its recorded steps.

The sweep records every telemetry batch of the specctl engine (``*_steps_*.jsonl.gz``); a results row has the
wall time its last round ended. The point's timed rounds are the ``--window-s`` seconds before that (3 rounds of
5 s plus the round boundaries), so a step belongs to the row whose window holds it. A step's time is the
batch's ``sent_at`` minus the engine-clock gap to the batch's last step (the steps of one batch are a few ms
apart). Per point it prints:

* ``steps``: steps in the window, and the share that carried prompt tokens;
* ``decode widths``: the share of each width among the decode-only steps (the steps the cell table measures);
* ``prompt-step depths``: the same for steps that carried a prompt (they verify the width chosen before them);
* mean requests per step and mean scheduled tokens per step (the budget bound shows as a flat maximum).

With ``--goodput`` it prints instead, per point, the tokens each width committed per second of engine time over
the window's timed steps (a step's committed tokens as the engine counts them: one per request plus its accepted
drafts, ``budget_sample``; its time: ``interval_s``) and that width's share of the time; ``mixed`` is the steps whose
requests did not all verify one width (prompt chunks beside drafted requests). Beside a plain engine's rows this
says what the speculative engine's K = 0 steps cost against plain decoding.

With ``--by-tokens N`` it prints instead, per point at ``--min-concurrency`` or more, the median interval between
steps in bins of N scheduled tokens: what a step costs against the tokens it carries (on the H200 at 256
requests a drafting step below the budget costs nearly what a full one does; see bench/gpu/README.md).

    python3 -m bench gpu.steady_widths RESULTS.jsonl STEPS.jsonl.gz [--engine specctl] [--window-s 16]
    python3 -m bench gpu.steady_widths RESULTS.jsonl STEPS.jsonl.gz --goodput
    python3 -m bench gpu.steady_widths RESULTS.jsonl STEPS.jsonl.gz --by-tokens 256 [--min-concurrency 256]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specctl_vllm.kernel.model.budget import budget_sample
from specctl_vllm.kernel.protocol import StepRecord

#: Seconds before a row's time that hold its timed rounds: 3 rounds of 5 s and the gaps between them.
WINDOW_S = 16.0
#: Seconds before a row's time left out: the row is written a moment after its last round ends.
TAIL_S = 0.3


@dataclass(frozen=True, kw_only=True)
class PointSteps:
    profile: str
    concurrency: int
    tok_per_s: float
    steps: int
    prompt_share: float
    decode_widths: dict[int, float]
    prompt_depths: dict[int, float]
    mean_batch: float
    mean_tokens: float


def read_batches(path: Path) -> Iterator[dict]:
    """The telemetry batches a sweep recorded (JSONL, gzip or plain), one dict each."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def timed_steps(batches: Iterable[dict]) -> Iterator[tuple[float, dict]]:
    """(wall time, step) of every step of the telemetry batches, in the batches' order."""
    for batch in batches:
        steps = batch.get("steps") or []
        if not steps:
            continue
        offset = float(batch["sent_at"]) - float(steps[-1]["t"])
        for step in steps:
            yield float(step["t"]) + offset, step


def shares(values: list[int]) -> dict[int, float]:
    counts = Counter(values)
    return {k: counts[k] / len(values) for k in sorted(counts)} if values else {}


def window_of(row: dict, times: list[float], steps: list[dict], window_s: float = WINDOW_S) -> list[dict]:
    """The steps of the row's timed rounds."""
    end = float(row["time"]) - TAIL_S
    lo, hi = bisect.bisect_left(times, end - window_s), bisect.bisect_right(times, end)
    return steps[lo:hi]


def point_steps(row: dict, times: list[float], steps: list[dict], window_s: float = WINDOW_S) -> PointSteps:
    window = window_of(row, times, steps, window_s)
    decode = [s for s in window if not s.get("prefill_tokens")]
    prompt = [s for s in window if s.get("prefill_tokens")]
    n = max(len(window), 1)
    return PointSteps(
        profile=row["profile"], concurrency=int(row["concurrency"]), tok_per_s=float(row["tok_per_s_median"]),
        steps=len(window), prompt_share=len(prompt) / n,
        decode_widths=shares([int(s.get("width", s.get("draft_depth", 0))) for s in decode]),
        prompt_depths=shares([int(s.get("draft_depth", 0)) for s in prompt]),
        mean_batch=sum(s.get("batch_size", 0) for s in window) / n,
        mean_tokens=sum(s.get("scheduled_tokens", 0) for s in window) / n)


def load(results: Path, steps_gz: Path, engine: str) -> tuple[list[dict], list[float], list[dict]]:
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("kind") == "row" and r.get("engine") == engine and r.get("time")]
    pairs = sorted(timed_steps(read_batches(steps_gz)), key=lambda p: p[0])
    return rows, [t for t, _ in pairs], [s for _, s in pairs]


def format_shares(values: dict[int, float]) -> str:
    return " ".join(f"K{k} {v:.0%}" for k, v in values.items()) or "-"


def render(points: list[PointSteps]) -> str:
    header = ("| profile | c | tok/s | steps (with a prompt) | decode widths | prompt-step depths | requests/step "
              "| tokens/step |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p.profile} | {p.concurrency} | {p.tok_per_s:.0f} | {p.steps} ({p.prompt_share:.0%}) | "
                     f"{format_shares(p.decode_widths)} | {format_shares(p.prompt_depths)} | {p.mean_batch:.0f} | "
                     f"{p.mean_tokens:.0f} |")
    return "\n".join(lines)


def interval_by_tokens(window: Iterable[dict], bin_tokens: int) -> dict[int, tuple[int, float]]:
    """{bin start: (steps, median interval in seconds)} over the timed steps, binned by scheduled tokens."""
    bins: dict[int, list[float]] = {}
    for s in window:
        if s.get("interval_s"):
            start = int(s.get("scheduled_tokens", 0)) // bin_tokens * bin_tokens
            bins.setdefault(start, []).append(float(s["interval_s"]))
    return {b: (len(v), statistics.median(v)) for b, v in sorted(bins.items())}


def committed_tokens(step: dict) -> int:
    """Tokens a recorded step committed, as the engine counts them (one per request plus every accepted draft:
    :func:`~specctl_vllm.kernel.model.budget.budget_sample`, the count the engine's meters use)."""
    return budget_sample(StepRecord.model_validate(step))[2]


def goodput_by_width(window: Iterable[dict]) -> dict[str, tuple[float, float]]:
    """{width ("K0", ..., "mixed"): (committed tokens per second of engine time, share of the timed time)} over the
    window's steps that carry an interval."""
    sums: dict[str, list[float]] = {}
    for s in window:
        interval = s.get("interval_s")
        if not interval:
            continue
        key = f"K{s['width']}" if s.get("width") is not None else "mixed"
        acc = sums.setdefault(key, [0.0, 0.0])
        acc[0] += committed_tokens(s)
        acc[1] += float(interval)
    total = sum(seconds for _, seconds in sums.values()) or 1.0
    return {k: (tokens / seconds, seconds / total) for k, (tokens, seconds) in sorted(sums.items()) if seconds > 0}


def render_goodput(rows: list[dict], times: list[float], steps: list[dict], window_s: float = WINDOW_S) -> str:
    lines = ["committed tokens per second of engine time by width over the timed steps (share of the time)", "",
             "| profile | c | tok/s | by width |", "|---|---|---|---|"]
    for row in rows:
        by = goodput_by_width(window_of(row, times, steps, window_s))
        cells = " ".join(f"{k}: {g:.0f} ({share:.0%})" for k, (g, share) in by.items())
        lines.append(f"| {row['profile']} | {row['concurrency']} | {float(row['tok_per_s_median']):.0f} | "
                     f"{cells or '-'} |")
    return "\n".join(lines)


def render_by_tokens(rows: list[dict], times: list[float], steps: list[dict], bin_tokens: int,
                     window_s: float = WINDOW_S) -> str:
    lines = [f"median interval between steps (ms), by scheduled tokens in bins of {bin_tokens} (steps in brackets)",
             "", "| profile | c | tok/s | widths run | by tokens |", "|---|---|---|---|---|"]
    for row in rows:
        window = window_of(row, times, steps, window_s)
        widths = shares([int(s.get("width", s.get("draft_depth", 0))) for s in window])
        cells = " ".join(f"{b}: {t * 1e3:.1f} ({n})" for b, (n, t) in interval_by_tokens(window, bin_tokens).items())
        lines.append(f"| {row['profile']} | {row['concurrency']} | {float(row['tok_per_s_median']):.0f} | "
                     f"{format_shares(widths)} | {cells or '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", type=Path)
    p.add_argument("steps", type=Path, help="the specctl engine's recorded telemetry batches (.jsonl.gz)")
    p.add_argument("--engine", default="specctl")
    p.add_argument("--window-s", type=float, default=WINDOW_S)
    p.add_argument("--by-tokens", type=int, default=0, metavar="N",
                   help="instead: median step interval in bins of N scheduled tokens")
    p.add_argument("--min-concurrency", type=int, default=256, help="--by-tokens: points from this c up")
    p.add_argument("--goodput", action="store_true",
                   help="instead: committed tokens per second of engine time by width, over the timed steps")
    args = p.parse_args(argv)
    if args.by_tokens < 0:
        p.error("--by-tokens must be a positive number of tokens")
    for path in (args.results, args.steps):
        if not path.is_file():
            p.error(f"{path}: no such file")
    rows, times, steps = load(args.results, args.steps, args.engine)
    if not rows:
        p.error(f"{args.results}: no {args.engine} rows")
    if args.goodput:
        print(render_goodput(rows, times, steps, args.window_s))
    elif args.by_tokens:
        chosen = [r for r in rows if int(r["concurrency"]) >= args.min_concurrency]
        print(render_by_tokens(chosen, times, steps, args.by_tokens, args.window_s))
    else:
        print(render([point_steps(r, times, steps, args.window_s) for r in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
