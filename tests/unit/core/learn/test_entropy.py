import math

import pytest

from specctl_vllm.controller.core.learn.entropy import HIGH_MIN_BITS, LOW_MAX_BITS, classify


@pytest.mark.parametrize(
    "betas, reached, name",
    [
        ([0.81, 0.79, 0.77, 0.72], [1000, 800, 600, 500], "low"),  # code / math class drafters
        ([0.6, 0.55], [1000, 600], "medium"),
        ([0.31, 0.25, 0.19], [1000, 300, 80], "high"),  # open conversation
        ([0.9], [10], "unknown"),  # below min evidence
        ([], [], "unknown"),
    ],
)
def test_classes(betas, reached, name):
    assert classify(betas, reached, min_evidence=100).name == name


def test_bits_are_the_reach_weighted_geometric_mean():
    c = classify([0.5, 0.25], [100, 50], min_evidence=10)
    expected = -(100 * math.log2(0.5) + 50 * math.log2(0.25)) / 150
    assert c.bits == pytest.approx(expected)
    assert c.mean_acceptance == pytest.approx(2 ** -expected)
    d = c.to_dict()
    assert d["thresholds"] == {"low_below_bits": LOW_MAX_BITS, "high_from_bits": HIGH_MIN_BITS}
    assert d["class"] == "medium" and d["evidence"] == 100


def test_zero_acceptance_is_finite():
    assert math.isfinite(classify([0.0], [500], 10).bits)
