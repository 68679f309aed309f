"""specctl / Controller: is telemetry arriving complete, and are engines getting fresh policies?

When anything here is red, the per-category dashboards are built on partial data: fix ingest first.
"""

from __future__ import annotations

from dashboards import metrics as m
from dashboards.panels import (
    ANY_IS_BAD,
    JSON,
    POLICY_AGE,
    Layout,
    dashboard,
    stat,
    target,
    thresholds,
    timeseries,
)
from dashboards.promql import ENGINE, MODEL, RANGE, RATE, Promql
from dashboards.scope import variables

UID = "specctl-controller"

#: Snapshots are written every 30 s by default: two missed ones are worth a look, five an alert.
SNAPSHOT_AGE = thresholds(("green", None), ("orange", 60), ("red", 150))

e = Promql(ENGINE)

ACCEPTED = 'outcome="accepted"'
DUPLICATE = 'outcome="duplicate"'
REJECTED = 'outcome="rejected"'


def _summary(layout: Layout) -> None:
    tiles = [
        stat(
            "Batches accepted / s",
            "Telemetry batches the controller accepted per second, over the selected engines. Each engine "
            f"posts about 10 per second (SPECCTL_REPORT_INTERVAL_S = 0.1).\n\nMetric: `{m.TELEMETRY_BATCHES}`",
            e.sum_rate(m.TELEMETRY_BATCHES, ACCEPTED),
            unit="reqps",
        ),
        stat(
            "Duplicates in range",
            "Batches received again after a retry: acknowledged, not counted twice. A few after network "
            f"blips are normal.\n\nMetric: `{m.TELEMETRY_BATCHES}`",
            e.sum_increase(m.TELEMETRY_BATCHES, DUPLICATE),
            unit="none",
            decimals=0,
        ),
        stat(
            "Rejected in range",
            "Batches refused as malformed (400) or invalid (422). Should be 0: the answer and the "
            "controller's JSON log carry the reason. Token failures (401/403) are refused before the body is "
            "read and show as a stale policy instead.\n\n"
            f"Metric: `{m.TELEMETRY_BATCHES}`",
            e.sum_increase(m.TELEMETRY_BATCHES, REJECTED),
            unit="none",
            steps=ANY_IS_BAD,
            decimals=0,
        ),
        stat(
            "Gaps in range",
            "Batches missing from an engine's sequence (never arrived). Their steps are lost to the "
            f"controller, so specctl's sums fall below vLLM's.\n\nMetric: `{m.TELEMETRY_GAPS}`",
            e.sum_increase(m.TELEMETRY_GAPS),
            unit="none",
            steps=ANY_IS_BAD,
            decimals=0,
        ),
        stat(
            "Steps dropped by engines",
            "Step records an engine dropped from its bounded queue because its reporter fell behind "
            f"(controller slow or down).\n\nMetric: `{m.DROPPED_STEPS}`",
            e.sum_increase(m.DROPPED_STEPS),
            unit="none",
            steps=ANY_IS_BAD,
            decimals=0,
        ),
        stat(
            "Oldest policy",
            "Seconds since the engine that heard from the controller least recently got a policy. Past the "
            f"policy's TTL that engine runs its static speculative config.\n\nMetric: `{m.POLICY_AGE}`",
            e.agg("max", m.POLICY_AGE),
            unit="s",
            steps=POLICY_AGE,
        ),
    ]
    for tile in tiles:
        layout.add(tile, 4, 4)


def _ingest(layout: Layout) -> None:
    layout.row("Ingest")
    panels = [
        timeseries(
            "Batches / s by outcome",
            f"Telemetry batches per second: accepted, duplicate, rejected.\n\nMetric: `{m.TELEMETRY_BATCHES}`",
            [target(e.sum_rate(m.TELEMETRY_BATCHES, by="outcome"), "{{outcome}}")],
            unit="reqps",
            stack=True,
        ),
        timeseries(
            "Accepted batches / s per engine",
            "Per engine. An engine whose line drops to 0 while vLLM still serves cannot reach the "
            f"controller.\n\nMetric: `{m.TELEMETRY_BATCHES}`",
            [target(e.sum_rate(m.TELEMETRY_BATCHES, ACCEPTED, by="engine"), "{{engine}}")],
            unit="reqps",
        ),
        timeseries(
            "Duplicates and rejected / s per engine",
            f"Retried and refused batches per engine.\n\nMetric: `{m.TELEMETRY_BATCHES}`",
            [
                target(e.sum_rate(m.TELEMETRY_BATCHES, DUPLICATE, by="engine"), "duplicate · {{engine}}"),
                target(e.sum_rate(m.TELEMETRY_BATCHES, REJECTED, by="engine"), "rejected · {{engine}}"),
            ],
            unit="reqps",
        ),
        timeseries(
            "Gaps and dropped steps per engine",
            "Missing batches (gaps, counted by the controller from sequence numbers) and step records the "
            f"engine dropped itself, per second.\n\nMetrics: `{m.TELEMETRY_GAPS}`, `{m.DROPPED_STEPS}`",
            [
                target(e.sum_rate(m.TELEMETRY_GAPS, by="engine"), "gaps · {{engine}}"),
                target(e.sum_rate(m.DROPPED_STEPS, by="engine"), "dropped steps · {{engine}}"),
            ],
        ),
    ]
    for panel in panels:
        layout.add(panel, 12, 8)


