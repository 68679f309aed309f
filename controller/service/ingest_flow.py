"""Large telemetry batches: bytes in flight bounded, parsed without the Brain's lock, merged in slices with
engines served in turn.

A 4 MiB batch takes about a second to parse and a quarter of one to merge on a shared core, and its parsed
form is about 14 times its bytes. Parsed under the Brain's lock, one engine posting such batches back to back
made every other engine wait for seconds; parsed without a bound on how many are in flight, 64 concurrent ones
took the process past 500 MB. So:

- :class:`BytesInFlight` admits a large body before it is read only while the bytes of large bodies in flight
  stay within a total, and after parsing only while its engine's stay within a share; beyond either the post
  gets 429 with ``Retry-After`` (the reporter waits that long, then trims or drops the batch). Small bodies
  (at most ``INLINE_BODY_BYTES``) are not counted: an engine's regular post is never refused for memory;
- the parse runs in a worker thread without the lock;
- :class:`FairMerger` merges each large batch in slices of about :data:`SLICE_UNITS` histogram rows (a few ms
  each), taking the lock for one slice at a time and waiting for it as any small post does, and takes one
  slice of each engine's oldest batch in turn.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from anyio import CapacityLimiter, to_thread
from starlette.exceptions import HTTPException

from specctl_vllm.controller.service.errors import parse_json
from specctl_vllm.controller.service.json_pieces import decode_object
from specctl_vllm.kernel.protocol import ENGINE_ID_PATTERN, StepRecord, TelemetryBatch

#: Steps decoded and validated between two pauses of a large body's parse: a C call holds the GIL for the whole
#: of it (a 2 MB body validated in one call stalled the event loop for 94 ms), a pause every 32 steps gives it back.
PARSE_STEPS_PER_PAUSE = 32

#: Histogram rows (and steps) merged under one hold of the Brain's lock: ~4 us each measured, so a slice
#: holds the lock for about 10 ms on a shared core.
SLICE_UNITS = 2048
#: Seconds a post refused for bytes in flight is told to wait.
RETRY_AFTER_S = 1


@dataclass
class Pacer:
    """Bulk work spread so that it runs at most ``share`` of the wall time: each :meth:`pause` sleeps in
    proportion to the time since the last one (the GIL is free meanwhile). That time includes waiting for the GIL,
    so the busier the event loop, the longer the pauses: a large batch's parse yields to the engines' posts."""

    share: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    since: float | None = None

    def pause(self, _: float = 0.0) -> None:
        now = self.clock()
        worked = 0.0 if self.since is None else now - self.since
        self.sleep(worked * (1.0 - self.share) / self.share)  # sleep(0) still gives the GIL up
        self.since = self.clock()


def parse_batch(raw: bytes, pause: Callable[[float], None] = time.sleep) -> TelemetryBatch:
    """``parse_json(raw, TelemetryBatch)`` in pieces: the envelope and each step decoded one after another
    (:mod:`.json_pieces`: no single C call holds the GIL for the whole body), each step validated as soon as it is
    decoded (its dicts go as its model comes: decoded JSON ~7x the body and models ~14x are not both held whole;
    the parse's peak was 77 MB for a 3.7 MB body, it is now the parsed batch's 52 MB), the GIL given up every
    :data:`PARSE_STEPS_PER_PAUSE` steps, then the envelope validated. Any problem is reported by the one-call
    parse, so a refusal's status and messages are exactly what a small body's would be."""
    try:
        doc = decode_object(raw.decode("utf-8"), "steps", lambda step: StepRecord.model_validate(step, strict=True),
                            pause, PARSE_STEPS_PER_PAUSE)
        if not isinstance(doc.get("steps"), list):
            raise TypeError("steps")
        return TelemetryBatch.model_validate(doc, strict=True)
    except Exception:  # noqa: BLE001 -- the one-call parse says what is wrong, as for any body
        return parse_json(raw, TelemetryBatch, "telemetry batch")


_ENGINE_ID = re.compile(ENGINE_ID_PATTERN)


def engine_id_of(raw: bytes) -> str | None:
    """Best-effort engine id of a refused batch, so the rejection is counted against its engine."""
    try:
        value = json.loads(raw).get("engine_id")
    except (ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, str) and _ENGINE_ID.match(value) else None


def step_units(step: StepRecord) -> int:
    return 1 + sum(len(c.hists) + sum(len(h) for h in c.counterfactual.values()) for c in step.categories)


def slice_bounds(units: list[int], max_units: int) -> list[tuple[int, int]]:
    """Consecutive step ranges of at most ``max_units`` each (a single larger step is a slice of its own);
    one empty range for a batch without steps."""
    bounds: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, u in enumerate(units):
        if total and total + u > max_units:
            bounds.append((start, i))
            start, total = i, 0
        total += u
    bounds.append((start, len(units)))
    return bounds


def slices(batch: TelemetryBatch, max_units: int = SLICE_UNITS) -> list[TelemetryBatch]:
    """``batch`` cut into parts of whole steps; the first carries the batch's own counters, the rest none."""
    bounds = slice_bounds([step_units(s) for s in batch.steps], max_units)
    if len(bounds) == 1:
        return [batch]
    return [batch.model_copy(update={"steps": batch.steps[a:b], **({} if i == 0 else {"dropped_steps": 0})})
            for i, (a, b) in enumerate(bounds)]


