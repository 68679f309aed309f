"""How far the measured check's per-step standard error understates the spread of goodput between blocks of steps.

The measured check (:mod:`specctl_vllm.kernel.model.measured`) compares what a drafting width and K = 0
committed per second of engine time, with a margin of one standard error of the difference. The per-step
standard error treats steps as independent; on a steady load they are not: a step's prompt chunks are the
completions of the steps before it, requests finish in waves, and the host drifts. This replays recorded steps
the way the engine's meter counts them (runs of one width in one batch bucket, the first
:data:`~specctl_vllm.kernel.model.measured.SETTLE_STEPS` of each run left out, steps with an interval
only) and, per (engine, bucket, width) with enough steps, sets the per-step relative standard error of the ratio
estimator beside the one from blocks of L consecutive counted steps of a run (batch means; a block never spans
two runs). A ratio above 1 is how much the per-step figure understates the noise the check must clear.

With ``--verdicts`` it replays instead each engine's steps through the engine's meter
(:class:`~specctl_vllm.kernel.model.measured.GoodputMeter`) and counts, over readings every ``--every``
steps of each drafting width against K = 0 in the step's bucket, the verdicts that the margin from blocks
(``block_margin``) would change, and how much wider it is than the per-step margin the check decides with. A step most of whose requests run prompt chunks is left
out, as the engine leaves it out; the record has only the step's prompt tokens, so the requests running one are
estimated as prompt tokens / ``--prompt-tokens``.

With ``--positions`` it prints instead how a step's goodput depends on its place in a run: per bin of positions
after a switch of width, the committed tokens per second of engine time against the same (engine, bucket,
width)'s steps at position 32 or later (its steady reading), pooled over cells for K = 0 and for drafting widths.
A probe measures positions ``SETTLE_STEPS`` to 31; a bin that reads away from 1 is a bias of probes against the
incumbent width.

    python3 -m bench gpu.check_noise STEPS.jsonl.gz [STEPS.jsonl.gz ...] [--blocks 8 16 32] [--out F.json]
    python3 -m bench gpu.check_noise STEPS.jsonl.gz --verdicts [--every 20] [--prompt-tokens 255]
    python3 -m bench gpu.check_noise STEPS.jsonl.gz --positions
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.gpu.steady_widths import committed_tokens, read_batches, timed_steps
from specctl_vllm.kernel.model.budget import verified_width
from specctl_vllm.kernel.model.cells import BATCH_EDGES, bucket_of
from specctl_vllm.kernel.model.measured import SETTLE_STEPS, GoodputMeter, ratio_rse, verdict

#: Counted steps a (engine, bucket, width) needs before its spread is reported.
MIN_CELL_STEPS = 200
#: Complete blocks a block size needs in a cell before its spread is reported.
MIN_BLOCKS = 8


@dataclass(frozen=True, kw_only=True)
class CellNoise:
    source: str
    engine: str
    bucket: int  # the bucket's lower batch edge
    width: int
    steps: int
    goodput: float  # committed tokens per second over the counted steps
    step_rse: float
    block_rse: dict[int, float]  # L -> relative standard error from blocks of L steps


def pairs_rse(pairs: Sequence[tuple[float, float]]) -> float:
    """Relative standard error of sum(y) / sum(x) from independent (x, y) samples: the meter's ratio estimator
    (:func:`~specctl_vllm.kernel.model.measured.ratio_rse`), undecayed, its spread over n - 1."""
    sums = [0.0] * 6
    for x, y in pairs:
        for i, v in enumerate((1.0, x, y, x * x, y * y, x * y)):
            sums[i] += v
    return ratio_rse(sums, ddof=1.0)


def counted_runs(steps: Iterable[dict], settle: int = SETTLE_STEPS) -> dict[tuple[int, int], list[list[tuple[float, float]]]]:
    """{(bucket, width): runs}, each run the (interval, committed) of its counted steps, as the engine's meter
    counts them: a run is the steps of one width back to back, its first ``settle`` not counted, a step without
    an interval not counted (it still belongs to the run)."""
    runs: dict[tuple[int, int], list[list[tuple[float, float]]]] = {}
    last_width = None
    position = 0
    current: list[tuple[float, float]] | None = None
    current_key = None
    for step in steps:
        width = step.get("width")
        position = position + 1 if width == last_width else 1
        last_width = width
        interval = step.get("interval_s")
        batch = int(step.get("batch_size") or 0)
        if width is None or not interval or batch <= 0 or position <= settle:
            if position == 1:
                current = None
            continue
        key = (bucket_of(batch, BATCH_EDGES), int(width))
        if current is None or key != current_key or position == settle + 1:
            current = []
            current_key = key
            runs.setdefault(key, []).append(current)
        current.append((float(interval), float(committed_tokens(step))))
    return runs


def blocks_of(runs: Iterable[list[tuple[float, float]]], size: int) -> list[tuple[float, float]]:
    """Sums of ``size`` consecutive counted steps of each run (a run's last incomplete block left out)."""
    out = []
    for run in runs:
        for i in range(0, len(run) - size + 1, size):
            block = run[i:i + size]
            out.append((sum(x for x, _ in block), sum(y for _, y in block)))
    return out


def cell_noise(source: str, engine: str, steps: Iterable[dict], sizes: Sequence[int]) -> list[CellNoise]:
    out = []
    for (bucket, width), runs in sorted(counted_runs(steps).items()):
        pairs = [p for run in runs for p in run]
        if len(pairs) < MIN_CELL_STEPS:
            continue
        by_size = {}
        for size in sizes:
            blocks = blocks_of(runs, size)
            if len(blocks) >= MIN_BLOCKS:
                by_size[size] = pairs_rse(blocks)
        sx, sy = sum(x for x, _ in pairs), sum(y for _, y in pairs)
        out.append(CellNoise(source=source, engine=engine, bucket=BATCH_EDGES[bucket], width=width,
                             steps=len(pairs), goodput=sy / sx, step_rse=pairs_rse(pairs), block_rse=by_size))
    return out


@dataclass(frozen=True, kw_only=True)
class VerdictChanges:
    source: str
    engine: str
    readings: int  # verdict readings where the per-step meter had measured both widths
    changed: list[dict]  # {"step", "batch", "width", "per_step", "with_blocks", "gain", "margins"}
    margin_ratio_median: float | None
    margin_ratio_p90: float | None


def decoding(step: dict, prompt_tokens: int) -> bool:
    """Whether the engine's measured check counts this step: fewer than half its requests run a prompt chunk
    (estimated from its prompt tokens)."""
    batch = int(step.get("batch_size") or 0)
    prompts = -(-int(step.get("prefill_tokens") or 0) // max(prompt_tokens, 1))
    return 2 * prompts <= batch


def step_width(step: dict) -> int:
    """The width the step verified: the engine's where it recorded one, else from its drafts per request."""
    width = step.get("width")
    if width is not None:
        return int(width)
    return verified_width(int(step.get("draft_tokens") or 0), int(step.get("batch_size") or 0))


def state_at(gain: float, margin: float) -> str:
    """The verdict's state for a measured gain against a margin (both widths measured)."""
    return "confirmed" if gain >= margin else "undecided" if gain > 0 else "refuted"


def verdict_changes(source: str, engine: str, steps: Sequence[dict], widths: Sequence[int] = (1, 2, 4, 7),
                    every: int = 20, prompt_tokens: int = 255) -> VerdictChanges:
    """Each drafting width's verdict against K = 0 in the step's bucket every ``every`` steps, with the margin it
    decides with and with :func:`~specctl_vllm.kernel.model.measured.block_margin`."""
    meter = GoodputMeter()
    changed, ratios, readings = [], [], 0
    for i, step in enumerate(steps):
        batch = int(step.get("batch_size") or 0)
        if decoding(step, prompt_tokens):
            meter.observe(batch, step_width(step), committed_tokens(step), step.get("interval_s"))
        if i % every or batch <= 0:
            continue
        plain = meter.reading(batch, 0)
        for width in widths:
            v = verdict(width, plain, meter.reading(batch, width))
            if v.state == "unmeasured":
                continue
            readings += 1
            blocked = v.state if v.block_margin is None else state_at(v.gain, v.block_margin)
            if v.block_margin is not None and 0 < v.margin < math.inf:
                ratios.append(v.block_margin / v.margin)
            if blocked != v.state:
                changed.append({"step": i, "batch": batch, "width": width, "per_step": v.state,
                                "with_blocks": blocked, "gain": round(v.gain, 4),
                                "margins": [round(v.margin, 4), round(v.block_margin, 4)]})
    ratios.sort()
    return VerdictChanges(source=source, engine=engine, readings=readings, changed=changed,
                          margin_ratio_median=statistics.median(ratios) if ratios else None,
                          margin_ratio_p90=ratios[int(0.9 * (len(ratios) - 1))] if ratios else None)


def render_verdicts(results: Sequence[VerdictChanges]) -> str:
    lines = ["| source | engine | readings | changed | margin with blocks / per step: median, p90 | changes |",
             "|---|---|---|---|---|---|"]
    for r in results:
        ratio = (f"{r.margin_ratio_median:.2f}, {r.margin_ratio_p90:.2f}" if r.margin_ratio_median is not None
                 else "-")
        what = "; ".join(f"K{c['width']}@{c['batch']} {c['per_step']}->{c['with_blocks']} ({c['gain']:+.3f})"
                         for c in r.changed[:4]) + (" ..." if len(r.changed) > 4 else "")
        lines.append(f"| {r.source} | {r.engine.split('/')[0]} | {r.readings} | {len(r.changed)} | {ratio} | "
                     f"{what or '-'} |")
    return "\n".join(lines)


#: Bins of positions in a run (0: the switch step), and the position from which a step counts as steady.
POSITION_BINS = ((0, 1), (1, 2), (2, 3), (3, 5), (5, 7), (7, 10), (10, 15), (15, 20), (20, 32))
STEADY_POSITION = 32
#: Steady steps a cell needs, and steps a bin of it, before the bin's ratio is pooled.
MIN_STEADY_STEPS = 200
MIN_BIN_STEPS = 10


def position_ratios(steps: Iterable[dict]) -> dict[tuple[bool, int], list[tuple[float, int]]]:
    """{(drafting width?, bin index): [(bin goodput / steady goodput, bin steps)] per (bucket, width) cell}. Runs
    that start the recording (no width before them) are left out: they follow no switch."""
    acc: dict[tuple[int, int], dict[int, list[float]]] = {}
    last = before = None
    position = 0
    for step in steps:
        width = step.get("width")
        if width != last:
            before, position = last, 0
        else:
            position += 1
        last = width
        interval = step.get("interval_s")
        batch = int(step.get("batch_size") or 0)
        if width is None or before is None or not interval or batch <= 0:
            continue
        b = next((i for i, (lo, hi) in enumerate(POSITION_BINS) if lo <= position < hi), -1)
        sums = acc.setdefault((bucket_of(batch, BATCH_EDGES), int(width)), {}).setdefault(b, [0.0, 0.0, 0])
        sums[0] += committed_tokens(step)
        sums[1] += float(interval)
        sums[2] += 1
    out: dict[tuple[bool, int], list[tuple[float, int]]] = {}
    for (_, width), bins in acc.items():
        steady = bins.get(-1)
        if not steady or steady[2] < MIN_STEADY_STEPS:
            continue
        g = steady[0] / steady[1]
        for b, (y, x, n) in bins.items():
            if b >= 0 and n >= MIN_BIN_STEPS:
                out.setdefault((width > 0, b), []).append((y / x / g, int(n)))
    return out


def render_positions(pooled: dict[tuple[bool, int], list[tuple[float, int]]]) -> str:
    lines = ["| widths | positions | cells | steps | goodput / steady: weighted mean | median |", "|---|---|---|---|---|---|"]
    for drafting in (False, True):
        for b, (lo, hi) in enumerate(POSITION_BINS):
            xs = pooled.get((drafting, b), [])
            if not xs:
                continue
            n = sum(k for _, k in xs)
            lines.append(f"| {'K > 0' if drafting else 'K = 0'} | {lo}-{hi - 1} | {len(xs)} | {n} | "
                         f"{sum(r * k for r, k in xs) / n:.3f} | {statistics.median(r for r, _ in xs):.3f} |")
    return "\n".join(lines)


def engines_steps(path: Path) -> dict[str, list[dict]]:
    """Each engine's (engine id and boot) recorded steps in the order they ran."""
    per: dict[str, list[tuple[float, dict]]] = {}
    for batch in read_batches(path):
        key = f"{batch.get('engine_id')}/{batch.get('boot_id')}"
        per.setdefault(key, []).extend(timed_steps([batch]))
    return {k: [s for _, s in sorted(v, key=lambda p: p[0])] for k, v in per.items()}


def summary(cells: Sequence[CellNoise], sizes: Sequence[int]) -> dict[int, dict[str, float]]:
    """Per block size: the median and the maximum of block rse / step rse over the cells that have it."""
    out = {}
    for size in sizes:
        ratios = [c.block_rse[size] / c.step_rse for c in cells if size in c.block_rse and c.step_rse > 0]
        if ratios:
            out[size] = {"cells": len(ratios), "median": statistics.median(ratios), "max": max(ratios),
                         "min": min(ratios)}
    return out


def render(cells: Sequence[CellNoise], sizes: Sequence[int]) -> str:
    head = "| source | engine | bucket | K | steps | tok/s | step rse | " + " | ".join(f"L={s}" for s in sizes) + " |"
    lines = [head, "|" + "---|" * (7 + len(sizes))]
    for c in cells:
        ratios = " | ".join(f"{c.block_rse[s]:.4f} (x{c.block_rse[s] / c.step_rse:.2f})" if s in c.block_rse else "-"
                            for s in sizes)
        lines.append(f"| {c.source} | {c.engine.split('/')[0]} | {c.bucket} | {c.width} | {c.steps} | {c.goodput:.0f} "
                     f"| {c.step_rse:.4f} | {ratios} |")
    lines.append("")
    for size, s in summary(cells, sizes).items():
        lines.append(f"L={size}: block rse / step rse over {s['cells']} cells: median {s['median']:.2f}, "
                     f"min {s['min']:.2f}, max {s['max']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps", type=Path, nargs="+", help="recorded telemetry batches (.jsonl or .jsonl.gz)")
    p.add_argument("--blocks", type=int, nargs="+", default=[8, 16, 32], help="block sizes L, in counted steps")
    p.add_argument("--out", type=Path, help="also write the cells and the summary as JSON here")
    p.add_argument("--verdicts", action="store_true",
                   help="instead: the verdicts the block spread changes, replayed over each engine's steps")
    p.add_argument("--positions", action="store_true",
                   help="instead: goodput by position in a run against the same cell's steady steps")
    p.add_argument("--every", type=int, default=20, help="--verdicts: steps between two readings")
    p.add_argument("--prompt-tokens", type=int, default=255,
                   help="--verdicts: the workload's prompt length, to estimate a step's prompt requests")
    args = p.parse_args(argv)
    if any(size < 2 for size in args.blocks):
        p.error("--blocks: every block size must be 2 steps or more")
    if args.every < 1 or args.prompt_tokens < 1:
        p.error("--every and --prompt-tokens must be 1 or more")
    missing = [str(path) for path in args.steps if not path.is_file()]
    if missing:
        p.error(f"no such file: {', '.join(missing)}")
    try:
        return run(args)
    except (ValueError, KeyError, TypeError, OSError) as exc:  # a file that is not recorded telemetry
        print(f"check_noise: cannot read the recorded steps: {type(exc).__name__}: {str(exc)[:300]}",
              file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """The analysis ``args`` ask for, on files that exist."""
    if args.positions:
        pooled: dict[tuple[bool, int], list[tuple[float, int]]] = {}
        for path in args.steps:
            for steps in engines_steps(path).values():
                for key, ratios in position_ratios(steps).items():
                    pooled.setdefault(key, []).extend(ratios)
        print(render_positions(pooled))
        return 0
    if args.verdicts:
        results = [verdict_changes(path.name, engine, steps, every=args.every, prompt_tokens=args.prompt_tokens)
                   for path in args.steps for engine, steps in engines_steps(path).items()]
        print(render_verdicts(results))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
        return 0
    cells: list[CellNoise] = []
    for path in args.steps:
        for engine, steps in engines_steps(path).items():
            cells.extend(cell_noise(path.name, engine, steps, args.blocks))
    if not cells:
        print(f"no (engine, bucket, width) with {MIN_CELL_STEPS} counted steps or more", file=sys.stderr)
        return 1
    print(render(cells, args.blocks))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cells": [asdict(c) for c in cells],
                                        "summary": summary(cells, args.blocks)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
