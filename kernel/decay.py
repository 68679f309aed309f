"""Exponential forgetting, in one place: every learner's state is decayed sums that age with one half-life.

A learner names its decayed attributes in ``_decayed`` (floats, numpy arrays, dicts of floats or of lists of
floats) and gets :meth:`Decayed.decay_to`, which ages them to ``now`` in place (writes), and
:meth:`Decayed.factor_to`, the factor that would apply (reads: a view computed at ``now`` scales what it
reads by it and leaves the state alone). Time only moves forward: a clock that repeats or steps back ages
nothing and keeps the latest time. :meth:`Decayed.aged` gives a read an aged copy when it needs the whole
object at ``now`` (the original is untouched).
"""

from __future__ import annotations

import copy

import numpy as np


def decay_factor(dt: float, half_life_s: float) -> float:
    """Weight left after ``dt`` seconds with the given half-life (1 for dt <= 0: clocks may repeat)."""
    if dt <= 0:
        return 1.0
    return 0.5 ** (dt / half_life_s)


class Decayed:
    """Mixin for state made of decayed sums; ``t_last`` is the time they were last aged to (None: never)."""

    __slots__ = ()
    #: names of the attributes that hold decayed sums
    _decayed: tuple[str, ...] = ()
    t_last: float | None

    def factor_to(self, now: float, half_life_s: float) -> float:
        """The factor :meth:`decay_to` would apply at ``now`` (1 before the first update)."""
        return 1.0 if self.t_last is None else decay_factor(now - self.t_last, half_life_s)

    def decay_to(self, now: float, half_life_s: float) -> None:
        f = self.factor_to(now, half_life_s)
        if f < 1.0:
            for name in self._decayed:
                setattr(self, name, _scaled(getattr(self, name), f))
            self._decayed_changed()
        if self.t_last is None or now > self.t_last:
            self.t_last = now

    def aged(self, now: float, half_life_s: float):
        """A copy aged to ``now`` for a read (``self`` when nothing would change); ``self`` is left alone."""
        f = self.factor_to(now, half_life_s)
        if f >= 1.0:
            return self
        out = copy.copy(self)
        for name in self._decayed:
            setattr(out, name, _scaled(_copied(getattr(self, name)), f))
        out._decayed_changed()
        out.t_last = now
        return out

    def _decayed_changed(self) -> None:
        """Called after the sums were aged (e.g. to drop what was derived from them)."""


def _copied(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: list(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


def _scaled(value, f: float):
    if isinstance(value, np.ndarray):
        value *= f
        return value
    if isinstance(value, dict):
        for key, v in value.items():
            if isinstance(v, list):
                v[:] = [x * f for x in v]
            else:
                value[key] = v * f
        return value
    return value * f
