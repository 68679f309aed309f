"""``specctl bench`` command line: send the user's requests to each configuration, measure, report.

See :mod:`specctl_vllm.controller.bench` for the request file and the configurations. Exit codes: 0 done; 2 bad input
(request file, options); 3 an endpoint or the controller could not be reached, or every request of a run
failed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from specctl_vllm.controller.bench_overrides import (  # noqa: F401 (apply_overrides, Unreachable: the CLI's API)
    Refused,
    Unreachable,
    apply_overrides,
    claim,
    current_overrides,
    put_back,
)
from specctl_vllm.controller.cli_common import EXIT_UNREACHABLE, EXIT_USAGE, URL_ENV, invoke

if TYPE_CHECKING:  # imported where used: `specctl --help` loads this module and should not load pydantic
    from specctl_vllm.controller.bench import BenchRequest, Config, Result

#: ``specctl_vllm.controller.trace_bench.DEFAULT_WINDOW_S`` (tests/unit/test_bench_trace_cli.py checks they agree),
#: here so that ``-h`` shows it without importing the trace model.
DEFAULT_WINDOW_S = 60.0


@dataclass(frozen=True)
class BenchOptions:
    """``specctl bench``'s options, as given."""

    requests: Path | None
    configs: list[str]
    endpoint: str | None = None
    controller: str | None = None
    model: str | None = None
    concurrency: int = 8
    repeats: int = 3
    settle: float = 3.0
    warmup: int = 2
    timeout: float = 300.0
    api_key: str = ""
    json: Path | None = None
    plots: Path | None = None
    baseline: str | None = None
    no_progress: bool = False
    replace_overrides: bool = False
    trace: Path | None = None
    window_s: float = DEFAULT_WINDOW_S


def bench(
    requests: Annotated[Path | None, typer.Argument(
        show_default=False, help="JSON lines, one request per line (with --trace: the requests a phases trace "
                                 "draws from; none for a request log)")] = None,
    configs: Annotated[list[str] | None, typer.Option(
        "--config", show_default="none",
        help="NAME=URL (an endpoint), or with --controller: off, k=N, k=CAT:N,..., specctl (repeatable)")] = None,
    endpoint: Annotated[str | None, typer.Option(
        show_default="none", help="the OpenAI-compatible base URL for override configurations")] = None,
    replace_overrides: Annotated[bool, typer.Option(
        "--replace-overrides",
        help="pin categories that carry an operator's override (put back after the run); without it the bench "
             "refuses to run over them")] = False,
    controller: Annotated[str | None, typer.Option(
        envvar=URL_ENV, show_default="none",
        help="the specctl controller's base URL (override configurations; acceptance per category from its "
             "/metrics)")] = None,
    model: Annotated[str | None, typer.Option(
        show_default="the endpoint's first /v1/models entry", help="model name sent in requests")] = None,
    concurrency: Annotated[int, typer.Option(help="requests in flight")] = 8,
    repeats: Annotated[int, typer.Option(help="rounds; each measures every configuration")] = 3,
    settle: Annotated[float, typer.Option(
        help="seconds to wait after changing overrides, so the engine has the new policy")] = 3.0,
    warmup: Annotated[int, typer.Option(help="requests sent to each endpoint before measuring, not counted")] = 2,
    timeout: Annotated[float, typer.Option(help="seconds per request")] = 300.0,
    api_key: Annotated[str, typer.Option(envvar="OPENAI_API_KEY", show_default="none",
                                         help="bearer token for the endpoints")] = "",
    json_out: Annotated[Path | None, typer.Option(
        "--json", show_default="none", help="write every run and the aggregate as JSON")] = None,
    plots: Annotated[Path | None, typer.Option(
        show_default="none", help="folder for plots (PNG with matplotlib installed, else SVG)")] = None,
    baseline: Annotated[str | None, typer.Option(
        show_default="the first configuration", help="configuration the table compares goodput against")] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="no progress bars on stderr")] = False,
    trace: Annotated[Path | None, typer.Option(
        show_default="none", help="play this trace under each configuration instead of the request file once: "
                                  "a phases file (bench/trace/day.json) or a request log (JSON lines with \"t\"); "
                                  "--json then writes trace_run rows (python -m bench trace.report reads them)")] = None,
    window_s: Annotated[float, typer.Option(
        "--window-s", help="with a request log: the report's phases are windows of this many seconds")
    ] = DEFAULT_WINDOW_S,
) -> None:
    """Measure your own requests against your endpoint(s): goodput, TTFT and inter-token latency percentiles and
    acceptance, per category and overall, for each configuration; interleaved and repeated rounds, with their
    spread.

    Request file: JSON lines {messages | prompt, category?, max_tokens?, response_format?, tools?, tool_choice?,
    temperature?} (docs/bench.md).

    Examples: specctl bench requests.jsonl --config plain=http://h:8000 --config spec=http://h:8001;
    specctl bench requests.jsonl --endpoint http://h:8000 --controller http://h:8081 --config off --config k=2
    --config k=structured:1,chat:4 --config specctl --repeats 3
    """
    raise typer.Exit(run(BenchOptions(
        requests=requests, configs=list(configs or []), endpoint=endpoint, controller=controller, model=model,
        concurrency=concurrency, repeats=repeats, settle=settle, warmup=warmup, timeout=timeout, api_key=api_key,
        json=json_out, plots=plots, baseline=baseline, no_progress=no_progress,
        replace_overrides=replace_overrides, trace=trace, window_s=window_s)))


