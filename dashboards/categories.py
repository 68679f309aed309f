"""specctl / Categories: what each request category gets from speculation, and what the controller decided.

Measured values come from counters (rates over ``$__rate_interval``); the controller's learned estimates
(exponentially forgotten) come from gauges. Showing both side by side is deliberate: a learned estimate
that drifts away from the measured rate means the forgetting half-life is too long for the workload.
"""

from __future__ import annotations

from dashboards import metrics as m
from dashboards.panels import (
    JSON,
    SPEEDUP,
    TOKENS_PER_S,
    Layout,
    dashboard,
    heatmap,
    stat,
    table,
    target,
    timeseries,
)
from dashboards.promql import CATEGORY, OVERRIDE, RANGE, Promql, divide
from dashboards.scope import variables

UID = "specctl-categories"

q = Promql(CATEGORY)
ov = Promql(OVERRIDE)


def accepted_per_draft(by: str = "") -> str:
    """Accepted draft tokens per verified draft (0 … k). The mean acceptance length is 1 + this."""
    return q.ratio(m.ACCEPTED, m.DRAFTS, by=by)


def mean_acceptance_length(by: str = "") -> str:
    """Mean acceptance length, vLLM's definition (it counts the bonus token): 1 + accepted per draft (1 … k+1),
    the same quantity as ``specctl_mean_acceptance_length`` and ``specctl status`` "mean acc len"."""
    return f"1 + {accepted_per_draft(by)}"


def _summary(layout: Layout) -> None:
    tiles = [
        stat(
            "Goodput",
            "Committed tokens per second over the selected categories (accepted drafts + one token per "
            f"request step).\n\nMetric: `{m.COMMITTED}`",
            q.sum_rate(m.COMMITTED),
            unit=TOKENS_PER_S,
        ),
        stat(
            "Draft acceptance rate",
            f"Share of verified draft tokens accepted.\n\nMetrics: `{m.ACCEPTED}`, `{m.DRAFT_TOKENS}`",
            q.ratio(m.ACCEPTED, m.DRAFT_TOKENS),
            unit="percentunit",
        ),
        stat(
            "Accepted tokens per draft",
            "Accepted draft tokens per verified draft over the selected categories (0 … k). The mean "
            f"acceptance length (vLLM's definition) is 1 + this.\n\nMetrics: `{m.ACCEPTED}`, `{m.DRAFTS}`",
            accepted_per_draft(),
            unit="short",
            decimals=2,
        ),
        stat(
            "Share of request-steps without drafts",
            "Request-steps run with k = 0 (policy, override or engine fallback) over all request-steps.\n\n"
            f"Metrics: `{m.SPEC_OFF_STEPS}`, `{m.REQUEST_STEPS}`",
            q.ratio(m.SPEC_OFF_STEPS, m.REQUEST_STEPS),
            unit="percentunit",
        ),
        stat(
            "Lowest estimated speedup",
            "The controller's estimated goodput ratio against plain decoding, for the worst selected "
            "category. Below 1 means speculation is costing throughput there; the controller should move "
            f"that category to k = 0 on its own (alert SpecctlSpeculationSlowerThanPlain).\n\n"
            f"Metric: `{m.ESTIMATED_SPEEDUP}`",
            q.agg("min", m.ESTIMATED_SPEEDUP),
            unit="x",
            steps=SPEEDUP,
            decimals=2,
        ),
        stat(
            "Active overrides",
            "Operator overrides in force (pinned k, pinned method, or speculation off). They beat the "
            f"policy until cleared or expired.\n\nMetric: `{m.OVERRIDE_ACTIVE}`",
            ov.agg("sum", m.OVERRIDE_ACTIVE),
            unit="none",
        ),
    ]
    for tile in tiles:
        layout.add(tile, 4, 4)


