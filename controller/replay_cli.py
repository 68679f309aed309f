"""``specctl replay`` command line: read recordings, pick the drafters that score traces, print the report.

The what-if model and the report are pure functions in :mod:`specctl_vllm.controller.core.offline.replay`; this module is the edge
that touches files, takes the model-free drafters the engine patch runs (:mod:`specctl_vllm.kernel.proposers`, shared by
both) and vLLM's n-gram when installed, and writes output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from specctl_vllm.controller.cli_common import EXIT_USAGE, PresetOpt, invoke

if TYPE_CHECKING:
    from specctl_vllm.controller.core.offline import token_traces
    from specctl_vllm.kernel.protocol import TelemetryBatch

#: ``specctl_vllm.controller.core.offline.replay.DEFAULT_POLICIES`` / ``DEFAULT_KS`` (tests/unit/test_cli_framework.py
#: checks they agree), here so that ``-h`` shows them without importing the replay model.
DEFAULT_POLICIES = "recorded,off,static,goodput,ema_tiers,oracle"
DEFAULT_KS = "1,2,3,4,6,8"


def default_proposers(engine_method: str, model_free: Sequence[str], engine_ngram: str = "auto"
                      ) -> tuple[dict[str, token_traces.Proposer], str]:
    """Drafters able to score token traces: the patch's model-free ones; vLLM's own n-gram when asked/found."""
    import numpy as np

    from specctl_vllm.controller.core.offline.replay import ReplayError
    from specctl_vllm.kernel.proposers import PROPOSERS

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


def _positive_seconds(values: list[float] | None) -> list[float] | None:
    for value in values or []:
        if not 0.0 < value < float("inf"):
            raise typer.BadParameter(f"must be a positive number of seconds, got {value}")
    return values


def replay(
    telemetry: Annotated[list[Path], typer.Argument(
        show_default=False, help="recorded telemetry: TelemetryBatch JSON lines, plain or gzip (.jsonl / .jsonl.gz), "
                                 "or a folder of them (what `specctl serve --record-dir` writes)")],
    requests: Annotated[list[Path] | None, typer.Option(
        show_default="none", help="request token traces, JSON lines {category, prompt_token_ids, output_token_ids} "
                                  "(repeatable)")] = None,
    policies: Annotated[str, typer.Option(help="comma-separated subset of the default")] = DEFAULT_POLICIES,
    ks: Annotated[str, typer.Option(help="static k rows, comma-separated")] = DEFAULT_KS,
    k_max: Annotated[int | None, typer.Option(
        min=0, show_default="the larger of the engine's and --ks", help="what-if k_max")] = None,
    batch_size: Annotated[float | None, typer.Option(
        min=0, show_default="the recorded mean", help="what-if batch size")] = None,
    preset: PresetOpt = "cpu",
    category_floor: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, show_default="0: the batch objective alone",
        help="the goodput policy's category floor, 0..1")] = None,
    model: Annotated[str | None, typer.Option(
        show_default="the only one", help="model to replay when the recording holds several")] = None,
    engine_ngram: Annotated[Literal["auto", "vllm", "patch"], typer.Option(
        help="n-gram used to score traces for an n-gram engine: vLLM's own (if installed) or the patch's")] = "auto",
    ema_initial_steps: Annotated[int, typer.Option(min=0, help="EMA tiers' configured steps at start")] = 3,
    timeline: Annotated[bool, typer.Option("--timeline",
                                           help="also list the goodput policy's decisions over time")] = False,
    first_s: Annotated[list[float] | None, typer.Option(
        "--first-s", metavar="SECONDS", show_default="none", callback=_positive_seconds,
        help="also price the goodput policy's decisions along the recording from a cold start, each batch at the "
             "decision it ran under, over the first SECONDS of engine time, against every static k over the same "
             "batches (repeatable)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", show_default="none",
                                                  help="write the full report here as JSON")] = None,
) -> None:
    """What each policy (recorded, off, static k, goodput, EMA tiers, hindsight oracle) would have done on recorded
    telemetry, per request category, and the goodput it would get.

    Example: specctl replay telemetry.jsonl --requests requests.jsonl --batch-size 32 --json out.json
    """
    from specctl_vllm.controller.core.offline import replay as model_replay
    from specctl_vllm.controller.core.offline.replay import ReplayError
    from specctl_vllm.controller.recording import RecordingError, read_recording

    try:
        batches = load_batches(telemetry)
        batches = model_replay.select_model(batches, model)
        traces = [t for source, lines in read_recording(requests or []).parts
                  for t in model_replay.parse_requests(lines, source)]
        proposers: dict[str, token_traces.Proposer] = {}
        if traces and batches:
            spec = batches[-1].spec
            proposers, used = default_proposers(spec.method, spec.model_free_methods, engine_ngram)
            print(f"scoring {len(traces)} request traces with {', '.join(proposers)} (n-gram: {used})",
                  file=sys.stderr)
        try:
            k_rows = [int(x) for x in ks.split(",") if x.strip()]
        except ValueError:
            raise ReplayError(f"--ks: comma-separated integers, got {ks!r}") from None
        names = [x.strip() for x in policies.split(",") if x.strip()]
        report = model_replay.replay(batches, traces, proposers, policies=names, ks=k_rows, k_max=k_max,
                                     batch_size=batch_size, preset=preset, ema_initial_steps=ema_initial_steps,
                                     timeline=timeline, category_floor=category_floor)
        path = _format_path(batches, preset, category_floor, k_rows, k_max, first_s) if first_s else ""
    except (OSError, RecordingError, ReplayError) as exc:
        print(f"specctl replay: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_USAGE) from None
    print(model_replay.format_report(report))
    if path:
        print(path)
    if json_out:
        json_out.write_text(json.dumps(report, indent=1, default=_jsonable))
        print(f"\nwrote {json_out}")


def main(argv: list[str] | None = None) -> int:
    """``specctl replay`` on ``argv``; the exit code."""
    return invoke(replay, argv, "specctl replay")


def _format_path(batches: Sequence[TelemetryBatch], preset: str, category_floor: float | None, ks: list[int],
                 k_max: int | None, windows: Sequence[float]) -> str:
    from specctl_vllm.controller.core.brain import Brain
    from specctl_vllm.controller.core.config import BrainConfig, PolicySettings
    from specctl_vllm.controller.core.offline.replay import REPLAY_LEARNER
    from specctl_vllm.controller.core.offline.replay_path import path_figures

    brain = Brain(BrainConfig(REPLAY_LEARNER, PolicySettings(cost_preset=preset, category_floor=category_floor or 0.0)))
    figs = path_figures(batches, brain, preset=preset, ks=ks, k_max=k_max, windows=windows)
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
    from specctl_vllm.controller.core.offline.replay import ReplayError, parse_telemetry
    from specctl_vllm.controller.recording import read_recording

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
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    try:
        return asdict(x)
    except TypeError:
        return str(x)


if __name__ == "__main__":
    sys.exit(main())
