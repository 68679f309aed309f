"""Scrapes rendered off the event loop and out of the interpreter that serves engines.

A full budget is tens of thousands of series: about 0.4 s of pure Python to write as text. In a worker
thread that still holds the GIL, and every engine's post waits for it in slices (measured: ingest p99 went
from 20 ms to 150-250 ms during back-to-back scrapes of a full budget). So the event loop only asks for the
Brain's snapshot (built in a worker thread, model by model, see :meth:`Runtime.metrics`), which is pickled
(about 7 ms for a full budget) to one render process that writes the text. Scrapes that arrive while one
renders share its result. If the render process cannot be used (it died, or the platform cannot start it),
the text is written in a worker thread instead, and the log says so once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from anyio import to_thread

from specctl_vllm.controller.service.metrics import ServiceStats, render

log = logging.getLogger("controller.service")

PR_SET_PDEATHSIG = 1
#: Seconds between a render process's checks that the server that started it is still its parent.
PARENT_CHECK_S = 1.0


def die_with_parent(parent_pid: int, check_s: float = PARENT_CHECK_S) -> None:
    """Initializer of a render process: it ends when the server ends, however the server ends (``kill -9``
    included; before, the render process and its resource tracker stayed behind). The kernel sends SIGKILL
    when the parent dies (``PR_SET_PDEATHSIG``, Linux); a watchdog thread covers other platforms and the
    race of a parent that died before the call. The resource tracker exits when this process, its last
    writer, is gone."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog below still ends it

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(check_s)
        os._exit(0)

    if os.getppid() != parent_pid:
        os._exit(0)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class Renderer:
    """Built in the app's lifespan (``processes=0``: render in a worker thread, as tests that need no process do)."""

    def __init__(self, processes: int = 1) -> None:
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if processes > 0:
            try:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=processes, mp_context=multiprocessing.get_context("spawn"),
                    initializer=die_with_parent, initargs=(os.getpid(),))
            except (OSError, ValueError) as exc:
                log.warning("no render process, scrapes render in a thread", extra={"error": str(exc)})
        self._inflight: dict[str, asyncio.Future[tuple[bytes, str]]] = {}

    async def scrape(self, runtime: Any, accept: str) -> tuple[bytes, str]:
        held = self._inflight.get(accept)
        if held is not None:
            return await asyncio.shield(held)
        future: asyncio.Future[tuple[bytes, str]] = asyncio.get_running_loop().create_future()
        self._inflight[accept] = future
        try:
            snapshot = await to_thread.run_sync(runtime.metrics)
            result = await self._render(snapshot, ServiceStats.of(runtime), accept)
            future.set_result(result)
            return result
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no warning when nobody else was waiting
            raise
        finally:
            self._inflight.pop(accept, None)

    async def _render(self, snapshot: Any, stats: ServiceStats, accept: str) -> tuple[bytes, str]:
        if self._pool is not None:
            try:
                return await asyncio.get_running_loop().run_in_executor(self._pool, render, snapshot, stats, accept)
            except (concurrent.futures.process.BrokenProcessPool, OSError, RuntimeError) as exc:
                # it died, or could not be started here (no /dev/shm, process limit): a thread from now on
                log.warning("render process unusable, scrapes render in a thread from now on",
                            extra={"error": f"{type(exc).__name__}: {exc}"})
                pool, self._pool = self._pool, None
                pool.shutdown(wait=False, cancel_futures=True)
        return await to_thread.run_sync(render, snapshot, stats, accept)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
