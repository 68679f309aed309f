"""The live controller: the Brain, its lock, the store and the overrides, wired together.

Built once per app in the lifespan (see :mod:`specctl_vllm.controller.service.app`), never at import time.

Concurrency: the Brain is not thread-safe, so every call into it holds ``_brain_lock``. The event loop never
waits on CPU work of the Brain: a batch's parse and merge and a decision refresh are CPU work of up to
hundreds of ms (a 4 MiB batch, a model of 60 categories at k_max 32), and a lock held by a worker thread
would stall a loop that waits for it just the same. So Brain calls run in worker threads, through a
capacity limiter of their own (:data:`BRAIN_THREADS`), and the lock is what the scrape's and the snapshot's
threads take too. The one exception is the common telemetry post, merged and answered on the loop when it
is small and its decision cached or small, after waiting for the lock as a task (:class:`BrainLock`,
:meth:`Runtime.ingest`). Whatever the order in which posts get the lock, each (engine, boot, seq) is merged
at most once (the engine book decides it under the lock), and an ack is sent only after its batch was
merged. SQLite writes run in a worker thread too (``fsync`` must not stall ingest); override changes are
serialised by an asyncio lock so the in-memory table is always applied in the order the file committed it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from anyio import CapacityLimiter, to_thread

from specctl_vllm.controller.core.brain import Brain, IngestRejected, IngestResult
from specctl_vllm.controller.core.overrides import Override, active_overrides
from specctl_vllm.controller.service.answers import AckEncoder, json_bytes, json_safe
from specctl_vllm.controller.service.brain_lock import BrainLock
from specctl_vllm.controller.service.clock import Clock
from specctl_vllm.controller.service.errors import BadInput, parse_json
from specctl_vllm.controller.service.ingest_flow import (
    BytesInFlight,
    FairMerger,
    Pacer,
    engine_id_of,
    parse_batch,
    slices,
)
from specctl_vllm.controller.service.state_text import state_text
from specctl_vllm.controller.service.store import AuditRecord, Store, describe_store_error
from specctl_vllm.kernel.protocol import Policy, SpecConfig, TelemetryBatch

log = logging.getLogger("controller.service")

#: Pause of a scrape's worker thread between two models' rows (lets a waiting ingest take the Brain lock).
SCRAPE_YIELD_S = 0.0005
#: Worker threads for requests' Brain calls (a decision due, a large batch, a read). They serialise on the
#: Brain lock, but a thread first waits for the GIL the busy loop holds (up to the switch interval, 1 ms by default), and
#: with one thread those waits queued up behind each other (load benchmark, docs/reliability.md#load). Their
#: own limiter, so that they never take the threads the store's writes and the scrapes use.
BRAIN_THREADS = 4
#: Bodies up to this size may be merged on the event loop (at most a few ms of CPU, measured in
#: docs/reliability.md); larger ones are parsed and merged in a worker thread.
INLINE_BODY_BYTES = 8 * 1024
#: Decisions up to this size ((category, drafter) pairs x max(k_max, 4), :meth:`Brain.decision_work`) are
#: computed on the loop: 1.3-1.6 ms of CPU measured (4 categories, 1 or 3 drafters, k_max 4), less than a
#: thread's hop costs a busy loop in latency; 8 categories x 3 drafters take 2.3 ms, 60 x 3 at k_max 32 50 ms.
INLINE_DECISION_WORK = 64

T = TypeVar("T")


class Runtime:
    def __init__(self, brain: Brain, store: Store, clock: Clock, overrides: list[Override],
                 snapshot_ts: float | None = None, *, flow: BytesInFlight | None = None,
                 large_share: float = 1.0) -> None:
        self._brain = brain
        self._brain_lock = BrainLock()
        #: bytes of large bodies in flight (checked by the telemetry route before reading, here after parsing)
        self.flow = flow or BytesInFlight(total_limit=4 * 1024 * 1024, engine_limit=4 * 1024 * 1024)
        self._merger = FairMerger(self._brain_lock.acquire_behind_waiters, self._brain_lock.release)
        self._parse_limiter: CapacityLimiter | None = None
        #: the share of wall time a large body's parse may run (:class:`Pacer`)
        self._large_share = large_share
        self._override_lock = asyncio.Lock()
        self.store = store
        self.clock = clock
        self._overrides: dict[str, Override] = {o.category: o for o in overrides}
        self.last_snapshot_ts = snapshot_ts
        self.store_error: str | None = None
        self.internal_errors = 0
        self.client_disconnects = 0
        self._acks = AckEncoder()  # used under the Brain lock only
        self._limiter: CapacityLimiter | None = None
        #: the server's ConnectionPolicy (its telemetry handling time), set by the app's lifespan; None in tests
        self.connections: Any = None
        #: the opt-in telemetry recorder (:mod:`specctl_vllm.controller.service.recorder`), set by the app's lifespan
        self.recorder: Any = None
        self._brain.set_overrides(self._overrides.values())

    # -- the Brain: every call in a worker thread, under its lock ------------------------------------

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._brain_lock:
            return fn(*args)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` under the Brain lock in a worker thread. Not abandoned when the
        request is cancelled (its client went away): a batch is merged whole or not at all."""
        if self._limiter is None:  # built on first use: a limiter belongs to the running event loop
            self._limiter = CapacityLimiter(BRAIN_THREADS)
        return await to_thread.run_sync(self._locked, fn, *args, limiter=self._limiter)

    # -- telemetry and policy ------------------------------------------------------------------------

    async def ingest(self, raw: bytes) -> bytes:
        """Parse and merge one batch's body; the :class:`TelemetryAck` (with the policy tailored to the sending
        engine) as JSON. Raises :class:`BadInput` (400/422 for a body that does not validate, 409/422/429 for a
        batch the Brain refuses), the refusal counted against the engine.

        The common post (a small body, the engine's decision cached or small) is merged and answered on the
        loop, once the lock is free (waited for as a task, never blocking the loop): a worker thread's hop
        costs more than that work (load benchmark, same host and hour: 1.46 ms of CPU per post with every post
        in a thread, 0.93 ms with none). A large body is parsed and merged off the loop, and so is a large
        decision a batch calls for.
        """
        now = self.clock.now()
        if len(raw) > INLINE_BODY_BYTES:
            return await self._ingest_large(raw, now)
        await self._brain_lock.acquire_async()
        try:
            batch, result = self._merge(raw, now)
            if self._brain.decision_work(batch.model_name, batch.spec, now, batch.engine_id) <= INLINE_DECISION_WORK:
                return self._answer(batch, result, now, raw)
        finally:
            self._brain_lock.release()
        return await self._off_loop(self._answer, batch, result, now, raw)

    async def _ingest_large(self, raw: bytes, now: float) -> bytes:
        """Parse without the lock (one parse at a time: its objects are ~14x the body), then merge in slices
        with other engines' batches in turn (:mod:`specctl_vllm.controller.service.ingest_flow`)."""
        if self._parse_limiter is None:
            self._parse_limiter = CapacityLimiter(1)
        try:
            pace = Pacer(self._large_share).pause
            batch = await to_thread.run_sync(parse_batch, raw, pace, limiter=self._parse_limiter)
        except BadInput:
            await self.record_rejected(engine_id_of(raw))
            raise
        with self.flow.engine(batch.engine_id, len(raw)):
            parts: list[TelemetryBatch | None] = list(slices(batch))
            # the steps are held by the parts only, each let go once merged: a batch being merged shrinks
            # slice by slice rather than staying whole (~14x its body) until its last slice
            head = batch if len(parts) == 1 else batch.model_copy(update={"steps": []})
            del batch
            state: dict[str, Any] = {"next": 0, "result": None}

            def step() -> tuple[bool, Any]:
                i = state["next"]
                state["next"] = i + 1
                part, parts[i] = parts[i], None
                assert part is not None
                if i == 0:
                    result = self._admit(part, now)
                    state["result"] = result
                    if result.outcome != "accepted":
                        return True, self._answer(head, result, now, raw)
                else:
                    try:
                        self._brain.ingest_continued(part, now)
                    except IngestRejected as exc:
                        raise BadInput(exc.status, f"telemetry batch refused: {exc.reason}") from None
                if state["next"] == len(parts):
                    return True, self._answer(head, state["result"], now, raw)
                return False, None

            return await self._merger.run(head.engine_id, step)

    async def close_merger(self) -> None:
        await self._merger.close()

    def _admit(self, batch: TelemetryBatch, now: float) -> IngestResult:
        """Merge a parsed batch, a refusal counted against its engine (caller holds the lock)."""
        try:
            return self._brain.ingest(batch, now)
        except IngestRejected as exc:
            self._brain.record_rejected(batch.engine_id)
            raise BadInput(exc.status, f"telemetry batch refused: {exc.reason}") from None

    def _merge(self, raw: bytes, now: float) -> tuple[TelemetryBatch, IngestResult]:
        """Parse and merge a body, a refusal counted against its engine (caller holds the lock)."""
        try:
            batch = parse_json(raw, TelemetryBatch, "telemetry batch")
        except BadInput:
            self._brain.record_rejected(engine_id_of(raw))
            raise
        try:
            return batch, self._brain.ingest(batch, now)
        except IngestRejected as exc:
            self._brain.record_rejected(batch.engine_id)
            raise BadInput(exc.status, f"telemetry batch refused: {exc.reason}") from None

    def _answer(self, batch: TelemetryBatch, result: IngestResult, now: float, raw: bytes) -> bytes:
        """The ack of a merged batch (caller holds the lock); an accepted one's body goes to the recorder."""
        policy = self._brain.policy_for(batch.model_name, batch.spec, now, engine_id=batch.engine_id)
        self._log_decision_error()
        if self.recorder is not None and result.outcome == "accepted":  # a re-sent batch is not recorded twice
            self.recorder.submit(raw)  # a queue append; the writer thread does the rest
        return self._acks.encode(result.outcome, batch.seq, result.gaps, policy)

    def _log_decision_error(self) -> None:
        """Log (once) a decision the Brain could not compute; it served the last good one (caller holds the lock)."""
        failed = self._brain.last_decision_error
        if failed is not None:
            self._brain.last_decision_error = None
            log.error("decision not computable, serving the last good one",
                      extra={"model_name": failed[0], "error": failed[1]})

    async def record_rejected(self, engine_id: str | None) -> None:
        await self._off_loop(self._brain.record_rejected, engine_id)

    async def policy(self, model: str, spec: SpecConfig, etag: Callable[[Policy], str]) -> tuple[Policy, str]:
        """The policy for an engine of this shape, with its ``etag`` (a hash of its JSON, also worked out off
        the loop)."""
        def read(now: float) -> tuple[Policy, str]:
            policy = self._brain.policy_for(model, spec, now)
            self._log_decision_error()
            return policy, etag(policy)

        return await self._off_loop(read, self.clock.now())

    async def categories(self) -> bytes:
        """Every category's view as JSON (a full budget's views are megabytes: encoded off the loop too)."""
        def read(now: float) -> bytes:
            out = [json_safe(view.to_dict()) for view in self._brain.categories(now)]
            self._log_decision_error()
            return json_bytes(out)

        return await self._off_loop(read, self.clock.now())

    async def category(self, name: str, model: str | None) -> dict[str, Any] | None:
        def read(now: float) -> dict[str, Any] | None:
            view = self._brain.category(name, now, model=model)
            self._log_decision_error()
            return None if view is None else json_safe(view.to_dict())

        return await self._off_loop(read, self.clock.now())

    async def engines(self) -> bytes:
        def read(now: float) -> bytes:
            return json_bytes([json_safe(view.to_dict()) for view in self._brain.engines(now)])

        return await self._off_loop(read, self.clock.now())

    def metrics(self) -> Any:
        """The scrape's snapshot, built model by model with the Brain lock let go in between (called from a
        worker thread: an ingest waits for one model's rows at most, not for the scrape)."""
        now = self.clock.now()
        with self._brain_lock:
            models = self._brain.model_names()
        parts = []
        for model in models:
            with self._brain_lock:
                parts.append(self._brain.model_metrics(model, now))
            # threading.Lock is not fair: without a pause this thread would take it straight back and an
            # ingest waiting for it would wait for every model in turn
            time.sleep(SCRAPE_YIELD_S)
        with self._brain_lock:
            snapshot = self._brain.metrics(now, parts)
            self._log_decision_error()
        return snapshot

    def dump(self) -> dict[str, Any]:
        """The learned state (from a worker thread or a test's thread, never the event loop)."""
        with self._brain_lock:
            return self._brain.dump()

    def snapshot_text(self) -> str:
        """The learned state as the snapshot's JSON (:mod:`.state_text`: piece by piece, from a worker thread)."""
        return state_text(self._brain, self._brain_lock)

    def series(self) -> int:
        """The series charged (from a worker thread or a test's thread, never the event loop)."""
        with self._brain_lock:
            return self._brain.series

    # -- the budget: idle eviction and an operator's forget (remembered in the file first) ------------

    async def evict_idle(self) -> list[tuple[str, str]]:
        """Forget what was idle too long; tombstones are written so a restart does not bring it back."""
        now = self.clock.now()
        evicted = await self._off_loop(self._brain.evict_idle, now)
        if evicted:
            await self._write(self.store.record_forgotten, evicted, now)
            log.info("idle state forgotten", extra={"count": len(evicted), "items": [f"{k}:{n}" for k, n in evicted[:20]]})
        return evicted

    async def forget(self, kind: str, name: str, *, actor: str, reason: str) -> int | None:
        """Forget one engine, model or (model, category); the series charged after, or None if it was unknown."""
        now = self.clock.now()

        def drop() -> int | None:
            return self._brain.series if self._brain.forget(kind, name) else None

        series = await self._off_loop(drop)
        if series is not None:
            await self._write(self.store.record_forgotten, [(kind, name)], now)
            log.info("state forgotten", extra={"kind": kind, "forgotten": name, "actor": actor, "reason": reason})
        return series

    # -- overrides (file first, then memory) ---------------------------------------------------------

    def overrides(self) -> list[Override]:
        """Overrides in force now, by category."""
        active = active_overrides(list(self._overrides.values()), self.clock.now())
        return [active[name] for name in sorted(active)]

    async def _apply(self) -> None:
        await self._off_loop(self._brain.set_overrides, list(self._overrides.values()))

    async def set_override(self, override: Override) -> AuditRecord:
        async with self._override_lock:
            record = await self._write(self.store.put_override, override)
            self._overrides[override.category] = override
            await self._apply()
        log.info("override set", extra={"category": override.category, "actor": override.actor,
                                        "audit_id": record.id})
        return record

    async def clear_override(self, category: str, actor: str, reason: str) -> AuditRecord | None:
        async with self._override_lock:
            held = self._overrides.get(category)
            if held is None or not held.active(self.clock.now()):
                return None  # an expired one is already gone for readers; the sweep audits its expiry
            record = await self._write(
                lambda: self.store.delete_override(category, actor=actor, reason=reason, ts=self.clock.now())
            )
            self._overrides.pop(category, None)
            await self._apply()
        if record is not None:
            log.info("override cleared", extra={"category": category, "actor": actor, "audit_id": record.id})
        return record

    async def expire_overrides(self) -> list[AuditRecord]:
        """Drop overrides whose TTL ran out from the file (audited) and from memory."""
        now = self.clock.now()
        if not any(o.expires_at is not None and o.expires_at <= now for o in self._overrides.values()):
            return []
        async with self._override_lock:
            records = await self._write(self.store.expire_overrides, now)
            for record in records:
                self._overrides.pop(record.category, None)
            await self._apply()
        for record in records:
            log.info("override expired", extra={"category": record.category, "audit_id": record.id})
        return records

    # -- snapshots -----------------------------------------------------------------------------------

    async def snapshot(self) -> None:
        """Dump, encode and write the learned state in a worker thread: the event loop never waits on it, and
        an ingest waits for one model's part at most (:meth:`snapshot_text`)."""
        now = self.clock.now()
        await self._write(lambda: self.store.save_snapshot(now, self.snapshot_text()))
        self.last_snapshot_ts = now

    async def check_store(self) -> str:
        """'ok', or the store's current problem; a passing write probe clears the last write's failure."""
        try:
            await to_thread.run_sync(self.store.check_writable)
        except sqlite3.Error as exc:
            return describe_store_error(exc)
        self.store_error = None
        return "ok"

    async def _write(self, fn: Any, *args: Any) -> Any:
        """Run a store write in a worker thread; remember the failure for /readyz, then re-raise."""
        try:
            result = await to_thread.run_sync(fn, *args)
        except Exception as exc:
            self.store_error = describe_store_error(exc)
            raise
        self.store_error = None
        return result