def _service(layout: Layout) -> None:
    layout.row("Controller process")
    panels = [
        stat(
            "Internal errors in range",
            "Requests the controller answered with a 500: each is a bug, logged with an id. Bad input is "
            f"answered with a 4xx and counted as rejected instead.\n\nMetric: `{m.HTTP_INTERNAL_ERRORS}`",
            f"sum(increase({m.HTTP_INTERNAL_ERRORS}[{RANGE}]))",
            unit="none",
            steps=ANY_IS_BAD,
            decimals=0,
        ),
        stat(
            "Learned-state snapshot age",
            "Seconds since the learned per-category state was last written to SQLite (every 30 s by "
            "default): what a crash would make the controller relearn. Growing without bound means the "
            f"disk refuses writes (alert SpecctlStateNotPersisted).\n\nMetric: `{m.SNAPSHOT_AGE}`",
            f"max({m.SNAPSHOT_AGE})",
            unit="s",
            steps=SNAPSHOT_AGE,
        ),
        stat(
            "Decision errors in range",
            "Decisions of a model that could not be computed: the last good decision (else the engine's static "
            "config) was served and telemetry still acknowledged; each is logged with its reason."
            f"\n\nMetric: `{m.DECISION_ERRORS}`",
            f"sum(increase({m.DECISION_ERRORS}[{RANGE}]))",
            unit="none",
            steps=ANY_IS_BAD,
            decimals=0,
        ),
        stat(
            "Shared engine ids in range",
            "Batches refused (409) because a second running engine uses the same engine id (alert "
            f"SpecctlEngineIdShared).\n\nMetric: `{m.ENGINE_ID_CONFLICTS}`",
            f"sum(increase({m.ENGINE_ID_CONFLICTS}[{RANGE}]))",
            unit="none",
            steps=ANY_IS_BAD,
            decimals=0,
        ),
    ]
    for panel in panels:
        layout.add(panel, 6, 6)
    layout.add(
        timeseries(
            "Learned-state budget",
            "Series the learned state is charged (an upper bound on what /metrics exports) against the budget "
            "SPECCTL_BUDGET_MAX_SERIES, forgotten engines/models/categories and batches refused because the "
            f"budget was full, per second.\n\nMetrics: `{m.SERIES}`, `{m.SERIES_BUDGET}`, `{m.EVICTIONS}`, "
            f"`{m.BUDGET_REFUSALS}`",
            [
                target(f"max({m.SERIES})", "series charged"),
                target(f"max({m.SERIES_BUDGET})", "budget"),
                target(f"sum(rate({m.EVICTIONS}[{RATE}]))", "forgotten / s"),
                target(f"sum(rate({m.BUDGET_REFUSALS}[{RATE}]))", "refused / s"),
            ],
        ),
        12,
        6,
    )
    layout.add(
        timeseries(
            "Category-steps pooled into the overflow category",
            "Per model, category-steps whose category name arrived after the model's category cap was "
            "reached, pooled into one overflow category. Non-zero means clients invent category names: "
            f"they share one learned profile.\n\nMetric: `{m.OVERFLOW_STEPS}`",
            [target(f"sum by (model_name) (rate({m.OVERFLOW_STEPS}{{{MODEL}}}[{RATE}]))", "{{model_name}}")],
        ),
        12,
        6,
    )


def _policy(layout: Layout) -> None:
    layout.row("Policy delivery")
    layout.add(
        timeseries(
            "Policy age per engine",
            "Seconds since each engine last received a policy (in the answer to its telemetry POST). It "
            "stays near the report interval while the loop is healthy; the dashed lines are 10 s and 30 s "
            f"(alert SpecctlPolicyStale).\n\nMetric: `{m.POLICY_AGE}`",
            [target(e.agg("max", m.POLICY_AGE, by="engine"), "{{engine}}")],
            unit="s",
            threshold_line=POLICY_AGE,
        ),
        24,
        8,
    )


def build() -> JSON:
    layout = Layout()
    _summary(layout)
    _ingest(layout)
    _policy(layout)
    _service(layout)
    return dashboard(
        UID,
        "specctl / Controller",
        "Controller health: telemetry ingest by outcome, duplicates, gaps, rejected batches, steps dropped "
        "by engines, policy age per engine, and the controller process itself.",
        layout,
        variables(),
    )