def _acceptance(layout: Layout) -> None:
    layout.row("Accepted tokens per draft, distribution per category")
    layout.add(
        heatmap(
            "Accepted tokens per draft: $category",
            "How many draft tokens were accepted per verified draft (0 … k; acceptance length = 1 + this), "
            "over time, for one category "
            "(the panel repeats per selected category). Mass at 0 means drafts are wasted; mass at k means "
            "the category would accept longer drafts.\n\n"
            f"Metric: `{m.ACCEPTED_PER_DRAFT}_bucket`",
            q.sum_rate(f"{m.ACCEPTED_PER_DRAFT}_bucket", by="le"),
            repeat="category",
        ),
        8,
        8,
    )

    layout.row("Acceptance")
    per_pos = divide(
        q.sum_rate(m.ACCEPTED_PER_POS, by="category, method, position"),
        q.sum_rate(m.DRAFTS, by="category, method"),
        "on (category, method) group_left ()",
    )
    panels = [
        timeseries(
            "Acceptance by draft position (measured)",
            "Share of drafts whose token at each position was accepted (unconditional: a token counts only "
            "if all earlier ones were accepted too), per category and method.\n\n"
            f"Metrics: `{m.ACCEPTED_PER_POS}`, `{m.DRAFTS}`",
            [target(per_pos, "{{category}} · {{method}} · pos {{position}}")],
            unit="percentunit",
            max_value=1,
        ),
        timeseries(
            "Conditional acceptance by position (learned)",
            "The controller's forgetting estimate of P(token i accepted | tokens before i accepted), the "
            "β_i in E(k) = 1 + Σ Π β_j that the policy maximises.\n\n"
            f"Metric: `{m.CONDITIONAL_ACCEPTANCE}`",
            [target(q.agg("max", m.CONDITIONAL_ACCEPTANCE, by="category, position"),
                    "{{category}} · pos {{position}}")],
            unit="percentunit",
            max_value=1,
        ),
        timeseries(
            "Mean acceptance length",
            "Mean acceptance length, vLLM's definition: 1 + accepted draft tokens per verified draft (1 … k+1). "
            "Measured: from the counters, per category and method. Learned: the controller's forgetting "
            "estimate for the category (`specctl status`, column \"mean acc len\").\n\n"
            f"Metrics: `{m.ACCEPTED}`, `{m.DRAFTS}`, `{m.MEAN_ACCEPTANCE_LENGTH}`",
            [
                target(mean_acceptance_length("category, method"), "measured · {{category}} · {{method}}"),
                target(q.agg("max", m.MEAN_ACCEPTANCE_LENGTH, by="category"), "learned · {{category}}"),
            ],
            decimals=2,
        ),
        timeseries(
            "Draft acceptance rate",
            "Accepted / verified draft tokens per category and method.\n\n"
            f"Metrics: `{m.ACCEPTED}`, `{m.DRAFT_TOKENS}`",
            [target(q.ratio(m.ACCEPTED, m.DRAFT_TOKENS, by="category, method"), "{{category}} · {{method}}")],
            unit="percentunit",
            max_value=1,
        ),
        timeseries(
            "Match rate of model-free drafters",
            "Share of the request steps asked to draft (or counterfactual tries) on which an n-gram or suffix "
            "drafter found a match and proposed anything. The acceptance panels describe the drafts that "
            "happened; the policy prices a drafter at 1 + match rate x (E(k) - 1) tokens per step, so a "
            "category whose text rarely repeats gets little from a drafter with high acceptance.\n\n"
            f"Metric: `{m.MATCH_RATE}`",
            [target(q.agg("max", m.MATCH_RATE, by="category, method"), "{{category}} · {{method}}")],
            unit="percentunit",
            max_value=1,
        ),
    ]
    for panel in panels:
        layout.add(panel, 12, 9)


