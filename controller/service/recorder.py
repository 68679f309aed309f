"""Opt-in telemetry recorder: every batch the controller ingests, as gzip JSON lines, bounded on disk.

Off unless ``SPECCTL_RECORD_DIR`` (or ``specctl serve --record-dir``) names a folder. Then each accepted
:class:`~specctl_vllm.kernel.protocol.TelemetryBatch` is appended, one JSON object per line, to
``telemetry-<UTC time>-<n>.jsonl.gz`` in that folder -- the input ``specctl replay`` and ``specctl report``
read (a folder works as their argument). A file is closed and a new one started once it holds
``SPECCTL_RECORD_FILE_BYTES`` compressed bytes; after each rotation the oldest files are deleted until the
folder's recordings fit in ``SPECCTL_RECORD_MAX_BYTES``.

The ingest path only appends the accepted body's own JSON bytes to an in-memory queue bounded in batches
(``SPECCTL_RECORD_QUEUE_BATCHES``) and in bytes (``SPECCTL_RECORD_QUEUE_BYTES``); a writer thread compresses and
writes. The queue holds bytes, not the parsed batch: a parsed batch takes ~14x its body (a 4 MB flood batch is
52 MB of objects), and queued parsed batches waiting for a writer slowed by a full disk took the server past
256 MB (soak, docs/reliability.md#soak); re-serialising them also held the GIL the engines' posts need. A full
queue drops the batch and counts it (``specctl_recorder_dropped_total``): recording never slows ingest down or
blocks it. The stream is compressed at :data:`COMPRESS_LEVEL` 6 (zlib's and the gzip tool's default), not
gzip's 9: 9 cost 4-6x the CPU for files 15-20 % smaller (a soak's 4 MB batch 0.52 s against 0.08 s; at 9 the
compression was about a tenth of the controller's CPU samples in a soak). The writer flushes the gzip stream at
least every ``SPECCTL_RECORD_FLUSH_S`` seconds, so a controller killed with ``kill -9`` leaves a readable file that lacks at
most that much (the readers keep the complete lines of a file cut short); a clean shutdown closes the file.
"""

from __future__ import annotations

import gzip
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from specctl_vllm.controller.service.settings import RecordSettings

log = logging.getLogger("controller.service.recorder")

FILE_RE = re.compile(r"^telemetry-(\d{8}T\d{6}Z)-(\d{6})\.jsonl\.gz$")


# -- pure helpers -----------------------------------------------------------------------------------------------


#: zlib level of the recordings (see the module's docstring); the readers take any level.
COMPRESS_LEVEL = 6

#: A gzip member's header for the names written here: a file no larger holds no batch.
GZIP_HEADER_BYTES = 64


def file_name(now: float, index: int) -> str:
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"telemetry-{stamp}-{index:06d}.jsonl.gz"


def to_delete(files: Sequence[tuple[str, int]], max_bytes: int, keep: str | None = None) -> list[str]:
    """Oldest-first names to delete so the total size fits ``max_bytes``; never ``keep`` (the open file)."""
    total = sum(size for _, size in files)
    out = []
    for name, size in sorted(files):
        if total <= max_bytes:
            break
        if name == keep:
            continue
        out.append(name)
        total -= size
    return out


def json_line(body: bytes) -> bytes:
    """A validated JSON body as one line: a CR or LF byte in valid JSON is whitespace (inside a string it must be
    escaped), so turning it into a space keeps the document and makes it one line of the recording."""
    return body.replace(b"\r", b" ").replace(b"\n", b" ") + b"\n"


@dataclass
class QueueBudget:
    """Batches and bytes queued for the writer; ``admit`` says whether one more of ``size`` bytes fits. The
    producers (the loop and worker threads) and the writer thread share it under its lock."""

    max_batches: int
    max_bytes: int
    batches: int = 0
    bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admit(self, size: int) -> bool:
        with self._lock:
            if self.batches + 1 > self.max_batches or (self.batches and self.bytes + size > self.max_bytes):
                return False
            self.batches += 1
            self.bytes += size
            return True

    def done(self, size: int) -> None:
        with self._lock:
            self.batches -= 1
            self.bytes -= size


def next_index(names: Sequence[str]) -> int:
    """The index after the highest one of the recorder's files already in the folder."""
    indices = [int(m.group(2)) for m in (FILE_RE.match(n) for n in names) if m]
    return max(indices, default=-1) + 1


@dataclass
class RecorderStats:
    batches: int = 0
    dropped: int = 0
    files: int = 0
    bytes_on_disk: int = 0
    errors: int = 0
    #: batches lost to a failed write: taken from the queue, never on disk
    lost: int = 0


