"""Connection-level limits uvicorn does not have: a cap on open connections and a header read deadline.

uvicorn's ``limit_concurrency`` answers 503 to requests beyond it but still accepts and keeps the sockets,
and nothing bounds how long a client may take to send its request line and headers: idle or trickling
connections then hold file descriptors until the process runs out (and ``/healthz`` fails with the rest).
:class:`LimitedHttpTools` closes a connection beyond ``max_connections`` at once, and one whose headers have
not all arrived ``header_timeout_s`` after it opened (or after the previous response, on keep-alive).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("controller.service")


def limited_protocol(max_connections: int, header_timeout_s: float) -> type[HttpToolsProtocol]:
    """An httptools protocol class with these limits (a class per server: no module-level state)."""

    class LimitedHttpTools(HttpToolsProtocol):
        refused = 0
        timed_out = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                type(self).refused += 1
                transport.abort()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                type(self).timed_out += 1
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._header_timer is None:
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the keep-alive wait is bounded by uvicorn; the next request's headers by this

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return LimitedHttpTools
