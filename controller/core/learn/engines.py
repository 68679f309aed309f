"""Per-engine telemetry bookkeeping: idempotency by (engine_id, boot_id, seq), gaps, outcomes, policy age.

Dedup rule. Within one boot, ``seq`` grows by one per batch. The book keeps the highest seq seen and the
set of seqs seen in the last ``WINDOW`` below it:
  * a seq seen before                      -> duplicate (acknowledged, not counted again);
  * a seq above the highest                -> accepted; every skipped seq is counted as a gap;
  * a missing seq arriving late (in window) -> accepted; it was counted as a gap, so the gap is taken back;
  * a seq older than the window            -> duplicate (it cannot be told apart from a retry; dropping is
                                              the safe side: nothing is counted twice).
A new ``boot_id`` starts a fresh seq space (the engine restarted); a late retry of a retired boot (a seq
it had already sent) is a duplicate. A retired boot that sends a seq *above* the last one seen from it a
second time is still running: two live engines were started with the same ``engine_id`` (the first such
batch may be one in flight across a restart and counts as a duplicate). That is a ``conflict``
(:attr:`EngineBook.id_conflicts`, refused with 409 so the second engine's log says why) rather than a
silent duplicate. Cumulative figures (gaps, dropped steps, outcomes) survive boots.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from specctl_vllm.controller.core.learn.mix import Mix
from specctl_vllm.kernel.protocol import MAX_K

WINDOW = 4096
RETIRED_BOOTS = 8
#: Every counter kept here stays at or below this (float64 holds it exactly, Prometheus samples are float64).
COUNTER_CAP = 2**53 - 1
#: A retired boot whose last seq is unknown (restored from an older snapshot): only a retry, never a conflict.
MAX_SEQ_ANY = COUNTER_CAP


def _count(value: object) -> int:
    """A counter restored from a snapshot: an int in [0, COUNTER_CAP] (ValueError/TypeError if not a number)."""
    return min(COUNTER_CAP, max(0, int(value)))  # type: ignore[call-overload]


@dataclass
class EngineBook:
    engine_id: str
    model: str = ""
    boot_id: str = ""
    spec_method: str = ""
    spec_k_max: int = 0
    spec_full_cuda_graphs: bool = False
    #: the engine's width set when graph-shaped: the views then show the width decision it is served
    spec_graph_widths: tuple[int, ...] = ()
    model_free_methods: tuple[str, ...] = ()
    max_seq: int = -1
    seen: set[int] = field(default_factory=set)
    retired_boots: list[str] = field(default_factory=list)
    retired_max_seq: dict[str, int] = field(default_factory=dict)  # highest seq seen from each retired boot
    id_conflicts: int = 0  # batches of a retired boot that was still running: the id is shared
    conflict_boot: str = ""  # the other boot of the last conflict
    conflict_at: float | None = None
    suspect_boots: set[str] = field(default_factory=set)  # retired boots that sent one new seq
    gaps: int = 0
    dropped_prev_boots: int = 0
    dropped_this_boot: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {"accepted": 0, "duplicate": 0, "rejected": 0})
    steps: int = 0
    step_seconds: float = 0.0
    #: graph-shaped engines: steps per proposal width they ran (0: plain decoding), since this controller met them;
    #: counted only once their series are charged to the budget (``widths_charged``)
    width_steps: dict[int, int] = field(default_factory=dict)
    widths_charged: bool = False
    last_seen: float | None = None
    policy_served_at: float | None = None
    policy_version_served: int | None = None
    policy_version_reported: int | None = None
    mix: Mix = field(default_factory=Mix)

    @property
    def dropped_steps(self) -> int:
        return self.dropped_prev_boots + self.dropped_this_boot

    def classify(self, boot_id: str, seq: int) -> tuple[str, int]:
        """('accepted'|'duplicate'|'stale', gap delta) for a batch, without changing anything."""
        if not self.boot_id:
            return "accepted", 0  # first contact: what came before this controller is unknown, not missing
        if boot_id != self.boot_id:
            if boot_id in self.retired_boots:
                if seq <= self.retired_max_seq.get(boot_id, MAX_SEQ_ANY):
                    return "stale", 0
                # a seq the old boot never sent: once may be a batch in flight across a restart, twice is a
                # second engine still running under this id
                return ("conflict" if boot_id in self.suspect_boots else "suspect"), 0
            return "accepted", seq  # a new boot: seqs 0..seq-1 of it are missing
        if seq > self.max_seq:
            return "accepted", seq - self.max_seq - 1
        if seq in self.seen:
            return "duplicate", 0
        if seq > self.max_seq - WINDOW:
            return "accepted", -1
        return "duplicate", 0

    def record_suspect(self, boot_id: str, seq: int) -> None:
        """A retired boot sent a seq it had not sent before (taken as a late batch, a duplicate, this once)."""
        self.suspect_boots = (self.suspect_boots | {boot_id}) & set(self.retired_boots)
        self.retired_max_seq[boot_id] = seq

    def record_conflict(self, boot_id: str, seq: int, now: float) -> None:
        """A retired boot is still sending: count it, remember its progress (each new batch counts once)."""
        self.id_conflicts = min(COUNTER_CAP, self.id_conflicts + 1)
        self.retired_max_seq[boot_id] = seq
        self.conflict_boot = boot_id
        self.conflict_at = now

    def record(self, boot_id: str, seq: int, gap_delta: int, dropped_steps: int) -> None:
        if boot_id != self.boot_id:
            if self.boot_id:
                self.retired_boots = (self.retired_boots + [self.boot_id])[-RETIRED_BOOTS:]
                self.retired_max_seq[self.boot_id] = self.max_seq
                self.retired_max_seq = {b: self.retired_max_seq[b] for b in self.retired_boots
                                        if b in self.retired_max_seq}
            self.boot_id = boot_id
            self.max_seq = -1
            self.seen = set()
            self.dropped_prev_boots = min(COUNTER_CAP, self.dropped_prev_boots + self.dropped_this_boot)
            self.dropped_this_boot = 0
        self.seen.add(seq)
        if seq > self.max_seq:
            self.max_seq = seq
            if len(self.seen) > 2 * WINDOW:
                floor = self.max_seq - WINDOW
                self.seen = {s for s in self.seen if s > floor}
        self.gaps = min(COUNTER_CAP, max(0, self.gaps + gap_delta))
        # the engine's counter is cumulative per boot; never let a smaller report shrink ours
        self.dropped_this_boot = min(COUNTER_CAP, max(self.dropped_this_boot, dropped_steps))

    def to_dict(self) -> dict:
        return {
            "engine_id": self.engine_id, "model": self.model, "boot_id": self.boot_id,
            "spec_method": self.spec_method, "spec_k_max": self.spec_k_max,
            "spec_full_cuda_graphs": self.spec_full_cuda_graphs,
            "model_free_methods": list(self.model_free_methods), "max_seq": self.max_seq,
            "seen": sorted(self.seen), "retired_boots": list(self.retired_boots), "gaps": self.gaps,
            "retired_max_seq": dict(self.retired_max_seq), "id_conflicts": self.id_conflicts,
            "conflict_boot": self.conflict_boot, "conflict_at": self.conflict_at,
            "dropped_prev_boots": self.dropped_prev_boots, "dropped_this_boot": self.dropped_this_boot,
            "outcomes": dict(self.outcomes), "steps": self.steps, "step_seconds": self.step_seconds,
            **({"width_steps": {str(w): n for w, n in sorted(self.width_steps.items())}} if self.width_steps else {}),
            **({"widths_charged": True} if self.widths_charged else {}),
            "last_seen": self.last_seen, "policy_served_at": self.policy_served_at,
            "policy_version_served": self.policy_version_served,
            "policy_version_reported": self.policy_version_reported, "mix": self.mix.to_dict(),
            # only where graph-shaped: a per-request engine's snapshot stays what it was
            **({"spec_graph_widths": list(self.spec_graph_widths)} if self.spec_graph_widths else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> EngineBook:
        b = cls(str(d["engine_id"]))
        b.model = str(d.get("model", ""))
        b.boot_id = str(d.get("boot_id", ""))
        b.spec_method = str(d.get("spec_method", ""))
        b.spec_k_max = int(d.get("spec_k_max", 0))
        b.spec_full_cuda_graphs = bool(d.get("spec_full_cuda_graphs", False))
        b.spec_graph_widths = _widths(d.get("spec_graph_widths", ()), b.spec_k_max)
        b.model_free_methods = tuple(str(m) for m in d.get("model_free_methods", []))
        b.max_seq = int(d.get("max_seq", -1))
        b.seen = {int(s) for s in d.get("seen", [])}
        if not -1 <= b.max_seq <= COUNTER_CAP or any(s < 0 or s > b.max_seq for s in b.seen):
            raise ValueError("seq out of range")
        b.retired_boots = [str(x) for x in d.get("retired_boots", [])][-RETIRED_BOOTS:]
        b.gaps = _count(d.get("gaps", 0))
        b.retired_max_seq = {str(k): min(COUNTER_CAP, max(-1, int(v)))
                             for k, v in dict(d.get("retired_max_seq", {})).items() if str(k) in b.retired_boots}
        b.id_conflicts = _count(d.get("id_conflicts", 0))
        b.conflict_boot = str(d.get("conflict_boot", ""))
        b.conflict_at = None if d.get("conflict_at") is None else float(d["conflict_at"])
        b.dropped_prev_boots = _count(d.get("dropped_prev_boots", 0))
        b.dropped_this_boot = _count(d.get("dropped_this_boot", 0))
        outcomes = d.get("outcomes", {})
        b.outcomes = {k: _count(outcomes.get(k, 0)) for k in ("accepted", "duplicate", "rejected")}
        b.steps = _count(d.get("steps", 0))
        b.step_seconds = max(0.0, float(d.get("step_seconds", 0.0)))
        if not math.isfinite(b.step_seconds):
            raise ValueError("step_seconds not finite")
        b.width_steps = _width_steps(d.get("width_steps", {}))
        b.widths_charged = bool(d.get("widths_charged", False)) or bool(b.width_steps)
        b.last_seen = None if d.get("last_seen") is None else float(d["last_seen"])
        b.policy_served_at = None if d.get("policy_served_at") is None else float(d["policy_served_at"])
        for name in ("policy_version_served", "policy_version_reported"):
            v = d.get(name)
            setattr(b, name, None if v is None else int(v))
        b.mix = Mix.from_dict(d["mix"]) if "mix" in d else Mix()
        return b


def _width_steps(raw) -> dict[int, int]:
    """A stored {width: steps}: widths the protocol allows, counts capped."""
    out = {}
    for w, n in dict(raw).items():
        width = int(w)
        if not 0 <= width <= MAX_K:
            raise ValueError("width out of range")
        out[width] = _count(n)
    return out


def record_width_steps(book: EngineBook, width_steps: dict[int, int]) -> None:
    """Add a batch's steps per width to the engine's counters (each capped; widths outside the protocol's
    range never reach here: the digest clamps them)."""
    counts = book.width_steps
    for w, n in width_steps.items():
        counts[w] = min(COUNTER_CAP, counts.get(w, 0) + n)


def _widths(raw, k_max: int) -> tuple[int, ...]:
    """A stored width set, kept only when it is one the protocol accepts (else: per-request k)."""
    try:
        w = tuple(int(x) for x in raw)
    except (TypeError, ValueError):
        return ()
    ok = bool(w) and w[0] == 0 and all(b > a for a, b in itertools.pairwise(w)) and w[-1] <= k_max
    return w if ok else ()
