import sqlite3

import pytest

from specctl_vllm.controller.core.overrides import Override
from specctl_vllm.controller.service.store import SCHEMA_VERSION, Store, StoreError


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "s.db", snapshots_kept=2)
    yield s
    s.close()


def ov(category="code", k=2, created_at=100.0, expires_at=None, **kw) -> Override:
    return Override(category=category, k=k, method=kw.get("method"), off=kw.get("off", False),
                    expires_at=expires_at, reason=kw.get("reason", "test"), actor="alice", created_at=created_at)


def test_pragmas(tmp_path):
    s = Store.open(tmp_path / "p.db")
    conn = s._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    s.close()


def test_put_replace_delete_audited(store):
    first = store.put_override(ov(k=2))
    second = store.put_override(ov(k=3, created_at=101.0))
    cleared = store.delete_override("code", actor="bob", reason="done", ts=102.0)
    assert store.delete_override("code", actor="bob", reason="again", ts=103.0) is None  # nothing, no row
    audit = store.audit()
    assert [a.id for a in audit] == [first.id, second.id, cleared.id] == [1, 2, 3]
    assert [a.action for a in audit] == ["set", "set", "clear"]
    assert audit[0].before is None and audit[0].after["k"] == 2
    assert audit[1].before["k"] == 2 and audit[1].after["k"] == 3
    assert audit[2].before["k"] == 3 and audit[2].after is None and audit[2].actor == "bob"
    assert store.load_overrides() == []


def test_overrides_survive_reopen(tmp_path):
    path = tmp_path / "r.db"
    s = Store.open(path)
    s.put_override(ov("code", k=1, expires_at=500.0))
    s.put_override(ov("prose", k=None, off=True))
    s.close()
    s = Store.open(path)
    assert s.load_overrides() == [ov("code", k=1, expires_at=500.0), ov("prose", k=None, off=True)]
    s.close()


@pytest.mark.parametrize(
    ("expiries", "now", "expired"),
    [
        ({"a": None, "b": 50.0, "c": 200.0}, 100.0, ["b"]),
        ({"a": 100.0}, 100.0, ["a"]),  # expires_at is exclusive: at now == expires_at it is gone
        ({"a": 100.0}, 99.9, []),
        ({}, 1.0, []),
    ],
)
def test_expire(store, expiries, now, expired):
    for name, at in expiries.items():
        store.put_override(ov(name, expires_at=at))
    records = store.expire_overrides(now)
    assert [r.category for r in records] == expired
    assert all(r.action == "expire" and r.after is None and r.actor == "specctl" for r in records)
    assert sorted(o.category for o in store.load_overrides()) == sorted(set(expiries) - set(expired))


def test_audit_paging_and_filter(store):
    for i in range(5):
        store.put_override(ov("a" if i % 2 else "b", k=i, created_at=float(i)))
    assert [r.id for r in store.audit(limit=2)] == [1, 2]
    assert [r.id for r in store.audit(after_id=2, limit=10)] == [3, 4, 5]
    assert [r.id for r in store.audit(category="a")] == [2, 4]


def test_failed_transaction_leaves_no_audit_hole(store, monkeypatch):
    store.put_override(ov("a"))
    bad = ov("b")
    object.__setattr__(bad, "reason", None)  # violates NOT NULL in the override row
    with pytest.raises(sqlite3.IntegrityError):
        store.put_override(bad)
    store.put_override(ov("c"))
    assert [r.id for r in store.audit()] == [1, 2]
    assert [o.category for o in store.load_overrides()] == ["a", "c"]


def test_snapshots_kept_newest_first(store):
    for i in range(4):
        store.save_snapshot(float(i), {"n": i})
    assert [data["n"] for _, _, data in store.latest_snapshots()] == [3, 2]


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "n.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store.open(path)


def test_not_a_database(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        Store.open(path)
