"""The step-cost cell table: prior shrinkage, monotone smoothing, decay, round trip, physical bounds."""

from __future__ import annotations

import itertools

import pytest

from controller.core.cost import PRESETS
from controller.core.model.cells import (
    BATCH_EDGES,
    PRIOR_STEPS,
    CellTable,
    bucket_of,
    monotone,
    prior_step_s,
    representative_batch,
)

H200 = PRESETS["h200"]
WIDTHS = (0, 1, 2, 4, 7)


@pytest.mark.parametrize(("n", "bucket"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (256, 13), (257, 14), (10_000, 15)])
def test_bucket_of(n, bucket) -> None:
    assert bucket_of(n) == bucket


def test_unmeasured_cells_are_the_prior() -> None:
    view = CellTable().view(WIDTHS, H200)
    for i, row in enumerate(view.step_s):
        for j, w in enumerate(WIDTHS):
            expected = prior_step_s(H200, representative_batch(i), w)
            assert row[j] == pytest.approx(expected)  # the preset is monotone in batch: smoothing keeps it
    assert all(c == 0 for row in view.steps for c in row)


def test_measurements_override_the_prior_and_count_as_confidence() -> None:
    table = CellTable()
    for _ in range(95):
        table.add(1, 4, 0.0072)
    view = table.view(WIDTHS, H200)
    s, n = view.step_s[0][3], view.steps[0][3]
    prior = prior_step_s(H200, 1.0, 4)
    assert n == 95
    assert s == pytest.approx((95 * 0.0072 + PRIOR_STEPS * prior) / (95 + PRIOR_STEPS))


def test_a_larger_batch_never_costs_less() -> None:
    table = CellTable()
    for _ in range(50):
        table.add(64, 2, 0.020)
        table.add(100, 2, 0.005)  # a noisy, implausibly cheap larger bucket
    view = table.view(WIDTHS, H200)
    col = [row[2] for row in view.step_s]
    assert all(b >= a for a, b in itertools.pairwise(col))


def test_decay_halves_the_evidence() -> None:
    table = CellTable()
    table.decay_to(0.0, 60.0)
    for _ in range(8):
        table.add(16, 1, 0.007)
    table.decay_to(60.0, 60.0)
    assert table.view(WIDTHS, H200).steps[bucket_of(16)][1] == pytest.approx(4.0)


@pytest.mark.parametrize(("n", "width", "seconds"), [(0, 1, 0.01), (4, -1, 0.01), (4, 1, 0.0), (4, 1, 1e9),
                                                     (4, 1, float("nan"))])
def test_unphysical_samples_are_ignored(n, width, seconds) -> None:
    table = CellTable()
    table.add(n, width, seconds)
    assert table.sums == {}


def test_round_trip_and_bad_cells_dropped() -> None:
    table = CellTable()
    table.decay_to(5.0, 60.0)
    table.add(3, 2, 0.006)
    again = CellTable.from_dict(table.to_dict())
    assert again.sums == table.sums and again.t == 5.0 and again.edges == BATCH_EDGES
    broken = table.to_dict()
    broken["cells"].append([99, 1, 1.0, 1.0])
    broken["cells"].append([0, 1, float("nan"), 1.0])
    assert CellTable.from_dict(broken).sums == table.sums


@pytest.mark.parametrize(
    ("values", "weights", "want"),
    [
        ([1.0, 2.0, 3.0], [1, 1, 1], [1.0, 2.0, 3.0]),
        ([2.0, 1.0], [1, 1], [1.5, 1.5]),
        ([10.7, 9.8], [5, 205], [pytest.approx(9.821, abs=1e-3)] * 2),  # a prior-only cell yields to a measured one
        ([1.0, 3.0, 2.0, 4.0], [1, 1, 3, 1], [1.0, 2.25, 2.25, 4.0]),
    ],
)
def test_monotone(values, weights, want) -> None:
    assert monotone(values, weights) == want
