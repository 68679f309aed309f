"""specctl wire protocol, version 1: the only contract shared by the engine patch and the controller.

One engine posts a :class:`TelemetryBatch` every ~100 ms; the controller answers with a
:class:`TelemetryAck` that carries the current :class:`Policy`, so one round trip both reports and learns.

Why the batch is aggregated per category per step (and not per request):
  * the controller only learns per (model, category), so per-request rows would be summed anyway;
  * size is bounded by categories x proposal lengths, not by batch size: a 256-request step with 4
    categories and k_max = 4 is ~4 x 5 x 6 integers instead of 256 rows;
  * the engine does the aggregation in O(1) per request in its step, where it is cheapest.

A histogram ``DraftHistogram(k=3, accepted=[a0, a1, a2, a3])`` means: in this step, ``sum(accepted)``
requests of the category had ``k`` draft tokens scheduled, and ``accepted[j]`` of them had exactly ``j``
draft tokens accepted. Sum over j of j*accepted[j] is the number of accepted draft tokens, and
k*sum(accepted) is the number of draft tokens, so both reconcile with vLLM's own
``vllm:spec_decode_num_draft_tokens_total`` / ``..._accepted_tokens_total``.

Idempotency: a batch is identified by (engine_id, seq). ``seq`` starts at 0 for a fresh engine
(``boot_id`` changes when the engine restarts) and grows by one per batch; a retried batch is
acknowledged as ``duplicate`` and not counted twice; a jump in seq is counted as a gap.

Expiry: the engine applies a policy for at most ``ttl_s`` seconds after it received it (its own
monotonic clock, so clock skew does not matter); after that it falls back to its static config.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PROTOCOL_VERSION = 1

#: Hard caps that keep one batch bounded (the HTTP layer also caps the body size).
MAX_K = 32
MAX_STEPS_PER_BATCH = 20_000
MAX_CATEGORIES_PER_STEP = 64
MAX_METHODS = 16
#: Largest ``seq`` (and policy version): 2**53 - 1 is the largest integer every JSON reader and Prometheus
#: sample (a float64) holds exactly; at 100 batches a second an engine reaches it in 2.8 million years.
MAX_SEQ = 2**53 - 1
#: Largest step token budget an engine may report: vLLM's default is 2048-16384; 2**24 leaves room for any
#: configuration and keeps the steady-step model's sums of squares far from float64's exact-integer range.
MAX_TOKEN_BUDGET = 2**24

#: Names other tools rely on.
CATEGORY_PATTERN = r"^[a-z0-9][a-z0-9_.\-]{0,63}$"
#: What a category name may look like where a person or a client writes one (before :func:`category_name` folds it).
CATEGORY_INPUT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
ENGINE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
METHOD_PATTERN = r"^[a-z0-9][a-z0-9_\-]{0,31}$"

#: Default categories the engine derives when a request does not name one.
DEFAULT_CATEGORY = "default"
STRUCTURED_CATEGORY = "structured"
TOOL_CATEGORY = "tool_call"
#: Where categories beyond the controller's cap are pooled.
OVERFLOW_CATEGORY = "_overflow"

#: Method names. The engine's own drafter reports its vLLM name (ngram, eagle3, mtp, draft_model, ...);
#: these two are model-free drafters computed by the engine patch itself; OFF means k = 0.
METHOD_NGRAM = "ngram"
METHOD_SUFFIX = "suffix"
METHOD_OFF = "off"
#: In a policy, "use whatever drafter the engine was started with".
METHOD_ENGINE = "engine"

_CATEGORY = re.compile(CATEGORY_PATTERN)
_ASCII_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def category_name(raw: object) -> str | None:
    """The category a written name means, or None when it names none. The one rule for category names, applied
    wherever a name comes in: the request tag (``vllm_xargs.specctl_category``, read by the engine patch and
    rewritten by its middleware), the controller's paths and queries, and the ``specctl`` CLI.

    * ASCII upper-case letters fold to lower case: ``SQL``, ``Sql`` and ``sql`` are one category, ``sql``.
    * The folded name must match :data:`CATEGORY_PATTERN` (1-64 of ``a-z 0-9 _ . -``, starting with a letter or
      digit); nothing else is folded or trimmed (``Straße`` and ``sql `` name no category).
    * A name that names no category is refused by the controller (HTTP 422) and the CLI (exit 2); the engine,
      which never fails a request because of its tag, counts such a request under ``default``.

    Telemetry and policies carry folded names only (:data:`CATEGORY_PATTERN`)."""
    if not isinstance(raw, str):
        return None
    folded = raw.translate(_ASCII_FOLD)
    return folded if _CATEGORY.fullmatch(folded) else None


Category = Annotated[str, Field(pattern=CATEGORY_PATTERN)]
Method = Annotated[str, Field(pattern=METHOD_PATTERN)]
#: Per-step counts: no engine schedules ten million requests or tokens in one step; the bound keeps one
#: absurd batch from poisoning the learned state (and the cost model's least squares).
NonNegInt = Annotated[int, Field(ge=0, le=10_000_000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class DraftHistogram(_Strict):
    """Requests that had ``k`` drafts scheduled, bucketed by how many were accepted (0..k)."""

    k: int = Field(ge=1, le=MAX_K, description="draft tokens scheduled per request (proposal length)")
    accepted: list[NonNegInt] = Field(description="accepted[j] = requests with exactly j drafts accepted; length k+1")

    @model_validator(mode="after")
    def _length_matches_k(self) -> DraftHistogram:
        if len(self.accepted) != self.k + 1:
            raise ValueError(f"accepted must have k+1={self.k + 1} buckets, got {len(self.accepted)}")
        return self

    @property
    def drafts(self) -> int:
        return sum(self.accepted)

    @property
    def draft_tokens(self) -> int:
        return self.k * self.drafts

    @property
    def accepted_tokens(self) -> int:
        return sum(j * n for j, n in enumerate(self.accepted))


class CategoryStep(_Strict):
    """One category's share of one engine step, for one draft method."""

    category: Category
    method: Method = Field(description="drafter that produced these drafts; 'off' for requests run without drafts")
    requests: NonNegInt = Field(description="requests of this category and method scheduled in the step")
    hists: list[DraftHistogram] = Field(default_factory=list, max_length=MAX_K)
    counterfactual: dict[Method, list[DraftHistogram]] = Field(
        default_factory=dict,
        max_length=MAX_METHODS,
        description="model-free drafters scored against the tokens the target produced (not run on the device)",
    )
    counterfactual_attempts: dict[Method, NonNegInt] = Field(
        default_factory=dict,
        max_length=MAX_METHODS,
        description="proposals tried per model-free drafter: the ones scored in `counterfactual` plus those that "
        "found no match and proposed nothing, so drafts in `counterfactual` over this is the drafter's match rate",
    )

    @model_validator(mode="after")
    def _drafted_within_requests(self) -> CategoryStep:
        # runs for every category of every step the controller receives: kept to plain loops and builtins
        hists = self.hists
        if not hists:
            return self
        drafted = 0
        for h in hists:
            drafted += sum(h.accepted)
        if drafted > self.requests:
            raise ValueError("more drafted requests than requests in the step")
        if len(hists) > 1 and len({h.k for h in hists}) != len(hists):
            raise ValueError("one histogram per proposal length")
        return self


