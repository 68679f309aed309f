"""SQLite persistence: operator overrides, an append-only audit log, and learned-state snapshots.

One file in WAL mode with ``synchronous=FULL``: a committed override or audit row is on disk before the
call returns, so the HTTP layer can answer 2xx only after :meth:`Store.put_override` returned, and a
``kill -9`` right after the answer loses nothing. An override change and its audit row are one
transaction, so the audit log has no holes and no entry without its effect (``AUTOINCREMENT`` ids are
rolled back with the transaction).

Snapshots of the learned state are written every ``snapshot_interval_s`` and at clean shutdown; a crash
loses at most one interval of learning. The newest ``snapshots_kept`` are kept.

The class is synchronous and guarded by a lock; the service calls it from a worker thread so the event
loop never waits on ``fsync``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from specctl_vllm.controller.core.overrides import Override

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS overrides (
    category   TEXT PRIMARY KEY,
    k          INTEGER,
    method     TEXT,
    off        INTEGER NOT NULL,
    expires_at REAL,
    reason     TEXT NOT NULL,
    actor      TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    ts       REAL NOT NULL,
    actor    TEXT NOT NULL,
    action   TEXT NOT NULL,
    category TEXT NOT NULL,
    reason   TEXT NOT NULL,
    before   TEXT,
    after    TEXT
);
CREATE INDEX IF NOT EXISTS audit_category ON audit (category, id);
CREATE TABLE IF NOT EXISTS snapshots (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    ts   REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantined_snapshots (
    id     INTEGER PRIMARY KEY,
    ts     REAL NOT NULL,
    data   TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS forgotten (
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    ts   REAL NOT NULL,
    PRIMARY KEY (kind, name)
);
"""

#: Tables and indexes of :data:`_SCHEMA`: a store that has them all needs no write to open.
SCHEMA_OBJECTS = frozenset({"overrides", "audit", "audit_category", "snapshots", "quarantined_snapshots", "forgotten"})

#: Actor recorded when the service itself removes an expired override.
SYSTEM_ACTOR = "specctl"

T = TypeVar("T")


def describe_store_error(exc: BaseException) -> str:
    """The store's failure in words an operator acts on (disk full, read-only, locked), with SQLite's text."""
    text = str(exc)
    lowered = text.lower()
    for needle, what in (("disk is full", "disk full"), ("readonly", "read-only store"),
                         ("read-only", "read-only store"), ("locked", "locked by another process"),
                         ("disk i/o", "disk I/O error")):
        if needle in lowered:
            return f"{what} ({type(exc).__name__}: {text})"
    return f"{type(exc).__name__}: {text}"


class StoreError(RuntimeError):
    """The file cannot be used (newer schema, not a database, unwritable)."""


@dataclass(frozen=True)
class AuditRecord:
    id: int
    ts: float
    actor: str
    action: str
    category: str
    reason: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None


def _override_json(override: Override | None) -> str | None:
    return None if override is None else json.dumps(asdict(override), sort_keys=True)


def _override_from_row(row: sqlite3.Row) -> Override:
    return Override(
        category=row["category"],
        k=row["k"],
        method=row["method"],
        off=bool(row["off"]),
        expires_at=row["expires_at"],
        reason=row["reason"],
        actor=row["actor"],
        created_at=row["created_at"],
    )


def _audit_from_row(row: sqlite3.Row) -> AuditRecord:
    return AuditRecord(
        id=row["id"],
        ts=row["ts"],
        actor=row["actor"],
        action=row["action"],
        category=row["category"],
        reason=row["reason"],
        before=json.loads(row["before"]) if row["before"] else None,
        after=json.loads(row["after"]) if row["after"] else None,
    )


