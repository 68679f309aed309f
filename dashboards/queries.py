"""Every PromQL query of the dashboards, and how to run one outside Grafana.

Tests use these to run each panel query against a real Prometheus (tests/e2e/test_prometheus.py) and to
check PromQL syntax with promtool (tests/unit/dashboards).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from dashboards import metrics as m
from dashboards.panels import JSON

#: Grafana's interval variables, in the order they must be replaced ($__range before $__range_s would
#: matter if we used the latter; longest names first keeps it safe).
INTERVAL_VARIABLES = ("$__rate_interval", "$__interval", "$__range")


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel, with what a test needs to run it the way Grafana does."""

    dashboard: str
    panel_id: int
    panel: str
    ref_id: str
    expr: str
    instant: bool

    @property
    def key(self) -> str:
        return f"{self.dashboard} / {self.panel_id}: {self.panel} / {self.ref_id}"


def _panels(board: JSON) -> Iterator[JSON]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_queries(boards: Mapping[str, JSON]) -> list[PanelQuery]:
    """Every panel query of every dashboard (template variables still in place)."""
    return [
        PanelQuery(name, panel["id"], panel["title"], t["refId"], t["expr"], bool(t.get("instant")))
        for name, board in boards.items()
        for panel in _panels(board)
        for t in panel.get("targets", [])
    ]


def variable_queries(boards: Mapping[str, JSON]) -> list[tuple[str, str, str]]:
    """(dashboard, variable name, query) of every query-type template variable."""
    return [
        (name, variable["name"], variable["query"])
        for name, board in boards.items()
        for variable in board["templating"]["list"]
        if variable["type"] == "query"
    ]


LABEL_VALUES = re.compile(r"^label_values\((?:(?P<series>[^,]+),\s*)?(?P<label>\w+)\)$")


def parse_label_values(query: str) -> tuple[str | None, str]:
    """``label_values(series, label)`` -> (series selector or None, label)."""
    match = LABEL_VALUES.match(query.strip())
    if not match:
        raise ValueError(f"not a label_values() query: {query!r}")
    return match["series"], match["label"]


def substitute(expr: str, variables: Mapping[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` template variables as Grafana would (values taken verbatim)."""
    names = sorted(variables, key=len, reverse=True)
    for name in names:
        value = variables[name]
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    if leftover := re.findall(r"\$\{?\w+", expr):
        raise ValueError(f"unsubstituted variables {leftover} in {expr!r}")
    return expr


def queried_metrics(exprs: list[str]) -> set[str]:
    """Metric names (``specctl_*`` and ``vllm:*``) appearing in ``exprs``, histogram suffixes kept."""
    return set(re.findall(r"\b(specctl_[a-z_]+|vllm:[a-z_]+)", " ".join(exprs)))


def unknown_metrics(exprs: list[str]) -> list[str]:
    """Queried names that are neither a known metric nor a histogram series of one."""
    known = m.SPECCTL | m.VLLM
    suffixes = ("_bucket", "_sum", "_count")
    return sorted(
        name
        for name in queried_metrics(exprs)
        if name not in known and not any(name.endswith(s) and name.removesuffix(s) in m.HISTOGRAMS for s in suffixes)
    )
