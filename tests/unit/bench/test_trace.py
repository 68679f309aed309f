"""The day-trace harness: trace parsing, the phase-driven load on a stand-in engine, the figures, the profiles."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from bench.trace import measured
from bench.trace.load import TraceLoad
from bench.trace.run import run_order
from bench.trace.spec import TraceError, load_profiles, parse_profiles, parse_trace, unconditional
from specctl_vllm.controller import trace_stats as stats
from specctl_vllm.controller.traces import pick, request_plan

PHASES = [
    {"name": "low", "duration_s": 2, "concurrency": 2, "mix": {"chat": 1}, "output_tokens": {"min": 3, "max": 3}},
    {"name": "high", "duration_s": 2, "concurrency": 6, "mix": {"json": 3, "chat": 1},
     "output_tokens": {"min": 2, "max": 5}},
]


@pytest.mark.parametrize("phase, message", [
    ({"duration_s": 1, "mix": {"a": 1}}, "exactly one of concurrency"),
    ({"duration_s": 1, "concurrency": 2, "rate_rps": 1, "mix": {"a": 1}}, "exactly one of concurrency"),
    ({"duration_s": 0, "concurrency": 2, "mix": {"a": 1}}, "duration_s: 0 is outside"),
    ({"duration_s": 1, "concurrency": 2.5, "mix": {"a": 1}}, "expected an integer"),
    ({"duration_s": 1, "concurrency": 2, "mix": {}}, "non-empty object"),
    ({"duration_s": 1, "concurrency": 2, "mix": {"Chat-1": 1}}, "lower-case letters"),
    ({"duration_s": 1, "concurrency": 2, "mix": {"a": 0}}, "sum to 0"),
    ({"duration_s": 1, "concurrency": 2, "mix": {"a": 1}, "output_tokens": {"min": 9, "max": 3}}, "min 9 > max 3"),
    ({"duration_s": "x", "concurrency": 2, "mix": {"a": 1}}, "expected a number"),
])
def test_a_bad_phase_is_refused_with_its_reason(phase, message):
    with pytest.raises(TraceError, match=message):
        parse_trace({"phases": [phase]})


def test_every_error_is_reported_at_once():
    with pytest.raises(TraceError) as err:
        parse_trace({"phases": [{"duration_s": -1, "concurrency": 0, "mix": {"a": 1}}]})
    assert "duration_s" in str(err.value) and "concurrency" in str(err.value)


def test_phase_lookup_scaling_and_normalised_mix():
    trace = parse_trace({"name": "t", "phases": PHASES})
    assert trace.duration_s == 4 and trace.categories == ("chat", "json")
    assert [trace.phase_at(t) for t in (0, 1.99, 2.0, 3.99, 4.0)] == [0, 0, 1, 1, None]
    assert dict(trace.phases[1].mix) == {"chat": 0.25, "json": 0.75}
    half = trace.scaled(2.0)
    assert [p.duration_s for p in half.phases] == [1.0, 1.0]
    assert parse_trace(trace.to_json()) == trace


@pytest.mark.parametrize("u, expected", [(0.0, "a"), (0.24, "a"), (0.25, "b"), (0.99, "b"), (1.0, "b")])
def test_pick_follows_cumulative_weights(u, expected):
    assert pick((("a", 0.25), ("b", 0.75)), u) == expected


def test_the_request_stream_is_the_same_for_every_configuration():
    trace = parse_trace({"phases": PHASES})
    a = [request_plan(trace.phases[1], 1, n, seed=7)[:2] for n in range(50)]
    b = [request_plan(trace.phases[1], 1, n, seed=7)[:2] for n in range(50)]
    assert a == b
    assert {c for c, _ in a} == {"chat", "json"} and all(2 <= n <= 5 for _, n in a)


@dataclass
class Out:
    token_ids: list


@dataclass
class Result:
    request_id: str
    outputs: list
    finished: bool


@dataclass
class StandInEngine:
    """One token per request per step; a step advances the fake clock by ``step_s``."""

    clock: list
    step_s: float = 0.01
    left: dict = field(default_factory=dict)
    in_flight: list = field(default_factory=list)
    aborted: list = field(default_factory=list)

    def add_request(self, request_id, prompt, params):
        self.left[request_id] = params

    def step(self):
        self.clock[0] += self.step_s
        self.in_flight.append(len(self.left))
        out = []
        for rid in list(self.left):
            self.left[rid] -= 1
            out.append(Result(rid, [Out([1])], self.left[rid] == 0))
            if self.left[rid] == 0:
                del self.left[rid]
        return out

    def abort_request(self, ids):
        self.aborted += ids
        for rid in ids:
            self.left.pop(rid, None)


def test_the_load_keeps_each_phase_in_flight_and_counts_tokens_per_phase():
    clock = [0.0]
    engine = StandInEngine(clock)
    trace = parse_trace({"phases": PHASES})
    load = TraceLoad(engine, trace, lambda cat, n, length, rng: ("prompt", length), clock=lambda: clock[0],
                     sleep=lambda s: None)
    record = load.run()
    first, second = record["phases"]
    # 200 steps of 10 ms per phase: 2 requests in flight, then 6 (one token each a step)
    assert max(engine.in_flight[:150]) == 2 and max(engine.in_flight[210:]) == 6
    assert first["tokens"] == pytest.approx(2 * 200, abs=4) and second["tokens"] == pytest.approx(6 * 200, abs=12)
    assert set(first["tokens_by_category"]) == {"chat"}
    assert set(second["tokens_by_category"]) == {"chat", "json"}
    assert record["tokens"] == first["tokens"] + second["tokens"]
    assert len(record["samples"]) >= 3 and engine.aborted  # the trace ends with requests in flight


def test_open_loop_arrivals_respect_the_cap():
    clock = [0.0]
    engine = StandInEngine(clock, step_s=0.05)
    trace = parse_trace({"phases": [{"name": "burst", "duration_s": 5, "rate_rps": 100, "max_in_flight": 4,
                                     "mix": {"a": 1}, "output_tokens": {"min": 50, "max": 50}}]})
    TraceLoad(engine, trace, lambda *a: ("p", 50), clock=lambda: clock[0], sleep=lambda s: None).run()
    assert max(engine.in_flight) == 4


def run_row(config, repeat, phase_tokens, seconds=(10.0, 10.0)):
    phases = [{"name": n, "seconds": s, "tokens": t} for n, s, t in zip(("a", "b"), seconds, phase_tokens,
                                                                        strict=True)]
    return {"kind": "trace_run", "trace": "t", "profile": "p", "duration_s": 20.0, "config": config,
            "repeat": repeat, "phases": phases, "tokens": sum(phase_tokens), "seconds": sum(seconds), "samples": []}


def test_oracle_is_each_phases_best_static_and_ratios_are_per_repeat():
    rows = []
    for r in range(3):
        rows += [run_row("k0", r, (1000, 3000)), run_row("k4", r, (2000, 1000)), run_row("specctl", r, (1900, 2900))]
    result = stats.analyse(rows)
    assert result["oracle_choice"] == {"a": "k4", "b": "k0"}
    assert result["oracle"]["median"] == pytest.approx((2000 + 3000) / 20)
    assert result["best_single_static"] == "k0"  # 4000 tokens against k4's 3000
    assert result["ratios"]["specctl/oracle"]["median"] == pytest.approx(4800 / 5000)
    assert result["ratios"]["oracle/best_single_static"]["median"] == pytest.approx(5000 / 4000)
    assert "specctl" in stats.table(result) and "**" in stats.phase_table(result)


def test_adaptive_verification_rows_are_no_static_and_get_their_ratios():
    rows = []
    for r in range(2):
        rows += [run_row("k4", r, (2000, 1000)), run_row("specctl", r, (1900, 2900)), run_row("av", r, (2000, 2000)),
                 run_row("specctl_av", r, (2200, 2200))]
    result = stats.analyse(rows)
    assert result["best_single_static"] == "k4" and set(result["oracle_choice"].values()) == {"k4"}
    assert result["ratios"]["specctl/av"]["median"] == pytest.approx(4800 / 4000)
    assert result["ratios"]["specctl_av/av"]["median"] == pytest.approx(1.1)
    assert result["ratios"]["av/best_single_static"]["median"] == pytest.approx(4000 / 3000)


@pytest.mark.parametrize(("configs", "adaptive", "platform", "problem"), [
    (("specctl", "k0", "k7"), False, "gpu", ""),
    (("av", "specctl_av"), True, "gpu", ""),
    (("av",), False, "gpu", "av needs --adaptive-verification"),
    (("specctl", "av"), True, "gpu", "specctl needs an engine without --adaptive-verification"),
    (("av",), True, "cpu", "needs the GPU platform"),
    (("k2", "fast"), False, "gpu", "unknown configuration 'fast'"),
])
def test_configurations_that_cannot_share_one_engine_are_refused(configs, adaptive, platform, problem):
    from bench.trace.run import config_problem

    found = config_problem(configs, adaptive, platform)
    assert (problem in found and found != "") if problem else found == ""


@pytest.mark.parametrize(("config", "k"), [("specctl", None), ("specctl_av", None), ("av", 7), ("k0", 0), ("k4", 4)])
def test_config_k(config, k):
    from bench.trace.engine_proc import config_k

    assert config_k(config) == k


def test_run_order_interleaves_repeats():
    assert run_order(("s", "a", "b"), 3) == [("s", 0), ("a", 0), ("b", 0), ("b", 1), ("a", 1), ("s", 1),
                                              ("s", 2), ("a", 2), ("b", 2)]


def test_profiles_take_one_rate_or_per_position_rates(tmp_path):
    profiles = parse_profiles({"profiles": {"p": {"categories": {"chat": 0.5, "json": [0.9, 0.8]}}}})
    p = profiles["p"]
    assert p.of("chat") == (0.5,) * 7 and p.of("json") == (0.9,) + (0.8,) * 6
    assert p.envelope() == (0.9,) + (0.8,) * 6
    assert unconditional([0.5, 0.5]) == [0.5, 0.25]
    with pytest.raises(TraceError, match=r"\[1\]"):
        parse_profiles({"profiles": {"p": {"categories": {"chat": [0.5, 1.5]}}}})
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(TraceError, match="not JSON"):
        load_profiles(path)


def test_shipped_trace_and_profiles_are_valid():
    from bench.trace.run import DEFAULT_PROFILES, DEFAULT_TRACE
    from bench.trace.spec import load_trace

    trace = load_trace(DEFAULT_TRACE)
    profiles = load_profiles(DEFAULT_PROFILES)
    assert 500 <= trace.duration_s <= 700
    for name, profile in profiles.items():
        assert all(profile.of(c) is not None for c in trace.categories), name


@pytest.mark.parametrize("hist, reached, accepted", [
    ({"k": 3, "accepted": [2, 0, 0, 0]}, [2, 0, 0], [0, 0, 0]),  # both rejected at position 0
    ({"k": 3, "accepted": [0, 1, 0, 0]}, [1, 1, 0], [1, 0, 0]),  # accepted 0, rejected at 1
    ({"k": 3, "accepted": [0, 0, 0, 1]}, [1, 1, 1], [1, 1, 1]),  # all three accepted
    ({"k": 2, "accepted": [0, 0, 3]}, [3, 3, 0], [3, 3, 0]),
])
def test_measured_rates_count_reached_and_accepted_positions(hist, reached, accepted):
    batches = [{"steps": [{"categories": [{"category": "c", "method": "ngram", "hists": [hist]}]}]}]
    counts = measured.count(batches, positions=3)
    assert counts[("c", "ngram")] == [reached, accepted]


def test_measured_rates_need_evidence():
    assert measured.rates([100, 50, 4], [50, 25, 4], min_reached=20) == [0.5, 0.5, 0.5]
    assert measured.rates([10, 50, 4], [5, 25, 4], min_reached=20) is None


def test_accept_plugin_takes_per_position_rates():
    from bench.gpu.accept_plugin import keep_table, parse_betas

    betas = parse_betas(json.dumps({"a": [0.9, 0.45], "b": 0.45, "bad": [0.5, 2]}))
    assert betas == {"a": (0.9, 0.45), "b": 0.45}
    table = keep_table([0.9, 0.9, 0.9], betas)
    assert list(table["a"]) == pytest.approx([1.0, 0.5, 0.5])
    assert list(table["b"]) == pytest.approx([0.5, 0.5, 0.5])


@pytest.mark.parametrize("samples, expected", [
    # steps at width 2 only between the samples: mean 2, at the earlier sample
    ([{"t": 1.0, "width_steps": {"0": 5}}, {"t": 2.0, "width_steps": {"0": 5, "2": 10}}], ([1.0], [2.0])),
    # 10 steps at 4 and 30 at 0: mean 1; an interval without steps is left out
    ([{"t": 1.0, "width_steps": {"4": 10}}, {"t": 2.0, "width_steps": {"0": 30, "4": 20}},
      {"t": 3.0, "width_steps": {"0": 30, "4": 20}}], ([1.0], [1.0])),
    ([{"t": 1.0}], ([], [])),
])
def test_mean_width_between_samples(samples, expected) -> None:
    from bench.trace.report import mean_widths

    assert mean_widths(samples) == expected


class _Controller:
    def __init__(self) -> None:
        self.params: dict = {}

    def request(self, method, path, params=None, **_):
        self.params = dict(params or {})
        return {"default": {"k": 7, "method": "engine"}, "categories": {"json": {"k": 0, "method": "off"}}}


@pytest.mark.parametrize(("engine", "sent"), [
    ({"model": "m", "spec_k_max": 7, "spec_method": "eagle3", "graph_widths": [0, 1, 2, 4, 7]},
     {"full_cuda_graphs": "true", "graph_widths": [0, 1, 2, 4, 7]}),
    ({"model": "m", "spec_k_max": 4, "spec_method": "ngram", "graph_widths": []},
     {"full_cuda_graphs": "false"}),
])
def test_the_poller_asks_for_the_policy_this_engine_is_served(engine, sent):
    # a graph-shaped engine gets caps per category; asking without its widths reads a per-request-k policy that
    # no engine of the run applies
    from bench.trace.engine_proc import served_policy
    ctl = _Controller()
    assert served_policy(ctl, engine) == {"*": [7, "engine"], "json": [0, "off"]}
    assert {k: ctl.params.get(k) for k in sent} == sent
    assert ("graph_widths" in ctl.params) == bool(engine["graph_widths"])
