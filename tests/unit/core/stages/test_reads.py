"""Reads' stage: a scrape never exports more series than the learned state is charged, whatever engine the
model's views are computed for (found by tests/fuzz/test_pipeline_stateful.py: exported 200 > charged 150)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig, BudgetSettings, LearnerSettings, PolicySettings
from specctl_vllm.controller.service.metrics import ServiceStats, render
from specctl_vllm.kernel.protocol import CategoryStep, SpecConfig
from tests.unit.core.factories import batch, cat_step, hist, step

MODEL = "org/model-c"
CATS = ("default", "tool_call", "x-1")
NOW = 1000.0  # fake time that does not move: engines seen "at once" tie for the model's most recent one


def make() -> Brain:
    return Brain(BrainConfig(LearnerSettings(), PolicySettings(), BudgetSettings(max_series=3_000)))


def exported(b: Brain) -> int:
    text, _ = render(b.metrics(NOW), ServiceStats(snapshot_age_s=1.0), "")
    return sum(len(f.samples) for f in text_string_to_metric_families(text.decode()))


def post(b: Brain, engine: str, k: int, *, method: str = "eagle3", drafts: bool = True, seq: int = 0) -> None:
    spec = SpecConfig(method=method if k else "off", k_max=k, model_free_methods=["ngram"])
    cats = [cat_step(c, 2, [0.7] * 32 if drafts and k else None, k=k) for c in CATS]
    b.ingest(batch([step(cats)], seq, engine=engine, model=MODEL, spec=spec), NOW)


def stale_engine_after_forget(b: Brain) -> Brain:
    """The fuzz's sequence: an engine at k_max 32 outlives its model (forgotten), which engines at k_max 1 and
    'off' bring back; the stale engine, seen at the same instant and first in order, is the one viewed."""
    post(b, "engine-0", 32)
    assert b.forget("model", MODEL)
    post(b, "engine-7", 1)
    post(b, "engine-4", 0, drafts=False)
    return b


def stale_engine_after_forget_no_drafts(b: Brain) -> Brain:
    post(b, "engine-0", 32)
    assert b.forget("model", MODEL)
    post(b, "engine-4", 0, drafts=False)
    return b


def snapshot_written_while_an_engine_raised_k(b: Brain) -> Brain:
    """A snapshot is written model by model, the engines last: a batch merged in between leaves an engine at
    k_max 32 beside its model charged at 1 (the same after a crash restart, or a forget replayed on load)."""
    post(b, "engine-7", 1)
    data = b.dump()
    data["engines"]["engine-7"]["spec_k_max"] = 32
    return Brain.load(data, b.config)


def counterfactual_above_k_max(b: Brain) -> Brain:
    """A model-free drafter scored at a k above the engine's k_max (the protocol bounds it by MAX_K only)."""
    spec = SpecConfig(method="eagle3", k_max=1, model_free_methods=["ngram"])
    cats = [CategoryStep(category=c, method="off", requests=10, counterfactual={"ngram": [hist([0.7] * 32, 32, 10)]})
            for c in (*CATS, "code", "json")]
    b.ingest(batch([step(cats)], 0, engine="engine-1", model=MODEL, spec=spec), NOW)
    return b


@pytest.mark.parametrize("scenario", [stale_engine_after_forget, stale_engine_after_forget_no_drafts,
                                      snapshot_written_while_an_engine_raised_k, counterfactual_above_k_max])
def test_a_scrape_never_exports_more_than_charged(scenario: Callable[[Brain], Brain]) -> None:
    b = scenario(make())
    assert exported(b) <= b.series, (exported(b), b.series)
    again = Brain.load(b.dump(), b.config)  # a restart charges what was charged, and exports the same
    assert not again.load_problems
    assert (exported(again), again.series) == (exported(b), b.series)
