"""PromQL snippets shared by the dashboards and kept in one place so every panel scopes the same way.

Conventions follow vLLM's own dashboards: rates over ``$__rate_interval`` (Grafana derives it from the
data source's scrape interval), and every ratio drops series whose denominator is zero instead of
drawing NaN during idle periods.
"""

from __future__ import annotations

RATE = "$__rate_interval"
RANGE = "$__range"

# Label scopes. specctl's per-category series carry model_name and category; its per-engine bookkeeping
# carries engine (the engine id the engine reports, SPECCTL_ENGINE_ID). vLLM's own `engine` label is the
# data-parallel index ("0", "1", ...), a different namespace, so vLLM series are scoped by model only.
MODEL = 'model_name=~"$model_name"'
CATEGORY = MODEL + ', category=~"$category"'
ENGINE = 'engine=~"$engine"'
MODEL_ENGINE = MODEL + ", " + ENGINE
OVERRIDE = 'category=~"$category"'


def _by(labels: str) -> str:
    return f" by ({labels}) " if labels else ""


def divide(numerator: str, denominator: str, matching: str = "") -> str:
    """``numerator / (denominator > 0)``: idle periods give no point instead of NaN."""
    op = f" {matching} " if matching else " "
    return f"{numerator} /{op}({denominator} > 0)"


class Promql:
    """Builds queries under one label selector."""

    def __init__(self, selector: str) -> None:
        self.selector = selector

    def sel(self, metric: str, *matchers: str) -> str:
        return f"{metric}{{{', '.join((self.selector, *matchers))}}}"

    def rate(self, metric: str, *matchers: str, window: str = RATE) -> str:
        return f"rate({self.sel(metric, *matchers)}[{window}])"

    def increase(self, metric: str, *matchers: str, window: str = RANGE) -> str:
        return f"increase({self.sel(metric, *matchers)}[{window}])"

    def sum_rate(self, metric: str, *matchers: str, by: str = "", window: str = RATE) -> str:
        return f"sum{_by(by)}({self.rate(metric, *matchers, window=window)})"

    def sum_increase(self, metric: str, *matchers: str, by: str = "", window: str = RANGE) -> str:
        return f"sum{_by(by)}({self.increase(metric, *matchers, window=window)})"

    def agg(self, op: str, metric: str, *matchers: str, by: str = "") -> str:
        return f"{op}{_by(by)}({self.sel(metric, *matchers)})"

    def ratio(self, numerator: str, denominator: str, *matchers: str, by: str = "", window: str = RATE) -> str:
        num = self.sum_rate(numerator, *matchers, by=by, window=window)
        return divide(num, self.sum_rate(denominator, *matchers, by=by, window=window))
