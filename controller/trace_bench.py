"""``specctl bench --trace FILE``: the user's requests driven through a trace against an OpenAI-compatible endpoint.

Two kinds of trace file:

* **phases** (a JSON object, :mod:`specctl_vllm.controller.traces`): each phase keeps its load (requests in
  flight, or Poisson arrivals) with its category mix; the n-th request of a phase takes a request of the drawn
  category from the request file (the same one under every configuration) with the phase's output length as its
  ``max_tokens``;
* **a recorded request log** (JSON lines, the request file's format plus ``"t"``: seconds after the log's start):
  every request is sent at its recorded time; the report's phases are consecutive windows of ``window_s``.

Committed tokens are counted as they stream back (the usage total spread over the request's chunks, so a chunk of
several speculated tokens counts them all) and credited to the phase in which they arrived. A run's record has the
shape of ``python -m bench trace``'s rows, so :mod:`specctl_vllm.controller.trace_stats` gives the same figures.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specctl_vllm.controller.bench import BenchError, BenchRequest, parse_requests
from specctl_vllm.controller.traces import Trace, TraceError, parse_trace, request_plan

SAMPLE_S = 1.0
DEFAULT_WINDOW_S = 60.0


@dataclass(frozen=True)
class TimedRequest:
    t: float
    request: BenchRequest


@dataclass(frozen=True)
class TraceInput:
    """Either phases (``trace``) or a request log (``log`` with ``trace`` its windows)."""

    trace: Trace
    log: tuple[TimedRequest, ...] = ()


def parse_trace_input(text: str, source: str, window_s: float = DEFAULT_WINDOW_S) -> TraceInput:
    """A phases file (one JSON object) or a request log (JSON lines with ``t``); BenchError with the reason."""
    stripped = text.strip()
    if not stripped:
        raise BenchError(f"{source}: empty trace file")
    try:
        data = json.loads(stripped)
    except ValueError:
        data = None
    if isinstance(data, dict) and "phases" in data:
        try:
            return TraceInput(parse_trace(data))
        except TraceError as exc:
            raise BenchError(f"{source}: {exc}") from None
    times, lines = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise BenchError(f"{source}:{n}: not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get("t"), int | float) or isinstance(row.get("t"), bool) \
                or not 0 <= row["t"] < 7 * 86400:
            raise BenchError(f"{source}:{n}: a request log line needs \"t\": seconds after the start, >= 0")
        times.append(float(row.pop("t")))
        lines.append(json.dumps(row))
    requests = parse_requests(lines, source)
    log = tuple(sorted((TimedRequest(t, r) for t, r in zip(times, requests, strict=True)), key=lambda x: x.t))
    if window_s <= 0:
        raise BenchError("--window-s must be > 0")
    end = log[-1].t + 1e-6
    n_windows = int(end // window_s) + 1
    phases = []
    for i in range(n_windows):
        cats = {r.request.category for r in log if i * window_s <= r.t < (i + 1) * window_s} or {"default"}
        phases.append({"name": f"t{i * window_s:g}", "duration_s": window_s, "rate_rps": 1.0,
                       "mix": {c: 1 for c in sorted(cats)}})
    try:
        return TraceInput(parse_trace({"name": source, "phases": phases}), log)
    except TraceError as exc:
        raise BenchError(f"{source}: {exc}") from None


def check_categories(trace: Trace, requests: Sequence[BenchRequest]) -> dict[str, list[BenchRequest]]:
    """The request file's requests by category; every category of the trace needs at least one."""
    pool: dict[str, list[BenchRequest]] = {}
    for r in requests:
        pool.setdefault(r.category, []).append(r)
    missing = [c for c in trace.categories if c not in pool]
    if missing:
        raise BenchError(f"the trace's categories {missing} have no request in the request file "
                         f"(it has {sorted(pool)})")
    return pool


