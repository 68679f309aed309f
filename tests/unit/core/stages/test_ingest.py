"""Ingest's stage: admit checks everything and learns nothing; apply learns what was admitted."""

from __future__ import annotations

import copy

import pytest

from specctl_vllm.controller.core.config import BrainConfig, BudgetSettings, LearnerSettings, PolicySettings
from specctl_vllm.controller.core.stages.evict import series
from specctl_vllm.controller.core.stages.ingest import Admission, IngestRejected, IngestResult, admit, apply
from specctl_vllm.kernel.cost import H200
from tests.unit.core.factories import batch, cat_step, step

CONFIG = BrainConfig(LearnerSettings(), PolicySettings())


def one(seq: int = 0, category: str = "code", **kw):
    return batch([step([cat_step(category, 4, [0.8, 0.7, 0.6, 0.5])])], seq, **kw)


def test_admit_leaves_the_learned_state_alone_and_apply_learns_it() -> None:
    engines, models = {}, {}
    got = admit(one(), engines, models, series(models, engines), CONFIG, H200, now=10.0)
    assert isinstance(got, Admission) and got.cost > 0
    assert engines == {} and models == {} and got.state.categories == {}
    result = apply(one(), got, 10.0, CONFIG)
    assert result == IngestResult("accepted", 0)
    assert "code" in got.state.categories and got.book.last_seen == 10.0 and got.book.model == "m"


def test_a_repeated_sequence_number_is_a_duplicate_counted_on_a_known_engine() -> None:
    engines, models = {}, {}
    first = admit(one(), engines, models, 0, CONFIG, H200, now=1.0)
    apply(one(), first, 1.0, CONFIG)
    engines["e1"], models["m"] = first.book, first.state
    again = admit(one(), engines, models, 0, CONFIG, H200, now=2.0)
    assert again == IngestResult("duplicate", 0) and first.book.outcomes["duplicate"] == 1


def test_a_full_budget_refuses_a_new_engine_and_leaves_the_state_as_it_was() -> None:
    engines, models = {}, {}
    first = admit(one(), engines, models, 0, CONFIG, H200, now=1.0)
    apply(one(), first, 1.0, CONFIG)
    engines["e1"], models["m"] = first.book, first.state
    before = copy.deepcopy((first.state.to_dict(), first.book.to_dict()))
    full = BrainConfig(LearnerSettings(), PolicySettings(), BudgetSettings(max_series=100))
    with pytest.raises(IngestRejected) as exc:
        admit(one(0, engine="e2"), engines, models, 100, full, H200, now=2.0)
    assert exc.value.status == 429 and "budget full" in exc.value.reason
    assert (first.state.to_dict(), first.book.to_dict()) == before and set(engines) == {"e1"}


def test_a_full_budget_accepts_a_known_engines_batch_with_what_fits() -> None:
    engines, models = {}, {}
    first = admit(one(), engines, models, 0, CONFIG, H200, now=1.0)
    apply(one(), first, 1.0, CONFIG)
    engines["e1"], models["m"] = first.book, first.state
    full = BrainConfig(LearnerSettings(), PolicySettings(), BudgetSettings(max_series=100))
    late = admit(one(1, category="chat"), engines, models, 100, full, H200, now=2.0)  # a new category
    assert not isinstance(late, IngestResult) and late.cost == 0
    assert first.state.dropped_methods == 1  # the new category's report, dropped and counted
