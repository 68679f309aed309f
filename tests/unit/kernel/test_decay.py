"""One forgetting rule for every learner: decayed sums age in place on writes, reads take the factor only."""

from __future__ import annotations

import numpy as np
import pytest

from specctl_vllm.controller.core.learn.cost_fit import OnlineCostModel
from specctl_vllm.controller.core.learn.estimator import AcceptanceEstimator
from specctl_vllm.controller.core.learn.mix import Mix
from specctl_vllm.kernel.cost import H200
from specctl_vllm.kernel.decay import Decayed, decay_factor
from specctl_vllm.kernel.model.cells import CellTable


class Sums(Decayed):
    _decayed = ("x", "arr", "per", "lists")

    def __init__(self) -> None:
        self.t_last = None
        self.x, self.arr, self.per, self.lists = 8.0, np.array([4.0, 2.0]), {"a": 2.0}, {(0, 1): [6.0, 3.0]}
        self.changed = 0

    def _decayed_changed(self) -> None:
        self.changed += 1


@pytest.mark.parametrize(("times", "factor", "t_last", "changed"), [
    ((0.0, 10.0), 0.5, 10.0, 1),  # one half-life
    ((0.0, 20.0), 0.25, 20.0, 1),
    ((0.0, 0.0), 1.0, 0.0, 0),  # a repeated clock ages nothing
    ((10.0, 5.0), 1.0, 10.0, 0),  # a clock stepping back ages nothing and keeps the latest time
    ((5.0,), 1.0, 5.0, 0),  # the first update only sets the time
])
def test_decay_to_scales_every_kind_of_sum(times, factor, t_last, changed) -> None:
    s = Sums()
    for t in times:
        s.decay_to(t, 10.0)
    assert s.x == pytest.approx(8.0 * factor)
    assert s.arr.tolist() == pytest.approx([4.0 * factor, 2.0 * factor])
    assert s.per["a"] == pytest.approx(2.0 * factor)
    assert s.lists[(0, 1)] == pytest.approx([6.0 * factor, 3.0 * factor])
    assert (s.t_last, s.changed) == (t_last, changed)


def test_factor_to_is_a_read() -> None:
    s = Sums()
    s.decay_to(0.0, 10.0)
    assert s.factor_to(10.0, 10.0) == pytest.approx(decay_factor(10.0, 10.0)) == pytest.approx(0.5)
    assert (s.x, s.t_last) == (8.0, 0.0)


def test_aged_is_a_copy_and_leaves_the_original_alone() -> None:
    s = Sums()
    s.decay_to(0.0, 10.0)
    old = (s.x, s.arr.tolist(), dict(s.per), {k: list(v) for k, v in s.lists.items()}, s.t_last)
    a = s.aged(10.0, 10.0)
    assert (a.x, a.arr.tolist(), a.per, a.lists, a.t_last) == (4.0, [2.0, 1.0], {"a": 1.0}, {(0, 1): [3.0, 1.5]}, 10.0)
    assert (s.x, s.arr.tolist(), s.per, s.lists, s.t_last) == old
    assert s.aged(0.0, 10.0) is s  # nothing to age: no copy
    s.decay_to(10.0, 10.0)
    assert (s.x, s.arr.tolist(), s.per, s.lists) == (a.x, a.arr.tolist(), a.per, a.lists)  # same as writing


@pytest.mark.parametrize("make", [AcceptanceEstimator, Mix, lambda: OnlineCostModel(H200), CellTable])
def test_every_learner_forgets_with_the_one_rule(make) -> None:
    learner = make()
    assert isinstance(learner, Decayed)
    learner.decay_to(0.0, 10.0)
    learner.decay_to(10.0, 10.0)
    assert learner.t_last == 10.0
