"""The learned-state budget: how many Prometheus series each piece of learned state can export.

The per-dimension caps (categories per model, methods per category, positions per method, models,
engines) multiply: 64 models x 64 categories x 16 methods x 33 positions is millions of series. One
global budget (:class:`~controller.core.config.BudgetSettings.max_series`) is enforced on their product
instead: every engine, model, category and method is charged, when it is created, the most series it can
ever export at the model's largest proposal length K, and nothing is created beyond the budget.

Charges (upper bounds, from :mod:`controller.service.metrics`; ``tests/unit/core/test_budget.py`` checks
that a scrape never exports more than the charged total):

* engine: 3 batch outcomes + gaps + dropped steps + policy age + steps + step seconds + id conflicts, and a
  draft-cost-ratio row for its drafter: :data:`ENGINE_SERIES`;
* model: draft-cost ratios of up to ``MAX_METHODS`` + 1 drafters, overflow and decision-error counters:
  :data:`MODEL_SERIES`;
* (model, category): 3 totals, the acceptance-length histogram (K + 1 buckets, +Inf, sum, count), k, method,
  entropy class, entropy, mean length, K conditional acceptances, speedup, best method: ``14 + 2K``;
* (model, category, method): 3 real and 3 counterfactual counters, K per-position counters, match rate:
  ``7 + K``.

Memory follows the series: each charged series stands for a few numbers of learned state (measured in
docs/reliability.md#budget).
"""

from __future__ import annotations

from controller.protocol import MAX_METHODS

ENGINE_SERIES = 10
MODEL_SERIES = MAX_METHODS + 3
#: The controller's own series (internal errors, disconnects, snapshot age, the budget gauges, unknown engine).
GLOBAL_SERIES = 16


def category_series(k: int, methods: int) -> int:
    """Series one (model, category) with ``methods`` drafters can export at proposal lengths up to ``k``."""
    k = max(k, 1)
    return 14 + 2 * k + methods * (7 + k)


def model_series(k: int, methods_per_category: list[int]) -> int:
    return MODEL_SERIES + sum(category_series(k, m) for m in methods_per_category)
