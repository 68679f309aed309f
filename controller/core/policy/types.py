"""Plain data a policy reads (:class:`PolicySnapshot`) and returns (:class:`Decision`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.protocol import METHOD_OFF


@dataclass(frozen=True)
class MethodProfile:
    """What is known about one drafter for one category."""

    method: str  # drafter name as the engine reports it (eagle3, draft_model, ngram, suffix, ...)
    betas: tuple[float, ...]  # posterior mean conditional acceptance, positions 1..k_max
    evidence: float  # decayed drafts that reached position 1
    counterfactual: bool  # evidence mostly scored counterfactually (model-free drafter not run)
    model_free: bool
    drafts_total: float = 0.0  # drafts ever seen (not decayed): eligibility survives a drafter not being run
    #: share of request steps that draft (a model-free drafter proposes only on a match; 1 for model drafters)
    match_rate: float = 1.0

    @property
    def eligible_evidence(self) -> float:
        return max(self.evidence, self.drafts_total)


@dataclass(frozen=True)
class Choice:
    k: int
    method: str  # drafter name, or 'off' when k == 0

    @staticmethod
    def off() -> Choice:
        return Choice(0, METHOD_OFF)


@dataclass(frozen=True)
class CategoryInput:
    name: str
    share: float  # mean requests of this category per step
    profiles: tuple[MethodProfile, ...]
    previous: Choice | None = None
    committed: float = 0.0  # mean committed tokens of this category per step (0: unknown, taken as ``share``)


@dataclass(frozen=True)
class PolicySnapshot:
    categories: tuple[CategoryInput, ...]
    pooled: tuple[MethodProfile, ...]  # all categories of the model pooled: the default
    batch_size: float  # mean requests per step the engine runs at
    extra_tokens: float  # mean scheduled tokens per step beyond one per request and the drafts (prefill)
    cost: CostCoefficients
    k_max: int  # the asking engine's num_speculative_tokens
    engine_method: str  # drafter the engine was started with ('off' if none)
    methods: tuple[str, ...]  # drafters this engine can run (its own + model-free ones it computes)
    previous_default: Choice | None = None
    #: observed prefill tokens per step as (value, weight) points; empty: ``extra_tokens`` every step
    extra_tokens_dist: tuple[tuple[float, float], ...] = ()
    #: observed prefill tokens per committed token (> 0: prefill scales with goodput, as in a saturated
    #: engine where every finished request is replaced; 0: ``extra_tokens`` per step whatever the policy)
    extra_per_committed: float = 0.0
    #: per drafting depth 0..k_max, measured over modelled step time at this batch size (empty: all 1);
    #: carries what the linear cost model cannot (CUDA graph modes, a drafter's catch-up pass at depth 0)
    depth_factor: tuple[float, ...] = ()
    #: measured step-time ratio of a decode step whose requests draft different k over a uniform one, at this
    #: batch size (1: no difference, as on a CPU; > 1 on engines that replay full CUDA graphs)
    mixed_penalty: float = 1.0
    #: probability; conditional acceptance a drafter is priced at before any evidence (the learner's Beta prior
    #: mean): what the cold-start default is chosen for
    prior_acceptance: float = 0.5


@dataclass(frozen=True, kw_only=True)
class KRow:
    """Goodput if this category ran at ``k`` (best usable method for that k), the rest of the batch fixed."""

    k: int
    method: str
    expected_committed: float  # E(k), tokens per request step
    step_ms: float
    goodput: float  # committed tokens per second for the whole batch
    speedup: float  # batch goodput over plain decoding


@dataclass(frozen=True, kw_only=True)
class CategoryDecision:
    name: str
    k: int
    method: str  # drafter name or 'off'
    source: str  # policy | default | probe
    reason: str
    expected_committed: float
    speedup: float  # this category's committed tokens/s per request, over plain decoding
    adapt_k_min: int
    adapt_k_max: int
    probe_rate: float = 0.0
    probe_k: int = 0
    probe_method: str = METHOD_OFF
    best_method: str = METHOD_OFF  # drafter that would serve this category best alone (any pool)
    best_method_speedup: float = 1.0
    table: tuple[KRow, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class Decision:
    categories: tuple[CategoryDecision, ...]
    default: CategoryDecision
    batch_size: float
    goodput: float  # tokens/s of the decided batch (model)
    plain_goodput: float  # tokens/s with speculation off everywhere (model)
    step_ms: float
    plain_step_ms: float
    #: graph-shaped engines: the width the engine's own rule is forecast to pick at the mean mix (a report: the
    #: engine picks each step's width itself, see policy/README.md); None for per-request engines
    width: int | None = None

    def by_name(self) -> dict[str, CategoryDecision]:
        return {c.name: c for c in self.categories}
