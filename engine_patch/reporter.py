"""The reporter thread: posts telemetry to the controller and installs the policy it answers with.

Loop (a daemon thread in the EngineCore process; the engine loop never waits on it):

1. every ``report_interval_s``, drain up to ``batch_max_steps`` rows from the :class:`StepQueue` into a
   :class:`~specctl_vllm.kernel.protocol.TelemetryBatch` with the next ``seq`` (an empty batch is a heartbeat that
   also fetches the policy);
2. ``POST {controller}/v1/telemetry`` with the ingest token, short timeouts;
3. a valid :class:`~specctl_vllm.kernel.protocol.TelemetryAck` for that ``seq`` → install its policy (validated against
   the engine's limits in :mod:`specctl_vllm.engine_patch.policy_table`), next ``seq``;
4. unreachable, timeout, 5xx, 401/403/408/429, or an answer that is not a valid ack for this seq → keep the
   *same* batch (same seq: the controller de-duplicates a batch it did receive) and retry after an
   exponential backoff (``interval * 2^failures``, capped at ``backoff_max_s``). Meanwhile rows keep queueing;
   beyond the queue's capacity the oldest are dropped and counted in ``dropped_steps``;
5. any other 4xx: the controller refuses this batch for good; it is dropped (counted) so that one bad batch
   cannot block the stream;
6. 429 or 503 with ``Retry-After``: the next try waits at least that long (up to ``backoff_max_s``). A batch
   refused with 429 :data:`TRIM_AFTER_REFUSALS` times is cut to half its steps (the rest counted in
   ``dropped_steps``), and one refused :data:`DROP_AFTER_REFUSALS` times is dropped (counted), so a batch the
   controller keeps refusing never blocks the stream.

The installed policy expires ``ttl_s`` after receipt on the engine's monotonic clock, so a controller that
stops answering (or answers garbage) puts the engine back on its static config by itself; the next valid
ack re-attaches it.

The thread shares the EngineCore process's GIL with the engine loop. A post is about 1 ms of Python (building
the batch, httpx, validating the ack, building the table): held in one stretch, it delays an engine loop that
wants the GIL back by the rest of that stretch, and an engine whose host is the bottleneck (the loop gives the
GIL up only briefly while it waits for the device) loses about that much time per post. So the reporter gives
the GIL up between the phases of a post, and every :data:`YIELD_EVERY_ROWS` rows while it builds a batch: a
waiting engine loop takes it at once, and the reporter goes on in the loop's next wait (``python -m bench
reporter_gil``: a host-bound loop ran 1.1 % slower beside the reporter posting in one stretch, 0.2 % with the
pauses).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import ValidationError

from specctl_vllm.engine_patch.policy_table import PolicyHolder
from specctl_vllm.engine_patch.settings import EngineSettings
from specctl_vllm.engine_patch.telemetry import StepQueue, StepRow, row_to_wire
from specctl_vllm.kernel import protocol

# Under "vllm.": in a vLLM process the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.specctl.reporter")

#: Statuses after which the same batch is retried (the controller may accept it later).
RETRY_STATUSES = frozenset({401, 403, 408, 425, 429})
#: 429 refusals of one batch after which it is cut to half its steps, and after which it is dropped.
TRIM_AFTER_REFUSALS = 2
DROP_AFTER_REFUSALS = 4
#: Rows serialised between two pauses while a batch is built (a row is ~10 us of Python; a batch after an outage
#: holds up to ``batch_max_steps`` of them).
YIELD_EVERY_ROWS = 32


@dataclass(frozen=True, slots=True)
class Identity:
    engine_id: str
    boot_id: str
    model_name: str
    spec: protocol.SpecConfig


@dataclass(slots=True)
class ReporterCounters:
    posts: int = 0
    acked: int = 0
    duplicates: int = 0
    failures: int = 0
    rejected_batches: int = 0
    garbage_answers: int = 0
    policies_installed: int = 0
    trimmed_steps: int = 0
    dropped_batches: int = 0


class Reporter:
    def __init__(
        self,
        settings: EngineSettings,
        queue: StepQueue,
        holder: PolicyHolder,
        identity: Identity,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        pause: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.holder = holder
        self.identity = identity
        self.counters = ReporterCounters()
        self._clock = clock
        self._wall_clock = wall_clock
        # pause(0) gives the GIL up (a waiting engine loop takes it at once) and comes back in its next wait
        self._pause = pause
        self._client = client or make_client(settings)
        # defaults left out: a field added to the spec later (full_cuda_graphs) reaches a controller older than
        # the patch only when it says something, so engines can be upgraded before their controller
        self._spec = identity.spec.model_dump(exclude_defaults=True)
        self._seq = 0
        self._pending: dict[str, Any] | None = None
        self._consecutive_failures = 0
        self._refusals = 0  # 429s of the pending batch
        self._retry_after = 0.0  # seconds the controller asked to wait before the next try
        self._attached = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one round trip (synchronous; the thread calls it, tests call it directly) --------------------

    def build_batch(self) -> dict[str, Any]:
        rows = self.queue.drain(self.settings.batch_max_steps)
        return {
            "protocol": protocol.PROTOCOL_VERSION,
            "engine_id": self.identity.engine_id,
            "boot_id": self.identity.boot_id,
            "model_name": self.identity.model_name,
            "seq": self._seq,
            "sent_at": self._wall_clock(),
            "spec": self._spec,
            "policy_version": self.holder.applied_version(self._clock()),
            "dropped_steps": self.queue.dropped,
            "steps": self._rows_to_wire(rows),
        }

    def _rows_to_wire(self, rows: list[StepRow]) -> list[dict[str, Any]]:
        wire = []
        for i, row in enumerate(rows, 1):
            wire.append(row_to_wire(row))
            if i % YIELD_EVERY_ROWS == 0:
                self._pause(0)
        return wire

    def run_once(self) -> str:
        """Post the pending batch (building one if none is pending). Returns the outcome's name."""
        if self._pending is None:
            self._pending = self.build_batch()
            self._pause(0)
        batch = self._pending
        self.counters.posts += 1
        try:
            response = self._client.post(self.settings.telemetry_url, json=batch)
        except httpx.HTTPError as exc:
            return self._failed(f"{type(exc).__name__}: {exc}")
        self._pause(0)
        status = response.status_code
        self._retry_after = _retry_after(response) if status in (429, 503) else 0.0
        if status == 429:
            return self._refused(batch)
        if status == 200:
            return self._answered(batch, response)
        if 400 <= status < 500 and status not in RETRY_STATUSES:
            self.counters.rejected_batches += 1
            logger.warning("specctl: controller refused telemetry batch seq=%d (%d): %.300s",
                           batch["seq"], status, response.text)
            self._advance()
            return "rejected"
        return self._failed(f"HTTP {status}")

    def _answered(self, batch: dict[str, Any], response: httpx.Response) -> str:
        try:
            ack = protocol.TelemetryAck.model_validate_json(response.content)
        except ValidationError as exc:
            self.counters.garbage_answers += 1
            return self._failed(f"invalid ack ({exc.error_count()} errors)")
        if ack.seq != batch["seq"]:
            self.counters.garbage_answers += 1
            return self._failed(f"ack for seq {ack.seq}, expected {batch['seq']}")
        self._pause(0)
        self.holder.install(ack.policy, self._clock())
        self.counters.policies_installed += 1
        if ack.outcome == "duplicate":
            self.counters.duplicates += 1
        else:
            self.counters.acked += 1
        if not self._attached:
            logger.info("specctl: attached to controller %s (policy v%d, ttl %.1f s)",
                        self.settings.controller_url, ack.policy.version, ack.policy.ttl_s)
            self._attached = True
        self._advance()
        return ack.outcome

    def _refused(self, batch: dict[str, Any]) -> str:
        """A 429: retry, then trim, then drop (counted): a refused batch never blocks the stream."""
        self._refusals += 1
        if self._refusals >= DROP_AFTER_REFUSALS:
            self.counters.dropped_batches += 1
            self.counters.trimmed_steps += len(batch["steps"])
            logger.warning("specctl: controller refused telemetry batch seq=%d %d times; dropped",
                           batch["seq"], self._refusals)
            self._advance()
            self._consecutive_failures = 1  # still wait before the next post
            return "dropped"
        if self._refusals >= TRIM_AFTER_REFUSALS and len(batch["steps"]) > 1:
            keep = len(batch["steps"]) // 2
            self.counters.trimmed_steps += len(batch["steps"]) - keep
            batch["dropped_steps"] = batch.get("dropped_steps", 0) + len(batch["steps"]) - keep
            batch["steps"] = batch["steps"][-keep:]  # the newest steps say most about now
        return self._failed("HTTP 429")

    def _advance(self) -> None:
        self._refusals = 0
        self._pending = None
        self._seq += 1
        self._consecutive_failures = 0

    def _failed(self, reason: str) -> str:
        self.counters.failures += 1
        self._consecutive_failures += 1
        if self._attached or self.counters.failures == 1:
            logger.warning("specctl: controller %s not usable (%s); retrying with backoff, the engine falls back "
                           "to its static speculative config when the policy expires",
                           self.settings.controller_url, reason)
            self._attached = False
        return "retry"

    def next_delay(self) -> float:
        interval = self.settings.report_interval_s
        if self._consecutive_failures == 0:
            return interval
        exponent = min(self._consecutive_failures, 30)
        backoff = max(interval * (2.0 ** exponent), self._retry_after)
        return min(self.settings.backoff_max_s, backoff)

    # -- thread ----------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="specctl-reporter", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.next_delay()):
            self._run_guarded()

    def _run_guarded(self) -> None:
        try:
            self.run_once()
        except Exception:  # the reporter must outlive any bug; the engine never depends on it
            self.counters.failures += 1
            self._consecutive_failures += 1
            logger.exception("specctl: reporter error")

    def stop(self, flush: bool = True, timeout: float = 2.0) -> None:
        """Stop the thread; with ``flush``, one last post of what is queued (bounded by the timeouts)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if flush and (self._pending is not None or len(self.queue)) and self._consecutive_failures == 0:
            self._run_guarded()
        self._client.close()


def _retry_after(response: httpx.Response) -> float:
    """``Retry-After`` in seconds (the delay form; a date or garbage counts as none)."""
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return 0.0
    return seconds if 0 <= seconds < 3600 else 0.0


def make_client(settings: EngineSettings) -> httpx.Client:
    headers = {"user-agent": "specctl-engine-patch"}
    if settings.ingest_token is not None:
        headers["authorization"] = f"Bearer {settings.ingest_token.get_secret_value()}"
    timeout = httpx.Timeout(settings.request_timeout_s, connect=settings.connect_timeout_s)
    # trust_env=False: proxy variables meant for the model download must not reroute engine -> controller.
    return httpx.Client(timeout=timeout, headers=headers, trust_env=False)
