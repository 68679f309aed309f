"""The measured check: goodput per (bucket, width) over timed runs, and the verdict on a drafting width."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specctl_vllm.kernel.model.measured import (
    MAX_MIX_CATEGORIES,
    NOTHING,
    GoodputMeter,
    Measured,
    block_margin,
    margin,
    probe_due,
    verdict,
)
from specctl_vllm.kernel.protocol import MAX_K


def feed(meter: GoodputMeter, width: int, steps: int, seconds: float, committed: int, batch: int = 64,
         noise: float = 0.0, rng: np.random.Generator | None = None) -> None:
    for _ in range(steps):
        s = seconds * (1 + (rng.normal(0, noise) if rng is not None else 0.0))
        meter.observe(batch, width, committed, s)


def test_a_run_s_settling_steps_are_not_measured() -> None:
    meter = GoodputMeter(settle=3)
    feed(meter, 0, 3, 0.010, 64)
    assert meter.reading(64, 0) is NOTHING  # all three settle
    feed(meter, 0, 5, 0.010, 64)
    r = meter.reading(64, 0)
    assert r.steps == pytest.approx(5 * 0.999 ** 2, rel=0.01)  # aged by the steps since (lazy, per timed step)
    assert r.goodput == pytest.approx(6400)
    assert r.rse == pytest.approx(0.0, abs=1e-9)  # no spread
    feed(meter, 1, 4, 0.020, 90)  # a new run: three settle, one counts
    assert meter.reading(64, 1).steps == pytest.approx(1.0)
    assert meter.reading(64, 0).goodput == pytest.approx(6400)  # the other width is untouched


@pytest.mark.parametrize(("batch", "interval", "committed"), [
    (0, 0.01, 5), (-3, 0.01, 5), (8, None, 5), (8, 0.0, 5), (8, -1.0, 5), (8, 61.0, 5), (8, math.inf, 5),
    (8, math.nan, 5), (8, 0.01, -1),
])
def test_untimed_or_impossible_steps_are_not_measured(batch, interval, committed) -> None:
    meter = GoodputMeter(settle=0)
    meter.observe(batch, 0, committed, interval)
    assert meter.reading(max(batch, 1), 0) is NOTHING


def test_buckets_are_kept_apart_and_old_evidence_fades() -> None:
    meter = GoodputMeter(settle=0, decay=0.99)
    feed(meter, 2, 50, 0.050, 700, batch=250)
    feed(meter, 2, 50, 0.008, 100, batch=16)
    assert meter.reading(250, 2).goodput == pytest.approx(14000)
    assert meter.reading(16, 2).goodput == pytest.approx(12500)
    assert meter.reading(250, 2).steps < 50 * 0.99 ** 50  # faded while the other bucket ran


def test_the_relative_standard_error_shrinks_as_one_over_root_steps() -> None:
    rng = np.random.default_rng(1)
    small, large = GoodputMeter(settle=0, decay=1.0), GoodputMeter(settle=0, decay=1.0)
    feed(small, 0, 25, 0.010, 64, noise=0.3, rng=rng)
    feed(large, 0, 400, 0.010, 64, noise=0.3, rng=rng)
    assert small.reading(64, 0).rse == pytest.approx(0.3 / 5, rel=0.35)
    assert large.reading(64, 0).rse == pytest.approx(0.3 / 20, rel=0.2)


def m(goodput: float, rse: float = 0.02, steps: float = 100.0) -> Measured:
    return Measured(goodput=goodput, rse=rse, steps=steps)


@pytest.mark.parametrize(("model", "plain", "drafting", "state", "width"), [
    (0, m(100), m(200), "confirmed", 0),  # the model already runs plain
    (4, NOTHING, m(200), "unmeasured", 4),  # nothing of K = 0: the model decides
    (4, m(100, steps=3), m(200), "unmeasured", 4),
    (4, m(100), m(150), "confirmed", 4),  # +50 % against a margin of 1 % + 2.8 %
    (4, m(100), m(102), "undecided", 0),  # +2 % inside it: plain runs
    (4, m(100), m(85), "refuted", 0),
    (4, m(100, rse=0.3), m(150, rse=0.3), "confirmed", 4),  # old, noisy evidence: a large gain still clears it
    (4, m(100, rse=0.3), m(120, rse=0.3), "undecided", 0),  # a small one does not
])
def test_verdict(model, plain, drafting, state, width) -> None:
    v = verdict(model, plain, drafting)
    assert (v.state, v.width) == (state, width)
    if state in ("confirmed", "undecided", "refuted") and model:
        assert v.margin == pytest.approx(margin(plain, drafting))
        assert v.gain == pytest.approx(drafting.goodput / plain.goodput - 1)


@pytest.mark.parametrize(("model", "plain", "drafting", "due"), [
    (0, NOTHING, NOTHING, None),
    (4, NOTHING, m(200), 0),  # measure plain
    (4, m(100, steps=50), m(200, steps=2), None),  # the model's width runs and measures itself
    (4, m(100, steps=20), m(150, steps=900), None),  # confirmed: nothing to probe
    (4, m(100, steps=900), m(102, steps=40), 4),  # undecided: the one with fewer steps
    (4, m(100, steps=40), m(102, steps=900), 0),
    (4, m(100, steps=900), m(102, steps=300), None),  # both well measured: the margin has spoken
    (4, m(100, steps=900), m(85, steps=100), None),  # refuted on fresh evidence
    (4, m(100, steps=900), m(85, steps=20), 4),  # refuted on faded evidence: look again
])
def test_probe_due(model, plain, drafting, due) -> None:
    assert probe_due(verdict(model, plain, drafting), plain, drafting, model) == due


@pytest.mark.parametrize(("plain", "drafting", "unseen", "due"), [
    (m(100, steps=900), m(85, steps=100), 0.19, None),  # refuted on fresh evidence, the traffic it saw
    (m(100, steps=900), m(85, steps=100), 0.2, 4),  # a fifth of the batch of categories no draft measured
    (m(100, steps=900), m(102, steps=300), 0.5, 4),  # undecided, decided on other traffic
    (m(100, steps=20), m(150, steps=900), 1.0, None),  # confirmed: it drafts, and so measures them
    (NOTHING, m(200), 1.0, 0),  # unmeasured: K = 0 is what lacks evidence
])
def test_a_verdict_taken_without_part_of_the_traffic_is_probed_again(plain, drafting, unseen, due) -> None:
    assert probe_due(verdict(4, plain, drafting), plain, drafting, 4, unseen=unseen) == due


def e_at_2(betas: dict[str, float]):
    """A transfer for K = 2 against today's mix of half ``json``: E(2) per category from geometric curves."""
    def e(mix: dict[str, float]) -> float:
        total = sum(mix.values())
        return sum(w * (1 + betas[c] + betas[c] ** 2) for c, w in mix.items()) / total
    now = e({"json": 0.5, "prose": 0.5})
    return lambda then: now / e(then)


