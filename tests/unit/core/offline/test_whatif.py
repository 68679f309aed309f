"""The what-if model's evidence: a drafter's match rate as the recording reports it (the policy's learner pools
the same asks and hits), so replay prices every option on the evidence the policy decides on."""

from __future__ import annotations

import pytest

from specctl_vllm.controller.core.offline import whatif
from specctl_vllm.kernel.protocol import CategoryStep, DraftHistogram, SpecConfig, StepRecord, TelemetryBatch

SPEC = SpecConfig(method="ngram", k_max=4, model_free_methods=["suffix"])


def _batch(cats: list[CategoryStep], steps: int = 10) -> TelemetryBatch:
    n = sum(c.requests for c in cats)
    recs = [StepRecord(t=i * 0.05, wall_s=0.05, batch_size=n, scheduled_tokens=n, draft_tokens=0, categories=cats)
            for i in range(steps)]
    return TelemetryBatch(engine_id="e", boot_id="b", model_name="m", seq=0, sent_at=0.0, spec=SPEC, steps=recs)


def _chat(cf_attempts: dict[str, int] | None) -> CategoryStep:
    """Chat runs suffix: 1 of 8 requests drafts (2 accepted of 2); n-gram, scored counterfactually, drafts once
    (1 of 2 accepted) per ``cf_attempts`` tries."""
    return CategoryStep(category="chat", method="suffix", requests=8, hists=[DraftHistogram(k=2, accepted=[0, 0, 1])],
                        counterfactual={"ngram": [DraftHistogram(k=2, accepted=[0, 1, 0])]},
                        counterfactual_attempts=cf_attempts or {})


@pytest.mark.parametrize(("cats", "category", "method", "rate"), [
    # run for real: requests that drafted over request steps
    ([_chat({"ngram": 10})], "chat", "suffix", 1 / 8),
    # scored counterfactually: drafts scored over tries (misses included)
    ([_chat({"ngram": 10})], "chat", "ngram", 1 / 10),
    # run for real and scored too: asks and hits pooled, as the learner pools them
    ([_chat({"ngram": 10}), CategoryStep(category="chat", method="ngram", requests=6,
                                         hists=[DraftHistogram(k=2, accepted=[1, 1, 1])])], "chat", "ngram",
     (1 + 3) / (10 + 6)),
    # a recording without counterfactual tries: no rate (priced as drafting on every ask)
    ([_chat(None)], "chat", "ngram", None),
])
def test_match_rate_pools_real_asks_and_counterfactual_tries(cats, category, method, rate) -> None:
    _, rates = whatif.acceptance([_batch(cats)])
    if rate is None:
        assert method not in rates.get(category, {})
    else:
        assert rates[category][method] == pytest.approx(rate)


def test_a_counterfactual_drafter_is_priced_at_its_match_rate() -> None:
    """E(1) = 1 + m * beta_1: n-gram found a match on 1 try in 10 for chat, so it is not priced as drafting
    on every request step (the what-if of a static n-gram k would otherwise credit it ten times over)."""
    batches = [_batch([_chat({"ngram": 10})])]
    est, _ = whatif.acceptance(batches)
    beta1 = est["chat"]["ngram"].betas(1, 0.5, 4.0)[0]
    prof = whatif.telemetry_profiles(batches, [1, 2])["chat"][("ngram", 1)]
    assert prof.e == pytest.approx(1 + beta1 / 10)
    assert prof.d == pytest.approx(1 / 10)
