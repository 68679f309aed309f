"""The width rule: argmax of modelled goodput over the width set, K > 0 only by a measured margin over plain."""

from __future__ import annotations

import pytest

from specctl_vllm.controller.core.model.widths import choose_width, expected_lengths, geometric_lengths, margin

WIDTHS = (0, 1, 2, 4, 7)
HIGH = geometric_lengths(0.85, 7)
LOW = geometric_lengths(0.45, 7)


def test_expected_lengths_is_one_plus_survival_sums() -> None:
    assert expected_lengths((0.5, 0.5), 3) == pytest.approx((1.0, 1.5, 1.75, 1.875))
    assert expected_lengths((), 2) == (1.0, 1.0, 1.0)
    assert HIGH[4] == pytest.approx(1 + 0.85 + 0.85**2 + 0.85**3 + 0.85**4)


@pytest.mark.parametrize(
    ("mix", "step_ms", "steps", "want"),
    [
        # batch 1 on an H200-like cell row: every width pays, K=4 is best for beta 0.85
        ({"json": 1}, (5.0, 5.6, 6.2, 7.2, 9.5), (1e3,) * 5, 4),
        # the same row for a prose-like category: E(2) = 1.65 in 1.24x the time pays
        ({"prose": 1}, (5.0, 5.6, 6.2, 7.2, 9.5), (1e3,) * 5, 2),
        # a dearer drafter (draft-model-like cells): K=1 gains under 1 %, below the margin, so plain
        ({"prose": 1}, (5.0, 7.2, 9.0, 13.0, 19.0), (1e3,) * 5, 0),
        # a large batch: verifying costs almost proportionally to tokens, nothing beats plain
        ({"json": 256}, (23.0, 45.0, 60.0, 95.0, 160.0), (1e3,) * 5, 0),
        # half and half at batch 16: K=2 wins on the mix
        ({"json": 8, "prose": 8}, (5.9, 6.6, 7.4, 9.8, 14.0), (1e3,) * 5, 2),
    ],
)
def test_choice_table(mix, step_ms, steps, want) -> None:
    curves = {"json": HIGH, "prose": LOW}
    got = choose_width(mix, curves, WIDTHS, [t / 1e3 for t in step_ms], steps)
    assert got.width == want


def test_unmeasured_cells_need_a_large_modelled_gain() -> None:
    row = [5.0e-3, 5.6e-3, 6.2e-3, 7.2e-3, 9.5e-3]
    curves = {"c": geometric_lengths(0.3, 7)}  # E(1)=1.3: +16 % at K=1, below the unmeasured margin
    assert choose_width({"c": 1}, curves, WIDTHS, row, (0, 0, 0, 0, 0)).width == 0
    assert choose_width({"c": 1}, curves, WIDTHS, row, (1e4,) * 5).width == 1
    assert margin(0, 0) > 0.3 > margin(100, 100) > margin(1e4, 1e4) >= 0.02


def test_degenerate_inputs_choose_plain() -> None:
    assert choose_width({}, {}, WIDTHS, [1.0] * 5, [1.0] * 5).width == 0
    assert choose_width({"a": 3}, {}, WIDTHS, [0.0] * 5, [1.0] * 5).width == 0
    inf = float("inf")
    assert choose_width({"a": 3}, {"a": HIGH}, WIDTHS, [1e-3, inf, inf, inf, inf], [9e3] * 5).width == 0


def test_category_without_curve_uses_the_default_curve() -> None:
    row = [5.0e-3, 5.6e-3, 6.2e-3, 7.2e-3, 9.5e-3]
    assert choose_width({"new": 1}, {}, WIDTHS, row, (1e3,) * 5, default_curve=HIGH).width == 4
    assert choose_width({"new": 1}, {}, WIDTHS, row, (1e3,) * 5).width == 0