@pytest.mark.parametrize(("mix", "transfer", "goodput"), [
    (None, None, 6400.0),  # no mix either side: as measured
    ({"prose": 1.0}, None, 6400.0),
    (None, e_at_2({"prose": 0.45, "json": 0.85}), 6400.0),  # measured without a mix: nothing to read it from
    ({"prose": 1.0}, e_at_2({"prose": 0.45, "json": 0.85}), 6400.0 * (2.1125 / 1.6525)),  # half JSON now
    ({"prose": 0.5, "json": 0.5}, e_at_2({"prose": 0.45, "json": 0.85}), 6400.0),  # the same mix
    ({"prose": 1.0}, lambda then: math.nan, 6400.0),  # impossible factors are ignored
    ({"prose": 1.0}, lambda then: 0.0, 6400.0),
    ({"prose": 1.0}, lambda then: math.inf, 6400.0),
])
def test_a_reading_is_read_for_today_s_mix(mix, transfer, goodput) -> None:
    meter = GoodputMeter(settle=0)
    for _ in range(10):
        meter.observe(64, 2, 64, 0.010, mix)
    r = meter.reading(64, 2, transfer)
    assert r.goodput == pytest.approx(goodput)
    assert r.steps == pytest.approx(10.0, rel=0.01)
    assert dict(r.mix) == ({c: pytest.approx(10 * w, rel=0.01) for c, w in mix.items()} if mix else {})


