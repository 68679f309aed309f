"""kill -9 the controller while overrides are written in a loop; nothing acknowledged may be lost.

Writers run in threads, each owning its own categories and sending one request at a time, so for every
category the order of writes is known and at most one write per writer is in flight when the process
dies. After each crash the controller is restarted on the same SQLite file and must show:
  * every category in the state of its last acknowledged write, or of the one write in flight;
  * an audit row for every acknowledged write (same id, action, category, reason), ids 1..N with no
    hole, and no row beyond the acknowledged writes except the in-flight ones.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest

from bench.support.specctl_serve import SpecctlServe

WRITERS = 4
CATEGORIES_PER_WRITER = 3
CRASHES = 3
MIN_WRITES_PER_CRASH = 40


@dataclass
class Write:
    category: str
    action: str  # "set" | "clear"
    reason: str
    k: int | None
    acked_audit_id: int | None = None


@dataclass
class Writer:
    index: int
    acked: list[Write] = field(default_factory=list)
    in_flight: Write | None = None
    n: int = 0

    def categories(self) -> list[str]:
        return [f"w{self.index}-c{j}" for j in range(CATEGORIES_PER_WRITER)]

    def run(self, url: str, token: str, stop: threading.Event, rng: random.Random) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=5) as client:
            while not stop.is_set():
                write = self._next(rng)
                self.in_flight = write
                try:
                    if write.action == "set":
                        response = client.put(f"/v1/overrides/{write.category}",
                                              json={"k": write.k, "reason": write.reason, "actor": "durability"})
                    else:
                        response = client.delete(f"/v1/overrides/{write.category}",
                                                 params={"actor": "durability", "reason": write.reason})
                except httpx.HTTPError:
                    return  # the process died: this write stays "in flight" (unknown outcome)
                if response.status_code == 404 and write.action == "clear":
                    self.in_flight = None  # nothing to clear, nothing written
                    continue
                assert response.status_code == 200, response.text
                write.acked_audit_id = response.json()["audit"]["id"]
                self.acked.append(write)
                self.in_flight = None

    def _next(self, rng: random.Random) -> Write:
        self.n += 1
        category = rng.choice(self.categories())
        reason = f"writer{self.index}-op{self.n}"
        if rng.random() < 0.25:
            return Write(category, "clear", reason, None)
        return Write(category, "set", reason, rng.randint(0, 8))


def _expected_states(writer: Writer) -> dict[str, set[int | None]]:
    """Per category, the acceptable k after restart (None = no override)."""
    last: dict[str, int | None] = {c: None for c in writer.categories()}
    for w in writer.acked:
        last[w.category] = w.k if w.action == "set" else None
    allowed = {c: {k} for c, k in last.items()}
    if writer.in_flight is not None:
        w = writer.in_flight
        allowed[w.category].add(w.k if w.action == "set" else None)
    return allowed


def _audit(url: str) -> list[dict]:
    rows, after = [], 0
    while True:
        page = httpx.get(url + "/v1/audit", params={"after_id": after, "limit": 1000}).json()
        if not page:
            return rows
        rows += page
        after = page[-1]["id"]


@pytest.fixture
def controller(tmp_path):
    proc = SpecctlServe(tmp_path, env={"SPECCTL_LOG_LEVEL": "warning"}).start()
    yield proc
    proc.stop()


def test_acknowledged_overrides_survive_kill9(controller):
    rng = random.Random(6)
    writers = [Writer(i) for i in range(WRITERS)]
    total_acked = 0
    for crash in range(CRASHES):
        stop = threading.Event()
        threads = [threading.Thread(target=w.run, args=(controller.url, controller.admin_token, stop,
                                                        random.Random(rng.random())))
                   for w in writers]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while sum(len(w.acked) for w in writers) < total_acked + MIN_WRITES_PER_CRASH and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))  # then crash at an arbitrary point, writes in flight
        controller.kill(signal.SIGKILL)
        stop.set()
        for t in threads:
            t.join(10)
        acked_now = sum(len(w.acked) for w in writers)
        assert acked_now >= total_acked + MIN_WRITES_PER_CRASH, "the writers made too little progress to test anything"
        total_acked = acked_now

        controller.start()
        state = {o["category"]: o["k"] for o in httpx.get(controller.url + "/v1/overrides").json()}
        for w in writers:
            for category, allowed in _expected_states(w).items():
                assert state.get(category) in allowed, (crash, category, state.get(category), allowed)

        rows = _audit(controller.url)
        ids = [r["id"] for r in rows]
        assert ids == list(range(1, len(rows) + 1)), "audit log has a hole"
        by_id = {r["id"]: r for r in rows}
        for w in writers:
            for write in w.acked:
                row = by_id.get(write.acked_audit_id)
                assert row is not None, f"acknowledged write {write.reason} missing from the audit log"
                assert (row["action"], row["category"], row["reason"]) == (write.action, write.category,
                                                                           write.reason)
        acked_ids = {write.acked_audit_id for w in writers for write in w.acked}
        unacked_rows = [r for r in rows if r["id"] not in acked_ids]
        in_flight = {w.in_flight.reason for w in writers if w.in_flight is not None}
        assert {r["reason"] for r in unacked_rows} <= in_flight, unacked_rows
        print(f"crash {crash}: {acked_now} writes acknowledged in total, {len(rows)} audit rows, "
              f"{len(in_flight)} in flight at the kill, {len(unacked_rows)} of them committed")
        for w in writers:  # whatever was in flight is now settled one way or the other
            if w.in_flight is not None and w.in_flight.reason in {r["reason"] for r in unacked_rows}:
                w.in_flight.acked_audit_id = next(r["id"] for r in unacked_rows if r["reason"] == w.in_flight.reason)
                w.acked.append(w.in_flight)
            w.in_flight = None
