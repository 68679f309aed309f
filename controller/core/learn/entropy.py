"""Entropy class of a category, from its acceptance profile.

A drafter's token is accepted with probability close to the target's probability mass on it, so a
category whose drafts are accepted often is one where the target is predictable (low entropy). We
summarise the profile as *surprise bits per drafted token*::

    bits = -log2( exp( sum_i r_i * ln(beta_i) / sum_i r_i ) )

the negative log2 of the reach-weighted geometric mean of the conditional acceptance ``beta_i``
(weights ``r_i`` = decayed drafts that reached position i, so well-measured positions dominate).
A fully predictable category has 0 bits; acceptance 0.5 per token is 1 bit.

Classes (thresholds are constants here and exposed with every view):
  * ``low``    bits <  0.5   (mean acceptance > 0.71: JSON, code, copying; speculate deep)
  * ``medium`` 0.5 <= bits < 1.5
  * ``high``   bits >= 1.5   (mean acceptance < 0.35: open conversation; speculation rarely pays)
  * ``unknown`` fewer than ``min_evidence`` drafts reached position 1.

Trade-off: the class is descriptive (dashboards, operators); the policy itself uses the full per-position
profile and the cost model, never the class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOW_MAX_BITS = 0.5
HIGH_MIN_BITS = 1.5
_FLOOR = 1e-6  # keeps log finite when a position was never accepted


@dataclass(frozen=True)
class EntropyClass:
    name: str  # low | medium | high | unknown
    bits: float | None
    mean_acceptance: float | None  # the geometric mean behind ``bits``
    evidence: float
    low_max_bits: float = LOW_MAX_BITS
    high_min_bits: float = HIGH_MIN_BITS

    def to_dict(self) -> dict:
        return {"class": self.name, "bits": self.bits, "mean_acceptance": self.mean_acceptance,
                "evidence": self.evidence, "thresholds": {"low_below_bits": self.low_max_bits,
                                                          "high_from_bits": self.high_min_bits}}


def classify(betas: list[float], reached: list[float], min_evidence: float) -> EntropyClass:
    """Class from posterior-mean ``betas`` and decayed ``reached`` counts per position (same length)."""
    evidence = reached[0] if reached else 0.0
    weight = sum(reached)
    if evidence < min_evidence or weight <= 0:
        return EntropyClass("unknown", None, None, evidence)
    log_mean = sum(r * math.log(max(b, _FLOOR)) for b, r in zip(betas, reached)) / weight
    bits = -log_mean / math.log(2)
    name = "low" if bits < LOW_MAX_BITS else ("high" if bits >= HIGH_MIN_BITS else "medium")
    return EntropyClass(name, bits, math.exp(log_mean), evidence)