def test_a_cell_s_mix_is_the_decayed_sum_of_its_steps_and_bounded() -> None:
    meter = GoodputMeter(settle=0, decay=0.5)
    meter.observe(64, 2, 128, 0.010, {"prose": 1.0})
    meter.observe(64, 2, 192, 0.010, {"json": 0.75, "prose": 0.25})  # the older step weighs half
    assert dict(meter.reading(64, 2).mix) == pytest.approx({"prose": 0.75, "json": 0.75})
    many = GoodputMeter(settle=0)
    many.observe(64, 2, 64, 0.010, {f"c{i}": 1.0 / 500 for i in range(500)})
    assert len(many.reading(64, 2).mix) == MAX_MIX_CATEGORIES
    many.observe(64, 0, 64, 0.010, {"prose": 1.0})  # K = 0 commits one token a request at any mix
    assert many.reading(64, 0).mix == {} and many.reading(64, 0).steps > 0


def test_widths_and_batches_of_any_size_keep_the_table_bounded() -> None:
    meter = GoodputMeter(settle=0)
    for width in range(0, 5000, 7):
        for batch in (1, 10**6):
            meter.observe(batch, width, 5, 0.01)
    assert len(meter._cells) <= 2 * (MAX_K + 1)
    assert meter.reading(10**6, 10**4).steps > 0  # a width past MAX_K reads its one key


# -- the spread between blocks of steps ----------------------------------------------------------------------

def feed_runs(meter: GoodputMeter, runs: list[tuple[int, int, float]], committed: int = 64,
              noise: float = 0.0, rng: np.random.Generator | None = None) -> None:
    """Runs of (width, steps, seconds per step), each step's time spread by ``noise`` (independent)."""
    for width, steps, seconds in runs:
        feed(meter, width, steps, seconds, committed, noise=noise, rng=rng)


@pytest.mark.parametrize(("runs", "blocks"), [
    ([(0, 20, 0.01), (1, 1, 0.02)], 1),  # a run of 20 measured steps: one block (half of 29 or more)
    ([(0, 14, 0.01), (1, 1, 0.02)], 0),  # 14: too short to be a block
    ([(0, 58, 0.01), (1, 1, 0.02)], 2),  # two full blocks
    ([(0, 10, 0.01), (1, 1, 0.02), (0, 10, 0.01), (1, 1, 0.02)], 0),  # never one block across two runs
    ([(0, 28, 0.01)], 0),  # the open block counts once it closes
    ([(0, 29, 0.01)], 1),  # ... which a full one does at once
])
def test_blocks_are_consecutive_steps_of_one_run(runs, blocks) -> None:
    meter = GoodputMeter(settle=0, decay=1.0, block_steps=29)
    feed_runs(meter, runs)
    assert meter.reading(64, 0).blocks == pytest.approx(blocks)


def test_a_change_of_bucket_closes_the_block() -> None:
    meter = GoodputMeter(settle=0, decay=1.0, block_steps=10)
    feed(meter, 0, 6, 0.01, 64, batch=64)
    feed(meter, 0, 6, 0.03, 250, batch=250)  # the same run, another bucket
    assert meter.reading(64, 0).blocks == pytest.approx(1.0)
    assert meter.reading(250, 0).blocks == pytest.approx(0.0)  # its block is still open


