"""The whole pipeline under random traffic (hypothesis stateful): no input may poison the controller.

Random sequences of schema-valid telemetry batches from many engines (values at and beyond the edge of
every field's range), invalid ones, overrides, clock jumps, idle sweeps, operator forgets and restarts
(clean or crash), against the real app on fake time with a small budget. After every step:

* no endpoint answers 5xx (/metrics, /v1/categories, /v1/engines, /v1/overrides, /readyz, a fresh post);
* /metrics exports no more series than the budget, and no more than the learned state is charged;
* the learned state round-trips through the snapshot (dump -> load -> dump is the same).

Bounded for CI (a few tens of seconds); ``SPECCTL_FUZZ_EXAMPLES`` / ``SPECCTL_FUZZ_STEPS`` make it longer
(``python -m bench fuzz``, run by ``make bench``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client.parser import text_string_to_metric_families

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig, BudgetSettings
from specctl_vllm.controller.service.app import create_app
from specctl_vllm.kernel.protocol import MAX_K, MAX_SEQ
from tests.unit.service.conftest import ADMIN, INGEST, FakeClock, parked_sleep, settings_for

EXAMPLES = int(os.environ.get("SPECCTL_FUZZ_EXAMPLES", "12"))
STEPS = int(os.environ.get("SPECCTL_FUZZ_STEPS", "25"))
BUDGET = 3_000

BIG = 10_000_000  # the protocol's per-step count bound
ENGINES = [f"engine-{i}" for i in range(8)]
BOOTS = ["boot-a", "boot-b", "boot-c"]
MODELS = ["m-a", "m-b", "org/model-c"]
CATEGORIES = ["code", "json", "prose", "tool_call", "structured", "a.b", "x-1", "default"]
METHODS = ["eagle3", "ngram", "suffix", "mtp"]

counts = st.sampled_from([0, 1, 2, 3, BIG // 64, BIG // 8]) | st.integers(0, BIG // 64)
times = st.sampled_from([0.0, 5e-324, 1e-300, 1e-9, 0.001, 1.0, 3599.999, 3600.0]) | st.floats(0, 3600)
clocks = st.sampled_from([0.0, 1e-300, 1.0, 1e9, 1e308]) | st.floats(0, 1e308)
seqs = st.sampled_from([0, 1, 2, 3, 4095, 4096, 10**6, MAX_SEQ - 1, MAX_SEQ]) | st.integers(0, MAX_SEQ)


@st.composite
def category_steps(draw, spec_method: str, k_max: int):
    name = draw(st.sampled_from(CATEGORIES))
    method = draw(st.sampled_from([spec_method, "ngram", "suffix", "off", "engine"]))
    hists = []
    if method != "off" and k_max > 0:
        for k in draw(st.lists(st.integers(1, k_max), max_size=2, unique=True)):
            hists.append({"k": k, "accepted": [draw(counts) for _ in range(k + 1)]})
    drafted = sum(sum(h["accepted"]) for h in hists)
    requests = min(BIG, drafted + draw(counts))
    if drafted > requests:
        hists = []
    out = {"category": name, "method": method, "requests": requests, "hists": hists}
    if k_max > 0 and draw(st.booleans()):
        cf = draw(st.sampled_from(["ngram", "suffix"]))
        k = draw(st.integers(1, k_max))
        out["counterfactual"] = {cf: [{"k": k, "accepted": [draw(counts) for _ in range(k + 1)]}]}
        out["counterfactual_attempts"] = {cf: draw(counts)}
    return out


@st.composite
def steps(draw, spec_method: str, k_max: int):
    cats = draw(st.lists(category_steps(spec_method, k_max), max_size=4, unique_by=lambda c: (c["category"], c["method"])))
    requests = sum(c["requests"] for c in cats)
    if requests > BIG:
        cats, requests = [], 0
    batch_size = min(BIG, requests + draw(st.sampled_from([0, 0, 1, 100])))
    scheduled = draw(st.sampled_from([batch_size, BIG, min(BIG, batch_size * 5)]))
    drafts = min(scheduled, draw(st.sampled_from([0, scheduled, scheduled // 2])))
    return {"t": draw(clocks), "wall_s": draw(times), "batch_size": batch_size, "scheduled_tokens": scheduled,
            "draft_tokens": drafts, "prefill_tokens": draw(counts), "draft_depth": draw(st.integers(0, MAX_K)),
            "categories": cats}


@st.composite
def batches(draw):
    spec_method = draw(st.sampled_from(["eagle3", "ngram", "mtp", "off"]))
    k_max = 0 if spec_method == "off" else draw(st.sampled_from([1, 2, 4, 7, MAX_K]))
    return {"protocol": 1, "engine_id": draw(st.sampled_from(ENGINES)), "boot_id": draw(st.sampled_from(BOOTS)),
            "model_name": draw(st.sampled_from(MODELS)), "seq": draw(seqs), "sent_at": draw(clocks),
            "spec": {"method": spec_method, "k_max": k_max, "model_free_methods": ["ngram", "suffix"],
                     "full_cuda_graphs": draw(st.booleans())},
            "dropped_steps": draw(st.sampled_from([0, 1, 2**62])),
            "policy_version": draw(st.none() | st.sampled_from([0, 1, MAX_SEQ])),
            "steps": draw(st.lists(steps(spec_method, k_max), max_size=3))}


#: Beyond the edges, as raw JSON text: each must be refused with a 4xx, never a 5xx.
BEYOND = [("seq", str(MAX_SEQ + 1)), ("seq", "1" + "0" * 400), ("seq", "-1"), ("policy_version", str(MAX_SEQ + 1)),
          ("sent_at", "1e400"), ("dropped_steps", str(2**62 + 1)), ("model_name", '""'), ("engine_id", '"bad id"'),
          ("steps.wall_s", "3600.0001"), ("steps.wall_s", "NaN"), ("steps.batch_size", str(BIG + 1)),
          ("steps.t", "Infinity"), ("steps.t", "-1.0"), ("seq", "true"), ("steps.wall_s", '"1"')]


class Pipeline(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="specctl-fuzz-"))
        self.clock = FakeClock()
        self.client: TestClient | None = None
        self._start()

    def _start(self) -> None:
        config = BrainConfig(budget=BudgetSettings(max_series=BUDGET, max_engines=6, max_models=3,
                                                   engine_idle_s=600, category_idle_s=3600, model_idle_s=7200))
        app = create_app(settings_for(self.dir / "db"), self.clock, sleep=parked_sleep, brain_config=config)
        self.client = TestClient(app, raise_server_exceptions=False)
        self.client.__enter__()

    def teardown(self) -> None:
        if self.client is not None:
            self.client.__exit__(None, None, None)
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def runtime(self):
        return self.client.app.state.runtime

    def _post(self, raw: str):
        return self.client.post("/v1/telemetry", content=raw, headers={**INGEST, "Content-Type": "application/json"})

    @rule(body=batches())
    def post_valid(self, body):
        r = self._post(json.dumps(body))
        event(f"valid batch answered {r.status_code}")
        assert r.status_code in (200, 409, 422, 429), (r.status_code, r.text[:300])
        if r.status_code != 200:
            assert r.json()["detail"]  # a reason

    @rule(body=batches(), copies=st.sampled_from([1_000, 7_000]))
    def post_many_steps(self, body, copies):
        """One step repeated thousands of times: enough weight to outvote every prior of the learned state."""
        if not body["steps"]:
            return
        body["steps"] = body["steps"][:1] * copies
        r = self._post(json.dumps(body, separators=(",", ":")))
        event(f"many-step batch answered {r.status_code}")
        assert r.status_code in (200, 409, 413, 422, 429), (r.status_code, r.text[:300])

    @rule(body=batches(), edge=st.sampled_from(BEYOND))
    def post_beyond_edge(self, body, edge):
        field, value = edge
        if field.startswith("steps."):
            if not body["steps"]:
                body["steps"] = [{"t": 0.0, "wall_s": 0.01, "batch_size": 0, "scheduled_tokens": 0, "draft_tokens": 0}]
            body["steps"][0][field[6:]] = "@@"
        else:
            body[field] = "@@"
        raw = json.dumps(body).replace('"@@"', value)
        r = self._post(raw)
        assert 400 <= r.status_code < 500, (field, value, r.status_code, r.text[:300])

    @rule(category=st.sampled_from(CATEGORIES + ["_overflow"]), k=st.integers(0, MAX_K),
          ttl=st.none() | st.sampled_from([1e-9, 1.0, 3600.0, 30 * 86400.0]))
    def set_override(self, category, k, ttl):
        r = self.client.put(f"/v1/overrides/{category}", json={"k": k, "ttl_s": ttl, "reason": "fuzz", "actor": "f"},
                            headers=ADMIN)
        assert r.status_code in (200, 404, 422), (r.status_code, r.text[:300])

    @rule(category=st.sampled_from(CATEGORIES))
    def clear_override(self, category):
        r = self.client.delete(f"/v1/overrides/{category}", params={"reason": "fuzz", "actor": "f"}, headers=ADMIN)
        assert r.status_code in (200, 404), (r.status_code, r.text[:300])

    @rule(seconds=st.sampled_from([0.0, 0.1, 2.0, 61.0, 700.0, 4000.0, 8000.0, 1e6]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule()
    def sweep(self):
        self.client.portal.call(self.runtime.expire_overrides)
        self.client.portal.call(self.runtime.evict_idle)
        self.client.portal.call(self.runtime.snapshot)

    @rule(what=st.sampled_from([{"engine": e} for e in ENGINES[:3]] + [{"model": m} for m in MODELS]
                               + [{"model": "m-a", "category": c} for c in CATEGORIES[:3]]))
    def forget(self, what):
        r = self.client.post("/v1/forget", json={**what, "reason": "fuzz", "actor": "f"}, headers=ADMIN)
        assert r.status_code in (200, 404), (r.status_code, r.text[:300])

    @rule(clean=st.booleans())
    def restart(self, clean):
        if not clean:
            async def crashed() -> None:
                return None

            self.runtime.snapshot = crashed  # kill -9: no final snapshot
        self.client.__exit__(None, None, None)
        self.client = None
        self._start()

    @precondition(lambda self: self.client is not None)
    @invariant()
    def nothing_answers_5xx(self):
        for path in ("/metrics", "/v1/categories", "/v1/engines", "/v1/overrides", "/readyz", "/healthz"):
            r = self.client.get(path)
            assert r.status_code < 500, (path, r.status_code, r.text[:300])
        assert self.runtime.internal_errors == 0

    @precondition(lambda self: self.client is not None)
    @invariant()
    def series_stay_under_the_budget(self):
        text = self.client.get("/metrics").text
        exported = sum(len(f.samples) for f in text_string_to_metric_families(text))
        charged = self.runtime.series()
        assert exported <= charged <= BUDGET, (exported, charged)

    @precondition(lambda self: self.client is not None)
    @invariant()
    def state_round_trips_through_the_snapshot(self):
        dump = self.runtime.dump()
        text = json.dumps(dump, allow_nan=False)  # what the store writes: no NaN or Infinity anywhere
        assert json.loads(self.runtime.snapshot_text()) == json.loads(text)  # written model by model: the same
        again = Brain.load(json.loads(text), self.runtime._brain.config)
        assert not again.load_problems, again.load_problems
        assert json.dumps(again.dump(), sort_keys=True) == json.dumps(json.loads(text), sort_keys=True)


Pipeline.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                                      suppress_health_check=list(HealthCheck))
TestPipeline = Pipeline.TestCase


def _replay_batch(engine: str, spec_method: str, k_max: int, categories: list[str], seq: int = 0) -> dict:
    method = spec_method if k_max else "off"
    cats = [{"category": c, "method": method, "requests": 2,
             "hists": [{"k": k_max, "accepted": [1] + [0] * (k_max - 1) + [1]}] if k_max else []} for c in categories]
    step = {"t": 1.0, "wall_s": 0.01, "batch_size": 2 * len(cats), "scheduled_tokens": 2 * len(cats) * (1 + k_max),
            "draft_tokens": 2 * len(cats) * k_max, "prefill_tokens": 0, "draft_depth": k_max, "categories": cats}
    return {"protocol": 1, "engine_id": engine, "boot_id": "boot-a", "model_name": "org/model-c", "seq": seq,
            "sent_at": 0.0, "dropped_steps": 0, "policy_version": None, "steps": [step],
            "spec": {"method": spec_method, "k_max": k_max, "model_free_methods": ["ngram", "suffix"],
                     "full_cuda_graphs": False}}


@settings(max_examples=1, deadline=None, database=None)
@given(st.none())  # inside a Hypothesis test: the rules record events
def test_replay_a_forgotten_model_brought_back_at_a_smaller_k(_):
    """The failing sequence the fuzzer found once (exported 200 > charged 150), replayed rule by rule on fake
    time that never moves: an engine at k_max 32 outlives its forgotten model, which engines at k_max 1 and
    'off' bring back; the stale engine ties for the model's most recently seen one and its K was exported."""
    m = Pipeline()
    try:
        def step(rule, *args):
            rule(*args)
            m.nothing_answers_5xx()
            m.series_stay_under_the_budget()
            m.state_round_trips_through_the_snapshot()

        step(m.post_valid, _replay_batch("engine-2", "eagle3", 32, ["code", "json"]))
        step(m.forget, {"engine": "engine-0"})
        step(m.forget, {"model": "org/model-c"})
        step(m.forget, {"model": "org/model-c"})
        for category, k in (("structured", 15), ("tool_call", 32), ("code", 20), ("x-1", 31)):
            step(m.set_override, category, k, None)
        step(m.restart, True)
        step(m.restart, False)
        step(m.post_valid, _replay_batch("engine-7", "eagle3", 1, ["code"]))
        step(m.restart, False)
        step(m.restart, False)
        step(m.post_many_steps, _replay_batch("engine-4", "off", 0, ["default", "tool_call", "x-1"]), 1_000)
    finally:
        m.teardown()
