"""Metric names the dashboards query, as data: the controller's (fixed by the project) and vLLM's own.

Keeping them here lets the unit tests check that every dashboard query uses only these names, and lets
the Prometheus e2e test know which series must exist.
"""

from __future__ import annotations

# specctl controller, per (model_name, category[, method]).
DRAFTS = "specctl_drafts_total"
DRAFT_TOKENS = "specctl_draft_tokens_total"
ACCEPTED = "specctl_accepted_tokens_total"
ACCEPTED_PER_POS = "specctl_accepted_tokens_per_pos_total"
ACCEPTED_PER_DRAFT = "specctl_accepted_tokens_per_draft"  # histogram: _bucket, _sum, _count
REQUEST_STEPS = "specctl_request_steps_total"
COMMITTED = "specctl_committed_tokens_total"
SPEC_OFF_STEPS = "specctl_spec_off_request_steps_total"
CURRENT_K = "specctl_current_k"
CURRENT_METHOD = "specctl_current_method_info"
ENTROPY_CLASS = "specctl_entropy_class_info"
ENTROPY_BITS = "specctl_acceptance_entropy"
MEAN_ACCEPTANCE_LENGTH = "specctl_mean_acceptance_length"
CONDITIONAL_ACCEPTANCE = "specctl_conditional_acceptance"
ESTIMATED_SPEEDUP = "specctl_estimated_speedup"
BEST_METHOD = "specctl_best_method_info"
DRAFT_COST_RATIO = "specctl_draft_cost_ratio"
# Overrides carry category and kind only (they are operator state, not per model).
OVERRIDE_ACTIVE = "specctl_override_active"
# Per-engine bookkeeping.
TELEMETRY_BATCHES = "specctl_telemetry_batches_total"
TELEMETRY_GAPS = "specctl_telemetry_gaps_total"
DROPPED_STEPS = "specctl_engine_dropped_steps_total"
WIDTH_STEPS = "specctl_engine_width_steps_total"
POLICY_AGE = "specctl_policy_age_seconds"
STEPS = "specctl_steps_total"
STEP_SECONDS = "specctl_step_seconds_total"

#: The metric names fixed by the project (every one of them is on a dashboard).
FIXED = frozenset(value for name, value in dict(globals()).items() if name.isupper() and isinstance(value, str))

# Model-free drafters scored against the target's own tokens (not run), kept apart from the real counters
# so that those reconcile exactly with vLLM's.
COUNTERFACTUAL_DRAFT_TOKENS = "specctl_counterfactual_draft_tokens_total"
COUNTERFACTUAL_ACCEPTED = "specctl_counterfactual_accepted_tokens_total"
COUNTERFACTUAL_DRAFTS = "specctl_counterfactual_drafts_total"
# Share of a model-free drafter's asks that drafted (only engines that report their tries; see docs/policy.md).
MATCH_RATE = "specctl_match_rate"
# Controller self-health.
OVERFLOW_STEPS = "specctl_overflow_category_steps_total"
HTTP_INTERNAL_ERRORS = "specctl_http_internal_errors_total"
SNAPSHOT_AGE = "specctl_snapshot_age_seconds"
DECISION_ERRORS = "specctl_decision_errors_total"
ENGINE_ID_CONFLICTS = "specctl_engine_id_conflicts_total"
SERIES = "specctl_series"
SERIES_BUDGET = "specctl_series_budget"
EVICTIONS = "specctl_evictions_total"
BUDGET_REFUSALS = "specctl_budget_refusals_total"
CLIENT_DISCONNECTS = "specctl_http_client_disconnects_total"

#: Every controller metric the dashboards may query.
SPECCTL = FIXED | {COUNTERFACTUAL_DRAFT_TOKENS, COUNTERFACTUAL_ACCEPTED, COUNTERFACTUAL_DRAFTS, MATCH_RATE,
                   OVERFLOW_STEPS, HTTP_INTERNAL_ERRORS, SNAPSHOT_AGE, DECISION_ERRORS, ENGINE_ID_CONFLICTS, SERIES,
                   SERIES_BUDGET, EVICTIONS, BUDGET_REFUSALS, CLIENT_DISCONNECTS}

#: Exposed as <name>_bucket / _sum / _count.
HISTOGRAMS = frozenset({ACCEPTED_PER_DRAFT})

# vLLM's own engine-wide speculative decoding counters (labels model_name, engine; per_pos adds position).
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

VLLM = frozenset({VLLM_DRAFTS, VLLM_DRAFT_TOKENS, VLLM_ACCEPTED, VLLM_ACCEPTED_PER_POS})
