"""A telemetry batch checked before it is learned from, and charged against the learned-state budget.

Nothing here mutates: :func:`validate` raises :class:`IngestRejected` for a batch that passed the schema but
makes no sense (or does not fit the engine/model caps), :func:`charge` says how many series a batch's digest
would add. The Brain applies a batch only after both passed, so a rejection leaves everything as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from controller.core.budget import category_series, label_weight
from controller.core.config import BudgetSettings
from controller.core.engines import EngineBook
from controller.core.learner import ModelState
from controller.protocol import METHOD_ENGINE, METHOD_OFF, TelemetryBatch


class IngestRejected(Exception):
    """A batch that passed the schema but makes no sense; the service answers ``status`` (422, or 409 for an
    engine id shared by two live engines, 429 for a full budget) with ``reason``."""

    def __init__(self, reason: str, status: int = 422) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class IngestResult:
    outcome: Literal["accepted", "duplicate"]
    gaps: int


def validate(batch: TelemetryBatch, book: EngineBook | None, engines: int, models: Mapping[str, ModelState],
             budget: BudgetSettings) -> None:
    if book is None and engines >= budget.max_engines:
        raise IngestRejected(f"too many engines (limit {budget.max_engines}; an engine idle for "
                             f"{budget.engine_idle_s:g} s is forgotten)", status=429)
    if batch.model_name not in models and len(models) >= budget.max_models:
        raise IngestRejected(f"too many models (limit {budget.max_models}; a model idle for "
                             f"{budget.model_idle_s:g} s is forgotten)", status=429)
    if book is not None and book.boot_id == batch.boot_id and book.model and book.model != batch.model_name:
        raise IngestRejected(f"engine {batch.engine_id} reports model {book.model!r} in this boot, "
                             f"not {batch.model_name!r}")
    k_max = batch.spec.k_max
    for i, step in enumerate(batch.steps):
        seen: set[tuple[str, str]] = set()
        requests = 0
        for cs in step.categories:
            key = (cs.category, cs.method)
            if key in seen:
                raise IngestRejected(f"step {i}: category {cs.category!r} method {cs.method!r} reported twice")
            seen.add(key)
            requests += cs.requests
            if cs.method == METHOD_OFF and cs.hists:
                raise IngestRejected(f"step {i}: category {cs.category!r} has drafts under method 'off'")
            for h in cs.hists:
                if h.k > k_max:
                    raise IngestRejected(f"step {i}: category {cs.category!r} drafted k={h.k} above the "
                                         f"engine's k_max={k_max}")
            if METHOD_OFF in cs.counterfactual or METHOD_ENGINE in cs.counterfactual:
                raise IngestRejected(f"step {i}: counterfactual method must name a drafter")
            for m, hs in cs.counterfactual.items():
                if len({h.k for h in hs}) != len(hs):
                    raise IngestRejected(f"step {i}: counterfactual {m!r}: one histogram per proposal length")
        if requests > step.batch_size:
            raise IngestRejected(f"step {i}: categories hold {requests} requests, batch_size is "
                                 f"{step.batch_size}")


def charge(ms: ModelState, digest, k_max: int) -> int:
    """Series the digest would add to ``ms`` (new categories, new methods, a larger k); 0 for most batches."""
    k = max(ms.charged_k, k_max)
    methods: dict[str, set[str]] = {}
    for cat, method, _cf in (*digest.hists, *digest.asks):
        st = ms.categories.get(cat)
        if st is None or method not in st.methods:
            methods.setdefault(cat, set(st.methods) if st is not None else set()).add(method)
    for cat in digest.new_categories:
        methods.setdefault(cat, set())
    if not methods and k <= ms.charged_k:
        return 0
    before = sum(category_series(ms.charged_k, len(st.methods), label_weight(ms.name, c))
                 for c, st in ms.categories.items())
    after = sum(category_series(k, len(methods[c]) if c in methods else len(st.methods), label_weight(ms.name, c))
                for c, st in ms.categories.items())
    after += sum(category_series(k, len(m), label_weight(ms.name, c)) for c, m in methods.items()
                 if c not in ms.categories)
    return after - before
