"""The Brain's lock, shared by the event loop (awaited as a task, never blocking it) and worker threads.

See :class:`BrainLock` and the concurrency notes of :mod:`specctl_vllm.controller.service.runtime`.
"""

from __future__ import annotations

import asyncio
import threading


class BrainLock:
    """The Brain's lock: worker threads take it with ``with``; the event loop awaits :meth:`acquire_async`,
    which never blocks the loop (a post waits as a task while a scrape's or a snapshot's thread holds it).

    A thread waiting for the lock goes first: the loop would otherwise take it back post after post (a
    ``threading.Lock`` is not fair, and the woken thread needs the GIL the loop holds), and a decision being
    computed in a thread waited a second and more under load. Posts that found the lock held used to go to a
    worker thread instead, which under load was a convoy: the thread then held the lock post after post,
    every later post found it held too and paid for the thread's hop (load benchmark: 1.1 ms of CPU per post
    instead of 0.9, p99 290 ms). A release wakes the loop's waiters, which then try again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = threading.Lock()  # guards _threads
        self._threads = 0  # threads blocked in __enter__
        self._waiters = 0  # tasks in acquire_async
        self._released: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None  # set when no task waits in acquire_async
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> None:
        if self._lock.acquire(blocking=False):
            return
        with self._count:
            self._threads += 1
        try:
            self._lock.acquire()
        finally:
            with self._count:
                self._threads -= 1

    def __exit__(self, *_: object) -> None:
        self.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def release(self) -> None:
        self._lock.release()
        # a waiter counts itself before trying the lock, so one that just failed is seen here
        if self._waiters and self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.set)

    def _try(self) -> bool:
        return not self._threads and self._lock.acquire(blocking=False)

    async def acquire_async(self) -> None:
        if self._try():
            return
        if self._released is None:
            self._loop, self._released = asyncio.get_running_loop(), asyncio.Event()
        self._waiters += 1
        try:
            while True:
                self._released.clear()
                if self._try():
                    return
                await self._released.wait()
        finally:
            self._waiters -= 1
            if not self._waiters and self._drained is not None:
                self._drained.set()

    async def acquire_behind_waiters(self) -> None:
        """For bulk work (a large batch's next slice): the tasks already waiting get the lock first. Released on
        the loop and taken back at once, the lock went from slice to slice while the posts woken by the release
        had not run yet: they waited for every slice of every queued batch (soak: a regular post's p50 in the
        server was 0.5 s beside two clients flooding). A waiting post's hold is short (merged on the loop)."""
        while self._waiters:
            if self._drained is None:
                self._drained = asyncio.Event()
            self._drained.clear()
            await self._drained.wait()
        await self.acquire_async()
