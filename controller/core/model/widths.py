"""The width rule: one proposal width K per step, from the width set the engine captured full graphs for.

    K* = argmax_{K in W}  sum_c n_c * E_c(K) / T(b, K)     subject to   value(K) >= value(0) * (1 + margin(b, K))

``n_c`` the step's requests per category, ``E_c(K)`` the expected tokens a request of category c commits when it
verifies K drafts (1 + the expected accepted drafts), ``T(b, K)`` the step time of the batch bucket b at width
K (:mod:`.cells`), and the margin shrinks with the steps measured in both cells: a width above 0 must beat plain
decoding *by measurement* before it is used. O(categories x widths), no allocation beyond one tuple per call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Smallest relative gain over K = 0 a width must show in two well-measured cells (measurement noise of a
#: steady step time on one GPU is ~1-2 %).
BASE_MARGIN = 0.02
#: Extra margin for a cell measured over no step: the modelled gain must be large before an unmeasured width
#: is trusted, and shrinks as 1/sqrt(steps).
UNMEASURED_MARGIN = 0.30


def expected_lengths(betas: Sequence[float], k_max: int) -> tuple[float, ...]:
    """E(K) for K = 0..k_max from per-position conditional acceptance ``betas`` (position 1 first):
    E(K) = 1 + sum_{i=1..K} prod_{j<=i} beta_j. Positions beyond ``betas`` reuse its last value."""
    out = [1.0]
    survive = 1.0
    last = betas[-1] if betas else 0.0
    for i in range(k_max):
        beta = betas[i] if i < len(betas) else last
        survive *= min(max(float(beta), 0.0), 1.0)
        out.append(out[-1] + survive)
    return tuple(out)


def geometric_lengths(beta: float, k_max: int) -> tuple[float, ...]:
    return expected_lengths((beta,), k_max)


def margin(steps_k: float, steps_0: float, base: float = BASE_MARGIN, unmeasured: float = UNMEASURED_MARGIN) -> float:
    n = max(min(steps_k, steps_0), 0.0)
    return base + unmeasured / math.sqrt(1.0 + n)


@dataclass(frozen=True, kw_only=True)
class WidthChoice:
    width: int
    value: float  # modelled committed tokens per second at that width
    plain_value: float  # the same at K = 0


def choose_width(
    mix: Mapping[str, int],
    curves: Mapping[str, Sequence[float]],
    widths: Sequence[int],
    step_s: Sequence[float],
    steps: Sequence[float],
    default_curve: Sequence[float] = (1.0,),
) -> WidthChoice:
    """The width rule for one step. ``widths`` ascending with 0 first; ``step_s[i]``/``steps[i]`` the cell's
    step time and measured steps at ``widths[i]`` for this step's batch bucket; ``curves[c][K]`` = E_c(K)
    (a category without a curve uses ``default_curve``; a curve shorter than K is extended flat)."""
    n = sum(mix.values())
    t0 = step_s[0]
    if n <= 0 or t0 <= 0 or not math.isfinite(t0):
        return WidthChoice(width=0, value=0.0, plain_value=0.0)
    plain = n / t0
    best, best_value = 0, plain
    for i in range(1, len(widths)):
        t = step_s[i]
        if not (t > 0 and math.isfinite(t)):
            continue
        k = widths[i]
        tokens = 0.0
        for cat, count in mix.items():
            curve = curves.get(cat, default_curve)
            tokens += count * curve[min(k, len(curve) - 1)]
        value = tokens / t
        if value > best_value and value >= plain * (1.0 + margin(steps[i], steps[0])):
            best, best_value = k, value
    return WidthChoice(width=best, value=best_value, plain_value=plain)