class StepRecord(_Strict):
    """One engine step: timing for the cost model and per-category acceptance."""

    # Finite times are checked by pydantic itself (allow_inf_nan=False), not by a Python validator: this model
    # is validated for every step of every batch, and a Python call per field adds up.
    t: float = Field(ge=0, allow_inf_nan=False, description="engine monotonic clock at step end, seconds")
    wall_s: float = Field(ge=0, le=3600, allow_inf_nan=False,
                          description="schedule() start to update_from_output() end, seconds")
    batch_size: NonNegInt = Field(description="requests scheduled in the step")
    scheduled_tokens: NonNegInt = Field(description="tokens the target verified (prefill + decode + drafts)")
    draft_tokens: NonNegInt = Field(description="draft tokens scheduled for verification in the step")
    prefill_tokens: NonNegInt = Field(default=0, description="scheduled tokens that are prompt prefill")
    draft_depth: NonNegInt = Field(default=0, le=MAX_K, description="drafting depth asked of the drafter for the next step")
    width: int | None = Field(default=None, ge=0, le=MAX_K,
                              description="graph-shaped engines: the one proposal width every request of this step "
                              "verified (drafts padded with placeholders where a request had fewer); else null")
    interval_s: float | None = Field(default=None, ge=0, le=3600, allow_inf_nan=False,
                                     description="seconds since the previous step ended, when the engine was busy "
                                     "in between (the step's cost under async scheduling); else null")
    categories: list[CategoryStep] = Field(default_factory=list, max_length=MAX_CATEGORIES_PER_STEP)

    @model_validator(mode="after")
    def _drafts_within_tokens(self) -> StepRecord:
        if self.draft_tokens > self.scheduled_tokens:
            raise ValueError("draft_tokens exceeds scheduled_tokens")
        return self


