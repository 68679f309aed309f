"""``specctl bench --trace FILE``: every configuration plays the same trace against the endpoint, one after the
other, repeats interleaved; the rows, the tables and the per-phase static oracle.

The trace (:mod:`specctl_vllm.controller.trace_bench`) is a phases file, whose requests are drawn from the request
file, or a recorded request log (JSON lines with ``"t"``) cut into ``--window-s`` windows. Configurations are
those of ``specctl bench``; in the rows an override configuration that pins every category is named ``kN``
(``off`` is ``k0``) and the controller's own policy ``specctl``, so that
:mod:`specctl_vllm.controller.trace_stats` (and ``python -m bench trace.report``) read them as static k and
specctl. Overrides are pinned and put back as by ``specctl bench`` (:mod:`specctl_vllm.controller.bench_overrides`).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from specctl_vllm.controller.bench_overrides import Refused, Unreachable, apply_overrides, claim, put_back
from specctl_vllm.controller.cli_common import EXIT_UNREACHABLE, EXIT_USAGE

if TYPE_CHECKING:
    from specctl_vllm.controller.bench import BenchRequest, Config
    from specctl_vllm.controller.bench_cli import BenchOptions
    from specctl_vllm.controller.trace_bench import TraceInput

#: the request plan's seed: every configuration and every repeat gets the same requests in the same order
PLAN_SEED = 0


def row_name(config: Config) -> str:
    """The configuration's name in trace rows: ``kN`` for a k pinned on every category (``off`` = ``k0``),
    ``specctl`` for the controller's policy, else its own name."""
    if config.kind == "override" and config.k_all is not None:
        return f"k{config.k_all}"
    if config.kind == "override" and config.ks is None:
        return "specctl"
    return config.name


def load(trace_path: Path, requests_path: Path | None, window_s: float
         ) -> tuple[TraceInput, dict[str, list[BenchRequest]], list[str]]:
    """The trace, the request pool by category, and the categories the run sends; BenchError with the reason."""
    from specctl_vllm.controller.bench import BenchError, parse_requests
    from specctl_vllm.controller.trace_bench import check_categories, parse_trace_input

    if not window_s > 0 or window_s == float("inf"):
        raise BenchError(f"--window-s must be a positive number of seconds, got {window_s:g}")
    text = _read(trace_path, "--trace")
    trace_input = parse_trace_input(text, str(trace_path), window_s)
    if trace_input.log:
        if requests_path is not None:
            raise BenchError(f"{trace_path} is a request log: it carries its own requests; give no request file")
        categories = sorted({item.request.category for item in trace_input.log})
        return trace_input, {}, categories
    if requests_path is None:
        raise BenchError(f"{trace_path} is a phases trace: give the request file its requests are drawn from")
    pool = check_categories(trace_input.trace, parse_requests(_read(requests_path, "requests").splitlines(),
                                                              str(requests_path)))
    return trace_input, pool, list(trace_input.trace.categories)


def _read(path: Path, what: str) -> str:
    from specctl_vllm.controller.bench import BenchError

    try:
        return path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"{what} {path}: cannot read it as UTF-8 text ({exc})") from None


def trace_row(record: dict, config: Config, repeat: int, trace_input: TraceInput, window_s: float,
              endpoint: str, model: str, now: float) -> dict:
    """One run as ``python -m bench trace`` writes it (``kind: trace_run``), plus where it ran."""
    trace = trace_input.trace
    return {"kind": "trace_run", "config": row_name(config), "bench_config": config.name, "repeat": repeat,
            "trace": trace.name, "profile": "", "duration_s": trace.duration_s,
            "window_s": window_s if trace_input.log else None, "endpoint": endpoint, "model": model,
            "time": now, **record}


def failed_everywhere(record: dict) -> bool:
    """Every request of the run failed and none finished."""
    phases = record["phases"]
    return sum(p["errors"] for p in phases) > 0 and sum(p["finished"] for p in phases) == 0


def tables(rows: Sequence[dict]) -> tuple[dict, str]:
    """The analysis of the rows (:func:`trace_stats.analyse`) and its tables."""
    from specctl_vllm.controller.trace_stats import analyse, phase_table, table

    result = analyse(list(rows))
    return result, f"{table(result)}\n\n{phase_table(result)}"


def run_trace_bench(args: BenchOptions, trace_path: Path, clock: Callable[[], float] = time.time,
                    sleep: Callable[[float], None] = time.sleep, transport: Any = None) -> int:
    """``specctl bench --trace``; its exit code. ``transport``: an httpx transport for the trace's requests."""
    from specctl_vllm.controller.bench import BenchError, schedule
    from specctl_vllm.controller.bench_cli import first_model, parse_configs, warm_up
    from specctl_vllm.controller.trace_bench import run_trace

    try:
        configs = parse_configs(args)
        trace_input, pool, categories = load(trace_path, args.requests, args.window_s)
        ledger = claim(args.controller, configs, categories, args.replace_overrides)
    except (BenchError, Refused) as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    trace = trace_input.trace
    rows: list[dict] = []
    out: TextIO | None = None
    try:
        if args.json:
            out = args.json.open("w")
        models: dict[str, str] = {}
        for round_, config in schedule(configs, args.repeats):
            base = config.url if config.kind == "endpoint" else args.endpoint.rstrip("/")
            if base not in models:
                models[base] = args.model or first_model(base, args.api_key)
                warm = [item.request for item in trace_input.log] or [r for rs in pool.values() for r in rs]
                warm_up(args, base, models[base], warm)
            if config.kind == "override":
                apply_overrides(args.controller, ledger.actions(config, categories))
                sleep(args.settle)
            print(f"round {round_ + 1}/{args.repeats} {config.name}: trace {trace.name}, {trace.duration_s:g} s",
                  file=sys.stderr)
            record = asyncio.run(run_trace(base, models[base], trace_input, pool, args.timeout, args.api_key,
                                           seed=PLAN_SEED, transport=transport))
            if failed_everywhere(record):
                raise Unreachable(f"{config.name}: every request of the trace failed")
            rows.append(trace_row(record, config, round_, trace_input, args.window_s, base, models[base], clock()))
            if out:  # as each run ends: an interrupted bench keeps the runs it finished
                out.write(json.dumps(rows[-1]) + "\n")
                out.flush()
    except OSError as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        print(f"specctl bench: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    finally:
        put_back(args.controller, ledger)
        if out:
            out.close()
    result, text = tables(rows)
    print(f"trace {trace.name}: {len(trace.phases)} phases, {trace.duration_s:g} s, x {args.repeats} rounds; "
          f"goodput = committed tokens / second of trace time")
    print(text)
    if args.json:
        with args.json.open("a") as fh:
            fh.write(json.dumps({"kind": "trace_analysis", "trace": trace.name, **result}) + "\n")
        print(f"wrote {args.json}")
    return 0
