"""Settings of the pure controller logic, one pydantic-settings class per concern.

The service builds them from the environment (``SPECCTL_LEARN_*``, ``SPECCTL_POLICY_*``) and hands the
frozen :class:`BrainConfig` to :class:`specctl_vllm.controller.core.brain.Brain`; the core never reads the environment
itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class LearnerSettings(BaseSettings):
    """How telemetry turns into learned acceptance and cost estimates."""

    model_config = SettingsConfigDict(env_prefix="SPECCTL_LEARN_", frozen=True, extra="ignore")

    half_life_s: float = Field(
        default=120.0, gt=0, le=86_400,
        description="seconds; weight of acceptance evidence halves every half_life_s. 120 s follows a workload "
        "shift within a few minutes while pooling thousands of drafts per category",
    )
    mix_half_life_s: float = Field(
        default=3.0, gt=0, le=3_600,
        description="seconds; half-life of the observed batch size and category mix. Load moves faster than "
        "acceptance, so the batch the policy optimises for must follow within seconds: at 10 s the estimate "
        "still sat at a third of a new load 8 s after it arrived (H200 run, bench/gpu/README.md); an engine "
        "reports hundreds of steps per half-life even so",
    )
    cost_half_life_s: float = Field(
        default=300.0, gt=0, le=86_400,
        description="seconds; half-life of step-timing evidence for the cost model. Hardware does not drift, "
        "but a long memory would let a short hiccup weigh forever",
    )
    prior_mean: float = Field(
        default=0.5, gt=0, lt=1,
        description="probability; Beta prior mean of the conditional acceptance at position 1 (later positions "
        "are shrunk toward the estimate of the position before). 0.5 says 'no idea' symmetrically",
    )
    prior_strength: float = Field(
        default=4.0, gt=0, le=10_000,
        description="pseudo-drafts; weight of the Beta prior. 4 means a handful of real drafts already dominate",
    )
    cost_prior_strength: float = Field(
        default=10.0, gt=0, le=1e7,
        description="pseudo-steps; ridge pull of the learned cost model toward the cold-start preset. "
        "Directions the telemetry does not excite (e.g. batch sizes never seen) stay at the preset; an engine "
        "reports tens of steps per second, so 10 yields to measurements within a second where they exist",
    )
    max_categories_per_model: int = Field(
        default=64, ge=1, le=1024,
        description="categories; beyond this many per model, new names are pooled into the overflow category "
        "(and counted) so a client cannot grow the controller's state without bound",
    )
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1,
        description="probability; coverage of the Wilson intervals shown for conditional acceptance",
    )


class PolicySettings(BaseSettings):
    """How learned estimates turn into per-category k and method."""

    model_config = SettingsConfigDict(env_prefix="SPECCTL_POLICY_", frozen=True, extra="ignore")

    interval_s: float = Field(
        default=2.0, gt=0, le=600,
        description="seconds; decisions are recomputed about this often (cached in between; each engine's "
        "period is a fixed 0.75-1.25x of it, so engines started together do not all recompute at once). "
        "The engine adapts each request every step; the controller only moves the per-category priors",
    )
    ttl_s: float = Field(
        default=30.0, gt=0, le=3600,
        description="seconds; an engine applies a policy at most this long, then falls back to its static "
        "config. 15 report intervals of slack before a dead controller stops steering",
    )
    min_evidence: float = Field(
        default=50.0, ge=0,
        description="drafts (decayed); a method's acceptance must rest on at least this many drafts before the "
        "policy uses it; below it the category keeps the default. 50 drafts put the first position's "
        "acceptance within about +-0.14, enough to tell a drafter rejected at position 0 from one that is "
        "accepted; a GPU engine reports that many within milliseconds, while the CPU engine's n-gram drafts "
        "(only on a match) took minutes to reach 200 and left every category on the static config meanwhile",
    )
    hysteresis: float = Field(
        default=0.03, ge=0, le=1,
        description="relative gain; a category moves off its current decision only when the batch gains more "
        "than this fraction of the category's own goodput. 3 % keeps k from flapping on noise",
    )
    probe_rate: float = Field(
        default=0.05, ge=0, le=0.25,
        description="share of requests; while a category is at k=0 this share still drafts (probe_k) so the "
        "category can recover. Bounded further by probe_budget",
    )
    probe_k: int = Field(default=1, ge=1, le=2, description="draft tokens; proposal length of probing requests")
    probe_budget: float = Field(
        default=0.01, ge=0, le=0.25,
        description="relative goodput; probing is throttled so its estimated cost stays below this share of "
        "the batch goodput",
    )
    probe_idle_budget: float = Field(
        default=0.001, ge=0, le=0.25,
        description="relative goodput; probing budget while even the optimistic bound of the drafter's "
        "acceptance cannot make it pay (a keep-alive so a category whose text changes is noticed within "
        "a few half-lives instead of waiting for its old evidence to fade)",
    )
    adapt_tolerance: float = Field(
        default=0.03, ge=0, le=0.5,
        description="relative goodput; per-request adaptation may move k within the band of k whose batch "
        "goodput is within this share of the optimum, so the fast loop cannot cost more than this",
    )
    cost_preset: str = Field(
        default="cpu",
        description="name; cold-start step-cost model (cpu, h200, mi300x, mi355x) until measured timings "
        "replace it",
    )
    category_floor: float = Field(
        default=0.0, ge=0, le=1,
        description="ratio; no category with requests in the batch may be modelled below this share of its own "
        "plain-decoding goodput (its requests' tokens per second), however much the batch gains: one "
        "category's drafts lengthen the step of every request beside it. 0 (default) = batch goodput decides, "
        "never below plain decoding overall. At 1 one category that gains little keeps every other category "
        "from drafting: measured on the CPU engine at concurrency 8, specctl with floor 1 ran 0.75-0.81x "
        "static k=2/3 (floor 0: 0.97-0.98x), and in the H200 simulator at batch 64 0.91x the oracle "
        "(docs/policy.md, section 3)",
    )
    explore_window_s: float = Field(
        default=10.0, ge=0, le=3600,
        description="seconds; a category with too few drafts of the engine's own drafter runs that drafter "
        "(priced with the pooled profile) when min_evidence drafts take at most this long at its share of "
        "the batch; slower to measure, it relies on probing instead. Model-free drafters need none of this: "
        "they are scored on every request",
    )

    @model_validator(mode="after")
    def _known_preset(self) -> PolicySettings:
        from specctl_vllm.kernel.cost import PRESETS

        if self.cost_preset not in PRESETS:
            raise ValueError(f"cost_preset must be one of {sorted(PRESETS)}")
        return self


class BudgetSettings(BaseSettings):
    """One budget for learned state and the series ``/metrics`` exports, and when idle state is let go."""

    model_config = SettingsConfigDict(env_prefix="SPECCTL_BUDGET_", frozen=True, extra="ignore")

    max_series: int = Field(
        default=50_000, ge=100, le=5_000_000,
        description="series; upper bound on what /metrics exports, counted as engines, models, categories, "
        "methods and positions are created (specctl_vllm.controller.core.learn.budget), a series with long names counting "
        "1 + (label bytes)/100, so /metrics stays under 100 bytes per series (5 MB at the default). Beyond it "
        "new names pool into the overflow category, new methods are dropped and new engines/models are refused "
        "with 429 until idle ones are evicted. Measured full (docs/reliability.md#budget): 50 000 is 17 MB of "
        "controller memory above an empty one and a 2.5 MB scrape written in 0.33 s; 200 000 (before label bytes "
        "were charged) 62 MB and 11 MB in 1.5 s (the render process adds 50-71 MB); the 512 Mi sidecar limit "
        "holds either",
    )
    max_engines: int = Field(
        default=4096, ge=1, le=65_536,
        description="engines known at once (each also counts in max_series); freed when an engine is evicted",
    )
    max_models: int = Field(
        default=64, ge=1, le=4096,
        description="models known at once (each also counts in max_series); freed when a model is evicted",
    )
    engine_idle_s: float = Field(
        default=3_600.0, gt=0, le=30 * 86_400,
        description="seconds; an engine not heard from for this long is forgotten (its id and counters). An "
        "engine posts every 0.1 s; an hour leaves room for long outages and rolling restarts",
    )
    category_idle_s: float = Field(
        default=86_400.0, gt=0, le=365 * 86_400,
        description="seconds; a (model, category) without traffic for this long is forgotten with what was "
        "learned for it. A day keeps a nightly batch workload's categories; its evidence has decayed long before",
    )
    model_idle_s: float = Field(
        default=86_400.0, gt=0, le=365 * 86_400,
        description="seconds; a model without traffic for this long is forgotten (cost model included)",
    )


@dataclass(frozen=True)
class BrainConfig:
    """Everything :class:`~specctl_vllm.controller.core.brain.Brain` needs, frozen (built by the service)."""

    learner: LearnerSettings = field(default_factory=LearnerSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    budget: BudgetSettings = field(default_factory=BudgetSettings)
