from dataclasses import replace

import numpy as np
import pytest

from specctl_vllm.controller.core.learn.cost_fit import OnlineCostModel
from specctl_vllm.kernel.cost import (
    CPU,
    H200,
    MIXED,
    PLAIN,
    PREFILL,
    PRESETS,
    UNIFORM,
    roofline_from_h200,
    step_kind,
    step_shape,
)
from specctl_vllm.kernel.protocol import StepRecord
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


def test_cpu_preset_matches_the_measured_engine():
    # bench/results/cpu_cost_fit.json: ~95 ms per step at 8 requests, +2.1 ms per scheduled token (knee 0)
    assert CPU.step_time(8, 8) == pytest.approx(95.5e-3, rel=0.02)
    assert CPU.step_time(8, 16) - CPU.step_time(8, 8) == pytest.approx(8 * 2.14e-3, rel=0.01)


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


# --- depth cells: what a linear model cannot express -------------------------------------------------------
#: An H200 draft-model engine started at k_max=7, batch 4 (measured shapes, bench/gpu/README.md): the full
#: depth replays a CUDA graph and is faster than trimmed depths; depth 0 still pays the drafter's catch-up.
GRAPH_ENGINE = {0: 9.4e-3, 1: 13.0e-3, 2: 13.4e-3, 3: 14.4e-3, 7: 12.8e-3}


def _cell_model(times: dict[int, float], n: int = 4, steps: int = 200, prior: float = 10.0) -> OnlineCostModel:
    model = OnlineCostModel(H200, prior)
    model.decay_to(0.0, 300)
    model.add_many([(float(n), float(n * (1 + d)), float(d), 0.0, wall)
                    for d, wall in times.items() for _ in range(steps)])
    return model


def _corrected(model: OnlineCostModel, n: int, d: int, k_max: int = 7) -> float:
    return model.coefficients().step_time(n, n * (1 + d), d) * model.depth_factors(n, k_max)[d]


def test_no_steps_means_no_correction():
    assert np.array_equal(OnlineCostModel(H200).depth_factors(16, 7), np.ones(8))


@pytest.mark.parametrize("depth", sorted(GRAPH_ENGINE))
def test_cells_reproduce_shapes_the_linear_fit_cannot(depth):
    model = _cell_model(GRAPH_ENGINE)
    assert abs(_corrected(model, 4, depth) / GRAPH_ENGINE[depth] - 1) < 0.03
    # the linear fit alone misses at least one of them by more than that (else the cells would be moot)
    assert max(abs(model.coefficients().step_time(4, 4 * (1 + d), d) / t - 1) for d, t in GRAPH_ENGINE.items()) > 0.05


def test_trimmed_depth_ranks_slower_than_the_full_one():
    f = _cell_model(GRAPH_ENGINE).depth_factors(4, 7)
    assert f[3] > f[7]


@pytest.mark.parametrize(
    ("n", "expect_from"),
    [(4, "own"), (5, "own"), (6, "neighbours"), (3, "own"), (64, "none"), (1, "none")],
)
def test_factors_interpolate_between_seen_batch_cells_only(n, expect_from):
    model = _cell_model({0: 20e-3, 4: 14e-3}, n=4)  # depth 0 far slower than the fit says
    f0 = model.depth_factors(n, 4)[0]
    if expect_from == "none":
        assert f0 == 1.0  # batch cells 1 and 64 never ran: the linear fit stands
    else:
        assert f0 > 1.05  # a single seen neighbour is used whole, not diluted toward 1


def test_a_few_steps_barely_move_a_cell():
    few = _cell_model({0: 20e-3, 4: 14e-3}, steps=2).depth_factors(4, 4)
    many = _cell_model({0: 20e-3, 4: 14e-3}, steps=200).depth_factors(4, 4)
    assert abs(few[0] - 1) < abs(many[0] - 1)


