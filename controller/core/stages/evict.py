"""Forgetting: what the idle sweep and a smaller budget drop, the drop itself, and the series the rest is charged.

State is per model (with its categories) and per engine; what was derived from it (cached decisions and served
policies, keyed by :data:`specctl_vllm.controller.core.stages.decide.Key`, and a model's decision-error count) goes with it,
so nothing forgotten is served again. :func:`idle` and :func:`over_budget` only read; :func:`drop` and
:func:`stamp_unseen` write the dictionaries they are given (the Brain's own).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, MutableMapping

from specctl_vllm.controller.core.config import BudgetSettings
from specctl_vllm.controller.core.learn.budget import GLOBAL_SERIES, engine_series, model_series, width_series
from specctl_vllm.controller.core.learn.engines import EngineBook
from specctl_vllm.controller.core.learn.learner import ModelState


def idle(models: dict[str, ModelState], engines: dict[str, EngineBook], budget: BudgetSettings, now: float) -> list[tuple[str, str]]:
    """What the idle sweep forgets at ``now``: engines, models, then categories of the models kept."""
    out: list[tuple[str, str]] = []
    out += [("engine", eid) for eid, b in engines.items()
            if b.last_seen is not None and now - b.last_seen > budget.engine_idle_s]
    for model, ms in models.items():
        if ms.last_seen is not None and now - ms.last_seen > budget.model_idle_s:
            out.append(("model", model))
            continue
        out += [("category", category_key(model, cat)) for cat, st in ms.categories.items()
                if st.last_seen is not None and now - st.last_seen > budget.category_idle_s]
    return out


def category_key(model: str, category: str) -> str:
    """The name of a (model, category) in eviction records: ``json.dumps([model, category])``."""
    return json.dumps([model, category])


def stamp_unseen(models: dict[str, ModelState], engines: dict[str, EngineBook], now: float) -> None:
    """State restored without a time starts its idle clock at ``now`` (else a restart would forget it at once)."""
    for book in engines.values():
        book.last_seen = now if book.last_seen is None else book.last_seen
    for ms in models.values():
        ms.last_seen = now if ms.last_seen is None else ms.last_seen
        for st in ms.categories.values():
            st.last_seen = now if st.last_seen is None else st.last_seen


def engine_charge(book: EngineBook) -> int:
    """Series one engine is charged."""
    return engine_series(book.engine_id, book.model or "") + (width_series(book.engine_id) if book.widths_charged else 0)


def series(models: dict[str, ModelState], engines: dict[str, EngineBook]) -> int:
    """Series the learned state is charged (an upper bound on what a scrape exports)."""
    return GLOBAL_SERIES + sum(engine_charge(b) for b in engines.values()) + sum(
        model_series(ms.name, ms.charged_k, {c: len(st.methods) for c, st in ms.categories.items()})
        for ms in models.values())


def over_budget(models: dict[str, ModelState], engines: dict[str, EngineBook]) -> Iterator[tuple[str, str]]:
    """The order state is forgotten in when it exceeds the budget: the least recently seen categories, then
    engines (the caller stops once the rest fits)."""
    cats = sorted((st.last_seen or 0.0, m, c) for m, ms in models.items() for c, st in ms.categories.items())
    for _seen, model, cat in cats:
        yield "category", category_key(model, cat)
    for eid in sorted(engines, key=lambda e: engines[e].last_seen or 0.0):
        yield "engine", eid


def drop(kind: str, name: str, models: dict[str, ModelState], engines: dict[str, EngineBook],
         caches: Iterable[MutableMapping[tuple, object]], decision_errors: dict[str, int]) -> bool:
    """Forget one engine, model or category (``name``: :func:`category_key`) and what was derived from it;
    False when there was nothing to forget."""
    caches = tuple(caches)
    if kind == "engine" and name in engines:
        engines.pop(name, None)
        _drop_cached(caches, lambda k: k[4] == name)
    elif kind == "model" and name in models:
        models.pop(name, None)
        decision_errors.pop(name, None)
        _drop_cached(caches, lambda k: k[0] == name)
    elif kind == "category":
        model, cat = json.loads(name)
        ms = models.get(model)
        if ms is None or cat not in ms.categories:
            return False
        ms.categories.pop(cat, None)
        for mix in [ms.mix] + [b.mix for b in engines.values() if b.model == ms.name]:
            mix.per_category.pop(cat, None)
            mix.committed_per_category.pop(cat, None)
    else:
        return False
    return True


def _drop_cached(caches: Iterable[MutableMapping[tuple, object]], match) -> None:
    for cache in caches:
        for key in [k for k in cache if match(k)]:
            cache.pop(key, None)
