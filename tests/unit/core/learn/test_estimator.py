import math

import numpy as np
import pytest

from specctl_vllm.controller.core.learn.estimator import (
    AcceptanceEstimator,
    expected_committed,
    positions_from_hist,
    wilson_interval,
    z_for,
)
from specctl_vllm.kernel.decay import decay_factor


@pytest.mark.parametrize(
    "betas, expected",
    [
        ([], [1.0]),
        ([0.5], [1.0, 1.5]),
        ([0.5, 0.5, 0.5], [1.0, 1.5, 1.75, 1.875]),
        ([1.0, 1.0], [1.0, 2.0, 3.0]),
        ([0.0, 0.9], [1.0, 1.0, 1.0]),
        ([0.8, 0.5, 0.25], [1.0, 1.8, 2.2, 2.3]),
    ],
)
def test_expected_committed_exact(betas, expected):
    assert expected_committed(betas) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    "k, accepted, reached, acc",
    [
        (1, [3, 7], [10], [7]),
        (3, [1, 2, 3, 4], [10, 9, 7], [9, 7, 4]),
        (2, [0, 0, 5], [5, 5], [5, 5]),
        (2, [5, 0, 0], [5, 0], [0, 0]),
    ],
)
def test_positions_from_hist(k, accepted, reached, acc):
    r, a = positions_from_hist(k, accepted)
    assert r.tolist() == reached
    assert a.tolist() == acc


def test_betas_are_conditional_rates_with_prior():
    est = AcceptanceEstimator()
    est.decay_to(0.0, 120)
    est.add(3, [1, 2, 3, 4], counterfactual=False)  # reached 10, 9, 7; accepted 9, 7, 4
    prior, strength = 0.5, 4.0
    b1 = (strength * prior + 9) / (strength + 10)
    b2 = (strength * b1 + 7) / (strength + 9)
    b3 = (strength * b2 + 4) / (strength + 7)
    b4 = b3  # never reached: the prior is the position before
    assert est.betas(4, prior, strength) == pytest.approx([b1, b2, b3, b4])
    assert est.mean_acceptance_length() == pytest.approx(1 + (2 + 6 + 12) / 10)
    assert est.length_distribution() == pytest.approx([0.1, 0.2, 0.3, 0.4])


@pytest.mark.parametrize("half_life, dt, factor", [(120, 0, 1.0), (120, 120, 0.5), (120, 240, 0.25),
                                                   (10, 5, 2 ** -0.5), (120, -30, 1.0)])
def test_decay_factor(half_life, dt, factor):
    assert decay_factor(dt, half_life) == pytest.approx(factor)


@pytest.mark.parametrize("half_life", [30.0, 120.0])
def test_forgetting_halves_evidence_per_half_life_and_keeps_the_mean(half_life):
    est = AcceptanceEstimator()
    est.decay_to(1000.0, half_life)
    est.add(2, [20, 30, 50], counterfactual=False)
    before = est.betas(2, 0.5, 0.0)
    est.decay_to(1000.0 + half_life, half_life)
    assert est.evidence == pytest.approx(50.0)
    assert est.real_drafts == pytest.approx(50.0)
    assert est.betas(2, 0.5, 0.0) == pytest.approx(before)
    est.decay_to(1000.0 + 3 * half_life, half_life)
    assert est.evidence == pytest.approx(12.5)
    assert est.cum.drafts == 100  # cumulative counters never decay


def test_new_evidence_outweighs_old_after_a_shift():
    est = AcceptanceEstimator()
    est.decay_to(0.0, 60)
    est.add(1, [90, 10], counterfactual=False)  # beta 0.1
    est.decay_to(600.0, 60)  # ten half-lives later
    est.add(1, [10, 90], counterfactual=False)  # beta 0.9
    assert est.betas(1, 0.5, 0.0)[0] == pytest.approx((10 * 2 ** -10 + 90) / (100 * 2 ** -10 + 100))


def test_counterfactual_evidence_is_flagged_and_counted_apart():
    est = AcceptanceEstimator()
    est.decay_to(0.0, 120)
    est.add(2, [1, 1, 2], counterfactual=True)
    est.add(2, [2, 0, 0], counterfactual=False)
    assert est.cf_drafts == 4 and est.real_drafts == 2
    assert est.cum.drafts == 2 and est.cf_cum.drafts == 4
    assert est.cum.accepted_tokens == 0 and est.cf_cum.accepted_tokens == 5
    assert est.evidence == 6


@pytest.mark.parametrize("succ, n", [(0, 10), (5, 10), (10, 10), (37.5, 80.2), (1, 1)])
def test_wilson_interval_contains_the_rate(succ, n):
    lo, hi = wilson_interval(succ, n, z_for(0.95))
    assert 0 <= lo <= succ / n <= hi <= 1
    assert hi - lo > 0


def test_wilson_interval_narrows_with_evidence_and_is_open_without():
    z = z_for(0.95)
    assert wilson_interval(0, 0, z) == (0.0, 1.0)
    small = wilson_interval(7, 10, z)
    big = wilson_interval(700, 1000, z)
    assert big[1] - big[0] < small[1] - small[0]


