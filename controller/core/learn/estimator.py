"""Per-position conditional acceptance with exponential forgetting (one estimator per model/category/method).

Evidence from a histogram ``DraftHistogram(k, accepted=[n_0..n_k])`` (``n_j`` drafts had exactly ``j``
tokens accepted), for position ``i = 1..k`` (1-based, as in the formulas):

  * reached_i  = sum_{j >= i-1} n_j    (all tokens before position i were accepted)
  * accepted_i = sum_{j >= i}   n_j    (the token at position i was accepted too)

Conditional acceptance ``beta_i = P(accept i | accepted 1..i-1)`` has a Beta posterior
``Beta(a_i + accepted_i, b_i + reached_i - accepted_i)``. The prior of position 1 has mean ``prior_mean``
and weight ``prior_strength`` pseudo-drafts; the prior of position i > 1 has the same weight and the
posterior mean of position i-1 as its mean, so positions that were never reached (k above anything
drafted so far) extrapolate the last measured one instead of jumping back to 0.5.

Forgetting: all counts are multiplied by ``2 ** (-(now - t_last) / half_life_s)`` before new evidence is
added (time is injected). A uniform decay leaves the means unchanged and only shrinks the evidence, so
an old category keeps its estimate but loses the confidence the guardrails ask for.

Match rate: a model-free drafter (n-gram, suffix) proposes only when it finds a match, so a request asked
to draft k tokens often drafts none. The histograms describe the drafts that happened; ``attempts`` (request
steps that asked the drafter, or counterfactual proposals tried) and ``hits`` (those that drafted), decayed
alike, give the match rate ``m = hits / attempts`` that scales both the gain and the drafted tokens
(:meth:`AcceptanceEstimator.match_rate`). Unknown (no attempts reported) reads as 1: every ask drafts.

Cumulative (never decayed) counters are kept alongside for Prometheus counters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specctl_vllm.kernel.decay import Decayed
from specctl_vllm.kernel.protocol import MAX_K

_N = MAX_K + 1  # positions 1..MAX_K stored at index 0..MAX_K-1; lengths 0..MAX_K


def wilson_interval(successes: float, trials: float, z: float) -> tuple[float, float]:
    """Wilson score interval; [0, 1] without trials. Works on decayed (fractional) counts."""
    if trials <= 0:
        return (0.0, 1.0)
    p = min(max(successes / trials, 0.0), 1.0)
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    lo = 0.0 if p <= 0 else max(0.0, min(p, centre - half))
    hi = 1.0 if p >= 1 else min(1.0, max(p, centre + half))
    return (lo, hi)


def z_for(confidence: float) -> float:
    """Two-sided normal quantile for a confidence level (inverse erf by bisection; no scipy)."""
    target = confidence
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_committed(betas) -> list[float]:
    """E(k) = 1 + sum_{i=1..k} prod_{j<=i} beta_j for k = 0..len(betas)."""
    out = [1.0]
    prod = 1.0
    for b in betas:
        prod *= b
        out.append(out[-1] + prod)
    return out


def positions_from_hist(k: int, accepted: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(reached, accepted) per position 1..k from one length histogram (index i-1 = position i)."""
    counts = np.asarray(accepted, dtype=float)
    tail = np.cumsum(counts[::-1])[::-1]  # tail[j] = sum_{l >= j} n_l
    return tail[:k], tail[1 : k + 1]


@dataclass
class _HistogramSums:
    """Histograms of several proposal lengths summed per position, in exact integers."""

    reached: list[int]  # index i-1 = position i, as in the arrays of AcceptanceEstimator
    accepted: list[int]
    lengths: list[int]  # drafts with exactly j accepted
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    max_k_drafted: int  # largest k with at least one draft (0 if none)

    @classmethod
    def of(cls, per_k: Mapping[int, Sequence[int]]) -> _HistogramSums:
        top = max(per_k, default=0)
        reached, accepted, lengths = [0] * top, [0] * top, [0] * (top + 1)
        drafts = draft_tokens = accepted_tokens = max_k = 0
        for k, counts in per_k.items():
            tail = 0  # drafts with at least j accepted, j going down from k (see the module docstring)
            for j in range(k, 0, -1):
                tail += counts[j]
                accepted[j - 1] += tail
                reached[j - 1] += tail + counts[j - 1]
                accepted_tokens += tail
            n = tail + counts[0]
            for j, c in enumerate(counts):
                lengths[j] += c
            drafts += n
            draft_tokens += k * n
            if n > 0:
                max_k = max(max_k, k)
        return cls(reached, accepted, lengths, drafts, draft_tokens, accepted_tokens, max_k)