def test_cells_forget_with_the_fit():
    model = _cell_model({0: 20e-3, 4: 14e-3})
    before = model.depth_factors(4, 4)[0]
    model.decay_to(3000.0, 300)  # ten half-lives
    assert abs(model.depth_factors(4, 4)[0] - 1) < abs(before - 1)


def test_cells_roundtrip_and_old_snapshots_load():
    model = _cell_model(GRAPH_ENGINE)
    back = OnlineCostModel.from_dict(model.to_dict(), H200, 10.0)
    assert np.allclose(back.depth_factors(4, 7), model.depth_factors(4, 7))
    old = {k: v for k, v in model.to_dict().items() if k != "cells"}
    assert np.array_equal(OnlineCostModel.from_dict(old, H200, 10.0).depth_factors(4, 7), np.ones(8))


@pytest.mark.parametrize("bad", [{"w": [[1.0]], "wall": [[1.0]], "x": [[[1.0]]]}, "nan"])
def test_corrupt_cells_are_refused(bad):
    d = _cell_model(GRAPH_ENGINE).to_dict()
    if bad == "nan":
        d["cells"]["wall"][0][0] = float("nan")
    else:
        d["cells"] = bad
    with pytest.raises(ValueError):
        OnlineCostModel.from_dict(d, H200, 10.0)


# --- step kinds, prefill out of the fit, the mixed-k penalty ---------------------------------------------------
def _kind_step(ks: list[int], prefill: int = 0) -> StepRecord:
    cats = [cat_step(f"c{i}", 1, [0.5] * 8, k=k) if k else cat_step(f"c{i}", 1, None) for i, k in enumerate(ks)]
    s = step(cats, depth=max(ks))
    return s.model_copy(update={"prefill_tokens": prefill, "scheduled_tokens": s.scheduled_tokens + prefill})


@pytest.mark.parametrize(
    ("ks", "prefill", "kind"),
    [
        ([4, 4, 4], 0, UNIFORM),
        ([4, 2], 0, MIXED),
        ([4, 0], 0, MIXED),  # a request without drafts in a drafting step: not a uniform batch either
        ([0, 0], 0, PLAIN),
        ([4, 4], 64, PREFILL),
    ],
)
def test_step_kind(ks, prefill, kind):
    assert step_kind(_kind_step(ks, prefill)) == kind


def test_prefill_steps_stay_out_of_the_fit():
    """Decode steps all at one depth plus a few prompt-heavy steps: the fit must not zero its base."""
    model = OnlineCostModel(H200, 10.0)
    model.decay_to(0.0, 300)
    decode = [(1.0, 8.0, 7.0, 0.0, 12.2e-3, UNIFORM)] * 450
    prompts = [(1.0, 257.0, 0.0, 0.0, 85e-3, PREFILL)] * 20
    model.add_many(decode + prompts)
    no_draft_step = model.coefficients().step_time(3, 3, 0)
    assert no_draft_step > 0.5 * H200.step_time(3, 3, 0)  # the preset's order of magnitude, not ~0
    assert model.steps_total == 470


def test_mixed_steps_learn_a_penalty_and_stay_out_of_the_depth_cells():
    model = OnlineCostModel(H200, 10.0)
    model.decay_to(0.0, 300)
    model.add_many([(4.0, 32.0, 7.0, 0.0, 11.7e-3, UNIFORM)] * 200 + [(4.0, 28.0, 7.0, 0.0, 27.1e-3, MIXED)] * 200)
    assert model.mixed_penalty(4) > 1.5
    linear = model.coefficients().step_time(4, 32, 7)  # pulled up by the mixed steps
    corrected = linear * model.depth_factors(4, 7)[7]
    assert corrected < linear
    assert corrected == pytest.approx(11.7e-3, rel=0.12)  # the depth cell is the uniform steps' cost


