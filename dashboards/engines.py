"""specctl / Engines: vLLM's own speculative-decoding counters next to specctl's per-category sums, and
draft-operator efficiency.

The agreement row is the trust anchor of every other specctl panel: the engine patch reports the same
drafts vLLM verifies, split by category, so per model the sum over categories must equal vLLM's
engine-wide counters. A persistent difference means lost telemetry (see the Controller dashboard) or an
engine that runs without the patch.
"""

from __future__ import annotations

from dashboards import metrics as m
from dashboards.panels import (
    JSON,
    TOKENS_PER_S,
    Layout,
    dashboard,
    stat,
    table,
    target,
    thresholds,
    timeseries,
)
from dashboards.promql import MODEL, MODEL_ENGINE, RANGE, Promql, divide
from dashboards.scope import variables

UID = "specctl-engines"

#: Draft cost ratio at which the alert SpecctlDraftCostHigh fires regardless of history (kept equal to the
#: rule): drafting one token then costs a whole plain decode step, so no k can pay off.
DRAFT_COST_ALERT = 1.0
DRAFT_COST = thresholds(("green", None), ("orange", DRAFT_COST_ALERT / 2), ("red", DRAFT_COST_ALERT))
#: |specctl − vLLM| / vLLM over the time range.
DISAGREEMENT = thresholds(("green", None), ("orange", 0.01), ("red", 0.05))

model = Promql(MODEL)
engine = Promql(MODEL_ENGINE)

#: (title, vLLM counter, specctl counter, what it counts)
PAIRS = [
    ("Draft tokens / s", m.VLLM_DRAFT_TOKENS, m.DRAFT_TOKENS, "draft tokens verified"),
    ("Accepted tokens / s", m.VLLM_ACCEPTED, m.ACCEPTED, "draft tokens accepted"),
    ("Drafts / s", m.VLLM_DRAFTS, m.DRAFTS, "verified drafts (requests with ≥ 1 draft token, per step)"),
]


def disagreement(vllm_counter: str, specctl_counter: str, window: str = RANGE) -> str:
    """|specctl − vLLM| / vLLM per model over ``window``; no point where vLLM counted nothing."""
    ours = model.sum_increase(specctl_counter, by="model_name", window=window)
    theirs = model.sum_increase(vllm_counter, by="model_name", window=window)
    return divide(f"abs({ours} - {theirs})", theirs)


def _summary(layout: Layout) -> None:
    for title, vllm_counter, specctl_counter, what in PAIRS[:2]:
        layout.add(
            stat(
                f"{title.split(' /')[0]}: disagreement",
                f"Largest |specctl − vLLM| / vLLM over the time range, across models, for {what}. Expect 0; "
                "a small value at the range edges comes from the two scrapes not being simultaneous.\n\n"
                f"Metrics: `{vllm_counter}`, `{specctl_counter}`",
                f"max({disagreement(vllm_counter, specctl_counter)})",
                unit="percentunit",
                steps=DISAGREEMENT,
                decimals=2,
            ),
            6,
            4,
        )
    layout.add(
        stat(
            "Highest draft cost ratio",
            "Largest draft cost ratio across methods: seconds to draft one token over one plain decode step "
            "(see the Draft-operator row).\n\n"
            f"Metric: `{m.DRAFT_COST_RATIO}`",
            model.agg("max", m.DRAFT_COST_RATIO),
            unit="percentunit",
            steps=DRAFT_COST,
        ),
        6,
        4,
    )
    layout.add(
        stat(
            "Mean engine step",
            "Mean wall time of an engine step over the selected engines (schedule() to "
            "update_from_output()).\n\n"
            f"Metrics: `{m.STEP_SECONDS}`, `{m.STEPS}`",
            engine.ratio(m.STEP_SECONDS, m.STEPS),
            unit="s",
        ),
        6,
        4,
    )


def _agreement(layout: Layout) -> None:
    layout.row("vLLM counters vs specctl per-category sum (must agree)")
    for title, vllm_counter, specctl_counter, what in PAIRS:
        layout.add(
            timeseries(
                title,
                f"vLLM's engine-wide rate of {what} next to the sum of specctl's per-category counter, per "
                "model. The two lines should lie on top of each other.\n\n"
                f"Metrics: `{vllm_counter}`, `{specctl_counter}`",
                [
                    target(model.sum_rate(vllm_counter, by="model_name"), "vLLM · {{model_name}}"),
                    target(model.sum_rate(specctl_counter, by="model_name"), "specctl Σ categories · {{model_name}}"),
                ],
                unit=TOKENS_PER_S if "tokens" in title else "short",
            ),
            8,
            8,
        )
    layout.add(
        timeseries(
            "Accepted tokens / s by draft position",
            "Per position: vLLM's counter next to specctl's sum over categories and methods.\n\n"
            f"Metrics: `{m.VLLM_ACCEPTED_PER_POS}`, `{m.ACCEPTED_PER_POS}`",
            [
                target(model.sum_rate(m.VLLM_ACCEPTED_PER_POS, by="model_name, position"),
                       "vLLM · {{model_name}} · pos {{position}}"),
                target(model.sum_rate(m.ACCEPTED_PER_POS, by="model_name, position"),
                       "specctl · {{model_name}} · pos {{position}}"),
            ],
            unit=TOKENS_PER_S,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Draft tokens / s by category",
            "specctl's per-category split of the engine-wide draft tokens: which categories the verify "
            f"compute goes to.\n\nMetric: `{m.DRAFT_TOKENS}`",
            [target(model.sum_rate(m.DRAFT_TOKENS, by="category"), "{{category}}")],
            unit=TOKENS_PER_S,
            stack=True,
        ),
        12,
        8,
    )


