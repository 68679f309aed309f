"""Graph-shaped steps: every request of a step verifies the step's one width (next to :mod:`.widths`).

Before ``schedule()`` no request is trimmed: each request's drafts are padded or cut to the step's width
(vLLM's placeholder drafts, -1, pad a request that has fewer, as its async scheduler does), and the step's
requests are counted per category (the mix the width rule prices). Inside ``schedule()``, once the batch is
formed, :meth:`GraphSteps.after` adds the admitted requests to the mix, asks the width rule
(:meth:`~specctl_vllm.engine_patch.widths.WidthChooser.choose`) for the next step's width and sets it as the
depth the engine's drafter drafts.

A steady batch is passed over once in :data:`BATCH_PASS_EVERY` steps: the pass resolves, counts and pads; the
steps between reuse its counts, plus the requests admitted since and less those vLLM reports finished.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from specctl_vllm.engine_patch.hook_stats import Step
from specctl_vllm.engine_patch.policy_table import PolicyTable
from specctl_vllm.engine_patch.request_rules import (
    STATE_ATTR,
    RequestRules,
    category_of_state,
    generation_of_state,
    state_of_request,
)
from specctl_vllm.engine_patch.widths import WidthChooser

#: Graph-shaped steps between two passes over the batch's requests (1 = a pass every step). Between passes a
#: step reuses the last pass's requests per category, plus the requests admitted since and less those vLLM
#: reports finished. One pass over a cache-cold batch cost 0.23 ms a step at 256 requests on the H200 host
#: ("before 229" of the hook's 404 us a step in the overhead line), while the mix of a steady batch moves by
#: the few requests that finish in a step. Drafts need no pass to reach the width under async scheduling:
#: vLLM sizes each request's placeholder drafts from the width the patch set for the step, so a pass that finds
#: every request at the width lets the next ones go.
BATCH_PASS_EVERY = 8

_drafts_of_request = attrgetter("spec_token_ids")
_id_of_request = attrgetter("request_id")


def pad_to_width(running: Iterable[Any], width: int) -> None:
    """Drafts of every request that has some to exactly ``width``: cut, or padded with vLLM's placeholder -1."""
    for request in running:
        spec = request.spec_token_ids
        if spec and len(spec) != width:
            request.spec_token_ids = spec[:width] if len(spec) > width else [*spec, *([-1] * (width - len(spec)))]


