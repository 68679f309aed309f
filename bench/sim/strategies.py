"""Strategies compared by the simulator: what k and drafter each request slot runs at every step.

Every strategy sees the same :class:`~bench.sim.engine.SimEngine` interface: ``choose(engine, now)``
returns per-slot (k, drafter index) arrays; ``observe(result, now)`` lets it learn from the step.

  * ``NoSpec``            k = 0;
  * ``FixedK(k)``         every request at k with the engine's drafter (vLLM's static config);
  * ``BatchTable``        k from a batch-size table (vLLM's ``num_speculative_tokens_per_batch_size``);
  * ``SglangTiers``       engine-wide k from an EMA of the accepted length with tiers and hysteresis per
                          batch-size slot: :mod:`specctl_vllm.controller.core.offline.ema_tiers`, the port of SGLang's adaptive
                          ``speculative_num_steps`` that ``specctl replay`` and the CPU benchmark use too;
  * ``Static``            a fixed (k, drafter) per category (the hindsight oracle's form);
  * ``Specctl``           the real :class:`specctl_vllm.controller.core.brain.Brain` fed with the simulated telemetry,
                          its policy applied per request with the real :func:`specctl_vllm.kernel.adapt.next_k`.
"""

from __future__ import annotations

import numpy as np

from bench.sim.engine import SimEngine, StepResult
from bench.sim.profiles import Trace
from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig
from specctl_vllm.controller.core.offline import ema_tiers
from specctl_vllm.kernel.adapt import RequestK, initial_state, next_k
from specctl_vllm.kernel.protocol import (
    METHOD_ENGINE,
    METHOD_OFF,
    AdaptRule,
    CategoryStep,
    DraftHistogram,
    Policy,
    SpecConfig,
    StepRecord,
    TelemetryBatch,
)


def _acts(cp) -> tuple:
    """What a request acts on (the reason text is not)."""
    return cp.k, cp.method, cp.adapt, cp.probe_rate, cp.probe_k


class Strategy:
    name = "strategy"

    def choose(self, eng: SimEngine, now: float) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def observe(self, res: StepResult, now: float) -> None:
        pass


class NoSpec(Strategy):
    name = "no_spec"

    def choose(self, eng, now):
        return np.zeros(eng.batch, dtype=int), np.zeros(eng.batch, dtype=int)


class FixedK(Strategy):
    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"k={k}"

    def choose(self, eng, now):
        return np.full(eng.batch, self.k, dtype=int), np.zeros(eng.batch, dtype=int)


class BatchTable(Strategy):
    """``table`` = [(lo, hi, k)]: k for a running batch of lo..hi requests."""

    name = "batch_table"

    def __init__(self, table: list[tuple[int, int, int]]) -> None:
        self.table = table

    def k_for(self, batch: int) -> int:
        for lo, hi, k in self.table:
            if lo <= batch <= hi:
                return k
        return 0

    def choose(self, eng, now):
        return np.full(eng.batch, self.k_for(eng.batch), dtype=int), np.zeros(eng.batch, dtype=int)


class SglangTiers(Strategy):
    """The core's port of SGLang's adaptive steps (:mod:`specctl_vllm.controller.core.offline.ema_tiers`, the one ``specctl replay``
    and the CPU benchmark run), routed by the simulated batch size."""

    name = "sglang_tiers"

    def __init__(self, k_max: int, initial_steps: int = 3,
                 slots: dict[int, ema_tiers.SlotConfig] | None = None) -> None:
        self.slots = ema_tiers.clamp_slots(slots or ema_tiers.DEFAULT_SLOTS, k_max)
        self.state = ema_tiers.init_state(min(initial_steps, k_max), self.slots)
        self.batch = 1

    @property
    def k(self) -> int:
        return self.state.steps_for_batch(self.batch)

    @property
    def tiers(self) -> tuple[int, ...]:
        """The candidate steps of the slot the current batch size routes to."""
        return self.slots[ema_tiers.slot_key(tuple(sorted(self.slots)), self.batch)].candidate_steps

    def choose(self, eng, now):
        self.batch = eng.batch
        return np.full(eng.batch, self.k, dtype=int), np.zeros(eng.batch, dtype=int)

    def observe(self, res, now):
        accepted = res.accepted[res.decoding].astype(float).tolist()  # per verified request, 0 when not drafting
        self.state = ema_tiers.update(self.state, self.slots, res.batch_size, accepted)


