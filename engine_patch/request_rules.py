"""Per-request rules: which rule a request runs under, and what it leaves of the drafts (resolve, trim).

A request's rule is resolved once per policy table (cached on the request as :class:`RequestState`; a new
table re-resolves it, keeping the request's adaptation state while its category's rule is unchanged). Engines
that verify per-request k (not graph-shaped) trim each request's drafts to its k before ``schedule()`` -- always
a *new* list, because the async scheduler shares one placeholder list between requests -- and note the largest
k any request may need next step (:func:`~specctl_vllm.engine_patch.policy_table.next_k_bound`), the depth the
engine's drafter drafts. The request-id -> key-code table the engine-loop counting call reads
(:func:`~specctl_vllm.engine_patch.hook.counting_call`) is filled here, as rules resolve.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from specctl_vllm.engine_patch.categories import category_from_sampling_params
from specctl_vllm.engine_patch.hook_stats import Step
from specctl_vllm.engine_patch.policy_table import CategoryRule, EngineSpec, PolicyTable, next_k_bound
from specctl_vllm.engine_patch.proposers import TokenHistory
from specctl_vllm.engine_patch.telemetry import KEY_SHIFT
from specctl_vllm.kernel import protocol
from specctl_vllm.kernel.adapt import RequestK

#: Attribute the patch sets on vLLM ``Request`` objects (its state dies with the request).
STATE_ATTR = "_specctl_state"
#: Key-table entries of requests vLLM no longer holds that ``finish`` lets accumulate before it drops them
#: (one pass over the table per this many finished requests).
KEYS_SLACK = 64


class RequestState:
    """The patch's per-request state."""

    __slots__ = ("adapt", "adaptive", "cat_rule", "category", "gen", "history", "key_off", "key_on", "pending", "rule")

    def __init__(self, category: str) -> None:
        self.category = category
        self.gen = -1
        self.cat_rule: CategoryRule | None = None
        self.rule: CategoryRule | None = None  # cat_rule, or its probe rule for a probed request
        self.adaptive = False  # rule.adapt.k_min < rule.adapt.k_max, kept as a plain bool for the hot loops
        self.adapt = RequestK(k=0)
        self.key_on: tuple[str, str] = (category, protocol.METHOD_OFF)
        self.key_off: tuple[str, str] = (category, protocol.METHOD_OFF)
        self.history: TokenHistory | None = None
        self.pending: list[tuple[str, int, list[int]]] | None = None  # counterfactual proposals to score


state_of_request = attrgetter(STATE_ATTR)
generation_of_state = attrgetter("gen")
category_of_state = attrgetter("category")


def probe_selected(request_id: str, rate: float) -> bool:
    """Deterministic per request id: the same request is always probed or never."""
    return zlib.crc32(request_id.encode()) < rate * 4294967296.0


