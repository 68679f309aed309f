"""Per-step records, from the engine loop to the reporter thread, and their wire form.

The engine loop builds one compact :class:`StepRow` per step (plain tuples/dicts/lists, no validation, no
allocation per draft) and appends it to a :class:`StepQueue`; the reporter thread drains the queue and turns
rows into :class:`~specctl_vllm.controller.protocol.StepRecord`-shaped dicts (:func:`row_to_wire`). Appending is one
``deque.append`` (thread-safe, O(1)); a full queue drops its oldest row and counts it.

Aggregation per step, keyed by ``(category, method)``: a :class:`CategoryTally` (requests, hists,
counterfactual, attempts) where ``hists[k][j]`` counts requests with ``k`` drafts scheduled and ``j`` accepted -- exactly the
protocol's :class:`~specctl_vllm.controller.protocol.DraftHistogram` -- ``counterfactual[method][k][j]`` the same for
model-free drafters scored against the tokens the target produced, and ``attempts[method]`` the proposals
tried for that scoring, matched or not (the match rate's denominator).
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

from specctl_vllm.controller import protocol


class CategoryTally:
    """One (category, method)'s counts in one step. A slotted record, not a dataclass: the hook creates and
    updates one per (category, method) in its per-request loop, where attribute access on slots costs what a
    list index does."""

    __slots__ = ("attempts", "counterfactual", "hists", "requests")

    def __init__(self) -> None:
        self.requests = 0  # requests of the step in this (category, method)
        self.hists: dict[int, list[int]] = {}  # drafts scheduled -> requests per accepted count
        self.counterfactual: dict[str, dict[int, list[int]]] | None = None  # method -> hists of its proposals
        self.attempts: dict[str, int] | None = None  # method -> counterfactual proposals tried


#: ``(category, method) -> CategoryTally``
Aggregate = dict[tuple[str, str], CategoryTally]


class StepRow(NamedTuple):
    t: float  # engine monotonic clock at step end, seconds
    wall_s: float
    batch_size: int
    scheduled_tokens: int
    draft_tokens: int
    prefill_tokens: int
    draft_depth: int
    agg: Aggregate
    width: int | None = None  # graph-shaped steps: the width every request verified
    interval_s: float | None = None  # seconds since the previous step ended, on a busy engine


def new_entry() -> CategoryTally:
    return CategoryTally()


def add_draft(hists: dict[int, list[int]], drafted: int, accepted: int) -> None:
    """Count one request that had ``drafted`` drafts scheduled and ``accepted`` of them accepted."""
    bucket = hists.get(drafted)
    if bucket is None:
        bucket = hists[drafted] = [0] * (drafted + 1)
    bucket[min(drafted, accepted)] += 1


def add_counterfactual(entry: CategoryTally, method: str, drafted: int, accepted: int) -> None:
    cf = entry.counterfactual
    if cf is None:
        cf = entry.counterfactual = {}
    hists = cf.get(method)
    if hists is None:
        hists = cf[method] = {}
    add_draft(hists, drafted, accepted)


def add_attempt(entry: CategoryTally, method: str) -> None:
    """Count one counterfactual proposal tried for ``method``, whether it found a match or not."""
    attempts = entry.attempts
    if attempts is None:
        attempts = entry.attempts = {}
    attempts[method] = attempts.get(method, 0) + 1


class StepQueue:
    """Bounded hand-off from the engine loop (producer) to the reporter thread (consumer)."""

    def __init__(self, capacity: int) -> None:
        self._rows: deque[StepRow] = deque(maxlen=capacity)
        self._capacity = capacity
        self._dropped = 0  # written by the engine loop only

    @property
    def dropped(self) -> int:
        """Rows dropped since start (oldest first) because the reporter could not keep up or deliver."""
        return self._dropped

    def __len__(self) -> int:
        return len(self._rows)

    def push(self, row: StepRow) -> None:
        if len(self._rows) >= self._capacity:
            self._dropped += 1
        self._rows.append(row)  # maxlen: the deque itself discards the oldest

    def drain(self, limit: int) -> list[StepRow]:
        rows: list[StepRow] = []
        pop = self._rows.popleft
        try:
            while len(rows) < limit:
                rows.append(pop())
        except IndexError:
            pass
        return rows


def _hists_to_wire(hists: dict[int, list[int]]) -> list[dict[str, Any]]:
    return [
        {"k": k, "accepted": list(buckets)} for k, buckets in sorted(hists.items()) if 1 <= k <= protocol.MAX_K
    ]


def row_to_wire(row: StepRow) -> dict[str, Any]:
    """A :class:`StepRow` as a :class:`~specctl_vllm.controller.protocol.StepRecord` dict."""
    categories = []
    for (category, method), tally in row.agg.items():
        cf, attempts = tally.counterfactual, tally.attempts
        entry: dict[str, Any] = {
            "category": category,
            "method": method,
            "requests": tally.requests,
            "hists": _hists_to_wire(tally.hists),
        }
        if cf:
            entry["counterfactual"] = {m: _hists_to_wire(h) for m, h in cf.items() if h}
        if attempts:
            entry["counterfactual_attempts"] = dict(attempts)
        categories.append(entry)
    draft_tokens = min(row.draft_tokens, row.scheduled_tokens)
    return {
        "t": row.t,
        "wall_s": min(max(row.wall_s, 0.0), 3600.0),
        "batch_size": row.batch_size,
        "scheduled_tokens": row.scheduled_tokens,
        "draft_tokens": draft_tokens,
        "prefill_tokens": row.prefill_tokens,
        "draft_depth": min(row.draft_depth, protocol.MAX_K),
        "categories": categories[: protocol.MAX_CATEGORIES_PER_STEP],
        **({"width": min(row.width, protocol.MAX_K)} if row.width is not None else {}),
        **({"interval_s": min(max(row.interval_s, 0.0), 3600.0)} if row.interval_s is not None else {}),
    }
