"""Telemetry handling time: the histogram and the quantile read from it."""

from __future__ import annotations

import math

import pytest

from specctl_vllm.controller.service.runtime import INLINE_BODY_BYTES
from specctl_vllm.controller.service.timing import BOUNDS, LatencyHistogram, body_class, quantile


@pytest.mark.parametrize(
    ("seconds", "bucket"),
    [(0.0, 0), (0.001, 0), (0.0011, 1), (0.2, BOUNDS.index(0.25)), (0.25, BOUNDS.index(0.25)),
     (10.0, len(BOUNDS) - 1), (11.0, len(BOUNDS))],
)
def test_observe_counts_in_the_bucket_of_the_first_bound_not_below(seconds, bucket):
    hist = LatencyHistogram()
    hist.observe(seconds)
    assert hist.counts[bucket] == 1 and hist.count == 1 and hist.total_s == seconds


@pytest.mark.parametrize(
    ("counts", "q", "expected"),
    [
        ([0, 0, 0], 0.99, None),  # nothing observed
        ([100, 0, 0], 0.99, 1.0),
        ([98, 2, 0], 0.99, 2.0),  # the 99th of 100 is the second bucket's
        ([99, 1, 0], 0.99, 1.0),
        ([99, 0, 1], 0.99, 1.0),
        ([0, 0, 5], 0.5, math.inf),  # above every bound
        ([50, 50, 0], 0.5, 1.0),
    ],
)
def test_quantile_is_the_upper_bound_of_its_bucket(counts, q, expected):
    assert quantile((1.0, 2.0), counts, q) == expected


@pytest.mark.parametrize(
    ("declared", "body"), [(0, "small"), (1600, "small"), (INLINE_BODY_BYTES, "small"), (INLINE_BODY_BYTES + 1, "large"),
                           (4 * 1024 * 1024, "large")],
)
def test_body_class_splits_regular_posts_from_large_ones(declared, body):
    assert body_class(declared) == body
