"""``specctl report`` command line: gather the data (a live controller or a recording), write one HTML file.

The page and the data it shows are built by pure functions in :mod:`specctl_vllm.controller.report`; this module reads files,
calls the controller's API and writes the output. Exit codes: 0 written, 2 bad input (usage, unreadable
recording), 3 the controller could not be reached or answered with an error.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from specctl_vllm.controller.cli_common import EXIT_UNREACHABLE, EXIT_USAGE, URL_ENV, PresetOpt, invoke


class LiveError(RuntimeError):
    """The controller could not be reached, or answered with an error."""


def report(
    ctx: typer.Context,
    recording: Annotated[list[Path] | None, typer.Argument(
        show_default=False, help="telemetry recordings (.jsonl / .jsonl.gz files or folders); or use --url")] = None,
    url: Annotated[str | None, typer.Option(
        envvar=URL_ENV, show_default="none",
        help="a live controller's base URL instead of a recording (the variable is ignored when a recording is "
             "given)")] = None,
    samples: Annotated[int, typer.Option(help="live: answers to take for k over time")] = 1,
    interval: Annotated[float, typer.Option(help="live: seconds between samples")] = 5.0,
    model: Annotated[str | None, typer.Option(
        show_default="the only one", help="model to report when there are several")] = None,
    preset: PresetOpt = "cpu",
    out: Annotated[Path, typer.Option(help="HTML file to write")] = Path("specctl-report.html"),
    json_out: Annotated[Path | None, typer.Option(
        "--json", show_default="none", help="also write the report's data as JSON")] = None,
    png: Annotated[Path | None, typer.Option(
        show_default="none", help="also write the charts as PNG files into this folder (needs matplotlib: "
                                  "pip install 'specctl-vllm[plots]')")] = None,
) -> None:
    """One self-contained HTML page (inline SVG, no script): per-category acceptance-length histograms, acceptance
    per draft position, k and method over time, estimated goodput against k at the current load, overrides. From a
    recording or from a live controller.

    Examples: specctl report recordings/ --out report.html (a folder written by --record-dir);
    specctl report --url http://127.0.0.1:8081 --samples 30 --interval 2 --out live.html
    """
    injected = ctx.obj or {}
    clock: Callable[[], float] = injected.get("clock", time.time)
    sleep: Callable[[float], None] = injected.get("sleep", time.sleep)
    source = ctx.get_parameter_source("url")
    if recording and url and getattr(source, "name", None) == "ENVIRONMENT":
        url = None  # a recording named on the command line beats the environment's controller
    raise typer.Exit(write_report(recording or [], url, samples=samples, interval=interval, model=model,
                                  preset=preset, out=out, json_out=json_out, png=png, clock=clock, sleep=sleep))


def write_pngs(data: dict, folder: Path) -> list[Path]:
    """The report's charts as PNG files (matplotlib): per category acceptance length, acceptance by position,
    goodput against k; k over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for view in data["categories"]:
        name = view["category"]
        fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
        dist = view.get("acceptance_length_distribution") or []
        axes[0].bar([j + 1 for j in range(len(dist))], dist)
        if view.get("mean_acceptance_length"):
            axes[0].axvline(view["mean_acceptance_length"], color="red", linestyle="--",
                            label=f"mean {view['mean_acceptance_length']:.2f}")
            axes[0].legend()
        axes[0].set(title=f"Acceptance length: {name}", xlabel="tokens per verified draft (1 + accepted)",
                    ylabel="share of drafts")
        pos = view.get("positions") or []
        axes[1].bar([p["position"] for p in pos], [p["beta"] for p in pos],
                    yerr=[[p["beta"] - p["ci_low"] for p in pos], [p["ci_high"] - p["beta"] for p in pos]])
        axes[1].set(title="Conditional acceptance by position", xlabel="draft position", ylim=(0, 1))
        table = (view.get("decision") or {}).get("goodput_table") or []
        axes[2].plot([r["k"] for r in table], [r["goodput_tokens_per_s"] for r in table], marker="o")
        axes[2].set(title="Estimated goodput vs k (current load)", xlabel="k", ylabel="tokens/s")
        fig.tight_layout()
        paths.append(folder / f"category_{name}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    rows = data.get("timeline") or []
    if rows:
        fig, ax = plt.subplots(figsize=(10, 3.8))
        for series, style in (("ran", "-"), ("policy", "--")):
            for cat in sorted({r["category"] for r in rows if r["series"] == series}):
                pts = [(r["t_s"], r["k"]) for r in rows if r["series"] == series and r["category"] == cat]
                ax.plot(*zip(*pts), style, drawstyle="steps-post" if series == "policy" else "default",
                        label=f"{cat} ({series})")
        ax.set(title="k over time", xlabel="seconds", ylabel="k")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(folder / "k_over_time.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


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


def write_report(recording: list[Path], url: str | None, *, samples: int, interval: float, model: str | None,
                 preset: str, out: Path, json_out: Path | None, png: Path | None, clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> int:
    """Gather, render and write; the exit code (0 written, 2 bad input, 3 the controller failed)."""
    from specctl_vllm.controller.core.offline.replay import ReplayError
    from specctl_vllm.controller.recording import RecordingError
    from specctl_vllm.controller.report import ReportError, from_live, from_recording, render_html

    if bool(recording) == bool(url):
        print("specctl report: give either recording files/folders or --url, not both (and not neither)",
              file=sys.stderr)
        return EXIT_USAGE
    if samples < 1 or interval < 0:
        print("specctl report: --samples must be >= 1 and --interval >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        if url:
            categories, overrides, taken = fetch_live(url, samples, interval, sleep, clock)
            data = from_live(categories, overrides, taken, source=url, model=model, generated_at=clock())
        else:
            from specctl_vllm.controller.replay_cli import load_batches

            batches = load_batches(recording)
            data = from_recording(batches, model=model, preset=preset, generated_at=clock(),
                                  source=", ".join(map(str, recording)))
    except LiveError as exc:
        print(f"specctl report: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (RecordingError, ReplayError, ReportError) as exc:
        print(f"specctl report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        out.write_text(render_html(data), encoding="utf-8")
        if json_out:
            json_out.write_text(json.dumps(data, indent=1) + "\n")
        if png:
            try:
                pngs = write_pngs(data, png)
            except ImportError:
                print("specctl report: --png needs matplotlib (pip install 'specctl-vllm[plots]'); the HTML was "
                      "written", file=sys.stderr)
                return EXIT_USAGE
            print(f"wrote {len(pngs)} PNG files into {png}")
    except OSError as exc:
        print(f"specctl report: cannot write: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {out} ({len(data['categories'])} categories)")
    return 0


def main(argv: list[str] | None = None, *, clock: Callable[[], float] = time.time,
         sleep: Callable[[float], None] = time.sleep) -> int:
    """``specctl report`` on ``argv``; the exit code."""
    return invoke(report, argv, "specctl report", obj={"clock": clock, "sleep": sleep})


if __name__ == "__main__":
    sys.exit(main())
