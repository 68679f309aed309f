"""Grafana panel, variable and dashboard builders over plain dicts (no SDK dependency).

The JSON shapes follow Grafana's dashboard schema version 39 as used by vLLM's generated dashboards, so
the specctl dashboards sit next to vLLM's (same ``vllm`` tag, same ``${datasource}`` variable).
"""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ["vllm", "specctl"]
GRID_WIDTH = 24

TOKENS_PER_S = "count:tok/s"

NO_TRAFFIC: JSON = {"type": "special", "options": {"match": "nan", "result": {"index": 0, "text": "No traffic"}}}


def thresholds(*steps: tuple[str, float | None]) -> JSON:
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for color, value in steps]}


NEUTRAL = thresholds(("blue", None))
#: A speedup below 1 means speculation costs more than plain decoding.
SPEEDUP = thresholds(("red", None), ("orange", 1.0), ("green", 1.05))
#: Any occurrence is worth a look (gaps, rejected batches, dropped steps).
ANY_IS_BAD = thresholds(("green", None), ("red", 1))
#: Policy age in seconds: an engine that has not heard from the controller for long falls back.
POLICY_AGE = thresholds(("green", None), ("orange", 10), ("red", 30))


def target(expr: str, legend: str = "__auto", *, instant: bool = False, fmt: str = "time_series") -> JSON:
    """One query of a panel; Grafana runs range queries unless ``instant``."""
    query: JSON = {"expr": expr, "legendFormat": legend}
    if fmt != "time_series":
        query["format"] = fmt
    if instant:
        query |= {"instant": True, "range": False}
    return query


def _panel(kind: str, title: str, description: str, targets: list[JSON]) -> JSON:
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    return {"type": kind, "title": title, "description": description, "datasource": DATASOURCE, "targets": targets}


def timeseries(
    title: str,
    description: str,
    targets: list[JSON],
    *,
    unit: str = "short",
    max_value: float | None = None,
    stack: bool = False,
    steps: bool = False,
    threshold_line: JSON | None = None,
    decimals: int | None = None,
) -> JSON:
    """A time series panel. ``steps`` draws step lines (for decisions such as k); ``threshold_line``
    draws the thresholds as dashed lines (e.g. speedup = 1)."""
    custom: JSON = {"fillOpacity": 25 if stack else 10, "lineWidth": 1, "showPoints": "never"}
    if stack:
        custom["stacking"] = {"group": "A", "mode": "normal"}
    if steps:
        custom["lineInterpolation"] = "stepAfter"
    defaults: JSON = {"color": {"mode": "palette-classic"}, "custom": custom, "unit": unit, "min": 0}
    if threshold_line is not None:
        custom["thresholdsStyle"] = {"mode": "dashed"}
        defaults["thresholds"] = threshold_line
    if max_value is not None:
        defaults["max"] = max_value
    if decimals is not None:
        defaults["decimals"] = decimals
    panel = _panel("timeseries", title, description, targets)
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "legend": {"calcs": ["mean", "lastNotNull"], "displayMode": "table", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel


def stat(
    title: str,
    description: str,
    expr: str,
    *,
    unit: str,
    steps: JSON = NEUTRAL,
    decimals: int | None = None,
) -> JSON:
    """A stat tile with a sparkline; tiles coloured by thresholds carry a judgement, neutral ones do not."""
    defaults: JSON = {
        "color": {"mode": "thresholds"},
        "mappings": [NO_TRAFFIC],
        "thresholds": steps,
        "unit": unit,
        "noValue": "No data",
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    panel = _panel("stat", title, description, [target(expr)])
    panel["fieldConfig"] = {"defaults": defaults, "overrides": []}
    panel["options"] = {
        "colorMode": "none" if steps is NEUTRAL else "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": "value",
    }
    return panel


def heatmap(title: str, description: str, expr: str, *, repeat: str | None = None) -> JSON:
    """A heatmap of a Prometheus histogram's buckets over time (one row per ``le`` bucket).

    With ``repeat`` the panel is repeated once per value of that template variable.
    """
    panel = _panel("heatmap", title, description, [target(expr, "{{le}}", fmt="heatmap")])
    panel["options"] = {
        "calculate": False,
        "cellGap": 1,
        "color": {"exponent": 0.5, "fill": "blue", "mode": "scheme", "reverse": False, "scale": "exponential",
                  "scheme": "Blues", "steps": 64},
        "legend": {"show": True},
        "rowsFrame": {"layout": "auto"},
        "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": True},
        "yAxis": {"axisPlacement": "left", "decimals": 0, "unit": "short"},
    }
    if repeat:
        panel |= {"repeat": repeat, "repeatDirection": "h", "maxPerRow": 4}
    return panel


def table(title: str, description: str, targets: list[JSON], columns: dict[str, str]) -> JSON:
    """A table of instant queries; ``columns`` maps the fields to show, in order, to their headers.

    Info-style metrics (``*_info``) show their labels; gauges show their value in the ``Value`` column.
    """
    panel = _panel("table", title, description, targets)
    panel["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "filterFieldsByName", "options": {"include": {"names": list(columns)}}},
        {"id": "organize", "options": {"indexByName": {n: i for i, n in enumerate(columns)}, "renameByName": columns}},
    ]
    panel["fieldConfig"] = {"defaults": {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}}, "overrides": []}
    panel["options"] = {"cellHeight": "sm", "footer": {"show": False}, "showHeader": True}
    return panel


class Layout:
    """Places panels left to right on Grafana's 24-column grid, row by row."""

    def __init__(self) -> None:
        self.panels: list[JSON] = []
        self._next_id = 1
        self._x = 0
        self._y = 0
        self._line_height = 0

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _newline(self) -> None:
        self._y += self._line_height
        self._x = 0
        self._line_height = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({
            "type": "row",
            "title": title,
            "collapsed": False,
            "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self._y},
            "id": self._new_id(),
            "panels": [],
        })
        self._y += 1

    def add(self, panel: JSON, w: int, h: int) -> None:
        if self._x + w > GRID_WIDTH:
            self._newline()
        panel["gridPos"] = {"h": h, "w": w, "x": self._x, "y": self._y}
        panel["id"] = self._new_id()
        self._x += w
        self._line_height = max(self._line_height, h)
        self.panels.append(panel)


def datasource_variable() -> JSON:
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "type": "datasource",
    }


def query_variable(name: str, label: str, metric: str, selector: str = "") -> JSON:
    """A multi-value variable listing the values of label ``name`` on ``metric`` (``All`` = any value)."""
    series = f"{metric}{{{selector}}}" if selector else metric
    query = f"label_values({series}, {name})"
    return {
        "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": DATASOURCE,
        "definition": query,
        "hide": 0,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "options": [],
        "query": query,
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "type": "query",
    }


def adhoc_variable() -> JSON:
    return {"datasource": DATASOURCE, "filters": [], "hide": 0, "label": "Filters", "name": "filters", "type": "adhoc"}


def dashboard(uid: str, title: str, description: str, layout: Layout, variables: list[JSON]) -> JSON:
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": True,
                "keepTime": True,
                "tags": ["specctl"],
                "targetBlank": False,
                "title": "specctl dashboards",
                "type": "dashboards",
            },
            {
                "asDropdown": True,
                "icon": "external link",
                "includeVars": False,
                "keepTime": True,
                "tags": ["vllm"],
                "targetBlank": False,
                "title": "vLLM dashboards",
                "type": "dashboards",
            },
        ],
        "panels": layout.panels,
        "refresh": "30s",
        "schemaVersion": 39,
        "tags": TAGS,
        "templating": {"list": variables + [adhoc_variable()]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }
