"""The online cost fit's batch median: the value np.median gives, for every batch shape."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specctl_vllm.controller.core.learn.cost_fit import _median


@pytest.mark.parametrize(
    "values",
    [
        [1.0],
        [2.0, 1.0],
        [1.2, 0.9, 1.1],
        [0.5, 0.5, 0.5, 0.5],
        [3.0, 1e-9, 7.5, 2.25, 1e9],
        [0.1 + 0.2, 0.3, 0.7, 0.30000000000000004],
        [-1.0, 4.0],
        [np.inf, 1.0, 2.0],
        [-np.inf, 1.0],
        [np.nan, 1.0, 2.0],
    ],
)
def test_median_matches_numpy(values):
    got, want = _median(np.array(values)), float(np.median(np.array(values)))
    assert (math.isnan(got) and math.isnan(want)) or got == want


def test_median_matches_numpy_on_random_batches():
    rng = np.random.default_rng(7)
    for n in range(1, 64):
        for scale in (1e-6, 1.0, 1e6):
            values = rng.random(n) * scale
            assert _median(values) == float(np.median(values))
