"""How long the server takes over a telemetry post, seen from its own side of the socket.

A client's latency includes its own scheduling: on a host whose cores the load generator shares, most of a
post's time can be spent in the generator before it sends or after the answer arrived (the soak's fleet,
docs/reliability.md#soak). The server's share is measured by the connection guard
(:mod:`specctl_vllm.controller.service.connections`), from when the event loop reads a request's first bytes to
when the first bytes of its answer are written, and exported as the histogram
``specctl_http_telemetry_seconds``, apart for an engine's regular posts (``body="small"``, a declared
``Content-Length`` of at most :data:`INLINE_BODY_BYTES`, merged on the loop) and large ones (a backlog flush,
parsed and merged in slices off it: seconds of work, not the latency an engine's step waits on). Time spent in the kernel's socket buffer before the loop reads it is not in
it: that part shows as a gap between the client's figure and this one.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from specctl_vllm.controller.service.runtime import INLINE_BODY_BYTES

#: Upper bounds (seconds) of the histogram's buckets: 1 ms to 10 s, about three per decade around the 250 ms
#: target, so a p99 is read within a bucket's width either side of it.
BOUNDS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


#: The body classes, as labelled.
BODIES = ("small", "large")


def body_class(declared_bytes: int) -> str:
    """``small`` for an engine's regular post, ``large`` for a body parsed and merged off the loop. A chunked
    body declares none (0): counted small here, though the route treats it as large."""
    return BODIES[0] if declared_bytes <= INLINE_BODY_BYTES else BODIES[1]


@dataclass
class LatencyHistogram:
    """Counts per bucket (the last one is above every bound), their sum; plain data, no locks: the event loop
    is its one writer."""

    bounds: tuple[float, ...] = BOUNDS
    counts: list[int] = field(default_factory=lambda: [0] * (len(BOUNDS) + 1))
    total_s: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_s += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)


def quantile(bounds: tuple[float, ...], counts: list[int], q: float) -> float | None:
    """The upper bound of the bucket that holds the ``q`` quantile (``inf`` above the last bound), or None for no
    observations: an upper estimate, never below the true quantile."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank and n:
            return bounds[i] if i < len(bounds) else float("inf")
    return float("inf")
