"""The learned-state budget: charged series bound what a scrape exports, the product of the dimensions is
capped, and idle engines, models and categories are forgotten (freeing the caps)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specctl_vllm.controller.core.brain import Brain, IngestRejected, category_key
from specctl_vllm.controller.core.config import BrainConfig, BudgetSettings, LearnerSettings, PolicySettings
from specctl_vllm.controller.service.metrics import ServiceStats, render
from specctl_vllm.kernel.protocol import OVERFLOW_CATEGORY, SpecConfig
from tests.unit.core.factories import batch, cat_step, step

BETAS = [0.7] * 32


def make(max_series=50_000, **budget) -> Brain:
    return Brain(BrainConfig(LearnerSettings(), PolicySettings(), BudgetSettings(max_series=max_series, **budget)))


def exported(brain: Brain, now: float) -> int:
    text, _ = render(brain.metrics(now), ServiceStats(snapshot_age_s=1.0), "")
    return sum(len(f.samples) for f in text_string_to_metric_families(text.decode()))


def post(b: Brain, *, engine="e1", model="m", cats=("code",), k=4, seq=0, methods=("eagle3",), now=1000.0,
         boot="b1"):
    spec = SpecConfig(method=methods[0], k_max=k, model_free_methods=["ngram"])
    steps = [step([cat_step(c, 2, BETAS, k=k, method=m) for c in cats for m in methods[:1]]
                  + [cat_step(c, 1, BETAS, k=k, method="ngram") for c in cats if "ngram" in methods[1:]])]
    return b.ingest(batch(steps, seq, engine=engine, boot=boot, model=model, spec=spec), now)


@pytest.mark.parametrize(
    ("engines", "models", "cats", "k", "methods"),
    [(1, 1, 1, 1, ("eagle3",)), (3, 2, 5, 4, ("eagle3", "ngram")), (2, 3, 8, 32, ("eagle3", "ngram")),
     (5, 1, 20, 7, ("ngram",))],
)
def test_scrape_never_exports_more_than_charged(engines, models, cats, k, methods):
    b = make()
    for e in range(engines):
        for m in range(models):
            post(b, engine=f"e{e}-{m}", model=f"m{m}", cats=[f"c{i}" for i in range(cats)], k=k, methods=methods)
    for i, v in enumerate(b.policy_for("m0", SpecConfig(method=methods[0], k_max=k), 1001.0, "e0-0").categories):
        assert v
    n = exported(b, 1002.0)
    assert n <= b.series, (n, b.series)
    assert b.series < 4 * n + 200  # and the charge is not wildly above it (positions never drafted: 0 rows)


def test_budget_caps_the_product_of_dimensions():
    b = make(max_series=2_000)
    refused = 0
    for m in range(40):
        for e in range(4):
            try:
                post(b, engine=f"e{m}-{e}", model=f"m{m}", cats=[f"c{i}" for i in range(30)], k=32,
                     methods=("eagle3", "ngram"))
            except IngestRejected as exc:
                assert exc.status == 429 and "budget full" in exc.reason or "too many" in exc.reason
                refused += 1
    assert refused > 0 and b.budget_refusals == refused
    assert b.series <= 2_000
    assert exported(b, 1001.0) <= 2_000


def test_full_budget_pools_new_categories_into_overflow():
    b = make(max_series=1_000)
    post(b, cats=[f"c{i}" for i in range(5)], k=4)
    room = b.series
    i = 5
    while b.series < 1_000 - 200:
        post(b, cats=[f"c{i}"], k=4, seq=i)
        i += 1
    post(b, cats=[f"new{j}" for j in range(30)], k=4, seq=i + 1)  # no room for 30 more names
    names = {v.category for v in b.categories(1001.0)}
    assert OVERFLOW_CATEGORY in names and not any(n.startswith("new") for n in names)
    assert room < b.series <= 1_000


def test_idle_state_is_forgotten_and_frees_the_caps():
    b = make(max_engines=2, max_models=1, engine_idle_s=60, category_idle_s=120, model_idle_s=300)
    post(b, engine="a", cats=["old", "live"], now=1000.0)
    post(b, engine="b", cats=["live"], now=1000.0)
    post(b, engine="b", cats=["live"], seq=1, now=1100.0)
    evicted = b.evict_idle(1100.0)
    assert evicted == [("engine", "a")]
    post(b, engine="c", now=1100.0)  # the engine cap freed up
    post(b, engine="b", cats=["live"], seq=2, now=1150.0)
    assert ("category", category_key("m", "old")) in b.evict_idle(1150.0)
    assert {v.category for v in b.categories(1150.0)} == {"live", "code"}
    assert b.evict_idle(1500.0)  # everything idle: the model goes too
    assert b.categories(1500.0) == [] and b.engines(1500.0) == []
    post(b, engine="d", model="other", now=1500.0)  # the model cap freed up


def test_at_a_cap_the_least_recently_seen_is_evicted_for_a_new_one():
    b = make(max_engines=2, max_models=1)
    post(b, engine="a", now=1000.0)
    post(b, engine="b", now=1001.0)
    post(b, engine="a", seq=1, now=1002.0)  # "b" is now the least recently seen
    post(b, engine="c", now=1003.0)  # served on its first post
    assert {e.engine_id for e in b.engines(1003.0)} == {"a", "c"} and b.cap_evictions == 1
    post(b, engine="d", model="other", now=1004.0)  # the model cap: the old model goes (and an engine)
    assert b.model_names() == ["other"] and b.cap_evictions >= 2


def storm(b: Brain, n: int, now: float) -> None:
    """An empty batch under a fresh engine id."""
    b.ingest(batch([], 0, engine=f"storm-{n}", model="m", spec=SpecConfig(method="eagle3", k_max=4)), now)


def test_a_full_budget_makes_room_for_a_new_engine_by_forgetting_the_least_recently_seen():
    """Fresh engine ids fill the series budget before the engine cap; a new engine is then served on its first
    post, the least recently seen engines forgotten for it, and a live engine is kept."""
    b = make(max_series=400)
    post(b, engine="live", now=1000.0)
    n = 0
    while b.cap_evictions == 0:  # a storm of fresh ids, each served, until the budget is full
        storm(b, n, 1000.0 + n * 0.01)
        n += 1
        post(b, engine="live", seq=n, now=1000.0 + n * 0.01)  # the live engine keeps posting
        assert n < 100
    assert n > 5 and b.series <= 400
    assert "storm-0" not in {e.engine_id for e in b.engines(1100.0)}  # the first forgotten: least recently seen
    before = {e.engine_id for e in b.engines(1100.0)}
    post(b, engine="new", now=1100.0)  # served on its first post
    after = {e.engine_id for e in b.engines(1100.0)}
    assert "new" in after and "live" in after and b.series <= 400
    assert before - after == {"storm-1"} and b.cap_evictions == 2  # the least recently seen, only as needed


def test_a_full_budget_forgets_nothing_for_a_batch_the_room_would_not_fit():
    b = make(max_series=1_000)
    grown, i = True, 0
    while grown:  # one model's categories take all the budget they can
        was = b.series
        post(b, cats=[f"c{i}"], k=32, seq=i)
        grown, i = b.series > was, i + 1
    n = 0
    while b.cap_evictions == 0:  # fresh ids take the rest
        storm(b, n, 1000.0 + n)
        n += 1
        assert n < 100
    evicted, before = b.cap_evictions, {e.engine_id for e in b.engines(2000.0)}
    with pytest.raises(IngestRejected) as exc:  # a new model at k 32: more than forgetting the engines frees
        post(b, engine="big", model="big", k=32, now=2000.0)
    assert exc.value.status == 429 and exc.value.needed > 0
    assert {e.engine_id for e in b.engines(2000.0)} == before and b.cap_evictions == evicted


def test_series_recounted_after_eviction_and_load():
    b = make()
    post(b, cats=["a", "b", "c"], k=8, methods=("eagle3", "ngram"))
    charged = b.series
    back = Brain.load(b.dump(), b.config)
    assert back.series == charged
    assert b.forget("category", category_key("m", "a"))
    assert b.series < charged


def test_forgotten_state_not_resurrected_by_an_older_snapshot():
    b = make()
    post(b, engine="e1", cats=["a", "b"])
    data = b.dump()
    back = Brain.load(data, b.config)
    dropped = back.apply_forgotten([("engine", "e1", 2000.0), ("category", category_key("m", "a"), 2000.0)],
                                   snapshot_ts=1500.0)
    assert dropped == 2 and back.engines(2000.0) == [] and {v.category for v in back.categories(2000.0)} == {"b"}
    newer = Brain.load(data, b.config)  # a snapshot taken after the eviction keeps what came back since
    assert newer.apply_forgotten([("engine", "e1", 1000.0)], snapshot_ts=1500.0) == 0


def test_smaller_budget_on_restart_shrinks_least_recently_seen_first():
    b = make()
    post(b, cats=["old"], k=4, now=1000.0)
    post(b, cats=["new"], k=4, seq=1, now=2000.0)
    small = BrainConfig(LearnerSettings(), PolicySettings(), BudgetSettings(max_series=b.series - 10))
    back = Brain.load(b.dump(), small)
    assert back.series <= small.budget.max_series
    assert "old" not in {v.category for v in back.categories(2000.0)}
    assert back.load_problems


#: Names at the protocol's limits: 63 bytes together (one charge per series before label bytes were charged),
#: the longest ASCII model name, 4-byte characters, characters the text format escapes.
HOSTILE_NAMES = {
    "63 bytes": (lambda m: (f"m{m}-" + "x" * 64)[:30], lambda i: (f"c{i}-" + "y" * 64)[:33]),
    "ascii": (lambda m: (f"m{m}-" + "x" * 256)[:256], lambda i: (f"c{i}-" + "y" * 64)[:64]),
    "4-byte": (lambda m: (f"{m}" + "\U0001F600" * 256)[:256], lambda i: (f"c{i}-" + "y" * 64)[:64]),
    "escaped": (lambda m: (f"{m}" + '\\"\n' * 90)[:256], lambda i: (f"c{i}-" + "y" * 64)[:64]),
}


@pytest.mark.parametrize("names", list(HOSTILE_NAMES), ids=list(HOSTILE_NAMES))
def test_a_full_budget_scrape_stays_under_100_bytes_per_series_whatever_the_names(names):
    """/metrics <= max_series x 100 bytes (+ the families' HELP/TYPE lines): 5 MB at the default budget."""
    model_name, category = HOSTILE_NAMES[names]
    budget = 10_000
    b = make(max_series=budget)
    for m in range(64):
        try:
            post(b, engine=(f"e{m}-" + "z" * 128)[:128], model=model_name(m), cats=[category(i) for i in range(60)],
                 k=32, methods=("eagle3",))
        except IngestRejected:
            break
    assert b.series > budget * 0.9  # filled
    text, _ = render(b.metrics(1001.0), ServiceStats(snapshot_age_s=1.0), "")
    assert len(text) <= budget * 100 + 16 * 1024, len(text)


def post_graph(b: Brain, *, engine: str, widths_seen: range, seq: int = 0, boot: str = "b1", k: int = 32):
    """A graph-shaped engine's batch whose steps ran every width in ``widths_seen`` (hostile: all 33)."""
    spec = SpecConfig(method="eagle3", k_max=k, graph_widths=[0, 1, 2, 4, k])
    steps = [step([cat_step("code", 2, BETAS, k=w)], depth=w).model_copy(update={"width": w}) for w in widths_seen]
    return b.ingest(batch(steps, seq, engine=engine, boot=boot, model="m", spec=spec), 1000.0)


def test_steps_per_width_are_charged_before_they_are_exported():
    """A graph-shaped engine exports one steps-per-width series per width it ran, up to every width the protocol
    allows: charged when it first reports a width set, and counted only where that charge fits the budget."""
    b = make()
    for e in range(3):
        post_graph(b, engine=f"g{e}", widths_seen=range(33))
    n = exported(b, 1002.0)
    assert n <= b.series, (n, b.series)
    assert all(len(e.width_steps) == 33 for e in b.metrics(1002.0).engines)
    before = b.series
    post_graph(b, engine="g0", widths_seen=range(33), seq=1)  # charged once
    assert b.series == before
    full = make()
    post_graph(full, engine="g", widths_seen=range(1))
    tight = make(max_series=full.series - 1)
    post_graph(tight, engine="g", widths_seen=range(1))  # the engine fits, its width series do not
    assert not tight.metrics(1002.0).engines[0].width_steps
    assert exported(tight, 1002.0) <= tight.series <= full.series - 1
    again = Brain.load(b.dump(), b.config)
    assert again.series == b.series  # the charge survives a restart
