"""Per-request proposal length, adapted every engine step (the fast timescale).

Rule (O(1) per request, no I/O), applied after each verify step of a request that had ``drafted > 0``:

  * every draft accepted (``accepted == drafted``): one more full step; after ``climb_after`` in a row,
    ``k_r = min(k_r + 1, k_max)``;
  * nothing accepted (``accepted == 0``): after ``drop_after`` in a row, ``k_r = k_min``
    (default ``drop_after = 1``: a request rejected at position 0 drops at once);
  * partial acceptance: ``k_r = clamp(accepted + 1, k_min, k_max)`` -- the classic "one more than what
    was accepted last time" heuristic, which tracks the request's own acceptance length.

A request at ``k_r == 0`` produces no signal; it is brought back to ``max(k_min, 1)`` every
``RETRY_EVERY`` steps so that a request whose text becomes predictable (e.g. a JSON body after
prose) can climb again. ``k_min``/``k_max`` come from the controller's :class:`AdaptRule`; the controller
keeps ``k_min = k_max`` when it wants a fixed k (an operator pin, or a category where adaptation loses).

Trade-off: one rejected step costs at most one step's drafts; one lucky step climbs only by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from specctl_vllm.kernel.protocol import AdaptRule

RETRY_EVERY = 16


@dataclass(slots=True)
class RequestK:
    """Mutable per-request adaptation state kept by the engine patch."""

    k: int
    full_streak: int = 0
    reject_streak: int = 0
    idle_steps: int = 0


def initial_state(k: int, rule: AdaptRule) -> RequestK:
    return RequestK(k=min(max(k, rule.k_min), rule.k_max))


def next_k(state: RequestK, drafted: int, accepted: int, rule: AdaptRule) -> RequestK:
    """Update ``state`` in place after one step and return it."""
    if drafted <= 0:
        if state.k == 0 and rule.k_max > 0:
            state.idle_steps += 1
            if state.idle_steps >= RETRY_EVERY:
                state.idle_steps = 0
                state.k = max(rule.k_min, 1)
        return state
    state.idle_steps = 0
    if accepted >= drafted:
        state.reject_streak = 0
        state.full_streak += 1
        if state.full_streak >= rule.climb_after:
            state.full_streak = 0
            state.k = min(max(state.k, drafted) + 1, rule.k_max)
    elif accepted == 0:
        state.full_streak = 0
        state.reject_streak += 1
        if state.reject_streak >= rule.drop_after:
            state.k = rule.k_min
    else:
        state.full_streak = 0
        state.reject_streak = 0
        state.k = min(max(accepted + 1, rule.k_min), rule.k_max)
    return state