def main(argv: list[str] | None = None) -> int:
    """``specctl bench`` on ``argv``; the exit code."""
    return invoke(bench, argv, "specctl bench")


class Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, label: str, total: int, enabled: bool, stream: Any = None) -> None:
        self.label, self.total, self.enabled, self.done = label, total, enabled, 0
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()
        self._draw()

    def step(self) -> None:
        self.done += 1
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // max(self.total, 1)
        rate = self.done / max(time.monotonic() - self.t0, 1e-9)
        self.stream.write(f"\r{self.label:<28} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
                          f" {rate:5.1f} req/s")
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


async def _one(client: Any, base: str, model: str, request: BenchRequest, timeout: float,
               clock: Callable[[], float]) -> Result:
    import httpx

    from specctl_vllm.controller.bench import Result

    path = "/v1/chat/completions" if request.kind == "chat" else "/v1/completions"
    body = {**request.body, "model": model, "stream": True, "stream_options": {"include_usage": True}}
    start = clock()
    first = last = None
    chunks = 0
    usage_tokens = None
    gaps: list[float] = []
    try:
        async with client.stream("POST", base + path, json=body, timeout=timeout) as response:
            if response.status_code >= 400:
                text = (await response.aread())[:300].decode("utf-8", "replace")
                return Result(request.category, False, error=f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = choice.get("text") or delta.get("content") or delta.get("reasoning_content") or ""
                    if text or delta.get("tool_calls"):
                        now = clock()
                        if first is None:
                            first = now
                        else:
                            gaps.append(now - last)
                        last = now
                        chunks += 1
    except httpx.HTTPError as exc:
        return Result(request.category, False, error=f"{type(exc).__name__}: {exc}")
    end = clock()
    if first is None:
        return Result(request.category, False, error="no tokens streamed")
    return Result(request.category, True, ttft_s=first - start, e2e_s=end - start,
                  output_tokens=usage_tokens if usage_tokens is not None else chunks, itl_s=gaps)


async def run_file(base: str, model: str, requests: list[BenchRequest], concurrency: int, timeout: float,
                   api_key: str, progress: Progress, clock: Callable[[], float] = time.perf_counter
                   ) -> tuple[list[Result], float]:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, limits=limits) as client:
        async def task(r: BenchRequest) -> Result:
            async with sem:
                result = await _one(client, base, model, r, timeout, clock)
            progress.step()
            return result

        t0 = clock()
        results = await asyncio.gather(*(task(r) for r in requests))
        return list(results), clock() - t0


