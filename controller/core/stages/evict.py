"""Forgetting idle state: which engines, models and categories the idle sweep drops at ``now`` (a read; the
Brain drops them)."""

from __future__ import annotations

import json

from controller.core.config import BudgetSettings
from controller.core.engines import EngineBook
from controller.core.learner import ModelState


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
