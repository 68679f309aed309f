"""SGLang-style adaptive speculation tiers: the acceptance-EMA baseline specctl is compared against.

A port of SGLang's EMA strategy (``python/sglang/srt/speculative/adaptive_spec_params.py``:
``AdaptiveStepSlot`` and ``AdaptiveSpeculativeParams``, with the batch-size routing of
``adaptive_step_router.py``). It is a baseline for the benchmarks and ``specctl replay`` (which runs the tiers
over recorded steps, :func:`recorded_steps`); the service never serves it.

Model. One engine-wide proposal length ("steps") per batch-size slot. The slot of a batch is the largest
configured key <= the batch size (keys 1, 8, 32, 64 by default: batches 1-7, 8-31, 32-63, >= 64). Each slot
keeps its own state: after every verify batch routed to it,

    ema <- (1 - alpha) * ema + alpha * mean(accepted drafts per request)      (only while steps > 0)
    count <- count + 1

and after ``warmup_batches`` batches, every ``update_interval`` batches, the slot re-picks its steps among
its ``candidate_steps`` (sorted):

  * steps == 0: probe the next candidate up (resetting a negative EMA to that step - 1);
  * otherwise step down while ema <= drop threshold of the next lower candidate
    (``prev - 0.5``, or ``0.5`` when the lower candidate is 0, plus ``down_hysteresis``);
  * if it did not move down, step up while ema > ``steps - 0.5 + up_hysteresis``;
  * ``ceiling_coeff`` > 0 caps a non-increasing target at ``ceil(ema * ceiling_coeff)``.

A fresh slot starts at the engine's configured steps if that is a candidate, else the middle candidate,
with ``ema = steps - 1``.

Defaults (SGLang's ``DEFAULT_ADAPTIVE_CONFIG``): slot 1: candidates 1/3/5/7, down hysteresis -0.25;
slot 8: 0/1/3; slot 32: 0/1; slot 64: 0; alpha 0.2, interval 5, warm-up 10, no ceiling. Candidates above
the engine's ``k_max`` are clamped to it (this engine cannot verify more).

Trade-offs: the rule reacts to acceptance only (not to the step cost), is engine-wide (one k for every
category) and per batch-size slot; it cannot tell that a large batch makes drafts dearer except through
the fixed slot candidates. Each update is O(requests in the batch); the state is a few numbers per slot.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from specctl_vllm.kernel.protocol import TelemetryBatch


@dataclass(frozen=True)
class SlotConfig:
    """One batch-size slot of SGLang's adaptive config (field names as in SGLang)."""

    candidate_steps: tuple[int, ...]
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0.0


#: SGLang's DEFAULT_ADAPTIVE_CONFIG (batch-size key -> slot).
DEFAULT_SLOTS: dict[int, SlotConfig] = {
    1: SlotConfig((1, 3, 5, 7), down_hysteresis=-0.25, up_hysteresis=0.0),
    8: SlotConfig((0, 1, 3), down_hysteresis=0.0, up_hysteresis=0.0),
    32: SlotConfig((0, 1), down_hysteresis=0.0, up_hysteresis=0.0),
    64: SlotConfig((0,), down_hysteresis=0.0, up_hysteresis=0.0),
}


@dataclass(frozen=True)
class SlotState:
    steps: int
    ema: float
    count: int = 0


@dataclass(frozen=True)
class TiersState:
    """All slots' states, keyed like the config."""

    slots: Mapping[int, SlotState]

    def steps_for_batch(self, batch_size: int) -> int:
        return self.slots[slot_key(tuple(sorted(self.slots)), batch_size)].steps


def clamp_slots(slots: Mapping[int, SlotConfig], k_max: int) -> dict[int, SlotConfig]:
    """Candidates above ``k_max`` become ``k_max`` (duplicates merged)."""
    return {key: replace(cfg, candidate_steps=tuple(sorted({min(s, k_max) for s in cfg.candidate_steps})))
            for key, cfg in slots.items()}


def slot_key(keys: Sequence[int], batch_size: int) -> int:
    """The largest key <= batch_size (the smallest key for smaller batches), as SGLang's router."""
    i = bisect.bisect_right(keys, batch_size) - 1
    return keys[max(0, i)]