@dataclass
class Cumulative:
    """Never-decayed counters (Prometheus counters; they only grow)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    per_pos: list[int] | None = None  # accepted at position i (unconditional, vLLM's per-pos counter)
    lengths: list[int] | None = None  # drafts with exactly j accepted

    def __post_init__(self) -> None:
        self.per_pos = list(self.per_pos or [0] * MAX_K)
        self.lengths = list(self.lengths or [0] * _N)

    def add(self, k: int, accepted: list[int]) -> None:
        self.add_sums(_HistogramSums.of({k: accepted}))

    def add_sums(self, sums: _HistogramSums) -> None:
        self.drafts += sums.drafts
        self.draft_tokens += sums.draft_tokens
        self.accepted_tokens += sums.accepted_tokens
        for i, n in enumerate(sums.accepted):  # accepted at position i+1 is vLLM's per-position counter
            self.per_pos[i] += n
        for j, n in enumerate(sums.lengths):
            self.lengths[j] += n

    def to_dict(self) -> dict:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "per_pos": list(self.per_pos), "lengths": list(self.lengths)}

    @classmethod
    def from_dict(cls, d: dict) -> Cumulative:
        per_pos = [int(x) for x in d.get("per_pos", [])][:MAX_K]
        lengths = [int(x) for x in d.get("lengths", [])][:_N]
        return cls(int(d["drafts"]), int(d["draft_tokens"]), int(d["accepted_tokens"]),
                   per_pos + [0] * (MAX_K - len(per_pos)), lengths + [0] * (_N - len(lengths)))


class AcceptanceEstimator(Decayed):
    """Decayed per-position evidence for one (model, category, method)."""

    _decayed = ("reached", "accepted", "lengths", "real_drafts", "cf_drafts", "attempts", "hits")

    __slots__ = ("accepted", "attempts", "cf_cum", "cf_drafts", "cum", "hits", "lengths", "max_k", "reached",
                 "real_drafts", "t_last")

    def __init__(self) -> None:
        self.reached = np.zeros(MAX_K)
        self.accepted = np.zeros(MAX_K)
        self.lengths = np.zeros(_N)
        self.t_last: float | None = None
        self.max_k = 0
        self.real_drafts = 0.0  # decayed drafts that were really run
        self.cf_drafts = 0.0  # decayed drafts scored counterfactually
        self.attempts = 0.0  # decayed asks of the drafter (request steps or counterfactual proposals tried)
        self.hits = 0.0  # decayed asks that drafted at least one token
        self.cum = Cumulative()
        self.cf_cum = Cumulative()

    # -- learning -------------------------------------------------------------------------------------------
    def add(self, k: int, accepted: list[int], counterfactual: bool) -> None:
        """Add one (already validated) histogram; call :meth:`decay_to` first for the batch's time."""
        self.add_many({k: accepted}, counterfactual)

    def add_many(self, per_k: Mapping[int, Sequence[int]], counterfactual: bool) -> None:
        """Add several (already validated) histograms, proposal length -> counts, as one piece of evidence.

        The batch's histograms are summed in integers first, so the decayed arrays get one vector add per
        batch instead of several per proposal length (numpy's per-call cost dominates arrays this small).
        Call :meth:`decay_to` first for the batch's time.
        """
        sums = _HistogramSums.of(per_k)
        top = len(sums.reached)
        self.reached[:top] += sums.reached
        self.accepted[:top] += sums.accepted
        self.lengths[: top + 1] += sums.lengths
        if counterfactual:
            self.cf_drafts += sums.drafts
            self.cf_cum.add_sums(sums)
        else:
            self.real_drafts += sums.drafts
            self.cum.add_sums(sums)
        self.max_k = max(self.max_k, sums.max_k_drafted)

    def add_attempts(self, attempts: float, hits: float) -> None:
        """Asks of the drafter and how many of them drafted; call :meth:`decay_to` first."""
        self.attempts += max(0.0, attempts)
        self.hits += max(0.0, min(hits, attempts))

    def merge_from(self, other: AcceptanceEstimator) -> None:
        """Pool another estimator's decayed evidence (both decayed to the same time first)."""
        self.reached += other.reached
        self.accepted += other.accepted
        self.lengths += other.lengths
        self.real_drafts += other.real_drafts
        self.cf_drafts += other.cf_drafts
        self.attempts += other.attempts
        self.hits += other.hits
        self.max_k = max(self.max_k, other.max_k)
        if other.t_last is not None and (self.t_last is None or other.t_last > self.t_last):
            self.t_last = other.t_last

    # -- reading --------------------------------------------------------------------------------------------
    @property
    def evidence(self) -> float:
        """Decayed drafts that reached position 1 (real + counterfactual)."""
        return float(self.reached[0])

    def betas(self, k: int, prior_mean: float, prior_strength: float) -> list[float]:
        """Posterior mean conditional acceptance for positions 1..k (prior chained from the position before)."""
        out: list[float] = []
        mean = prior_mean
        reached = self.reached
        acc = self.accepted
        for i in range(k):
            r = float(reached[i])
            mean = (prior_strength * mean + float(acc[i])) / (prior_strength + r)
            out.append(mean)
        return out

    def match_rate(self, prior_strength: float) -> float:
        """Share of asks that drafted: Beta posterior mean with a prior of ``prior_strength`` asks at 1 (no
        evidence of misses: price the drafter as if it always drafts, as before the rate was reported)."""
        return (prior_strength + self.hits) / (prior_strength + self.attempts)

    def length_distribution(self) -> list[float]:
        total = float(self.lengths.sum())
        top = max(self.max_k, 1)
        if total <= 0:
            return [0.0] * (top + 1)
        return [float(x) / total for x in self.lengths[: top + 1]]

    def mean_acceptance_length(self) -> float | None:
        """vLLM's definition: 1 + accepted tokens per draft (decayed); None without drafts."""
        total = float(self.lengths.sum())
        if total <= 0:
            return None
        return 1.0 + float(np.dot(np.arange(_N), self.lengths)) / total

    # -- persistence ----------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        top = max(self.max_k, 1)
        return {
            "reached": self.reached[:top].tolist(), "accepted": self.accepted[:top].tolist(),
            "lengths": self.lengths[: top + 1].tolist(), "t_last": self.t_last, "max_k": self.max_k,
            "real_drafts": self.real_drafts, "cf_drafts": self.cf_drafts,
            "attempts": self.attempts, "hits": self.hits,
            "cum": self.cum.to_dict(), "cf_cum": self.cf_cum.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> AcceptanceEstimator:
        est = cls()
        for name, size in (("reached", MAX_K), ("accepted", MAX_K), ("lengths", _N)):
            vals = np.asarray([float(x) for x in d[name]][:size], dtype=float)
            if not np.all(np.isfinite(vals)) or np.any(vals < 0):
                raise ValueError(f"bad {name}")
            getattr(est, name)[: len(vals)] = vals
        if np.any(est.accepted > est.reached + 1e-9):
            raise ValueError("accepted exceeds reached")
        est.t_last = None if d.get("t_last") is None else float(d["t_last"])
        est.max_k = min(int(d.get("max_k", 0)), MAX_K)
        est.real_drafts = max(0.0, float(d.get("real_drafts", 0.0)))
        est.cf_drafts = max(0.0, float(d.get("cf_drafts", 0.0)))
        est.attempts = max(0.0, float(d.get("attempts", 0.0)))
        est.hits = min(max(0.0, float(d.get("hits", 0.0))), est.attempts)
        if not (math.isfinite(est.attempts) and math.isfinite(est.hits)):
            raise ValueError("bad attempts")
        est.cum = Cumulative.from_dict(d["cum"])
        est.cf_cum = Cumulative.from_dict(d["cf_cum"])
        return est