class Store:
    def __init__(self, conn: sqlite3.Connection, snapshots_kept: int) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._snapshots_kept = snapshots_kept

    @classmethod
    def open(cls, path: Path, *, busy_timeout_ms: int = 5000, snapshots_kept: int = 3) -> Store:
        try:
            if path.parent and not path.parent.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT) below.
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = FULL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                conn.close()
                raise StoreError(f"{path}: schema version {version} is newer than this specctl ({SCHEMA_VERSION})")
            # Write only what is missing: a store on a full disk (or a read-only one) with its schema in place
            # still opens, serves its overrides and snapshots, and refuses writes one by one (503), instead of
            # the controller refusing to start.
            present = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
            if not SCHEMA_OBJECTS <= present:
                conn.executescript(_SCHEMA)
            if version != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: {exc}") from exc
        if str(mode).lower() != "wal":
            raise StoreError(f"{path}: WAL journal mode not available (got {mode})")
        return cls(conn, snapshots_kept)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def ping(self) -> None:
        with self._lock:
            self._conn.execute("SELECT 1").fetchone()

    # -- overrides and audit -------------------------------------------------------------------------

    def load_overrides(self) -> list[Override]:
        with self._lock:
            rows = self._conn.execute("SELECT * FROM overrides ORDER BY category").fetchall()
        return [_override_from_row(r) for r in rows]

    def _begin(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def _current(self, category: str) -> Override | None:
        row = self._conn.execute("SELECT * FROM overrides WHERE category = ?", (category,)).fetchone()
        return _override_from_row(row) if row else None

    def _audit(self, ts: float, actor: str, action: str, category: str, reason: str,
               before: Override | None, after: Override | None) -> AuditRecord:
        cur = self._conn.execute(
            "INSERT INTO audit (ts, actor, action, category, reason, before, after) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ts, actor, action, category, reason, _override_json(before), _override_json(after)),
        )
        row = self._conn.execute("SELECT * FROM audit WHERE id = ?", (cur.lastrowid,)).fetchone()
        return _audit_from_row(row)

    def _transaction(self, body: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            conn = self._begin()
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (disk full, I/O error): a second ROLLBACK would raise
                # "cannot rollback - no transaction is active" and hide the real reason
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise
            return result

    def check_writable(self) -> None:
        """Take the write lock and let it go (raises the store's error: locked, read-only, I/O)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("ROLLBACK")

    def put_override(self, override: Override) -> AuditRecord:
        """Insert or replace the category's override and audit it; durable when this returns."""

        def body(conn: sqlite3.Connection) -> AuditRecord:
            before = self._current(override.category)
            conn.execute(
                "INSERT OR REPLACE INTO overrides (category, k, method, off, expires_at, reason, actor, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (override.category, override.k, override.method, int(override.off), override.expires_at,
                 override.reason, override.actor, override.created_at),
            )
            return self._audit(override.created_at, override.actor, "set", override.category, override.reason,
                               before, override)

        return self._transaction(body)

    def delete_override(self, category: str, *, actor: str, reason: str, ts: float) -> AuditRecord | None:
        """Remove the category's override and audit it; ``None`` (and no audit row) when there was none."""

        def body(conn: sqlite3.Connection) -> AuditRecord | None:
            before = self._current(category)
            if before is None:
                return None
            conn.execute("DELETE FROM overrides WHERE category = ?", (category,))
            return self._audit(ts, actor, "clear", category, reason, before, None)

        return self._transaction(body)

    def expire_overrides(self, now: float) -> list[AuditRecord]:
        """Delete overrides whose TTL ran out, one ``expire`` audit row each."""

        def body(conn: sqlite3.Connection) -> list[AuditRecord]:
            rows = conn.execute(
                "SELECT * FROM overrides WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY category", (now,)
            ).fetchall()
            records = []
            for row in rows:
                expired = _override_from_row(row)
                conn.execute("DELETE FROM overrides WHERE category = ?", (expired.category,))
                records.append(self._audit(now, SYSTEM_ACTOR, "expire", expired.category, "ttl elapsed", expired, None))
            return records

        return self._transaction(body)

    def audit(self, *, limit: int = 100, after_id: int = 0, category: str | None = None) -> list[AuditRecord]:
        """Audit rows in id order, after ``after_id`` (for paging), optionally for one category."""
        query = "SELECT * FROM audit WHERE id > ?"
        params: list[Any] = [after_id]
        if category is not None:
            query += " AND category = ?"
            params.append(category)
        query += " ORDER BY id LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._conn.execute(query, params).fetchall()
        return [_audit_from_row(r) for r in rows]

    # -- learned-state snapshots ---------------------------------------------------------------------

    def save_snapshot(self, ts: float, data: dict[str, Any] | str) -> int:
        """``data``: the state, or its JSON text already encoded (see :meth:`Runtime.snapshot_text`)."""
        text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))

        def body(conn: sqlite3.Connection) -> int:
            cur = conn.execute("INSERT INTO snapshots (ts, data) VALUES (?, ?)", (ts, text))
            conn.execute(
                "DELETE FROM snapshots WHERE id NOT IN (SELECT id FROM snapshots ORDER BY id DESC LIMIT ?)",
                (self._snapshots_kept,),
            )
            # a tombstone older than every kept snapshot has nothing left to keep from coming back
            conn.execute("DELETE FROM forgotten WHERE ts < (SELECT min(ts) FROM snapshots)")
            return int(cur.lastrowid or 0)

        return self._transaction(body)

    def latest_snapshots(self) -> list[tuple[int, float, Any]]:
        """Kept snapshots as (id, ts, data), newest first (a caller falls back to an older one if the newest
        cannot load); data is None where the stored text is not JSON."""
        with self._lock:
            rows = self._conn.execute("SELECT id, ts, data FROM snapshots ORDER BY id DESC").fetchall()
        out: list[tuple[int, float, Any]] = []
        for row in rows:
            try:
                data = json.loads(row["data"])
            except (ValueError, RecursionError):
                data = None
            out.append((int(row["id"]), float(row["ts"]), data))
        return out

    def quarantine_snapshot(self, snapshot_id: int, reason: str, *, keep: bool = False) -> None:
        """Copy a snapshot into ``quarantined_snapshots`` (for inspection) and, unless ``keep``, remove it."""

        def body(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR REPLACE INTO quarantined_snapshots (id, ts, data, reason) "
                         "SELECT id, ts, data, ? FROM snapshots WHERE id = ?", (reason[:500], snapshot_id))
            if not keep:
                conn.execute("DELETE FROM snapshots WHERE id = ?", (snapshot_id,))

        self._transaction(body)

    def quarantined(self) -> list[tuple[int, float, str]]:
        with self._lock:
            rows = self._conn.execute("SELECT id, ts, reason FROM quarantined_snapshots ORDER BY id").fetchall()
        return [(int(r["id"]), float(r["ts"]), str(r["reason"])) for r in rows]

    # -- what an operator or the idle sweep evicted (a restart must not bring it back) -----------------

    def record_forgotten(self, items: list[tuple[str, str]], ts: float) -> None:
        """Remember evicted (kind, name) pairs: state a snapshot still holds for them is dropped on load."""

        def body(conn: sqlite3.Connection) -> None:
            conn.executemany("INSERT OR REPLACE INTO forgotten (kind, name, ts) VALUES (?, ?, ?)",
                             [(k, n, ts) for k, n in items])

        if items:
            self._transaction(body)

    def forgotten(self) -> list[tuple[str, str, float]]:
        with self._lock:
            rows = self._conn.execute("SELECT kind, name, ts FROM forgotten").fetchall()
        return [(str(r["kind"]), str(r["name"]), float(r["ts"])) for r in rows]
