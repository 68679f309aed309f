"""Forgetting's stage: what a drop takes with it, the order a smaller budget forgets in, the series charged."""

from __future__ import annotations

from specctl_vllm.controller.core.stages import evict
from tests.unit.core.factories import batch, brain, cat_step, step


def learned(now: float = 100.0):
    b = brain()
    for seq, (engine, cat) in enumerate([("e1", "code"), ("e2", "chat"), ("e1", "chat")]):
        b.ingest(batch([step([cat_step(cat, 4, [0.8, 0.7, 0.6, 0.5])])], seq, engine=engine), now + seq)
    return b._models, b._engines


def test_drop_takes_the_derived_state_with_it() -> None:
    models, engines = learned()
    decisions = {("m", "eagle3", 4, (), "e1", False, ()): "d1", ("m", "eagle3", 4, (), "e2", False, ()): "d2"}
    errors = {"m": 3}
    assert evict.drop("engine", "e1", models, engines, (decisions,), errors)
    assert set(engines) == {"e2"} and [k[4] for k in decisions] == ["e2"]
    assert evict.drop("category", evict.category_key("m", "chat"), models, engines, (decisions,), errors)
    assert "chat" not in models["m"].categories and "chat" not in engines["e2"].mix.per_category
    assert not evict.drop("category", evict.category_key("m", "chat"), models, engines, (decisions,), errors)
    assert evict.drop("model", "m", models, engines, (decisions,), errors)
    assert models == {} and decisions == {} and errors == {}
    assert not evict.drop("gpu", "m", models, engines, (), errors)


def test_over_budget_forgets_least_recently_seen_categories_then_engines() -> None:
    models, engines = learned()
    order = list(evict.over_budget(models, engines))
    assert order == [("category", evict.category_key("m", "code")), ("category", evict.category_key("m", "chat")),
                     ("engine", "e2"), ("engine", "e1")]


def test_series_shrinks_by_what_is_dropped_and_unseen_state_starts_its_idle_clock() -> None:
    models, engines = learned()
    full = evict.series(models, engines)
    evict.drop("engine", "e2", models, engines, (), {})
    assert evict.series(models, engines) < full
    models["m"].last_seen = engines["e1"].last_seen = None
    evict.stamp_unseen(models, engines, 500.0)
    assert models["m"].last_seen == engines["e1"].last_seen == 500.0
    assert models["m"].categories["code"].last_seen == 100.0
