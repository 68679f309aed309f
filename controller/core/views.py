"""Read-only views the service serves (categories, engines) and the metrics snapshot for the collector.

All frozen plain data; ``to_dict()`` gives JSON-able dicts (no numpy types, no NaN).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, kw_only=True)
class PositionView:
    position: int  # 1-based
    beta: float  # posterior mean conditional acceptance
    ci_low: float  # Wilson interval of the observed rate (decayed counts)
    ci_high: float
    reached: float  # decayed drafts that reached this position
    accepted: float  # decayed drafts accepted at this position


@dataclass(frozen=True, kw_only=True)
class MethodView:
    method: str
    counterfactual: bool  # evidence mostly scored counterfactually (model-free drafter, not run)
    model_free: bool
    evidence: float
    real_drafts: float  # decayed
    counterfactual_drafts: float  # decayed
    positions: tuple[PositionView, ...]
    mean_acceptance_length: float | None
    acceptance_length_distribution: tuple[float, ...]
    expected_committed: tuple[float, ...]  # E(0..k_max) from the posterior means
    drafts_total: int
    accepted_tokens_total: int
    #: share of asks that drafted (a model-free drafter proposes only on a match; 1 = always), and the
    #: decayed asks behind it; the policy scales E(k) - 1 and the drafted tokens by it
    match_rate: float = 1.0
    asks: float = 0.0


@dataclass(frozen=True, kw_only=True)
class DecisionView:
    k: int
    method: str  # drafter name, 'off', or the pinned method
    source: str  # policy | default | probe | override
    reason: str
    estimated_speedup: float
    expected_committed: float
    adapt_k_min: int
    adapt_k_max: int
    probe_rate: float
    probe_k: int
    best_method: str
    best_method_speedup: float
    batch_size: float
    engine_shape: str  # 'method/k_max' of the engine this decision was computed for
    goodput_table: tuple[dict, ...]  # per k: method, E(k), step ms, batch goodput, speedup vs plain
    override: dict | None
    #: graph-shaped engines: the width the engine's own rule is forecast to pick at the mean mix (``k`` is then
    #: the cap it may run up to; the engine picks each step's width itself); None for per-request engines
    width: int | None = None


@dataclass(frozen=True, kw_only=True)
class CategoryView:
    model: str
    category: str
    primary_method: str | None  # the drafter whose profile the top-level numbers describe
    positions: tuple[PositionView, ...]
    mean_acceptance_length: float | None
    acceptance_length_distribution: tuple[float, ...]
    entropy: dict  # class, bits, mean_acceptance, evidence, thresholds
    requests_per_step: float
    request_steps: int
    committed_tokens: int
    spec_off_request_steps: int
    methods: tuple[MethodView, ...]
    decision: DecisionView | None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class EngineView:
    engine_id: str
    model: str
    boot_id: str
    spec_method: str
    spec_k_max: int
    model_free_methods: tuple[str, ...]
    last_seq: int
    batches: dict  # outcome -> count
    gaps: int
    dropped_steps: int
    steps: int
    step_seconds: float
    last_seen_age_s: float | None
    policy_version_served: int | None
    policy_version_reported: int | None
    policy_age_s: float | None
    batch_size: float | None
    category_mix: dict  # category -> requests per step
    #: batches of another running engine with this id (a retired boot still sending): the id is shared
    id_conflicts: int = 0
    conflict_boot: str | None = None
    last_conflict_age_s: float | None = None
    #: graph-shaped engines: the widths they pick one of per step (empty: per-request k), and steps per width run
    graph_widths: tuple[int, ...] = ()
    width_steps: dict = field(default_factory=dict)  # width (str) -> steps

    def to_dict(self) -> dict:
        return asdict(self)


# --- metrics ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class MethodCounters:
    """Cumulative counters of one (model, category, method); counterfactual rows are scored, not run."""

    model: str
    category: str
    method: str
    counterfactual: bool
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_pos: tuple[int, ...]  # index i = position i (0-based like vLLM's label)
    accepted_length_counts: tuple[int, ...]  # index j = drafts with exactly j accepted


@dataclass(frozen=True, kw_only=True)
class CategoryMetrics:
    model: str
    category: str
    request_steps: int
    committed_tokens: int
    spec_off_request_steps: int
    accepted_length_counts: tuple[int, ...]  # real drafts of all methods, index j = exactly j accepted
    accepted_tokens: int  # sum for the histogram's _sum
    current_k: int | None
    method: str | None
    source: str | None
    entropy_class: str
    entropy_bits: float | None
    mean_acceptance_length: float | None
    conditional_acceptance: tuple[float, ...]  # posterior mean, index i = position i (0-based)
    estimated_speedup: float | None
    best_method: str | None


@dataclass(frozen=True, kw_only=True)
class EngineMetrics:
    engine: str
    model: str
    batches: dict  # accepted | duplicate | rejected -> count
    gaps: int
    dropped_steps: int
    policy_age_s: float | None
    steps: int
    step_seconds: float
    id_conflicts: int = 0
    #: graph-shaped engines: (width, steps that ran it), ascending
    width_steps: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, kw_only=True)
class MetricsSnapshot:
    methods: tuple[MethodCounters, ...]
    categories: tuple[CategoryMetrics, ...]
    engines: tuple[EngineMetrics, ...]
    draft_cost_ratio: tuple[tuple[str, str, float], ...]  # (model, method, ratio)
    overrides: tuple[tuple[str, str], ...]  # (category, kind) with kind off | k | method
    overflow_steps: tuple[tuple[str, int], ...]  # (model, category-steps pooled into the overflow category)
    rejected_unknown_engine: int  # rejected batches whose engine id could not be read
    #: (model, category, method, match rate) of model-free drafters with asks: the share that drafted
    match_rates: tuple[tuple[str, str, str, float], ...] = ()
    #: (model, decisions or reads that could not be computed: the last good decision was served instead)
    decision_errors: tuple[tuple[str, int], ...] = ()
    series: int = 0  # series the learned state is charged (specctl_vllm.controller.core.learn.budget)
    series_budget: int = 0
    evictions: int = 0  # engines, models and categories forgotten (idle or by an operator)
    budget_refusals: int = 0  # batches refused because the budget or an engine/model cap was full

    def to_dict(self) -> dict:
        return asdict(self)
