"""Injected time: the service never reads the clock or sleeps directly, so tests run on fake time.

``now()`` is wall-clock unix seconds: override expiry and policy ``issued_at`` must survive a restart,
which a monotonic clock would not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


Sleep = Callable[[float], Awaitable[None]]

#: The real sleep; tests pass their own.
real_sleep: Sleep = asyncio.sleep