def _efficiency(layout: Layout) -> None:
    layout.row("Draft-operator efficiency")
    layout.add(
        timeseries(
            "Draft cost / verify cost per method",
            "Seconds to draft one token for one request with the method, over one plain decode step of the "
            "target, from the controller's learned step-cost model. Model-free drafters (ngram, suffix) sit "
            "near 0; a draft model or EAGLE head above its usual level points at a slow draft kernel path on "
            f"this hardware. At {DRAFT_COST_ALERT:g} (red line) a drafted token costs a whole decode step and "
            "speculation with this method cannot pay off.\n\n"
            f"Metric: `{m.DRAFT_COST_RATIO}`",
            [target(model.agg("max", m.DRAFT_COST_RATIO, by="model_name, method"), "{{model_name}} · {{method}}")],
            unit="percentunit",
            threshold_line=DRAFT_COST,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Mean step time per engine",
            "Wall time per engine step on each engine: the denominator of goodput. An engine much slower "
            "than its peers drags the pooled cost model.\n\n"
            f"Metrics: `{m.STEP_SECONDS}`, `{m.STEPS}`",
            [target(engine.ratio(m.STEP_SECONDS, m.STEPS, by="engine"), "{{engine}}")],
            unit="s",
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Proposal width run, share of steps (graph-shaped engines)",
            "Share of each engine's steps per proposal width it verified (0: plain decoding). A graph-shaped "
            "engine picks one width per step with the width rule; a drafting width runs only while the engine "
            "measured it committing more than plain decoding in the same batch bucket (docs/policy.md, *The "
            "measured check*). Short bursts at another width are probes and exploration. On low-acceptance "
            "traffic under load expect width 0; a drafting width there that stays is the place to look.\n\n"
            f"Metric: `{m.WIDTH_STEPS}`",
            [target(divide(engine.sum_rate(m.WIDTH_STEPS, by="engine, width"),
                           engine.sum_rate(m.WIDTH_STEPS, by="engine"), "on (engine) group_left ()"),
                    "{{engine}} · K={{width}}")],
            unit="percentunit",
            max_value=1,
            stack=True,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Engine steps / s per engine",
            f"Steps each engine reported to the controller.\n\nMetric: `{m.STEPS}`",
            [target(engine.sum_rate(m.STEPS, by="engine"), "{{engine}}")],
        ),
        12,
        8,
    )
    real = model.ratio(m.ACCEPTED, m.DRAFT_TOKENS, by="category, method")
    scored = model.ratio(m.COUNTERFACTUAL_ACCEPTED, m.COUNTERFACTUAL_DRAFT_TOKENS, by="category, method")
    layout.add(
        timeseries(
            "Acceptance of run and scored drafters",
            "Per category: acceptance of the drafter the engine runs, next to model-free drafters the engine "
            "patch scores on the target's own tokens without running them (a small, bounded share of steps). "
            "A scored drafter well above the running one is what *Best method per category* acts on.\n\n"
            f"Metrics: `{m.ACCEPTED}`, `{m.DRAFT_TOKENS}`, `{m.COUNTERFACTUAL_ACCEPTED}`, "
            f"`{m.COUNTERFACTUAL_DRAFT_TOKENS}`",
            [target(real, "run · {{category}} · {{method}}"), target(scored, "scored · {{category}} · {{method}}")],
            unit="percentunit",
            max_value=1,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Scored drafts / s",
            "How much counterfactual scoring the engines do per category and method (drafts scored per "
            "second): the evidence behind the scored acceptance.\n\n"
            f"Metric: `{m.COUNTERFACTUAL_DRAFTS}`",
            [target(model.sum_rate(m.COUNTERFACTUAL_DRAFTS, by="category, method"), "{{category}} · {{method}}")],
        ),
        12,
        8,
    )
    layout.add(
        table(
            "Best method per category",
            "The draft method with the highest estimated goodput per category, including model-free "
            "drafters scored on the target's own tokens.\n\n"
            f"Metric: `{m.BEST_METHOD}`",
            [target(model.sel(m.BEST_METHOD), instant=True, fmt="table")],
            {"model_name": "Model", "category": "Category", "method": "Best method"},
        ),
        12,
        8,
    )


def build() -> JSON:
    layout = Layout()
    _summary(layout)
    _agreement(layout)
    _efficiency(layout)
    return dashboard(
        UID,
        "specctl / Engines",
        "vLLM's own spec_decode counters next to specctl's per-category sums (they must agree), and "
        "draft-operator efficiency per method and engine.",
        layout,
        variables(),
    )
