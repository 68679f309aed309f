"""Step accounting: what each step drafted and accepted, per (category, method), into telemetry.

Per scheduled request, drafted = scheduled drafts - grammar-invalid drafts and accepted = sampled tokens - 1
(vLLM's own arithmetic, so the sums reconcile with ``vllm:spec_decode_num_*_tokens_total``); aggregated per
(category, method) into accepted-count histograms; the request's k advances with
:func:`specctl_vllm.kernel.adapt.next_k`; one :class:`~specctl_vllm.engine_patch.telemetry.StepRow` per step.

Graph-shaped engines make no pass of their own (:meth:`StepAccounting.observe` is skipped): vLLM's
``update_from_output`` already walks the batch and calls ``make_spec_decoding_stats`` once per drafted request,
which :func:`~specctl_vllm.engine_patch.hook.counting_call` tallies into the step's sink (one packed
(category key, drafts, accepted) code per request). :meth:`StepAccounting.finish` reads the few distinct codes
once for what the engine itself needs (per category: accepted drafts, rejections, requests, for the width
rule's fast timescale and the meters' committed tokens), counts the step's requests that verified nothing from
the step's mix, and queues the codes as they are: the reporter thread unfolds them into histograms
(:func:`~specctl_vllm.engine_patch.telemetry.step_aggregate`), off the engine loop, while the engine waits on
the device (building the histograms here and reading them twice was a third of that section at 256 requests on
the CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from specctl_vllm.engine_patch.hook_stats import Step, no_cpu
from specctl_vllm.engine_patch.request_rules import STATE_ATTR, RequestRules
from specctl_vllm.engine_patch.telemetry import (
    CODE_BITS,
    CODE_MASK,
    KEY_SHIFT,
    Aggregate,
    PackedCounts,
    StepRow,
    new_entry,
    pack,
)
from specctl_vllm.engine_patch.widths import WidthChooser, verified_width
from specctl_vllm.kernel import protocol
from specctl_vllm.kernel.adapt import next_k

#: Two step ends closer than this are back-to-back steps of a busy engine: the gap is the later step's cost.
BUSY_GAP_S = 0.5


def committed_tokens(agg: Aggregate) -> int:
    """Tokens the step committed: one per request counted, plus every accepted draft. A request that only ran
    a prompt chunk is counted too (it commits at most its first token), an overcount of the few chunks a step
    carries beside hundreds of decoding requests."""
    total = 0
    for entry in agg.values():
        total += entry.requests
        for counts in entry.hists.values():
            for accepted, n in enumerate(counts):
                total += accepted * n
    return total


class StepAccounting:
    """Counts each step's drafts and acceptances, feeds the width rule's meters and builds the step's row."""

    def __init__(self, rules: RequestRules, widths: WidthChooser | None, *, num_sampled_per_step: int,
                 clock: Callable[[], float]) -> None:
        self.rules = rules
        self.widths = widths
        self.num_sampled = num_sampled_per_step
        self.clock = clock
        #: (request id, drafts, accepted) of the step's drafted requests whose id the key table lacks (appended
        #: by the counting call; cleared in place)
        self.unkeyed: list[tuple[str, int, int]] = []
        self._last_end: float | None = None

    def observe(self, step: Step, output: Any, runner_output: Any, requests: Mapping[str, Any]) -> None:
        """The patch's own pass over the step's scheduled requests (engines whose drafts vLLM's loop does not
        count for it)."""
        table = step.table
        agg = step.agg
        sched_spec = output.scheduled_spec_decode_tokens
        invalid = getattr(output, "num_invalid_spec_tokens", None)
        sampled = runner_output.sampled_token_ids
        ns = self.num_sampled
        n_sampled = len(sampled) if sampled else 0
        index = getattr(runner_output, "req_id_to_index", None)
        if index is None and n_sampled:  # vLLM 0.34 dropped the map: sampled rows follow req_ids, as vLLM reads them
            index = {rid: i for i, rid in enumerate(runner_output.req_ids)}
        draft_tokens = 0
        # The hottest loop of the patch (every scheduled request, every step): locals, dict lookups, no calls
        # on the common path.
        for req_id in output.num_scheduled_tokens:
            request = requests.get(req_id)
            if request is None or request.is_finished():
                continue
            attrs = request.__dict__
            state = attrs.get(STATE_ATTR)
            if state is None:
                state = self.rules.state_of(request, table)
            spec = sched_spec.get(req_id)
            generated = None
            if n_sampled:
                i = index.get(req_id)
                if i is not None and i < n_sampled:
                    generated = sampled[i]
            if spec:
                draft_tokens += len(spec)
                if generated:
                    if attrs.get("num_stale_output_tokens", 0) > 0 and attrs.get("drop_stale_output", False):
                        continue  # vLLM discards this output (and does not count it)
                    if attrs.get("async_tokens_to_discard", 0) > 0:
                        continue  # 0.26: a stale in-flight frame after a forced preemption, dropped by vLLM
                    drafted = len(spec) - invalid.get(req_id, 0) if invalid else len(spec)
                    accepted = len(generated) - ns
                    if accepted < 0:
                        accepted = 0
                    elif accepted > drafted:
                        accepted = drafted  # cannot happen (invalid drafts are -1); keeps the histogram valid
                    key = state.key_on
                    entry = agg.get(key)
                    if entry is None:
                        entry = agg[key] = new_entry()
                    entry.requests += 1
                    if drafted > 0:
                        bucket = entry.hists.get(drafted)
                        if bucket is None:
                            bucket = entry.hists[drafted] = [0] * (drafted + 1)
                        bucket[accepted] += 1
                    if state.adaptive:
                        next_k(state.adapt, drafted, accepted, state.rule.adapt)
                    continue
            key = state.key_on if state.adapt.k > 0 else state.key_off
            entry = agg.get(key)
            if entry is None:
                entry = agg[key] = new_entry()
            entry.requests += 1
            if generated and state.adaptive:
                next_k(state.adapt, 0, 0, state.rule.adapt)
        step.output = draft_tokens  # the output object is no longer needed; keep the count

    def sink_sums(self, step: Step, sink: dict[int, int],
                  requests: Mapping[str, Any] | None) -> dict[str, list[int]]:
        """Engine-loop steps: per category, [accepted drafts, rejections, requests] of the step's drafted
        requests (exactly those vLLM's counters count), read from the packed codes in one pass (a few codes per
        category); the histograms are unfolded off the engine loop. Requests the key table lacked are resolved
        first."""
        if self.unkeyed:
            self._tally_unkeyed(step, sink, requests)
        by_index: dict[int, list[int]] = {}
        for code, n in sink.items():
            index = code >> KEY_SHIFT
            sums = by_index.get(index)
            if sums is None:
                sums = by_index[index] = [0, 0, 0]
            took = code & CODE_MASK  # <= drafts: the counting call and pack() keep it there
            sums[0] += took * n
            if took < (code >> CODE_BITS) & CODE_MASK:
                sums[1] += n
            sums[2] += n
        keys = self.rules.key_list
        by_category: dict[str, list[int]] = {}
        for index, sums in by_index.items():
            category = keys[index][0]
            into = by_category.get(category)
            if into is None:
                by_category[category] = sums
            else:
                into[0] += sums[0]
                into[1] += sums[1]
                into[2] += sums[2]
        return by_category

    def _tally_unkeyed(self, step: Step, sink: dict[int, int], requests: Mapping[str, Any] | None) -> None:
        """The rare path: a request whose key is not in the table (one the hook has not resolved, or resumed
        after the table dropped it) is resolved from vLLM's request, or left out where vLLM no longer has it."""
        unkeyed = list(self.unkeyed)
        self.unkeyed.clear()  # in place: the counting call holds this list
        rules = self.rules
        for rid, drafted, accepted in unkeyed:
            request = requests.get(rid) if requests is not None else None
            if request is None:
                continue
            code = rules.keys[rid] = rules.key_code(rules.state_of(request, step.table).key_on)
            code += pack(drafted, accepted)
            sink[code] = sink.get(code, 0) + 1

    def count_undrafted(self, step: Step, batch: int, sums: Mapping[str, list[int]]) -> None:
        """Engine-loop steps: the step's requests that verified no drafts (prefill chunks, K = 0), per category
        from the step's mix, under the category's 'off' key; never more than the batch holds. ``sums``: the
        drafted requests' per-category sums (:meth:`sink_sums`)."""
        drafted = {category: counts[2] for category, counts in sums.items()}
        for (category, _method), entry in step.agg.items():
            if entry.requests:
                drafted[category] = drafted.get(category, 0) + entry.requests
        left = batch - sum(drafted.values())
        if left <= 0:
            return
        rests = {}
        for category, n in step.mix.items():
            rest = n - drafted.get(category, 0)
            if rest > 0:
                rests[category] = rest
        if sum(rests.values()) > left:  # a mix that counts more than the batch holds: the largest first
            rests = dict(sorted(rests.items(), key=lambda kv: -kv[1]))
        agg = step.agg
        for category, rest in rests.items():
            rest = min(rest, left)
            if rest <= 0:
                break
            key = (category, protocol.METHOD_OFF)
            entry = agg.get(key)
            if entry is None:
                entry = agg[key] = new_entry()
            entry.requests += rest
            left -= rest

    def finish(self, step: Step, output: Any, sink: dict[int, int] | None, calls: int, call_ns: float,
               requests: Mapping[str, Any] | None, t: int) -> tuple[StepRow | None, float | None, float]:
        """Close the step's counts: engine-loop tallies (``calls`` counting calls charged at ``call_ns`` each
        to the observe section), the width rule's fast sums and meters. Returns the step's telemetry row (None
        for a step that scheduled nothing), the interval since the last busy step's end, and the clock now."""
        batch = len(output.num_scheduled_tokens)
        sums: dict[str, list[int]] = {}  # engine-loop steps: the drafted requests' counts per category
        packed = None
        if step.engine_loop:
            if sink is not None:
                sums = self.sink_sums(step, sink, requests)
                if sink:
                    packed = PackedCounts(sink, self.rules.key_list)
                # the calls ran inside vLLM's loop, outside any section: each at its measured price, in observe
                step.spec_ns = int(calls * call_ns)
                step.hook_ns += step.spec_ns
                step.sections[2] += step.spec_ns
                if step.cpu is not no_cpu:
                    step.cpu_ns += step.spec_ns  # no thread-CPU clock per call: its wall price (no I/O, no lock)
            self.count_undrafted(step, batch, sums)
            if requests is not None:
                self.rules.drop_departed(requests)
        scheduled = output.total_num_scheduled_tokens
        draft_tokens = step.output if isinstance(step.output, int) else 0
        now = self.clock()
        interval = None
        if self._last_end is not None and 0 <= now - self._last_end <= BUSY_GAP_S:
            interval = now - self._last_end
        self._last_end = now if scheduled > 0 else None
        prefill = max(scheduled - batch - draft_tokens, 0)
        widths = self.widths
        if widths is not None:
            if step.agg or sums:
                widths.observe(step.agg, sums)
            if scheduled > 0:
                committed = committed_tokens(step.agg) + sum(counts[0] + counts[2] for counts in sums.values())
                verified = verified_width(draft_tokens, batch)
                if step.decoding:
                    widths.measured.observe(batch, verified, committed, interval, widths.measured_mix())
                if widths.budget is not None:
                    widths.budget.observe(scheduled, prefill, committed, interval, verified)
        if scheduled <= 0:
            return None, interval, now
        return StepRow(
            t=self.clock(),
            wall_s=(t - step.t0) / 1e9,
            batch_size=batch,
            scheduled_tokens=scheduled,
            draft_tokens=draft_tokens,
            prefill_tokens=prefill,
            draft_depth=step.depth,
            agg=step.agg,
            width=step.width if draft_tokens == batch * (step.width or 0) else None,
            interval_s=interval,
            packed=packed,
        ), interval, now
