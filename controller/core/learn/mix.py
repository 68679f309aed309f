"""The batch an engine runs at: decayed mean batch size, prefill tokens and category mix per step.

The goodput policy optimises one mean step, so it needs "how many requests of each category share a
step, and how many prefill tokens ride along". Load moves faster than acceptance, hence a short
half-life of its own (LearnerSettings.mix_half_life_s). Idle steps (no request) are not counted: the
policy is for the batch the engine runs when it is busy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from specctl_vllm.kernel.decay import Decayed

#: Prefill tokens per step are kept as a decayed histogram (bins of this many tokens, last bin open), so
#: the policy can take the expectation of the cost's knee over how prefill really arrives (in bursts).
EXTRA_BIN = 64
EXTRA_BINS = 129
DIST_POINTS = 8


def _binned(values: Iterable[float]) -> dict[int, tuple[int, float]]:
    """(steps, summed tokens) per bin of prefill tokens.

    A plain loop: a batch carries a handful of steps, for which numpy's per-call cost is most of the work.
    """
    out: dict[int, tuple[int, float]] = {}
    for v in values:
        b = min(int(v // EXTRA_BIN), EXTRA_BINS - 1)
        count, total = out.get(b, (0, 0))
        out[b] = (count + 1, total + v)
    return out


class Mix(Decayed):
    _decayed = ("steps", "requests", "extra_tokens", "extra_w", "extra_sum", "committed", "committed_per_category",
                "per_category")
    __slots__ = (
        "committed",
        "committed_per_category",
        "extra_sum",
        "extra_tokens",
        "extra_w",
        "per_category",
        "requests",
        "steps",
        "t_last",
    )

    def __init__(self) -> None:
        self.steps = 0.0  # decayed busy steps
        self.requests = 0.0  # decayed sum of batch sizes
        self.extra_tokens = 0.0  # decayed sum of prefill tokens beyond one token per request
        self.per_category: dict[str, float] = {}
        self.t_last: float | None = None
        self.extra_w = np.zeros(EXTRA_BINS)  # decayed steps per bin of prefill tokens
        self.extra_sum = np.zeros(EXTRA_BINS)  # decayed sum of prefill tokens per bin (exact bin means)
        self.committed = 0.0  # decayed committed tokens (to relate prefill to goodput)
        self.committed_per_category: dict[str, float] = {}  # decayed committed tokens per category

    def add(self, steps: int, requests: int, extra_tokens: int, per_category: dict[str, int],
            extra_values: list[int] | None = None, committed: dict[str, int] | None = None) -> None:
        """Add busy steps; ``extra_values`` = prefill tokens of each step (for the distribution),
        ``committed`` = committed tokens per category."""
        for c, n in (committed or {}).items():
            self.committed += n
            self.committed_per_category[c] = self.committed_per_category.get(c, 0.0) + n
        self.steps += steps
        self.requests += requests
        self.extra_tokens += extra_tokens
        for c, n in per_category.items():
            self.per_category[c] = self.per_category.get(c, 0.0) + n
        for b, (count, total) in _binned(extra_values or ()).items():
            self.extra_w[b] += count
            self.extra_sum[b] += total

    def extra_distribution(self, points: int = DIST_POINTS) -> tuple[tuple[float, float], ...]:
        """Prefill tokens per step as <= ``points`` (value, weight) pairs of equal weight (quantile groups)."""
        total = float(self.extra_w.sum())
        if total <= 1e-9:
            return ()
        out: list[tuple[float, float]] = []
        w_acc = s_acc = 0.0
        step = total / points
        for w, v in zip(self.extra_w, self.extra_sum):
            if w <= 0:
                continue
            w_acc += float(w)
            s_acc += float(v)
            if w_acc >= step * (1 - 1e-9):
                out.append((s_acc / w_acc, w_acc / total))
                w_acc = s_acc = 0.0
        if w_acc > 0:
            out.append((s_acc / w_acc, w_acc / total))
        return tuple(out)

    @property
    def batch_size(self) -> float | None:
        return self.requests / self.steps if self.steps > 1e-9 else None

    @property
    def extra_per_committed(self) -> float:
        """Prefill tokens per committed token (0 until both were seen)."""
        return self.extra_tokens / self.committed if self.committed > 1e-9 else 0.0

    @property
    def extra_per_step(self) -> float:
        return self.extra_tokens / self.steps if self.steps > 1e-9 else 0.0

    def committed_shares(self) -> dict[str, float]:
        """Committed tokens per busy step, per category."""
        if self.steps <= 1e-9:
            return {}
        return {c: n / self.steps for c, n in self.committed_per_category.items()}

    def shares(self) -> dict[str, float]:
        if self.steps <= 1e-9:
            return {}
        return {c: n / self.steps for c, n in self.per_category.items()}

    def to_dict(self) -> dict:
        return {"steps": self.steps, "requests": self.requests, "extra_tokens": self.extra_tokens,
                "per_category": dict(self.per_category), "t_last": self.t_last,
                "extra_w": _trimmed(self.extra_w), "extra_sum": _trimmed(self.extra_sum), "committed": self.committed,
                "committed_per_category": dict(self.committed_per_category)}

    @classmethod
    def from_dict(cls, d: dict) -> Mix:
        m = cls()
        m.steps = max(0.0, float(d["steps"]))
        m.requests = max(0.0, float(d["requests"]))
        m.extra_tokens = max(0.0, float(d["extra_tokens"]))
        m.per_category = {str(k): max(0.0, float(v)) for k, v in d.get("per_category", {}).items()}
        m.t_last = None if d.get("t_last") is None else float(d["t_last"])
        m.committed = max(0.0, float(d.get("committed", 0.0)))
        m.committed_per_category = {str(k): max(0.0, float(v))
                                    for k, v in d.get("committed_per_category", {}).items()}
        w = _padded(d.get("extra_w", []))
        v = _padded(d.get("extra_sum", []))
        if w is not None and v is not None:
            m.extra_w, m.extra_sum = w, v  # an older snapshot without the histogram starts it empty
        return m


def _trimmed(bins: np.ndarray) -> list[float]:
    """The bins up to the last non-zero one: most engines' prefill sizes fill a few of the 129 bins, and an
    engine's book was 2 x 129 floats in every snapshot (36 MB of objects at the engine cap)."""
    nonzero = np.flatnonzero(bins)
    return bins[: nonzero[-1] + 1 if nonzero.size else 0].tolist()


def _padded(values: object) -> np.ndarray | None:
    """:func:`_trimmed`'s list back to ``EXTRA_BINS`` bins (a full-length list as older snapshots wrote it
    too); None if it is no list of finite non-negative numbers of at most that length."""
    try:
        a = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        return None
    if a.ndim != 1 or a.size > EXTRA_BINS or not np.all(np.isfinite(a)) or not np.all(a >= 0):
        return None
    return np.concatenate([a, np.zeros(EXTRA_BINS - a.size)])
