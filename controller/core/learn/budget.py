"""The learned-state budget: how many Prometheus series each piece of learned state can export.

The per-dimension caps (categories per model, methods per category, positions per method, models,
engines) multiply: 64 models x 64 categories x 16 methods x 33 positions is millions of series. One
global budget (:class:`~specctl_vllm.controller.core.config.BudgetSettings.max_series`) is enforced on their product
instead: every engine, model, category and method is charged, when it is created, the most series it can
ever export at the model's largest proposal length K, and nothing is created beyond the budget.

Charges (upper bounds, from :mod:`specctl_vllm.controller.service.metrics`; ``tests/unit/core/learn/test_budget.py`` checks
that a scrape never exports more than the charged total):

* engine: 3 batch outcomes + gaps + dropped steps + policy age + steps + step seconds + id conflicts, and a
  draft-cost-ratio row for its drafter: :data:`ENGINE_SERIES`; a graph-shaped engine also its steps per width,
  one per width the protocol allows (:data:`WIDTH_SERIES`), charged when it first reports a width set (its steps
  per width are counted only once that charge fits);
* model: draft-cost ratios of up to ``MAX_METHODS`` + 1 drafters, overflow and decision-error counters:
  :data:`MODEL_SERIES`;
* (model, category): 3 totals, the acceptance-length histogram (K + 1 buckets, +Inf, sum, count), k, method,
  entropy class, entropy, mean length, K conditional acceptances, speedup, best method: ``14 + 2K``;
* (model, category, method): 3 real and 3 counterfactual counters, K per-position counters, match rate:
  ``7 + K``.

Label bytes are charged too: an exported series is charged ``1 + b / LABEL_BYTES``, ``b`` the bytes of its
label values (model name, engine id, category, as the text format writes them: UTF-8, escaped), so that
long names fill the budget sooner instead of making /metrics bigger: a line of the exposition is about
100 bytes without its label values (metric and label names, quotes, a value of up to 21 characters), so a
full budget stays under ``max_series x 100`` bytes (5 MB at the default) whatever the names (checked for
hostile names by ``tests/unit/core/learn/test_budget.py``). Without the weight, the default budget filled with the
longest names the protocol accepts was a 7 MB (63 bytes of names), 12 MB (256 ASCII characters) to 36 MB
(256 four-byte characters) scrape. Typical names cost little: ``meta-llama/Llama-3.1-8B-Instruct`` with
``tool_call`` is 1.41 per series (docs/reliability.md#budget).

Memory follows the series: each charged series stands for a few numbers of learned state (measured in
docs/reliability.md#budget).
"""

from __future__ import annotations

import math

from specctl_vllm.kernel.protocol import MAX_K, MAX_METHODS

ENGINE_SERIES = 10
#: Steps per proposal width of a graph-shaped engine: one series per width 0..MAX_K.
WIDTH_SERIES = MAX_K + 1
MODEL_SERIES = MAX_METHODS + 3
#: The controller's own series (internal errors, disconnects, snapshot age, the budget gauges, unknown engine).
GLOBAL_SERIES = 16


#: Label bytes that cost one more charge (the method label, at most 32 bytes, and the metric's own name are
#: in the 100 bytes a line has besides its model, engine and category names).
LABEL_BYTES = 100


def label_weight(*values: str) -> float:
    """Charge of one exported series whose label values are ``values``."""
    size = sum(len(v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"').encode()) for v in values)
    return 1.0 + size / LABEL_BYTES


def engine_series(engine_id: str, model: str) -> int:
    return math.ceil(ENGINE_SERIES * label_weight(engine_id, model))


def width_series(engine_id: str) -> int:
    """The steps-per-width counters of a graph-shaped engine (labels: engine, width)."""
    return math.ceil(WIDTH_SERIES * label_weight(engine_id))


def category_series(k: int, methods: int, weight: float = 1.0) -> int:
    """Charge of one (model, category) with ``methods`` drafters at proposal lengths up to ``k``, each of its
    series weighing ``weight`` (:func:`label_weight` of the model and category names)."""
    k = max(k, 1)
    return math.ceil(weight * (14 + 2 * k + methods * (7 + k)))


def model_series(model: str, k: int, methods_per_category: dict[str, int]) -> int:
    return math.ceil(MODEL_SERIES * label_weight(model)) + sum(
        category_series(k, m, label_weight(model, c)) for c, m in methods_per_category.items())
