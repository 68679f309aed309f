"""Model-free drafting and counterfactual scoring inside the engine loop.

Drafting: a request whose rule names a model-free method other than the engine's drafter (synchronous
scheduling only) gets the patch's proposal (:mod:`specctl_vllm.engine_patch.proposers`) in place of the
engine's drafts; verification stays exact.

Counterfactual scoring: the model-free drafters (:func:`scored_methods`) propose on a few requests per step,
round-robin, and are scored against the tokens the request commits later. It runs within a token bucket: each
step adds ``overhead_budget`` x step time minus what the rest of the hook cost in that step (:meth:`settle`),
so the patch's total per-step work (model-free drafting aside) stays within the budget on average, and the
scoring only gets what the per-request work leaves.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specctl_vllm.engine_patch.hook_stats import HookStats, Step
from specctl_vllm.engine_patch.policy_table import EngineSpec
from specctl_vllm.engine_patch.proposers import PROPOSERS, TokenHistory
from specctl_vllm.engine_patch.request_rules import STATE_ATTR, RequestState
from specctl_vllm.engine_patch.telemetry import Aggregate, add_attempt, add_counterfactual, new_entry
from specctl_vllm.kernel.proposers import common_prefix

#: Counterfactual credit stays within +-this: an idle period does not buy a burst of scoring work, and a
#: period where the hook alone overran the budget is forgotten after a while.
CF_CREDIT_CAP_NS = 20_000_000


def scored_methods(engine: EngineSpec) -> tuple[str, ...]:
    """Drafters scored counterfactually: the model-free ones the patch may substitute, and the engine's own
    drafter when the patch can compute it too (vLLM's n-gram), so a category running without drafts keeps
    measuring the engine's drafter at no device cost instead of waiting for probes."""
    methods = list(engine.model_free_methods)
    if engine.method in PROPOSERS and engine.method not in methods:
        methods.append(engine.method)
    return tuple(methods)


class ModelFree:
    """The patch's own drafters: drafting for model-free rules, and counterfactual scoring within a budget."""

    def __init__(self, engine: EngineSpec, stats: HookStats, *, overhead_budget: float, search_window: int,
                 validate_drafts: Callable[[Any, list[int]], list[int]] | None,
                 perf_ns: Callable[[], int]) -> None:
        self.engine = engine
        self.stats = stats
        self.budget = overhead_budget
        self.methods = scored_methods(engine) if engine.k_max > 0 and overhead_budget > 0 else ()
        self.window = search_window
        self.validate_drafts = validate_drafts
        self.perf_ns = perf_ns
        self.credit_ns = 0.0
        self._cursor = 0

    def draft(self, request: Any, state: RequestState, k: int) -> int:
        """Replace the request's drafts by the patch's own proposal; returns the ns it took."""
        t = self.perf_ns()
        if state.history is None:
            state.history = TokenHistory(request.num_tokens + 64)
        tokens = state.history.sync(request.all_token_ids)
        proposal = PROPOSERS[state.rule.method](tokens, k, window=self.window)
        if proposal and self.validate_drafts is not None and getattr(request, "use_structured_output", False):
            proposal = self.validate_drafts(request, proposal)
        request.spec_token_ids = proposal
        spent = self.perf_ns() - t
        self.stats.draft_ns += spent
        return spent

    # -- counterfactual scoring ------------------------------------------------------------------------

    def score(self, running: Sequence[Any], step: Step) -> None:
        """Score requests, from where the last step stopped, while the credit lasts (none: nothing)."""
        if not self.methods or self.credit_ns <= 0 or not running:
            return
        start = self.perf_ns()
        budget = self.credit_ns
        n = len(running)
        i = self._cursor % n
        for _ in range(n):
            request = running[i]
            i = (i + 1) % n
            state = getattr(request, STATE_ATTR, None)
            if state is not None and request.num_output_tokens > 0:
                self._score_request(request, state, step.agg)
            if self.perf_ns() - start >= budget:
                break
        self._cursor = i
        spent = self.perf_ns() - start
        self.credit_ns -= spent
        step.cf_ns += spent
        self.stats.cf_ns += spent

    def _score_request(self, request: Any, state: RequestState, agg: Aggregate) -> None:
        """Resolve this request's due proposals, then propose again for each model-free method not pending."""
        if state.history is None:
            state.history = TokenHistory(request.num_tokens + 64)
            state.pending = []
        tokens = state.history.sync(request.all_token_ids)
        length = tokens.shape[0]
        pending = state.pending if state.pending is not None else []
        key = state.key_on if state.adapt.k > 0 else state.key_off
        waiting: list[tuple[str, int, list[int]]] = []
        for method, position, proposal in pending:
            if length >= position + len(proposal):
                entry = agg.get(key)
                if entry is None:
                    entry = agg[key] = new_entry()
                actual = tokens[position : position + len(proposal)].tolist()
                add_counterfactual(entry, method, len(proposal), common_prefix(proposal, actual))
                add_attempt(entry, method)  # a matched try counts when it is scored, so hits <= attempts per step
                self.stats.cf_scored += 1
            else:
                waiting.append((method, position, proposal))
        busy = {method for method, _, _ in waiting}
        own = state.rule.method if state.rule is not None else None
        tried = None
        for method in self.methods:
            if method == own or method in busy:
                continue
            proposal = PROPOSERS[method](tokens, self.engine.k_max, window=self.window)
            if proposal:
                waiting.append((method, length, proposal))
                continue
            if tried is None:  # no match: a try that drafts nothing
                tried = agg.get(key)
                if tried is None:
                    tried = agg[key] = new_entry()
            add_attempt(tried, method)
        state.pending = waiting

    def settle(self, step: Step, wall_ns: int, hook_ns: int) -> None:
        """Credit the step's budget less what the rest of the hook (drafting aside) cost in it."""
        if self.methods:
            left = self.budget * wall_ns - (hook_ns - step.cf_ns - step.draft_ns)
            credit = self.credit_ns + left
            self.credit_ns = min(max(credit, -CF_CREDIT_CAP_NS), CF_CREDIT_CAP_NS)
