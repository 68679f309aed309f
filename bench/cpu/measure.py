"""What one measured phase yields: goodput overall and per category, greedy equality against a reference.

Definitions (committed tokens = output token ids the server returned):
  * overall goodput  = committed tokens of the phase / wall time of the phase (first request sent to last
    answer received);
  * category goodput = committed tokens of the category / summed latency of its requests: the decoding rate
    a user of that category sees, in a batch shared with every other category. At concurrency 1 it is the
    category's share of the wall time exactly; at concurrency 8 it includes waiting on the other requests
    of each step, which is what a category's k costs the others.
Greedy equality: every request's token ids must equal the no-speculation run's at the same concurrency;
each mismatch is reported with its first differing position and, where the reference pass with log-probs
has it, the reference's top-2 log-prob margin there (a near-tie explains a float difference).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

from bench.cpu.driver import Phase, Record


@dataclass
class PhaseSummary:
    goodput: float
    tokens: int
    wall_s: float
    per_category: dict[str, float]
    tokens_per_category: dict[str, int]
    requests: int
    failed: int
    engine_cpu_s: float | None = None
    load_avg: tuple[float, float] | None = None  # 1-min load average at start and end

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        if self.engine_cpu_s:
            d["tokens_per_engine_cpu_s"] = self.tokens / self.engine_cpu_s
        return d


def summarise(phase: Phase, engine_cpu_s: float | None = None, load: tuple[float, float] | None = None) -> PhaseSummary:
    tokens: dict[str, int] = defaultdict(int)
    latency: dict[str, float] = defaultdict(float)
    for r in phase.records:
        if r.ok:
            tokens[r.category] += len(r.token_ids)
            latency[r.category] += r.latency
    total = sum(tokens.values())
    per = {c: tokens[c] / latency[c] for c in tokens if latency[c] > 0}
    return PhaseSummary(total / phase.wall_s if phase.wall_s > 0 else 0.0, total, phase.wall_s, per, dict(tokens),
                        len(phase.records), sum(not r.ok for r in phase.records), engine_cpu_s, load)


def load_avg() -> float:
    return os.getloadavg()[0]


@dataclass
class Mismatch:
    prompt_id: str
    category: str
    position: int
    reference_len: int
    got_len: int
    margin: float | None  # reference top-2 log-prob margin at ``position`` (None: not recorded)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def mismatches(reference: list[Record], other: list[Record], margins: dict[str, list[tuple[float, float]]]
               ) -> list[Mismatch]:
    ref = {r.id: r for r in reference}
    out = []
    for r in other:
        base = ref.get(r.id)
        if base is None or not base.ok or not r.ok or base.token_ids == r.token_ids:
            continue
        a, b = base.token_ids, r.token_ids
        pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        tops = margins.get(r.id, [])
        margin = tops[pos][0] - tops[pos][1] if pos < len(tops) else None
        out.append(Mismatch(r.id, r.category, pos, len(a), len(b), margin))
    return out