class Tally:
    """Tokens per phase and per second, credited when they arrive."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.phases = [{"name": p.name, "seconds": p.duration_s, "tokens": 0.0, "tokens_by_category": {},
                        "started": 0, "finished": 0, "errors": 0} for p in trace.phases]
        self.seconds: dict[int, float] = {}

    def tokens(self, t: float, category: str, n: float) -> None:
        i = self.trace.phase_at(t)
        if i is None:
            return
        ph = self.phases[i]
        ph["tokens"] += n
        ph["tokens_by_category"][category] = ph["tokens_by_category"].get(category, 0.0) + n
        self.seconds[int(t // SAMPLE_S)] = self.seconds.get(int(t // SAMPLE_S), 0.0) + n

    def record(self) -> dict:
        phases = [{**p, "tokens": round(p["tokens"], 1)} for p in self.phases]
        return {"phases": phases, "tokens": round(sum(p["tokens"] for p in phases), 1),
                "seconds": self.trace.duration_s,
                "samples": [{"t": (s + 1) * SAMPLE_S, "tokens": round(v, 1)} for s, v in sorted(self.seconds.items())]}


async def stream_one(client: Any, base: str, model: str, request: BenchRequest, max_tokens: int, timeout: float,
                     on_tokens: Callable[[float], None]) -> bool:
    """Send one request (streamed); ``on_tokens(n)`` as tokens arrive. True when it completed."""
    import httpx

    path = "/v1/chat/completions" if request.kind == "chat" else "/v1/completions"
    body = {**request.body, "model": model, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks = 0
    try:
        async with client.stream("POST", base + path, json=body, timeout=timeout) as response:
            if response.status_code >= 400:
                await response.aread()
                return False
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                try:
                    event = json.loads(line[5:])
                except ValueError:
                    continue
                usage = event.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    # the usage total, less the one token a chunk counted so far
                    on_tokens(max(0.0, float(usage["completion_tokens"]) - chunks))
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if choice.get("text") or delta.get("content") or delta.get("tool_calls") \
                            or delta.get("reasoning_content"):
                        chunks += 1
                        on_tokens(1.0)
    except httpx.HTTPError:
        return False
    return True


async def run_trace(base: str, model: str, trace_input: TraceInput, pool: Mapping[str, list[BenchRequest]],
                    timeout: float, api_key: str, seed: int = 0, max_connections: int = 1024,
                    clock: Callable[[], float] = time.perf_counter, transport: Any = None) -> dict:
    """One pass of the trace from its start; the run's record (phases, samples, tokens, seconds)."""
    import httpx

    trace = trace_input.trace
    tally = Tally(trace)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    active: set[asyncio.Task] = set()
    counts = [0] * len(trace.phases)
    arrivals = random.Random(f"{seed}/arrivals")
    async with httpx.AsyncClient(headers=headers, limits=limits, transport=transport) as client:
        t0 = clock()

        def launch(request: BenchRequest, category: str, max_tokens: int) -> None:
            i = trace.phase_at(clock() - t0)
            if i is not None:
                tally.phases[i]["started"] += 1

            async def go() -> None:
                ok = await stream_one(client, base, model, request, max_tokens, timeout,
                                      lambda n: tally.tokens(clock() - t0, category, n))
                j = trace.phase_at(clock() - t0)
                if j is not None:
                    tally.phases[j]["finished" if ok else "errors"] += 1

            task = asyncio.create_task(go())
            active.add(task)
            task.add_done_callback(active.discard)

        log = list(trace_input.log)
        next_arrival: float | None = None
        current = None
        while True:
            t = clock() - t0
            i = trace.phase_at(t)
            if i is None:
                break
            phase = trace.phases[i]
            if i != current:
                current, next_arrival = i, None
            if trace_input.log:  # a request log sends its own requests only, also once all are sent
                while log and log[0].t <= t:
                    item = log.pop(0)
                    launch(item.request, item.request.category, item.request.max_tokens)
            elif phase.concurrency is not None:
                while len(active) < phase.concurrency:
                    category, length, rng = request_plan(phase, i, counts[i], seed)
                    counts[i] += 1
                    choices = pool[category]
                    launch(choices[rng.randrange(len(choices))], category, length)
            else:
                next_arrival = t if next_arrival is None else next_arrival
                while next_arrival <= t:
                    if len(active) < phase.in_flight_cap:
                        category, length, rng = request_plan(phase, i, counts[i], seed)
                        counts[i] += 1
                        choices = pool[category]
                        launch(choices[rng.randrange(len(choices))], category, length)
                    next_arrival += arrivals.expovariate(phase.rate_rps)
            if active:
                await asyncio.wait(active, timeout=0.02, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(0.01)
        for task in list(active):
            task.cancel()
        await asyncio.gather(*active, return_exceptions=True)
    return tally.record()
