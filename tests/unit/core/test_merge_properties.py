"""Merging telemetry: idempotent per (engine, seq), independent of arrival order, never negative."""

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.kernel.protocol import CategoryStep, DraftHistogram, StepRecord
from tests.unit.core.factories import batch, config


@st.composite
def hists(draw):
    ks = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3, unique=True))
    return [DraftHistogram(k=k, accepted=draw(st.lists(st.integers(0, 20), min_size=k + 1, max_size=k + 1)))
            for k in ks]


@st.composite
def steps(draw):
    cats = []
    for name in draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3)):
        hs = draw(hists())
        drafted = sum(h.drafts for h in hs)
        requests = drafted + draw(st.integers(0, 5))
        cf = {"ngram": draw(hists())} if draw(st.booleans()) else {}
        cats.append(CategoryStep(category=name, method="eagle3" if hs else "off", requests=requests, hists=hs,
                                 counterfactual=cf))
    n = sum(c.requests for c in cats)
    drafts = sum(h.k * h.drafts for c in cats for h in c.hists)
    return StepRecord(t=0.0, wall_s=draw(st.floats(1e-4, 0.05)), batch_size=n, scheduled_tokens=n + drafts,
                      draft_tokens=drafts, draft_depth=4 if drafts else 0, categories=cats)


batches = st.lists(st.lists(steps(), min_size=1, max_size=3), min_size=1, max_size=6)


def learned(b: Brain) -> dict:
    """Learned state and counters; engine outcome counters legitimately differ between runs."""
    d = b.dump()
    for e in d["engines"].values():
        e.pop("outcomes")
        e.pop("seen")
        e.pop("max_seq")
    return d


def run(seq_batches, order, now=100.0):
    b = Brain(config())
    for i in order:
        b.ingest(batch(seq_batches[i], i), now)
    return b


def close(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return bool(np.isclose(a, b, rtol=1e-9, atol=1e-12))
    return a == b


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches, st.data())
def test_replaying_any_batch_changes_nothing(bs, data):
    once = run(bs, range(len(bs)))
    again = run(bs, range(len(bs)))
    for i in data.draw(st.lists(st.integers(0, len(bs) - 1), max_size=8)):
        assert again.ingest(batch(bs[i], i), 100.0).outcome == "duplicate"
    assert learned(again) == learned(once)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches, st.randoms(use_true_random=False))
def test_arrival_order_does_not_matter(bs, rnd):
    order = list(range(len(bs)))
    rnd.shuffle(order)
    a = learned(run(bs, range(len(bs))))
    b = learned(run(bs, order))
    assert a["engines"]["e1"]["gaps"] == b["engines"]["e1"]["gaps"] == 0
    assert close(a["models"], b["models"])


def _non_negative(x) -> bool:
    if isinstance(x, dict):
        return all(_non_negative(v) for k, v in x.items() if k not in ("max_seq",))
    if isinstance(x, list):
        return all(_non_negative(v) for v in x)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return x >= 0
    return True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches, st.lists(st.floats(0, 1e4), min_size=6, max_size=6))
def test_state_is_never_negative_and_rates_are_probabilities(bs, times):
    b = Brain(config())
    for i, s in enumerate(bs):
        b.ingest(batch(s, i), 1000.0 + sorted(times)[i])
    dump = b.dump()
    json.dumps(dump)
    models = dump["models"]
    assert _non_negative({k: v for k, v in models.items()})
    for v in b.categories(2e4):
        for m in v.methods:
            for p in m.positions:
                assert 0 <= p.ci_low <= p.ci_high <= 1 and 0 <= p.beta <= 1 and p.accepted <= p.reached + 1e-9
    for c in b.metrics(2e4).categories:
        assert c.request_steps >= 0 and c.committed_tokens >= c.request_steps - c.spec_off_request_steps
