"""The step-cost cell table: prior shrinkage, monotone smoothing, decay, round trip, physical bounds."""

from __future__ import annotations

import itertools

import pytest

from specctl_vllm.kernel.cost import PRESETS
from specctl_vllm.kernel.model.cells import (
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
    for _ in range(5):
        table.add(1, 0, 0.0049)
    view = table.view(WIDTHS, H200)
    s, n = view.step_s[0][3], view.steps[0][3]
    prior = prior_step_s(H200, 1.0, 4) * table.calibration(WIDTHS, H200)[(0, 4)]
    assert n == 95
    assert s == pytest.approx((95 * 0.0072 + PRIOR_STEPS * prior) / (95 + PRIOR_STEPS))
    assert s == pytest.approx(0.0072, rel=0.02)  # the calibrated prior is near the cell's own measurement


def _preset_times(factor: float, n: int, width: int) -> float:
    return factor * prior_step_s(H200, representative_batch(bucket_of(n)), width)


@pytest.mark.parametrize(("measured", "target", "factor"), [
    # (batch, width) measured at `factor` x the preset; (batch, width) not measured: its prior moves the same way
    ((16, 4), (64, 4), 1.6),  # same width, a bucket the load has not reached yet
    ((16, 4), (16, 2), 0.7),  # another width, same bucket
    ((64, 0), (256, 0), 2.0),
    ((1, 7), (1, 4), 0.7),
])
def test_unmeasured_cells_inherit_the_calibration_of_measured_ones(measured, target, factor) -> None:
    table = CellTable()
    for _ in range(200):
        table.add(measured[0], measured[1], _preset_times(factor, *measured))
    view = table.view(WIDTHS, H200)
    estimate = view.step_s[bucket_of(target[0])][WIDTHS.index(target[1])]
    assert view.steps[bucket_of(target[0])][WIDTHS.index(target[1])] == 0
    assert estimate == pytest.approx(_preset_times(factor, *target), rel=1e-6)


def test_plain_and_drafting_widths_do_not_calibrate_each_other() -> None:
    table = CellTable()
    for _ in range(200):
        table.add(16, 0, _preset_times(1.3, 16, 0))  # K = 0 dearer than the preset (the drafter's catch-up)
    f = table.calibration(WIDTHS, H200)
    assert f[(bucket_of(16), 0)] == pytest.approx(1.3) and f[(bucket_of(64), 0)] == pytest.approx(1.3)
    assert all(f[(bucket_of(16), w)] == 1.0 for w in WIDTHS if w > 0)
    for _ in range(200):
        table.add(4, 4, _preset_times(0.7, 4, 4))
    f = table.calibration(WIDTHS, H200)
    assert f[(bucket_of(16), 2)] == pytest.approx(0.7) and f[(bucket_of(16), 0)] == pytest.approx(1.3)


def test_near_cells_weigh_more_in_the_calibration() -> None:
    table = CellTable()
    for _ in range(100):
        table.add(16, 4, _preset_times(2.0, 16, 4))  # near bucket 24
        table.add(256, 4, _preset_times(0.5, 256, 4))  # far from it
    f = table.calibration(WIDTHS, H200)[(bucket_of(24), 4)]
    assert 1.0 < f < 2.0


@pytest.mark.parametrize(("factor", "bound"), [(100.0, 4.0), (0.01, 0.25)])
def test_the_calibration_is_bounded(factor, bound) -> None:
    table = CellTable()
    for _ in range(100):
        table.add(4, 2, min(_preset_times(factor, 4, 2), 59.0))
    assert table.calibration(WIDTHS, H200)[(bucket_of(64), 1)] == pytest.approx(bound)


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