class SpecConfig(_Strict):
    """The engine's static speculative config: what it falls back to without a policy."""

    method: Method = Field(description="vLLM speculative method the engine was started with, or 'off'")
    k_max: int = Field(ge=0, le=MAX_K, description="num_speculative_tokens the engine was started with")
    model_free_methods: list[Method] = Field(default_factory=list, description="drafters the patch can compute itself")
    full_cuda_graphs: bool = Field(
        default=False,
        description="the engine replays full CUDA graphs for uniform decode batches, so a step whose requests "
        "draft different k runs slower (piecewise graphs); the controller then starts from a mixed-k penalty",
    )
    graph_widths: list[Annotated[int, Field(ge=0, le=MAX_K)]] = Field(
        default_factory=list, max_length=MAX_K + 1,
        description="graph-shaped engines: the proposal widths the engine captured full CUDA graphs for and picks "
        "one of per step (ascending, 0 first); empty for per-request k",
    )
    token_budget: int | None = Field(
        default=None, ge=1, le=MAX_TOKEN_BUDGET,
        description="graph-shaped engines: tokens one step may schedule (vLLM's max_num_batched_tokens); with it "
        "the controller prices budget-bound steps as the engine does (the steady-step model)",
    )

    @model_validator(mode="after")
    def _widths_ascending_within_k_max(self) -> SpecConfig:
        w = self.graph_widths
        if w and (w[0] != 0 or any(b <= a for a, b in itertools.pairwise(w)) or w[-1] > self.k_max):
            raise ValueError("graph_widths must be strictly ascending, start at 0 and not exceed k_max")
        return self


class TelemetryBatch(_Strict):
    protocol: Literal[1] = PROTOCOL_VERSION
    engine_id: str = Field(pattern=ENGINE_ID_PATTERN)
    boot_id: str = Field(pattern=ENGINE_ID_PATTERN, description="changes when the engine restarts; seq restarts at 0")
    model_name: str = Field(min_length=1, max_length=256)
    seq: int = Field(ge=0, le=MAX_SEQ, description="batch sequence number per (engine_id, boot_id)")
    sent_at: float = Field(ge=0, allow_inf_nan=False, description="engine wall clock (unix seconds), informational")
    spec: SpecConfig
    policy_version: int | None = Field(default=None, ge=0, le=MAX_SEQ,
                                       description="policy the engine applied in these steps")
    dropped_steps: int = Field(default=0, ge=0, le=2**62, description="steps dropped by the engine's bounded queue since boot")
    steps: list[StepRecord] = Field(default_factory=list, max_length=MAX_STEPS_PER_BATCH)


