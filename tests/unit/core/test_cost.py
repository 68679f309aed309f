from dataclasses import replace

import numpy as np
import pytest

from controller.core.cost import CPU, H200, PRESETS, OnlineCostModel, roofline_from_h200, step_shape
from tests.unit.core.factories import cat_step, step


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_grow_with_tokens_and_batch(name):
    c = PRESETS[name]
    assert c.step_time(1, 1) > 0
    assert c.step_time(256, 256) > c.step_time(1, 1)
    assert c.step_time(64, 64 * 5, depth=4) > c.step_time(64, 64)
    assert c.step_time(8, 8, free_tokens=32) >= c.step_time(8, 8)


@pytest.mark.parametrize("name", ["h200", "mi300x", "mi355x"])
def test_gpu_presets_are_flat_below_the_knee_and_steep_above(name):
    c = PRESETS[name]
    below = (c.step_time(1, 5) - c.step_time(1, 1)) / 4
    above = (c.step_time(1, c.knee + 500) - c.step_time(1, c.knee + 100)) / 400
    assert above > below
    assert c.step_time(1, 5) < 1.02 * c.step_time(1, 1)  # five tokens cost ~ one on a memory-bound GPU


def test_cpu_preset_is_compute_bound():
    # verify cost almost linear in tokens: doubling the decode tokens at 8 requests adds > 30 % step time
    assert CPU.step_time(8, 16) > 1.3 * CPU.step_time(8, 8)
    assert CPU.step_time(8, 8) == pytest.approx(1.5e-3, rel=0.05)


@pytest.mark.parametrize("bw, flops", [(5.3e12, 1.3e15), (8.0e12, 2.5e15)])
def test_roofline_presets_are_faster_where_the_hardware_is(bw, flops):
    c = roofline_from_h200(bw, flops)
    assert c.step_time(1, 1) < H200.step_time(1, 1)
    assert c.per_token_above_knee < H200.per_token_above_knee
    assert c.knee > H200.knee  # more FLOP/s per byte moves the knee right


def test_roofline_identity_on_h200_numbers():
    c = roofline_from_h200(4.8e12, 989e12)
    for f in ("base", "per_request", "per_token_above_knee", "draft_pass", "knee"):
        assert getattr(c, f) == pytest.approx(getattr(H200, f))


def _truth_steps(truth, rng, count):
    rows = []
    for _ in range(count):
        n = float(rng.integers(1, 257))
        depth = float(rng.integers(0, 5))
        tokens = n * (1 + depth) + float(rng.integers(0, 200))
        free = float(rng.integers(0, 50))
        rows.append((n, tokens, depth, free, truth.step_time(n, tokens, depth, free)))
    return rows


def test_online_model_recovers_a_different_machine():
    truth = replace(H200, base=6e-3, per_request=2e-5, per_token_above_knee=3e-5, draft_pass=5e-4)
    model = OnlineCostModel(H200, prior_strength=10)
    rng = np.random.default_rng(1)
    model.decay_to(0.0, 300)
    model.add_many(_truth_steps(truth, rng, 3000))
    got = model.coefficients()
    for n, tok, d in [(1, 1, 0), (1, 5, 4), (64, 320, 4), (256, 256, 0), (256, 1280, 4)]:
        assert got.step_time(n, tok, d) == pytest.approx(truth.step_time(n, tok, d), rel=0.03)


def test_unexcited_directions_stay_at_the_preset():
    """Only batch 1, no drafting: the fit moves base, but large-batch and draft costs keep the preset's."""
    truth = replace(H200, base=5.5e-3)
    model = OnlineCostModel(H200, prior_strength=50)
    model.decay_to(0.0, 300)
    model.add_many([(1.0, 1.0, 0.0, 0.0, truth.step_time(1, 1))] * 2000)
    got = model.coefficients()
    assert got.step_time(1, 1) == pytest.approx(truth.step_time(1, 1), rel=0.02)
    assert got.draft_pass == pytest.approx(H200.draft_pass, rel=0.2)
    assert got.per_token_above_knee == pytest.approx(H200.per_token_above_knee, rel=0.2)


def test_fit_forgets_old_hardware():
    old = replace(H200, base=8e-3)
    model = OnlineCostModel(H200, prior_strength=10)
    model.decay_to(0.0, 60)
    model.add_many([(8.0, 8.0, 0.0, 0.0, old.step_time(8, 8))] * 500)
    model.decay_to(1200.0, 60)  # 20 half-lives
    model.add_many([(8.0, 8.0, 0.0, 0.0, H200.step_time(8, 8))] * 500)
    assert model.coefficients().step_time(8, 8) == pytest.approx(H200.step_time(8, 8), rel=0.01)


def test_outlier_steps_are_capped():
    model = OnlineCostModel(H200, prior_strength=50)
    model.decay_to(0.0, 300)
    rows = [(8.0, 8.0, 0.0, 0.0, H200.step_time(8, 8))] * 999 + [(8.0, 8.0, 0.0, 0.0, 3.0)]  # one 3 s pause
    model.add_many(rows)
    assert model.coefficients().step_time(8, 8) == pytest.approx(H200.step_time(8, 8), rel=0.01)


def test_coefficients_never_negative():
    model = OnlineCostModel(H200, prior_strength=1)
    model.decay_to(0.0, 300)
    model.add_many([(float(n), float(n), 0.0, 0.0, 1e-3) for n in range(1, 200)])  # cheaper than any preset
    assert (model.coefficients().vector() >= 0).all()


def test_roundtrip_dict():
    model = OnlineCostModel(H200, 50)
    model.decay_to(3.0, 300)
    model.add_many(_truth_steps(H200, np.random.default_rng(0), 50))
    back = OnlineCostModel.from_dict(model.to_dict(), H200, 50)
    assert back.coefficients() == model.coefficients()


@pytest.mark.parametrize(
    "engine_method, cats, expect",
    [
        ("eagle3", [cat_step("a", 2, [0.5] * 4, k=3)], (2.0, 8.0, 4.0, 0.0)),
        ("ngram", [cat_step("a", 2, [0.5] * 4, k=3, method="ngram")], (2.0, 8.0, 0.0, 6.0)),
        ("eagle3", [cat_step("a", 2, [0.5] * 4, k=3, method="ngram"), cat_step("b", 1, None)], (3.0, 9.0, 0.0, 6.0)),
        ("eagle3", [cat_step("a", 1, None)], (1.0, 1.0, 0.0, 0.0)),
    ],
)
def test_step_shape(engine_method, cats, expect):
    assert step_shape(step(cats, depth=4), engine_method) == expect