def test_z_for_matches_normal_quantiles():
    assert z_for(0.95) == pytest.approx(1.959964, abs=1e-5)
    assert z_for(0.99) == pytest.approx(2.575829, abs=1e-5)


def test_roundtrip_dict():
    est = AcceptanceEstimator()
    est.decay_to(5.0, 120)
    est.add(3, [1, 2, 3, 4], counterfactual=False)
    est.add(2, [4, 0, 1], counterfactual=True)
    back = AcceptanceEstimator.from_dict(est.to_dict())
    assert np.allclose(back.reached, est.reached) and np.allclose(back.accepted, est.accepted)
    assert back.cum.to_dict() == est.cum.to_dict() and back.cf_cum.to_dict() == est.cf_cum.to_dict()
    assert back.t_last == 5.0 and back.max_k == 3


@pytest.mark.parametrize("bad", [{"reached": [1.0], "accepted": [2.0]}, {"reached": [-1.0], "accepted": [0.0]},
                                 {"reached": [math.nan], "accepted": [0.0]}])
def test_from_dict_rejects_inconsistent_state(bad):
    d = AcceptanceEstimator().to_dict() | bad
    with pytest.raises(ValueError):
        AcceptanceEstimator.from_dict(d)


@pytest.mark.parametrize(
    "per_k",
    [
        {3: [1, 2, 3, 4]},
        {1: [3, 5], 2: [1, 2, 4], 4: [0, 1, 2, 1, 2]},
        {2: [5, 0, 0], 4: [0, 0, 0, 0, 0]},  # nothing accepted; an empty histogram does not raise max_k
        {5: [0, 0, 0, 0, 0, 7], 1: [2, 2]},
    ],
)
@pytest.mark.parametrize("counterfactual", [False, True])
def test_adding_a_batch_at_once_equals_adding_its_histograms_one_by_one(per_k, counterfactual):
    """add_many sums in integers before touching the arrays; the reference is positions_from_hist per histogram."""
    together, reference = AcceptanceEstimator(), AcceptanceEstimator()
    together.add_many(per_k, counterfactual)
    cum = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "per_pos": [0] * 32, "lengths": [0] * 33}
    for k, counts in per_k.items():
        reached, accepted = positions_from_hist(k, counts)
        reference.reached[:k] += reached
        reference.accepted[:k] += accepted
        reference.lengths[: k + 1] += counts
        if sum(counts):
            reference.max_k = max(reference.max_k, k)
        cum["drafts"] += sum(counts)
        cum["draft_tokens"] += k * sum(counts)
        cum["accepted_tokens"] += sum(j * c for j, c in enumerate(counts))
        cum["per_pos"][:k] = [int(a + b) for a, b in zip(cum["per_pos"][:k], accepted)]
        cum["lengths"][: k + 1] = [a + b for a, b in zip(cum["lengths"][: k + 1], counts)]
    assert np.array_equal(together.reached, reference.reached)
    assert np.array_equal(together.accepted, reference.accepted)
    assert np.array_equal(together.lengths, reference.lengths)
    assert together.max_k == reference.max_k
    drafts = sum(map(sum, per_k.values()))
    assert (together.cf_drafts, together.real_drafts) == ((drafts, 0) if counterfactual else (0, drafts))
    counted, untouched = (together.cf_cum, together.cum) if counterfactual else (together.cum, together.cf_cum)
    assert counted.to_dict() == cum and untouched.drafts == 0


@pytest.mark.parametrize(("asks", "hits", "prior", "rate"), [
    (0, 0, 4.0, 1.0),  # nothing reported: the drafter is priced as always drafting
    (100, 25, 4.0, 29 / 104),
    (1000, 0, 4.0, 4 / 1004),
    (10, 10, 4.0, 1.0),
    (10, 20, 4.0, 1.0),  # more hits than asks in one call cannot happen: clamped
])
def test_match_rate_is_a_posterior_share_of_asks_that_drafted(asks, hits, prior, rate):
    est = AcceptanceEstimator()
    est.decay_to(0.0, 120)
    est.add_attempts(asks, hits)
    assert est.match_rate(prior) == pytest.approx(rate)


def test_match_rate_decays_merges_and_persists():
    a, b = AcceptanceEstimator(), AcceptanceEstimator()
    a.decay_to(0.0, 10)
    a.add_attempts(100, 10)
    a.decay_to(10.0, 10)  # one half-life: the counts halve, the rate stays
    assert (a.attempts, a.hits) == (50, 5)
    b.decay_to(10.0, 10)
    b.add_attempts(50, 45)
    pool = AcceptanceEstimator()
    pool.merge_from(a)
    pool.merge_from(b)
    assert pool.match_rate(1e-9) == pytest.approx(0.5)
    again = AcceptanceEstimator.from_dict(pool.to_dict())
    assert (again.attempts, again.hits) == (pool.attempts, pool.hits)
    old = pool.to_dict()
    del old["attempts"], old["hits"]  # a snapshot written before the rate was kept
    assert AcceptanceEstimator.from_dict(old).match_rate(4.0) == 1.0
