"""Per-step records, from the engine loop to the reporter thread, and their wire form.

The engine loop builds one compact :class:`StepRow` per step (plain tuples/dicts/lists, no validation, no
allocation per draft) and appends it to a :class:`StepQueue`; the reporter thread drains the queue and turns
rows into :class:`~specctl_vllm.kernel.protocol.StepRecord`-shaped dicts (:func:`row_to_wire`). Appending is one
``deque.append`` (thread-safe, O(1)); a full queue drops its oldest row and counts it.

Aggregation per step, keyed by ``(category, method)``: a :class:`CategoryTally` (requests, hists,
counterfactual, attempts) where ``hists[k][j]`` counts requests with ``k`` drafts scheduled and ``j`` accepted -- exactly the
protocol's :class:`~specctl_vllm.kernel.protocol.DraftHistogram` -- ``counterfactual[method][k][j]`` the same for
model-free drafters scored against the tokens the target produced, and ``attempts[method]`` the proposals
tried for that scoring, matched or not (the match rate's denominator). A graph-shaped engine that counts its
drafted requests in vLLM's own update loop queues those as :class:`PackedCounts` (one int per distinct
(key, drafts, accepted)); :func:`step_aggregate` unfolds them, on the reporter's side.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from specctl_vllm.kernel import protocol


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

#: Bits of a drafts or accepted count in a packed code (any count up to protocol.MAX_K fits).
CODE_BITS = 8
CODE_MASK = (1 << CODE_BITS) - 1
#: A packed code's (category, method) key index sits above its (drafts, accepted) pair.
KEY_SHIFT = 2 * CODE_BITS


def pack(drafted: int, accepted: int) -> int:
    """(drafts, accepted) of one request's step as the low bits of a packed code; vLLM's counts lie in
    0..MAX_K with accepted <= drafts, anything else is clamped into that range."""
    drafted = min(max(drafted, 0), protocol.MAX_K)
    return (drafted << CODE_BITS) + min(max(accepted, 0), drafted)


class PackedCounts(NamedTuple):
    """A step's drafted requests as vLLM's own update loop counted them, not yet unfolded into histograms:
    packed code (key index << KEY_SHIFT | drafts << CODE_BITS | accepted) -> requests, and the
    ``(category, method)`` keys the indices name. ``keys`` is the engine's append-only key list: an index a
    code holds stays valid while the list grows."""

    codes: dict[int, int]
    keys: Sequence[tuple[str, str]]


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
    #: graph-shaped engines counting in vLLM's loop: the drafted requests, unfolded off the engine loop
    #: (:func:`step_aggregate`); ``agg`` then holds only the step's other counts
    packed: PackedCounts | None = None


def new_entry() -> CategoryTally:
    return CategoryTally()


def _copy_entry(entry: CategoryTally) -> CategoryTally:
    """A copy whose requests and histograms may be added to (the rest is shared: nothing here changes it)."""
    copy = CategoryTally()
    copy.requests = entry.requests
    copy.hists = {k: list(counts) for k, counts in entry.hists.items()}
    copy.counterfactual = entry.counterfactual
    copy.attempts = entry.attempts
    return copy


def step_aggregate(row: StepRow) -> Aggregate:
    """The row's per-(category, method) counts with its packed counts unfolded: a new dict where the row has
    any (the row itself is not changed, so reading it twice gives the same counts), ``row.agg`` otherwise."""
    packed = row.packed
    if packed is None or not packed.codes:
        return row.agg
    merged = dict(row.agg)
    fresh: set[tuple[str, str]] = set()
    keys = packed.keys
    for code, n in packed.codes.items():
        key = keys[code >> KEY_SHIFT]
        entry = merged.get(key)
        if key not in fresh:
            entry = merged[key] = _copy_entry(entry) if entry is not None else CategoryTally()
            fresh.add(key)
        entry.requests += n
        drafted = (code >> CODE_BITS) & CODE_MASK
        if drafted > 0:
            bucket = entry.hists.get(drafted)
            if bucket is None:
                bucket = entry.hists[drafted] = [0] * (drafted + 1)
            bucket[min(code & CODE_MASK, drafted)] += n
    return merged


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
    """A :class:`StepRow` as a :class:`~specctl_vllm.kernel.protocol.StepRecord` dict."""
    categories = []
    for (category, method), tally in step_aggregate(row).items():
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