def _get(url: str, headers: dict | None = None) -> Any:
    import httpx

    try:
        response = httpx.get(url, headers=headers or {}, timeout=15.0)
    except httpx.HTTPError as exc:
        raise Unreachable(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        raise Unreachable(f"{url}: HTTP {response.status_code}")
    return response


def first_model(base: str, api_key: str) -> str:
    response = _get(base + "/v1/models", {"Authorization": f"Bearer {api_key}"} if api_key else None)
    try:
        return response.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise Unreachable(f"{base}/v1/models: no model listed; pass --model") from None


def scrape(url: str | None, names: dict[str, str], label: str | None) -> dict[str, dict[str, float]] | None:
    from specctl_vllm.controller.bench import parse_prometheus_counters

    if not url:
        return None
    try:
        return parse_prometheus_counters(_get(url.rstrip("/") + "/metrics").text, names, label)
    except Unreachable:
        return None


def parse_configs(args: BenchOptions) -> list[Config]:
    """The run's configurations and its counts, checked; BenchError with the reason."""
    from specctl_vllm.controller.bench import BenchError, parse_config

    if args.concurrency < 1 or args.repeats < 1 or args.warmup < 0:
        raise BenchError("--concurrency and --repeats must be >= 1, --warmup >= 0")
    if not args.configs:
        raise BenchError("give at least one --config")
    configs = [parse_config(c) for c in args.configs]
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise BenchError(f"configuration names repeat: {names}")
    if any(c.kind == "override" for c in configs) and not (args.controller and args.endpoint):
        raise BenchError("off / k=N / specctl configurations need --controller and --endpoint")
    return configs


def warm_up(args: BenchOptions, base: str, model: str, requests: list[BenchRequest]) -> None:
    """The first ``--warmup`` requests sent once to an endpoint before it is measured, not counted."""
    if args.warmup and requests:
        warm = Progress(f"warm-up {base}", min(args.warmup, len(requests)), not args.no_progress)
        asyncio.run(run_file(base, model, requests[: args.warmup], args.concurrency, args.timeout, args.api_key,
                             warm))


def run(args: BenchOptions) -> int:
    """The bench; its exit code."""
    from specctl_vllm.controller.bench import (
        SPECCTL_COUNTERS,
        VLLM_COUNTERS,
        BenchError,
        aggregate,
        counter_delta,
        format_table,
        parse_requests,
        schedule,
        summarize,
    )

    if args.trace is not None:
        from specctl_vllm.controller.bench_trace_cli import run_trace_bench

        return run_trace_bench(args, args.trace)
    try:
        configs = parse_configs(args)
        names = [c.name for c in configs]
        if args.requests is None:
            raise BenchError("give the request file (or --trace FILE)")
        try:
            text = args.requests.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise BenchError(f"{args.requests}: cannot read it as UTF-8 text ({exc})") from None
        requests = parse_requests(text.splitlines(), str(args.requests))
    except BenchError as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    categories = sorted({r.category for r in requests})
    runs: list[dict[str, Any]] = []
    try:
        ledger = claim(args.controller, configs, categories, args.replace_overrides)
    except Refused as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        models: dict[str, str] = {}
        for round_, config in schedule(configs, args.repeats):
            base = config.url if config.kind == "endpoint" else args.endpoint.rstrip("/")
            if base not in models:
                models[base] = args.model or first_model(base, args.api_key)
                warm_up(args, base, models[base], requests)
            if config.kind == "override":
                apply_overrides(args.controller, ledger.actions(config, categories))
                time.sleep(args.settle)
            before_ctl = scrape(args.controller, SPECCTL_COUNTERS, "category")
            before_vllm = scrape(base, VLLM_COUNTERS, None)
            progress = Progress(f"round {round_ + 1}/{args.repeats} {config.name}", len(requests),
                                not args.no_progress)
            results, wall = asyncio.run(run_file(base, models[base], requests, args.concurrency, args.timeout,
                                                 args.api_key, progress))
            after_ctl = scrape(args.controller, SPECCTL_COUNTERS, "category")
            after_vllm = scrape(base, VLLM_COUNTERS, None)
            acceptance = None
            if before_ctl is not None and after_ctl is not None:
                delta_ctl = counter_delta(after_ctl, before_ctl)
                acceptance = delta_ctl if any(v.get("drafts") for v in delta_ctl.values()) else None
            summary = summarize(results, wall, acceptance)
            if before_vllm is not None and after_vllm is not None:  # the engine's own, all categories
                delta = counter_delta(after_vllm, before_vllm).get("all", {})
                if delta.get("drafts"):
                    summary["vllm_overall"] = {"drafts": delta["drafts"],
                                               "acceptance_rate": delta.get("accepted", 0) / delta["draft_tokens"]
                                               if delta.get("draft_tokens") else None,
                                               "mean_acceptance_length": 1 + delta.get("accepted", 0) / delta["drafts"]}
                    if acceptance is None:
                        summary["categories"]["overall"].update(summary["vllm_overall"])
            runs.append({"round": round_, "config": config.name, "endpoint": base, "model": models[base],
                         "summary": summary})
            if summary["categories"]["overall"]["errors"] == len(requests):
                raise Unreachable(f"{config.name}: every request failed, e.g. {summary['error_samples'][:1]}")
    except Unreachable as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    finally:
        put_back(args.controller, ledger)
    agg = aggregate(runs)
    baseline = args.baseline or configs[0].name
    print(f"{len(requests)} requests x {args.repeats} rounds, concurrency {args.concurrency}; "
          f"goodput = output tokens / wall second of the run")
    print(format_table(agg, baseline if baseline in agg else None))
    if args.json:
        args.json.write_text(json.dumps({"requests": len(requests), "categories": categories,
                                         "concurrency": args.concurrency, "repeats": args.repeats,
                                         "configs": names, "runs": runs, "aggregate": agg}, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plots:
        from specctl_vllm.controller.bench_plots import plot

        for path in plot(agg, args.plots):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