class GraphSteps:
    """The per-step batch pass and width choice of a graph-shaped engine."""

    def __init__(self, widths: WidthChooser, rules: RequestRules, *, async_mode: bool,
                 perf_ns: Callable[[], int]) -> None:
        self.widths = widths
        self.rules = rules
        self.async_mode = async_mode
        self.perf_ns = perf_ns
        #: the last batch pass's requests per category, the rules generation and batch size it saw, and how
        #: many more steps may reuse it (BATCH_PASS_EVERY)
        self.mix: dict[str, int] = {}
        #: request id -> category of the requests the last pass counted, and of those admitted since: the
        #: steps between passes add what they admit and take away what vLLM reports finished
        self.members: dict[str, str] = {}
        self.generation = -1
        self.batch = 0
        self.reuses_left = 0

    def before(self, running: Sequence[Any], table: PolicyTable, step: Step) -> None:
        """Set the step's width and mix; pad or cut every request's drafts to the width.

        The common step (every request resolved under this table, drafts already at the width or none) is
        counted in C passes over the batch (attribute getters, a Counter, a set of lengths), not an interpreted
        loop. On the H200 host the section still cost 0.2 ms a step at 256 requests with them: there its time is
        the cache misses on a cold batch, which any pass over the requests pays. So the pass runs once in
        BATCH_PASS_EVERY steps, and at once when the table, or the batch by more than an eighth, changes, or
        when the last pass had drafts to cut or pad."""
        width = self.widths.width
        step.width = width
        generation = table.rules_generation
        batch = len(running)
        if self.reuses_left > 0 and self.generation == generation and 8 * abs(batch - self.batch) <= self.batch:
            self.reuses_left -= 1
            step.mix = dict(self.mix)  # a copy: after() adds the step's admitted requests
            return
        step.batch_pass = True
        self.reuses_left = 0
        self.generation = generation
        self.batch = batch
        try:
            states = list(map(state_of_request, running))
        except AttributeError:  # a request the patch has not seen yet
            states = None
        if states is not None and set(map(generation_of_state, states)) <= {generation}:
            lengths = set(map(len, map(_drafts_of_request, running)))
            lengths.discard(0)
            if lengths and lengths != {width}:
                pad_to_width(running, width)
            elif self.async_mode:
                # Every request already at the width, and the async scheduler gives each request placeholder
                # drafts sized from the width the patch set: the next steps may skip the pass. (Drafts a
                # synchronous engine hands back may differ in length per request: there every step passes.)
                self.reuses_left = BATCH_PASS_EVERY - 1
            categories = list(map(category_of_state, states))
            step.mix = dict(Counter(categories))
            self.mix = dict(step.mix)
            self.members = dict(zip(map(_id_of_request, running), categories))
            return
        mix: dict[str, int] = {}
        members: dict[str, str] = {}
        count = mix.get
        state_of = self.rules.state_of
        for request in running:
            state = getattr(request, STATE_ATTR, None)
            if state is None or state.gen != generation:
                state = state_of(request, table)
            category = state.category
            mix[category] = count(category, 0) + 1
            members[request.request_id] = category
        pad_to_width(running, width)
        step.mix = mix
        self.mix = dict(mix)
        self.members = members

    def after(self, step: Step, output: Any, requests: Mapping[str, Any]) -> None:
        """Count the step's admitted and finished requests, choose the next step's width and set it as the depth
        the engine's drafter drafts (left to the engine on the static config)."""
        table = step.table
        mix = step.mix if step.mix is not None else {}
        new_reqs = getattr(output, "scheduled_new_reqs", ())
        for new in new_reqs:
            request = requests.get(new.req_id)
            if request is not None:
                category = self.rules.state_of(request, table).category
                mix[category] = mix.get(category, 0) + 1
                self._admitted(new.req_id, category)
        for rid in getattr(output, "finished_req_ids", None) or ():
            self._departed(rid)
        scheduled = output.num_scheduled_tokens
        batch = len(scheduled)
        # A decode-only step schedules at most 1 + width tokens per request; more means a prompt chunk.
        tokens = getattr(output, "total_num_scheduled_tokens", 0)
        limit = 1 + (step.width or 0)
        decode_only = not new_reqs and tokens <= batch * limit
        # A step most of whose requests run prompt chunks (an engine's first steps, a burst of arrivals)
        # measures prefill, not the width it verified: it commits next to nothing whatever the width, and
        # with no drafts it would read as a K = 0 step (counted in C: a map over the batch's token counts).
        step.decoding = decode_only or 2 * sum(map(limit.__ge__, scheduled.values())) >= batch
        rule_t = self.perf_ns()
        width = self.widths.choose(mix, table, batch, measurable=decode_only)
        step.rule_ns = self.perf_ns() - rule_t
        if not table.is_static:
            output.num_spec_tokens_to_schedule = width
        step.depth = width

    def _admitted(self, request_id: str, category: str) -> None:
        """A request the step admits joins the counts the steps up to the next pass reuse."""
        if request_id not in self.members:
            self.members[request_id] = category
            self.mix[category] = self.mix.get(category, 0) + 1

    def _departed(self, request_id: str) -> None:
        """A request vLLM reports finished leaves those counts (once: only a counted request)."""
        category = self.members.pop(request_id, None)
        if category is not None:
            left = self.mix.get(category, 0) - 1
            if left > 0:
                self.mix[category] = left
            else:
                self.mix.pop(category, None)