@pytest.mark.parametrize("mixed_s", [11.7e-3, 9e-3])
def test_no_penalty_where_mixed_steps_are_not_slower(mixed_s):
    model = OnlineCostModel(H200, 10.0)
    model.decay_to(0.0, 300)
    model.add_many([(4.0, 32.0, 7.0, 0.0, 11.7e-3, UNIFORM)] * 200 + [(4.0, 32.0, 7.0, 0.0, mixed_s, MIXED)] * 200)
    assert model.mixed_penalty(4) <= 1.02


def test_penalty_without_evidence_is_one_and_unseen_batches_use_the_engine_wide_one():
    assert OnlineCostModel(H200).mixed_penalty(16) == 1.0
    model = OnlineCostModel(H200, 10.0)
    model.decay_to(0.0, 300)
    model.add_many([(4.0, 32.0, 7.0, 0.0, 11.7e-3, UNIFORM)] * 200 + [(4.0, 28.0, 7.0, 0.0, 27.1e-3, MIXED)] * 200)
    assert 1.0 < model.mixed_penalty(256) <= model.mixed_penalty(4)


def test_kinds_roundtrip():
    model = OnlineCostModel(H200, 10.0)
    model.decay_to(0.0, 300)
    model.add_many([(4.0, 32.0, 7.0, 0.0, 11.7e-3, UNIFORM)] * 50 + [(4.0, 28.0, 7.0, 0.0, 27.1e-3, MIXED)] * 50)
    back = OnlineCostModel.from_dict(model.to_dict(), H200, 10.0)
    assert back.mixed_penalty(4) == pytest.approx(model.mixed_penalty(4))


def test_the_penalty_prior_holds_until_steps_speak():
    from specctl_vllm.kernel.cost import FULL_GRAPH_PENALTY
    assert OnlineCostModel(H200).mixed_penalty(16, FULL_GRAPH_PENALTY) == pytest.approx(FULL_GRAPH_PENALTY)
    model = OnlineCostModel(H200, 10.0)
    model.decay_to(0.0, 300)
    model.add_many([(16.0, 128.0, 7.0, 0.0, 12e-3, UNIFORM)] * 300 + [(16.0, 128.0, 7.0, 0.0, 12e-3, MIXED)] * 300)
    assert model.mixed_penalty(16, FULL_GRAPH_PENALTY) < 1.1  # mixed steps measured as fast: the prior yields


@pytest.mark.parametrize(
    ("n", "tokens", "depth", "free", "wall_s"),
    [(1, 10_000_000, 32, 0, 5e-324), (1, 10_000_000, 32, 0, 1e-6), (10_000_000, 10_000_000, 32, 10_000_000, 3600.0),
     (10_000_000, 1, 32, 10_000_000, 1e-9), (1, 1000, 1, 0, 1e-6)],
)
def test_fit_is_total_at_the_edges(n, tokens, depth, free, wall_s):
    """Steps at the edge of the protocol's ranges: the fit neither raises (a singular system) nor prices a
    step at zero (every goodput would divide by it)."""
    from specctl_vllm.controller.core.learn.cost_fit import MIN_BASE_S
    from specctl_vllm.kernel.cost import PLAIN, UNIFORM

    for kind in (PLAIN, UNIFORM):
        m = OnlineCostModel(PRESETS["h200"], 10.0)
        for _ in range(20):
            m.add_many([(n, tokens, depth, free, wall_s, kind)] * 20_000)
        c = m.coefficients()
        assert all(np.isfinite(c.vector())) and c.base >= MIN_BASE_S
        assert c.step_time(1, 1) > 0 and np.all(m.depth_factors(1, 32) > 0) and m.mixed_penalty(1) > 0


def test_the_fit_s_names_have_one_home():
    """The online fit lives in specctl_vllm.controller.core.learn.cost_fit only: this module re-exports none of it."""
    from specctl_vllm.controller.core.learn import cost_fit
    from specctl_vllm.kernel import cost

    for name in ("OnlineCostModel", "features", "N_FEATURES", "MIN_BASE_S", "BATCH_CELLS", "CELL_PRIOR", "batch_cell"):
        assert hasattr(cost_fit, name) and not hasattr(cost, name), name
