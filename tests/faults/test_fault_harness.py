"""The fault suite's own arithmetic, without an engine."""

from __future__ import annotations

import pytest

from tests.faults.harness import uncovered


@pytest.mark.parametrize(("spans", "expected"), [
    ([], 10.0),
    ([(0.0, 10.0)], 0.0),
    ([(2.0, 4.0)], 8.0),
    ([(2.0, 4.0), (3.0, 5.0)], 7.0),           # overlapping
    ([(3.0, 5.0), (2.0, 4.0)], 7.0),           # in any order
    ([(2.0, 6.0), (3.0, 4.0)], 6.0),           # one inside another
    ([(-5.0, 1.0), (9.0, 15.0)], 8.0),         # sticking out on both ends
    ([(-5.0, -1.0), (11.0, 12.0)], 10.0),      # wholly outside
    ([(1.0, 2.0), (2.0, 3.0)], 8.0),           # touching
])
def test_uncovered(spans, expected):
    assert uncovered(spans, 0.0, 10.0) == pytest.approx(expected)
