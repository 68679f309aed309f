"""Round aggregation, counters, dispatch snapshots and request categories of the steady-load benchmark."""

from __future__ import annotations

import enum
import json
from types import SimpleNamespace

import pytest

from bench.gpu.accept_plugin import (
    META_KEY,
    DispatchCounter,
    dispatch_key,
    parse_dispatch_key,
    snapshot_counts,
    snapshot_meta,
    wrap_dispatch,
)
from bench.gpu.steady import DispatchWatch
from bench.gpu.steady_stats import (
    Round,
    counter_delta,
    full_share,
    model_steps,
    slot_category,
    spec_counters,
    spread_of,
    summarise,
    target_modes,
)

M = "ModelCudaGraphManager"
S = "SpeculatorCudaGraphManager"


def rnd(seconds: float, by_cat: dict[str, int], steps: int | None = 100, window: float | None = None,
        spec: dict | None = None, dispatch: dict | None = None) -> dict:
    return Round(seconds=seconds, tokens=sum(by_cat.values()), tokens_by_category=by_cat, driver_steps=90,
                 model_steps=steps, window_s=window, spec=spec or {}, dispatch=dispatch or {}).record()


def test_spread_is_range_over_median():
    s = spread_of([100.0, 110.0, 90.0])
    assert (s.median, s.min, s.max, s.n) == (100.0, 90.0, 110.0, 3)
    assert s.spread == pytest.approx(0.2)
    assert spread_of([]) is None


def test_round_goodput_and_step_time():
    r = Round(seconds=5.0, tokens=5000, tokens_by_category={"high": 3000, "low": 2000}, driver_steps=400,
              model_steps=500, window_s=4.9, spec={}, dispatch={})
    assert r.tok_per_s == 1000.0
    assert r.mean_step_ms == pytest.approx(9.8)  # the snapshot window, not the driver's round
    assert r.record()["tok_per_s_by_category"] == {"high": 600.0, "low": 400.0}
    no_window = Round(seconds=5.0, tokens=1, tokens_by_category={}, driver_steps=1, model_steps=500, window_s=None,
                      spec={}, dispatch={})
    assert no_window.mean_step_ms == pytest.approx(10.0)
    assert Round(seconds=5.0, tokens=1, tokens_by_category={}, driver_steps=1, model_steps=None, window_s=None,
                 spec={}, dispatch={}).mean_step_ms is None


def test_summarise_rounds_overall_per_category_and_counters():
    key = dispatch_key(M, 5, "FULL", 5)
    rounds = [rnd(5.0, {"high": 3000, "low": 2000}, spec={"vllm:spec_decode_num_drafts": 10,
                                                          "vllm:spec_decode_num_accepted_tokens_per_pos": [5, 3]},
                  dispatch={key: 400}),
              rnd(5.0, {"high": 3500, "low": 2000}, dispatch={key: 410}),
              rnd(5.0, {"high": 2500, "low": 2500}, steps=None, spec={"vllm:spec_decode_num_drafts": 5,
                                                                      "vllm:spec_decode_num_accepted_tokens_per_pos": [1, 1, 1]})]
    out = summarise(rounds)
    assert out["tok_per_s_median"] == 1000.0 and out["tok_per_s_min"] == 1000.0 and out["tok_per_s_max"] == 1100.0
    assert out["tok_per_s_spread"] == pytest.approx(0.1)
    assert out["tok_per_s_by_category"]["high"]["median"] == 600.0
    assert out["tok_per_s_by_category"]["low"]["max"] == 500.0
    assert out["mean_step_ms_median"] == pytest.approx(5000.0 / 100)
    assert out["spec"] == {"vllm:spec_decode_num_drafts": 15, "vllm:spec_decode_num_accepted_tokens_per_pos": [6, 4, 1]}
    assert out["dispatch"] == {key: 810}


def test_spec_counters_sum_label_sets_and_vectors():
    metrics = [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=3),
               SimpleNamespace(name="vllm:spec_decode_num_drafts", value=4),
               SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[1, 2]),
               SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[1, 1, 1]),
               SimpleNamespace(name="vllm:num_requests_running", value=9)]
    assert spec_counters(metrics) == {"vllm:spec_decode_num_drafts": 7,
                                      "vllm:spec_decode_num_accepted_tokens_per_pos": [2, 3, 1]}
    assert counter_delta({"a": 10, "v": [3, 4]}, {"a": 4, "v": [1]}) == {"a": 6, "v": [2, 4]}