class Static(Strategy):
    """Fixed (k, drafter index) per category."""

    def __init__(self, name: str, per_category: list[tuple[int, int]]) -> None:
        self.name = name
        self.k = np.array([k for k, _ in per_category], dtype=int)
        self.m = np.array([m for _, m in per_category], dtype=int)

    def choose(self, eng, now):
        return self.k[eng.cat], self.m[eng.cat]


class Specctl(Strategy):
    """The real controller logic in the loop (telemetry every ``report_s`` of simulated time)."""

    name = "specctl"

    def __init__(self, trace: Trace, config: BrainConfig, seed: int, report_s: float = 0.1,
                 model: str = "sim-model", engine_id: str = "sim-engine") -> None:
        self.trace = trace
        self.brain = Brain(config)
        self.spec = SpecConfig(method=trace.engine_method, k_max=trace.k_max,
                               model_free_methods=list(trace.model_free_methods))
        self.model, self.engine_id = model, engine_id
        self.report_s = report_s
        self.rng = np.random.default_rng(seed)
        self.names = [c.name for c in trace.categories]
        self.method_names = [trace.engine_method, *trace.model_free_methods]
        self.method_index = {METHOD_ENGINE: 0, trace.engine_method: 0}
        self.method_index.update({m: i + 1 for i, m in enumerate(trace.model_free_methods)})
        self.pending: list[StepRecord] = []
        self.seq = 0
        self.last_report = 0.0
        self.policy: Policy = self.brain.policy_for(model, self.spec, 0.0, engine_id)
        self.slot_id: np.ndarray | None = None
        self.states: list[RequestK] = []
        self.rules: list[AdaptRule] = []
        self.method: np.ndarray | None = None
        self.validated = False
        self.versions = 1

    # -- per request ----------------------------------------------------------------------------------------
    def _assign(self, slot: int, cat: int) -> None:
        cp = self.policy.categories.get(self.names[cat], self.policy.default)
        if cp.k == 0:
            if cp.probe_rate > 0 and cp.probe_k > 0 and self.rng.random() < cp.probe_rate:
                rule = AdaptRule(k_min=cp.probe_k, k_max=cp.probe_k)
                m = self.method_index.get(cp.method, 0)
                self.states[slot], self.rules[slot], self.method[slot] = RequestK(cp.probe_k), rule, m
                return
            rule = AdaptRule(k_min=0, k_max=0)
            self.states[slot], self.rules[slot], self.method[slot] = RequestK(0), rule, 0
            return
        self.states[slot] = initial_state(cp.k, cp.adapt)
        self.rules[slot] = cp.adapt
        self.method[slot] = self.method_index.get(cp.method, 0)

    def choose(self, eng, now):
        if self.slot_id is None:
            self.slot_id = np.full(eng.batch, -1, dtype=np.int64)
            self.states = [RequestK(0)] * eng.batch
            self.rules = [AdaptRule()] * eng.batch
            self.method = np.zeros(eng.batch, dtype=int)
        for s in np.flatnonzero(eng.admitted != self.slot_id):
            self._assign(int(s), int(eng.cat[s]))
        self.slot_id = eng.admitted.copy()
        self.cat_of_slot = eng.cat.copy()
        k = np.fromiter((st.k for st in self.states), dtype=int, count=eng.batch)
        return k, self.method.copy()

    def observe(self, res, now):
        for s in np.flatnonzero(res.decoding & ~res.finished):
            next_k(self.states[s], int(res.k[s]), int(res.accepted[s]), self.rules[s])
        self.pending.append(self._record(res, now))
        if now - self.last_report >= self.report_s:
            self._report(now)

    # -- telemetry ------------------------------------------------------------------------------------------
    def _record(self, res: StepResult, now: float) -> StepRecord:
        kmax, n_m, n_c = self.trace.k_max, len(self.method_names), len(self.names)
        drafting = res.k > 0
        key = ((res.cat * n_m + res.method) * (kmax + 1) + res.k) * (kmax + 1) + res.accepted
        counts = np.bincount(key[drafting], minlength=n_c * n_m * (kmax + 1) ** 2).reshape(
            n_c, n_m, kmax + 1, kmax + 1)
        requests = np.bincount((res.cat * n_m + res.method)[drafting], minlength=n_c * n_m).reshape(n_c, n_m)
        off = np.bincount(res.cat[~drafting], minlength=n_c)
        cf_counts = None
        n_f = res.cf_accepted.shape[1]
        if n_f:
            scored = res.cf_accepted >= 0
            cf_key = (res.cat[:, None] * n_f + np.arange(n_f)[None, :]) * (kmax + 1) + np.maximum(res.cf_accepted, 0)
            cf_counts = np.bincount(cf_key[scored], minlength=n_c * n_f * (kmax + 1)).reshape(n_c, n_f, kmax + 1)
        cats = []
        for c in range(n_c):
            steps_c: list[CategoryStep] = []
            cf = {}
            if cf_counts is not None:
                for f in range(n_f):
                    if cf_counts[c, f].any():
                        cf[self.method_names[f + 1]] = [
                            DraftHistogram.model_construct(k=kmax, accepted=cf_counts[c, f].tolist())]
            for m in range(n_m):
                if requests[c, m]:
                    hists = [DraftHistogram.model_construct(k=k, accepted=counts[c, m, k, : k + 1].tolist())
                             for k in range(1, kmax + 1) if counts[c, m, k].any()]
                    steps_c.append(CategoryStep.model_construct(category=self.names[c], method=self.method_names[m],
                                                                requests=int(requests[c, m]), hists=hists,
                                                                counterfactual={}))
            if off[c]:
                steps_c.append(CategoryStep.model_construct(category=self.names[c], method=METHOD_OFF,
                                                            requests=int(off[c]), hists=[], counterfactual={}))
            if steps_c and cf:
                first = steps_c[0]
                steps_c[0] = CategoryStep.model_construct(category=first.category, method=first.method,
                                                          requests=first.requests, hists=first.hists,
                                                          counterfactual=cf)
            cats.extend(steps_c)
        return StepRecord.model_construct(t=now, wall_s=res.wall_s, batch_size=res.batch_size,
                                          scheduled_tokens=res.scheduled_tokens, draft_tokens=res.draft_tokens,
                                          prefill_tokens=res.prefill_tokens, draft_depth=res.depth, categories=cats)

    def _report(self, now: float) -> None:
        batch = TelemetryBatch.model_construct(protocol=1, engine_id=self.engine_id, boot_id="sim", model_name=self.model,
                                               seq=self.seq, sent_at=now, spec=self.spec,
                                               policy_version=self.policy.version, dropped_steps=0,
                                               steps=self.pending)
        if not self.validated:  # the simulated telemetry must be valid wire protocol (checked once)
            TelemetryBatch.model_validate_json(batch.model_dump_json())
            self.validated = True
        self.brain.ingest(batch, now)
        self.seq += 1
        self.pending = []
        self.last_report = now
        policy = self.brain.policy_for(self.model, self.spec, now, self.engine_id)
        if policy.version != self.policy.version:
            # like the engine patch: a running request keeps its adaptation state unless its category changed
            changed = [i for i, name in enumerate(self.names)
                       if _acts(policy.categories.get(name, policy.default))
                       != _acts(self.policy.categories.get(name, self.policy.default))]
            self.policy = policy
            self.versions += 1
            if changed and self.slot_id is not None:
                self.slot_id[np.isin(self.cat_of_slot, changed)] = -1
