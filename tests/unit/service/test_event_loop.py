"""The event loop never waits on CPU work: while a decision is being computed (here: one that blocks until
the test lets it go), the loop keeps answering.

No timing in the assertions: the injected decision waits on an event the test sets only after ``/healthz``
has answered. Were the decision run on the loop, ``/healthz`` could not even be sent before the decision's
safety timeout let it return, and the test sees that it returned first.
"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest

from specctl_vllm.controller.core.policy import goodput
from specctl_vllm.controller.service.brain_lock import BrainLock
from specctl_vllm.controller.service.runtime import INLINE_DECISION_WORK
from tests.unit.service.batches import MODEL, batch, hist, step
from tests.unit.service.conftest import ADMIN, INGEST

#: Only reached if the decision blocked the loop (then the test fails); never waited for when it passes.
SAFETY_S = 10.0


class SlowDecision:
    """``goodput.decide`` that, once armed, blocks its thread until released (as a decision of a huge model)."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.released = threading.Event()
        self.returned = threading.Event()
        self._decide = goodput.decide

    def __call__(self, snap, cfg):
        if self.armed:
            self.entered.set()
            self.released.wait(SAFETY_S)
            self.returned.set()
        return self._decide(snap, cfg)


def _request(ac: httpx.AsyncClient, what: str):
    if what == "telemetry":
        return ac.post("/v1/telemetry", json=batch(1, engine_id="engine-new"), headers=INGEST)
    if what == "policy":
        return ac.get("/v1/policy", params={"model": MODEL, "k_max": 4, "method": "ngram"})
    return ac.get("/v1/categories")


@pytest.mark.parametrize("what", ["telemetry", "policy", "categories"])
def test_a_slow_decision_does_not_block_the_loop(client, clock, monkeypatch, what):
    slow = SlowDecision()
    monkeypatch.setattr(goodput, "decide", slow)
    # a model large enough that its decisions are computed off the loop (small ones are cheaper there)
    big = [step({f"c{i}": [hist(4, [1, 0, 0, 0, 3])] for i in range(INLINE_DECISION_WORK // 4 + 1)})]
    assert client.post("/v1/telemetry", json=batch(0, big), headers=INGEST).status_code == 200
    clock.advance(3600.0)  # every cached decision due again: the next request computes one
    slow.armed = True

    async def scenario() -> tuple[int, bool, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://controller") as ac:
            pending = asyncio.ensure_future(_request(ac, what))
            entered = await asyncio.to_thread(slow.entered.wait, SAFETY_S)
            health = await ac.get("/healthz")
            # the lock held by the decision must not stall the loop either: an override write waits for it
            # in its worker thread, off the loop
            override = asyncio.ensure_future(ac.put("/v1/overrides/code", json={"k": 1, "reason": "t", "actor": "t"},
                                                    headers=ADMIN))
            await asyncio.sleep(0)
            answered_while_blocked = entered and not slow.returned.is_set()
            health2 = await ac.get("/healthz")
            answered_while_blocked = answered_while_blocked and not slow.returned.is_set()
            slow.released.set()
            return health.status_code + health2.status_code, answered_while_blocked, await pending, await override

    status, answered_while_blocked, answer, override = client.portal.call(scenario)
    assert slow.entered.is_set(), "the request computed no decision"
    assert status == 400 and answered_while_blocked
    assert answer.status_code == 200 and override.status_code == 200


def test_concurrent_posts_of_one_engine_merge_each_batch_once(client):
    """Posts of one engine in flight together (resends racing the next batches), all off the loop: every
    (boot, seq) merged exactly once, every acknowledged batch counted."""
    seqs = [0, 1, 1, 2, 0, 3, 3]

    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://controller") as ac:
            return list(await asyncio.gather(*(ac.post("/v1/telemetry", json=batch(s), headers=INGEST)
                                               for s in seqs)))

    answers = client.portal.call(scenario)
    assert all(a.status_code == 200 for a in answers)
    accepted = sorted(s for s, a in zip(seqs, answers) if a.json()["outcome"] == "accepted")
    assert accepted == [0, 1, 2, 3]
    engine = client.get("/v1/engines").json()[0]
    assert engine["last_seq"] == 3 and engine["gaps"] == 0
    assert engine["batches"]["accepted"] == 4 and engine["batches"]["duplicate"] == 3
    (category,) = client.get("/v1/categories").json()
    assert category["request_steps"] == 4 * batch_requests()


def batch_requests() -> int:
    return batch(0)["steps"][0]["batch_size"]


@pytest.mark.parametrize(("engines_per_piece", "engine_pieces"), [(256, 1), (2, 3), (1, 5)])
def test_snapshot_is_the_dump_written_model_by_model(client, monkeypatch, engines_per_piece, engine_pieces):
    """The snapshot's text is the whole dump, and the Brain lock is let go between two models' parts and
    between two pieces of ``ENGINES_PER_PIECE`` engines (a post waits for one piece at most, not for the whole
    state; at the engine cap the engines in one piece held the lock for most of a second)."""
    monkeypatch.setattr("specctl_vllm.controller.service.state_text.ENGINES_PER_PIECE", engines_per_piece)
    for i, model in enumerate(["m-a", "m-b", "org/m-c", "m-a", "m-b"]):
        assert client.post("/v1/telemetry", json=batch(0, engine_id=f"e-{i}", model=model),
                           headers=INGEST).status_code == 200
    runtime = client.app.state.runtime
    pauses = []

    def pause(_: float) -> None:
        pauses.append(runtime._brain_lock.locked())

    monkeypatch.setattr("specctl_vllm.controller.service.runtime.time.sleep", pause)
    text = runtime.snapshot_text()
    assert pauses == [False] * (3 + engine_pieces)
    assert len(json.loads(text)["engines"]) == 5
    assert json.loads(text) == json.loads(json.dumps(runtime.dump()))
    client.portal.call(runtime.snapshot)
    (_, _, stored), *_ = runtime.store.latest_snapshots()
    assert stored == json.loads(text)


def test_brain_lock_wakes_the_loop_and_lets_a_waiting_thread_first():
    """A task waiting for the lock is woken by a thread's release (no lost wake-up), and a thread that waits
    for the lock gets it before the loop's tasks (the loop would otherwise take it back post after post)."""
    lock = BrainLock()
    order: list[str] = []

    async def scenario() -> None:
        lock._lock.acquire()  # held, as by a scrape's thread
        task = asyncio.ensure_future(lock.acquire_async())
        await asyncio.sleep(0)
        assert not task.done()
        thread_waiting = threading.Event()

        def worker() -> None:
            thread_waiting.set()
            with lock:
                order.append("thread")

        thread = threading.Thread(target=worker)
        thread.start()
        await asyncio.to_thread(thread_waiting.wait)
        while not lock._threads:  # the thread blocked in the lock
            await asyncio.sleep(0.001)
        lock.release()
        await task
        order.append("task")
        lock.release()
        await asyncio.to_thread(thread.join)

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert order == ["thread", "task"]