class Recorder:
    """See the module docstring. ``submit`` is thread-safe and never blocks."""

    _STOP = object()

    def __init__(self, settings: RecordSettings, clock: Callable[[], float] = time.time) -> None:
        if settings.record_dir is None:
            raise ValueError("Recorder needs record_dir")
        self.settings = settings
        self.folder = Path(settings.record_dir)
        self.clock = clock
        self.stats = RecorderStats()
        # unbounded as a queue: the budget bounds it (batches and bytes) before anything is put
        self._queue: queue.Queue = queue.Queue()
        self.budget = QueueBudget(settings.record_queue_batches, settings.record_queue_bytes)
        self._thread: threading.Thread | None = None
        self._file: gzip.GzipFile | None = None
        self._raw = None
        self._name: str | None = None
        self._index = 0
        self._warned_drop = False
        self._unflushed = 0  # batches written into the gzip stream since its last successful flush

    # -- producer side (the ingest path) ----------------------------------------------------------------------

    def submit(self, body: bytes) -> None:
        """Queue an accepted batch's JSON body (the bytes the engine sent, validated) for the writer."""
        if self.budget.admit(len(body)):
            self._queue.put_nowait(body)
        else:
            self.stats.dropped += 1
            if not self._warned_drop:
                self._warned_drop = True
                log.warning("telemetry recorder queue full: dropping batches (counted in "
                            "specctl_recorder_dropped_total)", extra={"record_dir": str(self.folder)})

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._index = next_index([p.name for p in self.folder.iterdir()])
        self._prune()  # the cap may have been lowered since the last run
        self._thread = threading.Thread(target=self._run, name="specctl-recorder", daemon=True)
        self._thread.start()
        log.info("telemetry recorder on", extra={"record_dir": str(self.folder),
                                                 "max_bytes": self.settings.record_max_bytes})

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the file (a complete gzip), stop the thread."""
        if self._thread is None:
            return
        self._queue.put(self._STOP)
        self._thread.join(timeout)
        self._thread = None

    # -- writer thread -----------------------------------------------------------------------------------------

    def _run(self) -> None:
        flush_every = self.settings.record_flush_s
        last_flush = time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=flush_every)
            except queue.Empty:
                item = None
            if item is self._STOP:
                self._close()
                return
            try:
                if item is not None:
                    self._write(json_line(item))
                if self._file is not None and time.monotonic() - last_flush >= flush_every:
                    self._flush()
                    last_flush = time.monotonic()
            except OSError as exc:
                self.stats.errors += 1
                self.stats.lost += self._unflushed + (item is not None and self._file is None)
                self._unflushed = 0
                if self.stats.errors == 1:
                    log.error("telemetry recorder cannot write; batches are lost until it can (counted in "
                              "specctl_recorder_lost_total)", extra={"record_dir": str(self.folder), "error": str(exc)})
                self._close(failed=True)
            finally:
                if item is not None:  # counted until written: the budget bounds what the writer holds too
                    self.budget.done(len(item))
                    item = None

    def _write(self, line: bytes) -> None:
        if self._file is None:
            self._open()
        self._unflushed += 1
        self._file.write(line)
        if self._raw.tell() >= self.settings.record_file_bytes:
            self._close()
            self._prune()

    def _flush(self) -> None:
        """Flush the gzip stream and the file; only then do its batches count as written."""
        self._file.flush()
        self._raw.flush()
        self.stats.batches += self._unflushed
        self._unflushed = 0

    def _open(self) -> None:
        self._name = file_name(self.clock(), self._index)
        self._index += 1
        self._raw = open(self.folder / self._name, "ab")  # noqa: SIM115 -- closed in _close
        self._file = gzip.GzipFile(filename=self._name[: -len(".gz")], mode="wb", fileobj=self._raw, mtime=0,
                                   compresslevel=COMPRESS_LEVEL)
        self.stats.files += 1

    def _close(self, failed: bool = False) -> None:
        if self._file is not None:
            try:
                if not failed:
                    self._file.close()
                    self._raw.flush()
                    self.stats.batches += self._unflushed
                    self._unflushed = 0
            except OSError:
                self.stats.errors += 1
                self.stats.lost += self._unflushed
                self._unflushed = 0
                failed = True
            finally:
                try:
                    self._raw.close()
                except OSError:
                    failed = True
            if failed:
                self._drop_if_empty()
        self._file = self._raw = None
        self._refresh_disk_usage()

    def _drop_if_empty(self) -> None:
        """A file a failed write left without a byte of data (a full disk) is removed, not left behind."""
        if self._name is None:
            return
        path = self.folder / self._name
        try:
            if path.stat().st_size <= GZIP_HEADER_BYTES:
                path.unlink()
                self.stats.files -= 1
        except OSError:
            pass

    def _sizes(self) -> list[tuple[str, int]]:
        out = []
        for p in self.folder.iterdir():
            if FILE_RE.match(p.name):
                try:
                    out.append((p.name, p.stat().st_size))
                except OSError:
                    continue
        return out

    def _prune(self) -> None:
        for name in to_delete(self._sizes(), self.settings.record_max_bytes, keep=self._name if self._file else None):
            try:
                (self.folder / name).unlink()
            except OSError:
                self.stats.errors += 1
        self._refresh_disk_usage()

    def _refresh_disk_usage(self) -> None:
        try:
            self.stats.bytes_on_disk = sum(size for _, size in self._sizes())
        except OSError:
            pass
