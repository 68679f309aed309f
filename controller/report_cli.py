"""``specctl report`` command line: gather the data (a live controller or a recording), write one HTML file.

The page and the data it shows are built by pure functions in :mod:`controller.report`; this module reads files,
calls the controller's API and writes the output. Exit codes: 0 written, 2 bad input (usage, unreadable
recording), 3 the controller could not be reached or answered with an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controller.core.cost import PRESETS
from controller.core.replay import ReplayError
from controller.recording import RecordingError
from controller.report import ReportError, from_live, from_recording, render_html

EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class LiveError(RuntimeError):
    """The controller could not be reached, or answered with an error."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specctl report", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="One self-contained HTML page (inline SVG, no script): per-category acceptance-length "
                    "histograms, acceptance per draft position, k and method over time, estimated goodput "
                    "against k at the current load, overrides. From a recording or from a live controller.",
        epilog="examples:\n"
               "  specctl report recordings/ --out report.html            # a folder written by --record-dir\n"
               "  specctl report --url http://127.0.0.1:8081 --samples 30 --interval 2 --out live.html")
    p.add_argument("recording", nargs="*", type=Path,
                   help="telemetry recordings (.jsonl / .jsonl.gz files or folders); or use --url")
    p.add_argument("--url", help="a live controller's base URL instead of a recording")
    p.add_argument("--samples", type=int, default=1, help="live: answers to take for k over time (default 1)")
    p.add_argument("--interval", type=float, default=5.0, help="live: seconds between samples (default 5)")
    p.add_argument("--model", help="model to report when there are several")
    p.add_argument("--preset", default="cpu", choices=sorted(PRESETS),
                   help="recording: cost preset the controller's fit starts from (default cpu)")
    p.add_argument("--out", type=Path, default=Path("specctl-report.html"), help="HTML file to write")
    p.add_argument("--json", type=Path, help="also write the report's data as JSON")
    return p


def fetch_live(url: str, samples: int, interval: float, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.time) -> tuple[list, list, list]:
    import httpx

    def get(path: str) -> Any:
        try:
            response = httpx.get(url.rstrip("/") + path, timeout=10.0)
        except httpx.HTTPError as exc:
            raise LiveError(f"cannot reach the controller at {url}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise LiveError(f"{url}{path}: HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            raise LiveError(f"{url}{path}: the answer is not JSON (is this a specctl controller?)") from None

    taken = []
    for i in range(samples):
        if i:
            sleep(interval)
        taken.append((clock(), get("/v1/categories")))
    return taken[-1][1], get("/v1/overrides"), taken


def main(argv: list[str] | None = None, *, clock: Callable[[], float] = time.time,
         sleep: Callable[[float], None] = time.sleep) -> int:
    args = build_parser().parse_args(argv)
    if bool(args.recording) == bool(args.url):
        print("specctl report: give either recording files/folders or --url, not both (and not neither)",
              file=sys.stderr)
        return EXIT_USAGE
    if args.samples < 1 or args.interval < 0:
        print("specctl report: --samples must be >= 1 and --interval >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.url:
            categories, overrides, samples = fetch_live(args.url, args.samples, args.interval, sleep, clock)
            data = from_live(categories, overrides, samples, source=args.url, model=args.model,
                             generated_at=clock())
        else:
            from controller.replay_cli import load_batches

            batches = load_batches(args.recording)
            data = from_recording(batches, model=args.model, preset=args.preset, generated_at=clock(),
                                  source=", ".join(map(str, args.recording)))
    except LiveError as exc:
        print(f"specctl report: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (RecordingError, ReplayError, ReportError) as exc:
        print(f"specctl report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        args.out.write_text(render_html(data), encoding="utf-8")
        if args.json:
            args.json.write_text(json.dumps(data, indent=1) + "\n")
    except OSError as exc:
        print(f"specctl report: cannot write: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {args.out} ({len(data['categories'])} categories)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