def test_dispatch_keys_steps_and_modes():
    delta = {dispatch_key(M, 5, "FULL", 5): 90, dispatch_key(M, 5, "PIECEWISE", None): 10,
             dispatch_key(S, 1, "FULL", 1): 400, dispatch_key(S, 5, "FULL", 5): 90}
    assert parse_dispatch_key(dispatch_key(M, 5, "PIECEWISE", None)) == (M, 5, "PIECEWISE", None)
    assert model_steps(delta) == 100
    assert target_modes(delta) == {"FULL|u=5": 90, "PIECEWISE|u=None": 10}
    assert full_share(delta) == pytest.approx(0.9)
    assert full_share({}) is None


def test_mixed_slots_hold_half_of_each_category_and_replacements_keep_it():
    cats = [slot_category("mixed", s, 0, 16) for s in range(16)]
    assert cats.count("high") == cats.count("low") == 8
    assert all(slot_category("mixed", s, g, 16) == cats[s] for s in range(16) for g in range(5))
    assert [slot_category("mixed", 0, g, 1) for g in range(4)] == ["high", "low", "high", "low"]
    assert {slot_category("low", s, g, 4) for s in range(4) for g in range(3)} == {"low"}


class Mode(enum.Enum):
    FULL = 2


class ModelCudaGraphManager:
    """Named like vLLM's target manager: the counter keys by class name."""

    def __init__(self, dql: int) -> None:
        self.decode_query_len = dql
        self._graphs_captured = True
        self._capture_descs = {Mode.FULL: [SimpleNamespace(uniform_token_count=dql)] * 3}


def desc(mode: str, uniform: int | None):
    return SimpleNamespace(cg_mode=SimpleNamespace(name=mode), uniform_token_count=uniform)


def test_dispatch_counter_writes_atomically_at_most_every_interval(tmp_path):
    now = [0.0]
    path = tmp_path / "dispatch.json"
    counter = DispatchCounter(str(path), interval_s=0.5, clock=lambda: now[0], every=4)
    manager = ModelCudaGraphManager(5)
    dispatch = wrap_dispatch(lambda self, *a: desc("FULL", 5), counter)
    for _ in range(4):
        dispatch(manager, 1, 5, 5, 0)
    first = json.loads(path.read_text())
    assert snapshot_meta(first)["seq"] == 1 and snapshot_counts(first) == {dispatch_key(M, 5, "FULL", 5): 4}
    assert snapshot_meta(first)["managers"][0]["captured"] == {"FULL|u=5": 3}
    # flat: a reader that diffs the numeric entries gets exactly the counts
    assert {k for k, v in first.items() if isinstance(v, int)} == {dispatch_key(M, 5, "FULL", 5)}
    for _ in range(4):  # the clock did not move: no write
        dispatch(manager, 1, 5, 5, 0)
    assert snapshot_meta(json.loads(path.read_text()))["seq"] == 1
    now[0] = 0.6
    for _ in range(4):
        dispatch(manager, 1, 5, 5, 0)
    assert json.loads(path.read_text())[dispatch_key(M, 5, "FULL", 5)] == 12
    assert not list(tmp_path.glob("*.tmp"))


def test_dispatch_wrapper_returns_the_descriptor_even_when_counting_fails(tmp_path):
    counter = DispatchCounter(str(tmp_path / "d.json"))
    original = desc("FULL", 5)
    assert wrap_dispatch(lambda self, *a: original, counter)(object()) is original  # no decode_query_len