def test_independent_steps_spread_between_blocks_as_the_steps_say() -> None:
    rng = np.random.default_rng(3)
    meter = GoodputMeter(settle=0, decay=1.0, block_steps=20)
    feed_runs(meter, [(0, 2000, 0.010), (1, 1, 0.02)], noise=0.3, rng=rng)
    r = meter.reading(64, 0)
    assert r.blocks == pytest.approx(100)
    assert r.rse == pytest.approx(0.3 / math.sqrt(2000), rel=0.3)
    assert r.block_rse == pytest.approx(r.rse, rel=0.3)
    assert 1.0 <= r.inflation < 1.3


def test_correlated_steps_spread_between_blocks_more_than_the_steps_say() -> None:
    """Each run sits 10 % above or below the mean (the waves of a steady load, a drifting host): the steps of a
    run agree with each other, so their spread says little about the mean's error; the runs' does."""
    rng = np.random.default_rng(5)
    meter = GoodputMeter(settle=0, decay=1.0, block_steps=29)
    runs = []
    for _ in range(12):
        runs += [(0, 29, 0.010 * (1 + rng.choice([-0.1, 0.1]))), (1, 1, 0.02)]
    feed_runs(meter, runs, noise=0.01, rng=rng)
    r = meter.reading(64, 0)
    # what the check decides with: the steps' spread, as if 348 independent steps had spread 10 %
    assert r.rse == pytest.approx(0.1 / math.sqrt(12 * 29), rel=0.3)
    assert r.block_rse == pytest.approx(0.1 / math.sqrt(12), rel=0.4)
    assert r.inflation > 5


def test_too_few_blocks_give_no_block_spread() -> None:
    rng = np.random.default_rng(7)
    meter = GoodputMeter(settle=0, decay=1.0, block_steps=29)
    feed_runs(meter, [(0, 29, 0.009), (1, 1, 0.02), (0, 29, 0.011), (1, 1, 0.02)], noise=0.01, rng=rng)
    r = meter.reading(64, 0)
    assert r.blocks == pytest.approx(2)
    assert r.block_rse is None and r.inflation is None


@pytest.mark.parametrize(("plain", "drafting", "expected"), [
    (Measured(goodput=100, rse=0.02, steps=500, block_rse=0.04), Measured(goodput=110, rse=0.03, steps=29),
     0.01 + math.hypot(0.04, 0.06)),  # the probed width had one block: the other's ratio (2x) scales it
    (Measured(goodput=100, rse=0.02, steps=29), Measured(goodput=110, rse=0.03, steps=500, block_rse=0.045),
     0.01 + math.hypot(0.03, 0.045)),
    (Measured(goodput=100, rse=0.02, steps=500, block_rse=0.04), Measured(goodput=110, rse=0.03, steps=500,
                                                                           block_rse=0.036),
     0.01 + math.hypot(0.04, 0.036)),  # each its own
    (Measured(goodput=100, rse=0.02, steps=500, block_rse=0.01), m(110, rse=0.03),
     0.01 + math.hypot(0.02, 0.03)),  # blocks never narrow the per-step figure
    (m(100), m(110, rse=0.03), None),  # neither has blocks
])
def test_the_block_margin_lends_a_width_without_blocks_the_other_s_ratio(plain, drafting, expected) -> None:
    got = block_margin(plain, drafting)
    assert got == (None if expected is None else pytest.approx(expected))


def test_the_verdict_reports_the_block_margin_and_decides_with_the_per_step_one() -> None:
    plain = Measured(goodput=100, rse=0.02, steps=500, block_rse=0.08)
    drafting = Measured(goodput=106, rse=0.02, steps=500, block_rse=0.08)
    v = verdict(4, plain, drafting)
    assert v.margin == pytest.approx(0.01 + math.hypot(0.02, 0.02))
    assert v.block_margin == pytest.approx(0.01 + math.hypot(0.08, 0.08))
    assert (v.state, v.width) == ("confirmed", 4)  # +6 % clears 3.8 %; the 12.3 % of the blocks does not decide