def too_many(what: str) -> HTTPException:
    return HTTPException(429, f"too many telemetry bytes in flight ({what}); retry later",
                         headers={"Retry-After": str(RETRY_AFTER_S)})


@dataclass
class BytesInFlight:
    """Bytes of large bodies between arrival and merge, in total and per engine."""

    total_limit: int
    engine_limit: int
    total: int = 0
    per_engine: dict[str, int] = field(default_factory=dict)
    refused: int = 0

    @contextmanager
    def body(self, size: int) -> Iterator[None]:
        if self.total and self.total + size > self.total_limit:
            self.refused += 1
            raise too_many(f"limit {self.total_limit} bytes in all")
        self.total += size
        try:
            yield
        finally:
            self.total -= size

    @contextmanager
    def engine(self, engine_id: str, size: int) -> Iterator[None]:
        held = self.per_engine.get(engine_id, 0)
        if held and held + size > self.engine_limit:
            self.refused += 1
            raise too_many(f"limit {self.engine_limit} bytes per engine")
        self.per_engine[engine_id] = held + size
        try:
            yield
        finally:
            left = self.per_engine[engine_id] - size
            if left:
                self.per_engine[engine_id] = left
            else:
                del self.per_engine[engine_id]


class Job:
    """One batch's merge: ``step()`` runs the next slice under the lock and says whether the job is done
    (with its value)."""

    def __init__(self, step: Callable[[], tuple[bool, Any]]) -> None:
        self.step = step
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


class FairMerger:
    """Runs jobs slice by slice, one slice at a time, each engine's oldest job in turn."""

    def __init__(self, acquire: Callable[[], Any], release: Callable[[], None]) -> None:
        self._acquire = acquire
        self._release = release
        self._queues: dict[str, deque[Job]] = {}
        self._task: asyncio.Task[None] | None = None
        self._limiter: CapacityLimiter | None = None
        self.slices = 0

    async def run(self, engine_id: str, step: Callable[[], tuple[bool, Any]]) -> Any:
        job = Job(step)
        self._queues.setdefault(engine_id, deque()).append(job)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drive())
        # shielded: a client that goes away does not stop its batch half-merged
        return await asyncio.shield(job.future)

    async def _drive(self) -> None:
        if self._limiter is None:
            self._limiter = CapacityLimiter(1)
        while self._queues:
            for engine_id in list(self._queues):
                queue = self._queues[engine_id]
                job = queue[0]
                await self._acquire()  # waits as a task, as small posts do: they get the lock between slices
                try:
                    done, value = await to_thread.run_sync(job.step, limiter=self._limiter)
                except Exception as exc:  # noqa: BLE001 -- the job's own failure, answered to its request
                    done, value = True, exc
                finally:
                    self._release()
                self.slices += 1
                if done:
                    queue.popleft()
                    if not queue:
                        del self._queues[engine_id]
                    if not job.future.done():
                        if isinstance(value, Exception):
                            job.future.set_exception(value)
                        else:
                            job.future.set_result(value)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