class FakeLoad:
    """Stands in for SteadyLoad: each step lets the 'worker' publish a snapshot every third step."""

    def __init__(self, path) -> None:
        self.path = path
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps % 3 == 0:
            self.path.write_text(json.dumps({"k|1|FULL|1": self.steps,
                                             META_KEY: {"seq": self.steps // 3, "t_mono": float(self.steps)}}))


def test_dispatch_watch_waits_for_the_next_snapshot(tmp_path):
    path = tmp_path / "d.json"
    load = FakeLoad(path)
    watch = DispatchWatch(str(path))
    assert watch.wait_fresh(load, max_s=2.0)
    seq, steps = watch.seq, watch.counts["k|1|FULL|1"]
    assert watch.wait_fresh(load, max_s=2.0)
    assert watch.seq == seq + 1 and watch.counts["k|1|FULL|1"] == steps + 3 and watch.t_mono == steps + 3


def test_dispatch_watch_gives_up_once_when_nothing_is_counted(tmp_path):
    watch = DispatchWatch(str(tmp_path / "never.json"))
    load = SimpleNamespace(step=lambda: None)
    assert not watch.wait_fresh(load, max_s=0.05)
    assert watch.absent and not watch.wait_fresh(load, max_s=10.0)


class FakeEngine:
    """LLMEngine stand-in: every request commits `per_step` tokens a step (DELTA outputs) and finishes at 128."""

    def __init__(self, per_step: dict[str, int]) -> None:
        self.per_step = per_step
        self.live: dict[str, list] = {}
        self.prompts: list[list[int]] = []
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt, params) -> None:
        self.live[request_id] = [0, params]
        self.prompts.append(prompt["prompt_token_ids"])

    def abort_request(self, ids) -> None:
        self.aborted += ids
        for rid in ids:
            self.live.pop(rid, None)

    def step(self):
        outs = []
        for rid, state in list(self.live.items()):
            length = state[1][1]  # params are (category, max_tokens)
            n = min(self.per_step[rid.split("-")[0]], length - state[0])
            state[0] += n
            done = state[0] >= length
            outs.append(SimpleNamespace(request_id=rid, finished=done, outputs=[SimpleNamespace(token_ids=[7] * n)]))
            if done:
                del self.live[rid]
        return outs


def PARAMS(category, max_tokens):
    return (category, max_tokens)


def _fixed():
    from bench.gpu.steady_plan import WORKLOADS

    return WORKLOADS["fixed"]


FIXED = _fixed()


def test_spread_workload_draws_the_same_lengths_for_every_engine_and_keeps_the_prompts():
    from bench.gpu.steady import SteadyLoad
    from bench.gpu.steady_plan import WORKLOADS, Point

    spread = WORKLOADS["spread"]
    point = Point(label="k4", profile="high", concurrency=8, warmup_s=0)
    runs = []
    for per_step, workload in ((1, spread), (3, spread), (1, FIXED)):  # two engines of different speeds, and fixed
        engine = FakeEngine({"high": per_step, "low": per_step})
        lengths = []
        load = SteadyLoad(engine, vocab=1000, seed=0, workload=workload, prompt_type=dict,
                          params=lambda cat, n, seen=lengths: seen.append(n) or (cat, n))
        load.begin(point)
        for _ in range(3000):
            load.step()
        runs.append((engine.prompts, lengths))
    (p1, l1), (p3, l3), (pf, _lf) = runs
    k = min(len(l1), len(l3))
    assert k > 50
    # the n-th request has the same length (and the same prompt) whatever the engine's speed
    assert l1[:k] == l3[:k]
    assert p1[:k] == p3[:k] == pf[:k]  # prompts do not depend on the workload either
    assert all(spread.output_min <= n <= spread.output_max for n in l1)
    assert len(set(l1)) > 20 and abs(sum(l1) / len(l1) - spread.mean_output) < 15


def test_steady_load_keeps_c_in_flight_counts_per_category_and_switches_points():
    from bench.gpu.steady import SteadyLoad
    from bench.gpu.steady_plan import Point

    engine = FakeEngine({"high": 4, "low": 2})  # both divide 128: every step commits the same
    load = SteadyLoad(engine, vocab=1000, seed=0, workload=FIXED, params=PARAMS,
                      prompt_type=dict)
    load.begin(Point(label="k4", profile="mixed", concurrency=4, warmup_s=0))
    for _ in range(200):
        load.step()
        assert len(engine.live) == 4
        cats = [rid.split("-")[0] for rid in engine.live]
        assert cats.count("high") == cats.count("low") == 2
    assert load.tokens == {"high": 2 * 4 * 200, "low": 2 * 2 * 200}
    assert all(len(p) == 256 and min(p) >= 16 and max(p) < 1000 - 16 for p in engine.prompts)
    first_prompts = engine.prompts[:4]
    load.begin(Point(label="k4", profile="low", concurrency=2, warmup_s=0))
    assert len(engine.aborted) == 4 and len(engine.live) == 2
    assert all(rid.startswith("low-") for rid in engine.live)
    assert load.tokens == {"low": 0}
    # the same point always starts from the same prompts (every engine sees the same prompt set)
    again = SteadyLoad(FakeEngine({"high": 1, "low": 1}), vocab=1000, seed=0, workload=FIXED,
                       params=PARAMS, prompt_type=dict)
    again.begin(Point(label="plain", profile="mixed", concurrency=4, warmup_s=0))
    assert again.llm.prompts == first_prompts


class SnapshotEngine(FakeEngine):
    """FakeEngine whose 'worker' counts one target dispatch per step and publishes every third step."""

    def __init__(self, path) -> None:
        super().__init__({"high": 1, "low": 1})
        self.path = path
        self.forward_steps = 0

    def step(self):
        self.forward_steps += 1
        if self.forward_steps % 3 == 0:
            self.path.write_text(json.dumps({dispatch_key(M, 5, "FULL", 5): self.forward_steps,
                                             META_KEY: {"seq": self.forward_steps // 3,
                                                        "t_mono": 0.01 * self.forward_steps}}))
        return super().step()

    def get_metrics(self):
        return [SimpleNamespace(name="vllm:spec_decode_num_drafts", value=self.forward_steps)]


def test_timed_rounds_start_and_end_on_snapshots_and_chain(tmp_path):
    from bench.gpu.steady import DispatchWatch, SteadyLoad, timed_round
    from bench.gpu.steady_plan import Point

    path = tmp_path / "d.json"
    engine = SnapshotEngine(path)
    load = SteadyLoad(engine, vocab=1000, seed=0, workload=FIXED, params=PARAMS,
                      prompt_type=dict)
    load.begin(Point(label="k4", profile="high", concurrency=2, warmup_s=0))
    watch = DispatchWatch(str(path))
    first, fresh = timed_round(engine, load, watch, round_s=0.02)
    assert fresh and first.model_steps % 3 == 0 and first.model_steps > 0
    assert first.window_s == pytest.approx(0.01 * first.model_steps)
    assert first.mean_step_ms == pytest.approx(10.0)
    assert first.tokens == 2 * first.driver_steps  # 2 requests, one token a step each
    end_of_first = watch.counts[dispatch_key(M, 5, "FULL", 5)]
    second, _ = timed_round(engine, load, watch, round_s=0.02, aligned=True)
    assert watch.counts[dispatch_key(M, 5, "FULL", 5)] - end_of_first == second.model_steps  # no gap between rounds
    assert second.spec["vllm:spec_decode_num_drafts"] == second.driver_steps


@pytest.mark.parametrize(("model", "sent"), [("/models/8b-mimo", {"model": "/models/8b-mimo"}), (None, None)])
def test_the_rows_controller_view_asks_for_the_engines_own_model(monkeypatch, model, sent) -> None:
    """The controller keeps categories per model: a row must show the categories of the model its engine
    serves, not the first model the controller learned (session 13's MTP rows showed the EAGLE-3 engine's)."""
    import httpx

    from bench.gpu.steady import controller_view

    asked: list[tuple[str, object]] = []

    def fake_request(method, url, timeout=None, params=None):
        asked.append((url.rsplit("/v1", 1)[1], params))
        return httpx.Response(200, json={"ok": True})

    monkeypatch.setenv("SPECCTL_CONTROLLER_URL", "http://controller:1")
    monkeypatch.setattr(httpx, "request", fake_request)
    view = controller_view(("high", "low"), model)
    assert view["categories"] == {"high": {"ok": True}, "low": {"ok": True}}
    assert [a for a in asked if a[0].startswith("/categories/")] == [("/categories/high", sent),
                                                                     ("/categories/low", sent)]