def _decisions(layout: Layout) -> None:
    layout.row("Decisions")
    layout.add(
        timeseries(
            "Proposal length k",
            "The k the controller sends per category (0 = speculation off). Overrides show here too.\n\n"
            f"Metric: `{m.CURRENT_K}`",
            [target(q.agg("max", m.CURRENT_K, by="category"), "{{category}}")],
            steps=True,
            decimals=0,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Estimated speedup vs plain decoding",
            "E(k) / cost(k) relative to k = 0 per category, from the learned acceptance and the step-cost "
            "model. The dashed line is 1: below it speculation is slower than plain decoding.\n\n"
            f"Metric: `{m.ESTIMATED_SPEEDUP}`",
            [target(q.agg("min", m.ESTIMATED_SPEEDUP, by="category"), "{{category}}")],
            unit="x",
            threshold_line=SPEEDUP,
            decimals=2,
        ),
        12,
        8,
    )
    layout.add(
        table(
            "Current method",
            "Draft method per category and where the decision came from (policy, override, probe, default)."
            f"\n\nMetric: `{m.CURRENT_METHOD}`",
            [target(q.sel(m.CURRENT_METHOD), instant=True, fmt="table")],
            {"model_name": "Model", "category": "Category", "method": "Method", "source": "Source"},
        ),
        8,
        8,
    )
    layout.add(
        table(
            "Entropy class",
            "The category's entropy class (low / medium / high) derived from its acceptance profile, and "
            "the entropy in bits behind it.\n\n"
            f"Metrics: `{m.ENTROPY_CLASS}`, `{m.ENTROPY_BITS}`",
            [
                target(q.sel(m.ENTROPY_CLASS), instant=True, fmt="table"),
                target(q.agg("max", m.ENTROPY_BITS, by="model_name, category"), instant=True, fmt="table"),
            ],
            {"model_name": "Model", "category": "Category", "entropy_class": "Class", "Value #B": "Entropy (bits)"},
        ),
        8,
        8,
    )
    layout.add(
        table(
            "Overrides in force",
            "Active operator overrides per category and kind (k, method, off). Clear with "
            f"`specctl override clear CATEGORY`.\n\nMetric: `{m.OVERRIDE_ACTIVE}`",
            [target(f"{ov.sel(m.OVERRIDE_ACTIVE)} > 0", instant=True, fmt="table")],
            {"category": "Category", "kind": "Kind"},
        ),
        8,
        8,
    )


def _goodput(layout: Layout) -> None:
    layout.row("Goodput")
    steps_off = q.ratio(m.SPEC_OFF_STEPS, m.REQUEST_STEPS, by="category")
    panels = [
        timeseries(
            "Committed tokens / s per category",
            "Goodput: tokens that end up in outputs, per category. This is what the policy maximises.\n\n"
            f"Metric: `{m.COMMITTED}`",
            [target(q.sum_rate(m.COMMITTED, by="category"), "{{category}}")],
            unit=TOKENS_PER_S,
            stack=True,
        ),
        timeseries(
            "Committed tokens per request-step",
            "Tokens a request commits per engine step it is scheduled in: 1 without speculation, up to "
            "k + 1 with it. The direct per-category payoff of speculation.\n\n"
            f"Metrics: `{m.COMMITTED}`, `{m.REQUEST_STEPS}`",
            [target(q.ratio(m.COMMITTED, m.REQUEST_STEPS, by="category"), "{{category}}")],
            decimals=2,
        ),
        timeseries(
            "Share of request-steps without drafts",
            "Per category, request-steps run with k = 0 over all its request-steps.\n\n"
            f"Metrics: `{m.SPEC_OFF_STEPS}`, `{m.REQUEST_STEPS}`",
            [target(steps_off, "{{category}}")],
            unit="percentunit",
            max_value=1,
        ),
        table(
            "Time with speculation off",
            "Share of the dashboard's time range during which the controller's k for the category was 0.\n\n"
            f"Metric: `{m.CURRENT_K}`",
            [target(f"avg by (category) (avg_over_time(({q.sel(m.CURRENT_K)} == bool 0)[{RANGE}:]))",
                    instant=True, fmt="table")],
            {"category": "Category", "Value": "Time off"},
        ),
    ]
    for panel in panels:
        layout.add(panel, 12, 8)
    # The table's single value column is a share of time.
    layout.panels[-1]["fieldConfig"]["defaults"]["unit"] = "percentunit"


def build() -> JSON:
    layout = Layout()
    _summary(layout)
    _acceptance(layout)
    _decisions(layout)
    _goodput(layout)
    return dashboard(
        UID,
        "specctl / Categories",
        "Per request category: acceptance-length distribution, acceptance by position, the k and method "
        "the controller chose and why (entropy class, estimated speedup, overrides), and goodput.",
        layout,
        variables(),
    )