def init_slot(initial_steps: int, cfg: SlotConfig) -> SlotState:
    cands = cfg.candidate_steps
    steps = initial_steps if initial_steps in cands else cands[len(cands) // 2]
    return SlotState(steps=steps, ema=float(steps - 1))


def init_state(initial_steps: int, slots: Mapping[int, SlotConfig] = DEFAULT_SLOTS) -> TiersState:
    return TiersState({key: init_slot(initial_steps, cfg) for key, cfg in sorted(slots.items())})


def _recompute(s: SlotState, cfg: SlotConfig) -> SlotState:
    cands = cfg.candidate_steps
    idx = cands.index(s.steps)
    if s.steps == 0:
        idx = min(idx + 1, len(cands) - 1)
        target = cands[idx]
        ema = float(target - 1) if target > 0 and s.ema < 0 else s.ema
        return replace(s, steps=target, ema=ema)
    old = idx
    while idx > 0:
        prev = cands[idx - 1]
        drop = (0.5 if prev == 0 else prev - 0.5) + cfg.down_hysteresis
        if s.ema <= drop:
            idx -= 1
        else:
            break
    if idx >= old:
        while idx < len(cands) - 1 and s.ema > cands[idx] - 0.5 + cfg.up_hysteresis:
            idx += 1
    target = cands[idx]
    if cfg.ceiling_coeff > 0:
        ceiling = max(1, math.ceil(s.ema * cfg.ceiling_coeff))
        if ceiling < target <= s.steps:
            while idx > 0 and cands[idx] > ceiling:
                idx -= 1
            target = cands[idx]
    return replace(s, steps=target)


def update_slot(s: SlotState, cfg: SlotConfig, accepted: Sequence[float]) -> SlotState:
    """One verify batch of this slot: ``accepted`` = accepted draft tokens per request."""
    if not accepted:
        return s
    ema = s.ema
    if s.steps > 0:
        ema = (1 - cfg.ema_alpha) * ema + cfg.ema_alpha * (sum(accepted) / len(accepted))
    s = SlotState(s.steps, ema, s.count + 1)
    if s.count <= cfg.warmup_batches or (s.count - cfg.warmup_batches) % cfg.update_interval:
        return s
    return _recompute(s, cfg)


def update(state: TiersState, slots: Mapping[int, SlotConfig], batch_size: int,
           accepted: Sequence[float]) -> TiersState:
    """Route one verify batch to its slot and update that slot only."""
    key = slot_key(tuple(sorted(slots)), batch_size)
    old = state.slots[key]
    new = update_slot(old, slots[key], accepted)
    if new == old:
        return state
    return TiersState({**state.slots, key: new})


# --- the tiers over recorded steps (``specctl replay``) --------------------------------------------------------------
def _tail(betas: np.ndarray, start: int, k: int) -> float:
    """Expected further acceptances at positions start+1..k given everything up to ``start`` was accepted."""
    if k <= start:
        return 0.0
    return float(np.sum(np.cumprod(betas[start:k])))


def recorded_steps(batches: Sequence[TelemetryBatch], betas: Mapping[str, np.ndarray], k_max: int,
                   initial_steps: int = 3, slots: Mapping[int, SlotConfig] | None = None
                   ) -> dict[int, int]:
    """Steps the EMA tiers would have spent at each k on the recorded traffic.

    Each recorded draft of length ``k_r`` with ``j`` accepted is what a draft of length ``k`` would have
    accepted up to ``min(j, k)`` (prefix-consistent drafters); beyond ``k_r`` after a full acceptance the
    category's conditional acceptance ``betas`` gives the expected rest.
    """
    cfg = clamp_slots(slots or DEFAULT_SLOTS, k_max)
    state = init_state(min(initial_steps, k_max), cfg)
    counts: dict[int, int] = defaultdict(int)
    for b in batches:
        for st in b.steps:
            if st.batch_size <= 0:
                continue
            k = state.steps_for_batch(st.batch_size)
            counts[k] += 1
            accepted: list[float] = []
            for cs in st.categories:
                bet = betas.get(cs.category)
                for h in cs.hists:
                    for j, n in enumerate(h.accepted):
                        if not n:
                            continue
                        if j < h.k or k <= h.k:
                            a = float(min(j, k))
                        else:
                            a = h.k + (_tail(bet, h.k, k) if bet is not None else 0.0)
                        accepted.extend([a] * n)
            if k == 0:
                accepted = [0.0] * st.batch_size
            if accepted:
                state = update(state, cfg, st.batch_size, accepted)
    return dict(counts)