class RequestRules:
    """Resolves requests' rules and trims their drafts; owns the bounded category set and the key table."""

    def __init__(self, engine: EngineSpec, max_categories: int, graph: bool) -> None:
        self.engine = engine
        self.max_categories = max_categories
        #: graph-shaped steps verify the step's width whatever a request's own k is, so that k is not adapted
        #: there (one call per request per step the width rule would never read)
        self.graph = graph
        #: drafted requests are counted in vLLM's update loop: resolving a request keys it in :attr:`keys`
        self.keyed = False
        self.categories: set[str] = {protocol.DEFAULT_CATEGORY}
        #: request id -> the code of its category key for drafted requests (``key_on``, :meth:`key_code`), kept
        #: as rules resolve; entries of requests vLLM no longer holds are dropped by :meth:`drop_departed` (in
        #: place: the counting call holds this dict).
        self.keys: dict[str, int] = {}
        self._key_codes: dict[tuple[str, str], int] = {}
        #: bounded: categories (max_categories) x drafters; append-only, as queued rows' packed codes index it
        #: from the reporter thread
        self.key_list: list[tuple[str, str]] = []

    def admit_category(self, category: str) -> str:
        if category in self.categories:
            return category
        if len(self.categories) >= self.max_categories:
            return protocol.DEFAULT_CATEGORY
        self.categories.add(category)
        return category

    def state_of(self, request: Any, table: PolicyTable) -> RequestState:
        state = getattr(request, STATE_ATTR, None)
        if state is None:
            category = self.admit_category(category_from_sampling_params(request.sampling_params))
            state = RequestState(category)
            setattr(request, STATE_ATTR, state)
        if state.gen != table.rules_generation:
            self.resolve(state, request, table)
        return state

    def resolve(self, state: RequestState, request: Any, table: PolicyTable) -> None:
        state.gen = table.rules_generation
        cat_rule = table.rule_for(state.category)
        if cat_rule is state.cat_rule:
            return  # the category's rule did not change: keep the request's adaptation state
        state.cat_rule = cat_rule
        rule = cat_rule
        if cat_rule.probe is not None and probe_selected(request.request_id, cat_rule.probe_rate):
            rule = cat_rule.probe
        state.rule = rule
        state.adaptive = not self.graph and not rule.fixed
        state.adapt = RequestK(k=rule.k)
        # Drafts a request verifies under an 'off' rule come from the engine's drafter: a graph-shaped step
        # pads every request to the step's width, whatever its category decided.
        drafter = self.engine.method if rule.method == protocol.METHOD_OFF else rule.method
        state.key_on = (state.category, drafter)
        state.key_off = (state.category, protocol.METHOD_OFF)
        if self.keyed:
            self.keys[request.request_id] = self.key_code(state.key_on)

    def key_code(self, key: tuple[str, str]) -> int:
        """The key's id, shifted past a (drafts, accepted) pair: a request's step packs into one int."""
        code = self._key_codes.get(key)
        if code is None:
            code = self._key_codes[key] = len(self.key_list) << KEY_SHIFT
            self.key_list.append(key)
        return code

    def drop_departed(self, requests: Mapping[str, Any]) -> None:
        """Drop the keys of requests vLLM no longer holds, once KEYS_SLACK of them accumulated."""
        if len(self.keys) > len(requests) + KEYS_SLACK:
            for rid in [rid for rid in self.keys if rid not in requests]:
                del self.keys[rid]

    # -- engines with per-request k --------------------------------------------------------------------

    def trim(self, running: Sequence[Any], table: PolicyTable, step: Step,
             draft: Callable[[Any, RequestState, int], int] | None) -> None:
        """Resolve every running request, cap its drafts to its k and set ``step.depth`` to the largest k the
        batch can need next step. ``draft``: the model-free drafter that replaces a decoding request's drafts
        under a model-free rule (None under async scheduling, whose drafts the engine has already placed);
        its ns are charged to ``step.draft_ns``."""
        static = table.is_static
        depth = 0
        for request in running:
            state = getattr(request, STATE_ATTR, None)
            if state is None or state.gen != table.rules_generation:
                state = self.state_of(request, table)
            if static:
                continue  # the static config caps nothing: every request runs the engine's own k
            k = state.adapt.k
            rule = state.rule
            if rule.model_free:
                if draft is not None and k > 0 and request.num_tokens - request.num_computed_tokens == 1:
                    step.draft_ns += draft(request, state, k)
            else:
                bound = next_k_bound(state.adapt, rule) if state.adaptive else k
                depth = max(depth, bound)
            spec = request.spec_token_ids
            if len(spec) > k:
                request.spec_token_ids = spec[:k]
        step.depth = depth

    def admitted_depth(self, output: Any, requests: Mapping[str, Any], table: PolicyTable, depth: int) -> int:
        """``depth`` raised to the largest k the requests admitted in this step (not in the running list
        before ``schedule()``) can need."""
        for new in getattr(output, "scheduled_new_reqs", ()):
            request = requests.get(new.req_id)
            if request is None:
                continue
            state = self.state_of(request, table)
            if not state.rule.model_free:
                depth = max(depth, next_k_bound(state.adapt, state.rule))
        return depth
