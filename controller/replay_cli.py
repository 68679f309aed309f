"""``specctl replay`` command line: read recordings, pick the drafters that score traces, print the report.

The what-if model and the report are pure functions in :mod:`specctl_vllm.controller.core.replay`; this module is the edge
that touches files, takes the model-free drafters the engine patch runs (:mod:`specctl_vllm.controller.proposers`, shared by
both) and vLLM's n-gram when installed, and writes output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from specctl_vllm.controller.core import token_traces
from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig, PolicySettings
from specctl_vllm.controller.core.cost import PRESETS
from specctl_vllm.controller.core.replay import (
    DEFAULT_KS,
    DEFAULT_POLICIES,
    REPLAY_LEARNER,
    ReplayError,
    format_report,
    parse_requests,
    parse_telemetry,
    replay,
    select_model,
)
from specctl_vllm.controller.core.replay_path import path_figures
from specctl_vllm.controller.proposers import PROPOSERS
from specctl_vllm.controller.protocol import TelemetryBatch
from specctl_vllm.controller.recording import RecordingError, read_recording


def default_proposers(engine_method: str, model_free: Sequence[str], engine_ngram: str = "auto"
                      ) -> tuple[dict[str, token_traces.Proposer], str]:
    """Drafters able to score token traces: the patch's model-free ones; vLLM's own n-gram when asked/found."""
    out: dict[str, token_traces.Proposer] = {m: PROPOSERS[m] for m in (engine_method, *model_free) if m in PROPOSERS}
    used = "patch"
    if engine_method == "ngram" and engine_ngram in ("auto", "vllm"):
        try:
            from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as f
        except ImportError:
            if engine_ngram == "vllm":
                raise ReplayError("--engine-ngram vllm: vLLM is not installed here") from None
        else:
            def vllm_ngram(tokens: np.ndarray, k: int) -> list[int]:
                return f(tokens, 2, 4, 1 << 30, k).tolist()

            out["ngram"] = vllm_ngram
            used = "vllm"
    return out, used


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specctl replay", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="What each policy (recorded, off, static k, goodput, EMA tiers, hindsight oracle) would have "
                    "done on recorded telemetry, per request category, and the goodput it would get.",
        epilog="example:\n  specctl replay telemetry.jsonl --requests requests.jsonl --batch-size 32 --json out.json")
    p.add_argument("telemetry", nargs="+", type=Path,
                   help="recorded telemetry: TelemetryBatch JSON lines, plain or gzip (.jsonl / .jsonl.gz), or a "
                        "folder of them (what `specctl serve --record-dir` writes)")
    p.add_argument("--requests", type=Path, action="append", default=[],
                   help="request token traces, JSON lines {category, prompt_token_ids, output_token_ids}")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="comma-separated subset of %(default)s")
    p.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)), help="static k rows (default %(default)s)")
    p.add_argument("--k-max", type=int, help="what-if k_max (default: the larger of the engine's and --ks)")
    p.add_argument("--batch-size", type=float, help="what-if batch size (default: the recorded mean)")
    p.add_argument("--preset", default="cpu", choices=sorted(PRESETS), help="cost preset the fit is pulled toward")
    p.add_argument("--category-floor", type=_ratio, default=None,
                   help="the goodput policy's category floor, 0..1 (default 0: the batch objective alone)")
    p.add_argument("--model", help="model to replay when the recording holds several")
    p.add_argument("--engine-ngram", choices=("auto", "vllm", "patch"), default="auto",
                   help="n-gram used to score traces for an n-gram engine: vLLM's own (if installed) or the patch's")
    p.add_argument("--ema-initial-steps", type=int, default=3, help="EMA tiers' configured steps at start")
    p.add_argument("--timeline", action="store_true", help="also list the goodput policy's decisions over time")
    p.add_argument("--first-s", type=_seconds, action="append", default=[], metavar="SECONDS",
                   help="also price the goodput policy's decisions along the recording from a cold start, each batch "
                        "at the decision it ran under, over the first SECONDS, against every static k over the same "
                        "batches (repeatable)")
    p.add_argument("--json", type=Path, help="write the full report here as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        batches = load_batches(args.telemetry)
        batches = select_model(batches, args.model)
        traces = [t for source, lines in read_recording(args.requests).parts for t in parse_requests(lines, source)]
        proposers: dict[str, token_traces.Proposer] = {}
        if traces and batches:
            spec = batches[-1].spec
            proposers, used = default_proposers(spec.method, spec.model_free_methods, args.engine_ngram)
            print(f"scoring {len(traces)} request traces with {', '.join(proposers)} (n-gram: {used})",
                  file=sys.stderr)
        ks = [int(x) for x in args.ks.split(",") if x.strip()]
        policies = [x.strip() for x in args.policies.split(",") if x.strip()]
        report = replay(batches, traces, proposers, policies=policies, ks=ks, k_max=args.k_max,
                        batch_size=args.batch_size, preset=args.preset, ema_initial_steps=args.ema_initial_steps,
                        timeline=args.timeline, category_floor=args.category_floor)
        path = _format_path(batches, args) if args.first_s else ""
    except (OSError, RecordingError) as exc:
        print(f"specctl replay: {exc}", file=sys.stderr)
        return 2
    except ReplayError as exc:
        print(f"specctl replay: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    if path:
        print(path)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=_jsonable))
        print(f"\nwrote {args.json}")
    return 0


def _format_path(batches: Sequence[TelemetryBatch], args: argparse.Namespace) -> str:
    brain = Brain(BrainConfig(REPLAY_LEARNER, PolicySettings(cost_preset=args.preset,
                                                             category_floor=args.category_floor or 0.0)))
    ks = [int(x) for x in args.ks.split(",") if x.strip()]
    figs = path_figures(batches, brain, preset=args.preset, ks=ks, k_max=args.k_max, windows=args.first_s)
    out = ["", "goodput policy along the recording from cold, vs the best static k over the same batches:"]
    for w, f in figs.items():
        if f.off <= 0:
            out.append(f"  first {w:g} s ({f.batches} batches): no committed tokens")
            continue
        k, best = f.best_static
        out.append(f"  first {w:g} s ({f.batches} batches): policy {f.goodput / f.off:.3f}x off, best static "
                   f"k={k} {best / f.off:.3f}x, policy / best static {f.vs_best_static:.3f}")
    return "\n".join(out)


def load_batches(paths: Sequence[Path]) -> list[TelemetryBatch]:
    """Every batch of the recordings (files or folders, plain or gzip), with the reader's notes on stderr.

    Raises :class:`RecordingError` / :class:`ReplayError` with the file (and line) at fault."""
    recording = read_recording(paths)
    for note in recording.notes:
        print(f"note: {note}", file=sys.stderr)
    batches: list[TelemetryBatch] = []
    for source, lines in recording.parts:
        batches += parse_telemetry(lines, source)
    if not batches:
        raise ReplayError(f"no telemetry batches in {', '.join(map(str, paths))}")
    return batches


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    try:
        return asdict(x)
    except TypeError:
        return str(x)
