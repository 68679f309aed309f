"""The width rule's fast timescale: what this engine measured of each category's acceptance over the last few
dozen steps, blended into the controller's curve (no I/O).

The controller's E_c(K) has minutes of evidence behind it and arrives with its next policy; a burst of JSON
after prose must move the width within a second. So each step's accepted drafts and rejections per category
are folded into decayed sums (:data:`FAST_DECAY`), read as a geometric curve and blended with the controller's,
weighing at most :data:`FAST_MAX_WEIGHT`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specctl_vllm.kernel.model.widths import COLD_BETA, geometric_lengths

#: Per-step decay of the fast acceptance sums: a half-life of about 35 steps (well under a second on a GPU).
FAST_DECAY = 0.98
#: Request-steps of fast evidence at which it weighs as much as the controller's curve; it never weighs more
#: than :data:`FAST_MAX_WEIGHT` (the controller's curve has minutes of evidence behind it).
FAST_HALF_WEIGHT = 100.0
FAST_MAX_WEIGHT = 0.5


class FastCurves:
    """Decayed [accepted drafts, rejections] per category, and the blended curve they give."""

    def __init__(self, k_max: int) -> None:
        self.k_max = k_max
        self._sums: dict[str, list[float]] = {}  # category -> [accepted drafts, rejections]

    def __contains__(self, category: str) -> bool:
        """Whether this engine has seen ``category`` draft."""
        return category in self._sums

    def observe(self, agg: Mapping, by_category: Mapping[str, Sequence[int]] | None = None) -> None:
        """Fold one step's per-(category, method) histograms into the fast sums, and ``by_category``: per
        category, [accepted drafts, rejections, ...] of drafted requests counted without histograms (read from
        the hook's packed codes)."""
        for sums in self._sums.values():
            sums[0] *= FAST_DECAY
            sums[1] *= FAST_DECAY
        for category, (accepted, rejected, *_) in (by_category or {}).items():
            sums = self._sums.get(category)
            if sums is None:
                sums = self._sums[category] = [0.0, 0.0]
            sums[0] += accepted
            sums[1] += rejected
        for (category, _method), entry in agg.items():
            hists = entry.hists
            if not hists:
                continue
            sums = self._sums.get(category)
            if sums is None:
                sums = self._sums[category] = [0.0, 0.0]
            for drafted, counts in hists.items():
                for accepted, n in enumerate(counts):
                    if n:
                        sums[0] += accepted * n
                        if accepted < drafted:
                            sums[1] += n

    def curve(self, category: str, slow: Sequence[float] | None) -> tuple[float, ...]:
        """E(K) for ``category``: ``slow`` (the controller's curve) blended with the fast evidence; the fast
        curve alone without ``slow``, ``slow`` alone (or the cold prior) without evidence."""
        sums = self._sums.get(category)
        evidence = (sums[0] + sums[1]) if sums else 0.0
        if evidence <= 0:
            return tuple(slow) if slow else geometric_lengths(COLD_BETA, self.k_max)
        fast = geometric_lengths(sums[0] / evidence, self.k_max)
        if not slow:
            return fast
        w = min(FAST_MAX_WEIGHT, evidence / (evidence + FAST_HALF_WEIGHT))
        return tuple((1 - w) * a + w * b for a, b in zip(slow, fast))
