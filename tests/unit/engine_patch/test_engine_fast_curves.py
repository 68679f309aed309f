"""The width rule's fast timescale: decayed per-category acceptance blended into the controller's curve."""

from types import SimpleNamespace

import pytest

from specctl_vllm.engine_patch.fast_curves import FAST_DECAY, FAST_MAX_WEIGHT, FastCurves
from specctl_vllm.kernel.model.widths import COLD_BETA, geometric_lengths


def entry(hists):
    return SimpleNamespace(hists=hists)


@pytest.mark.parametrize(("slow", "expected"), [
    (None, geometric_lengths(COLD_BETA, 4)),  # nothing known: the cold prior
    ((1.0, 1.5, 1.8, 2.0, 2.1), (1.0, 1.5, 1.8, 2.0, 2.1)),  # no evidence: the controller's curve as sent
])
def test_without_evidence_the_curve_is_the_slow_one_or_the_prior(slow, expected):
    assert FastCurves(4).curve("chat", slow) == pytest.approx(expected)


def test_evidence_is_counted_from_histograms_and_packed_codes():
    fast = FastCurves(4)
    # k=2 drafts: 3 requests accepted both (no rejection), 1 accepted none (one rejection): 6 accepted, 1 rejected
    fast.observe({("chat", "ngram"): entry({2: [1, 0, 3]})}, {"json": [0, 5]})
    assert "chat" in fast and "json" in fast and "code" not in fast
    assert fast.curve("chat", None) == pytest.approx(geometric_lengths(6 / 7, 4))
    assert fast.curve("json", None) == pytest.approx(geometric_lengths(0.0, 4))


def test_evidence_decays_and_never_outweighs_the_controller():
    fast = FastCurves(2)
    fast.observe({}, {"chat": [1000, 0]})  # overwhelming evidence of beta = 1
    slow = (1.0, 1.0, 1.0)
    blended = fast.curve("chat", slow)
    full = geometric_lengths(1.0, 2)
    assert blended == pytest.approx(tuple((1 - FAST_MAX_WEIGHT) * a + FAST_MAX_WEIGHT * b for a, b in zip(slow, full)))
    fast.observe({}, {})
    assert fast._sums["chat"][0] == pytest.approx(1000 * FAST_DECAY)