class AdaptRule(_Strict):
    """Per-request, per-step adaptation inside the engine (fast timescale), within controller bounds.

    See :func:`specctl_vllm.kernel.adapt.next_k` for the exact rule.
    """

    k_min: int = Field(default=0, ge=0, le=MAX_K)
    k_max: int = Field(default=0, ge=0, le=MAX_K)
    drop_after: int = Field(default=1, ge=1, le=64, description="consecutive all-rejected steps before k_r -> k_min")
    climb_after: int = Field(default=2, ge=1, le=64, description="consecutive fully-accepted steps before k_r += 1")

    @model_validator(mode="after")
    def _ordered(self) -> AdaptRule:
        if self.k_min > self.k_max:
            raise ValueError("k_min must be <= k_max")
        return self


class CategoryPolicy(_Strict):
    k: int = Field(ge=0, le=MAX_K, description="starting proposal length for the category's requests; 0 = off")
    method: Method = Field(default=METHOD_ENGINE, description="'engine', a model-free method, or 'off'")
    adapt: AdaptRule = Field(default_factory=AdaptRule)
    probe_rate: float = Field(default=0.0, ge=0.0, le=0.25, description="share of requests run at probe_k while k=0")
    probe_k: int = Field(default=0, ge=0, le=MAX_K)
    source: Literal["policy", "override", "probe", "default"] = "policy"
    reason: str = Field(default="", max_length=512)
    expected: list[Annotated[float, Field(ge=1.0, le=MAX_K + 1.0, allow_inf_nan=False)]] = Field(
        default_factory=list, max_length=MAX_K + 1,
        description="graph-shaped engines: E(K) for K = 0.. (tokens a request commits per step when it verifies K "
        "drafts, 1 + expected accepted drafts), the input of the engine's width rule; empty: not known",
    )


class StepCells(_Strict):
    """Step seconds per (batch bucket, width) cell, for graph-shaped engines' width rule."""

    batch_edges: list[Annotated[int, Field(ge=1, le=1_000_000)]] = Field(min_length=1, max_length=64,
                                                                       description="upper edge of each batch bucket")
    widths: list[Annotated[int, Field(ge=0, le=MAX_K)]] = Field(min_length=1, max_length=MAX_K + 1)
    step_s: list[list[Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)]]] = Field(
        description="step_s[bucket][width index]: estimated seconds per step")
    steps: list[list[Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]]] = Field(
        description="steps[bucket][width index]: decayed steps measured in the cell (its confidence)")

    @model_validator(mode="after")
    def _shape(self) -> StepCells:
        rows, cols = len(self.batch_edges), len(self.widths)
        if len(self.step_s) != rows or len(self.steps) != rows or any(len(r) != cols for r in self.step_s) \
                or any(len(r) != cols for r in self.steps):
            raise ValueError("step_s and steps must be len(batch_edges) x len(widths)")
        if sorted(set(self.widths)) != self.widths or sorted(set(self.batch_edges)) != self.batch_edges:
            raise ValueError("widths and batch_edges must be strictly ascending")
        return self


class Policy(_Strict):
    protocol: Literal[1] = PROTOCOL_VERSION
    version: int = Field(ge=0)
    issued_at: float = Field(description="controller wall clock, unix seconds")
    ttl_s: float = Field(gt=0, le=3600, description="apply for at most this long after receipt, then fall back")
    default: CategoryPolicy = Field(description="for categories the policy does not list")
    categories: dict[Category, CategoryPolicy] = Field(default_factory=dict, max_length=1024)
    step_cells: StepCells | None = Field(default=None, description="graph-shaped engines: the step-cost cell table")

    _check_issued_at = field_validator("issued_at", "ttl_s")(_finite)


class TelemetryAck(_Strict):
    outcome: Literal["accepted", "duplicate"]
    seq: int
    gaps: int = Field(ge=0, description="batches missing for this engine so far")
    policy: Policy
