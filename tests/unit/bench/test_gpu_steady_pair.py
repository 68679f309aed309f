"""Paired rounds: two engines on one GPU measured in turns, the idle one paused with its requests kept."""

from __future__ import annotations

import argparse
import os

import pytest

from bench.gpu import steady
from bench.gpu import steady_plan as plan
from bench.gpu.steady_stats import Round


@pytest.mark.parametrize(("i", "first"), [(0, 0), (1, 1), (2, 0), (3, 1)])
def test_rounds_alternate_which_engine_goes_first(i, first) -> None:
    assert steady.round_order(i)[0] == first
    assert sorted(steady.round_order(i)) == [0, 1]


@pytest.mark.parametrize(("test", "reference", "median", "low", "high"), [
    ([100, 90, 110], [100, 100, 100], 1.0, 0.9, 1.1),
    ([100, 120], [100, 100], 1.1, 1.0, 1.2),       # even count: the middle two averaged
    ([100, 50], [0, 100], 0.5, 0.5, 0.5),          # a reference round with no tokens gives no ratio
])
def test_each_pair_of_rounds_gives_one_ratio(test, reference, median, low, high) -> None:
    got = steady.pair_summary([{"tok_per_s": t} for t in test], [{"tok_per_s": r} for r in reference], "plain")
    assert got["engine"] == "plain"
    assert (got["ratio_median"], got["ratio_min"], got["ratio_max"]) == pytest.approx((median, low, high))


def test_no_pairs_no_ratio() -> None:
    got = steady.pair_summary([], [], "plain")
    assert (got["ratio_median"], got["ratio_min"], got["ratio_max"], got["ratios"]) == (None, None, None, [])


def test_the_reference_starts_in_its_own_environment_and_the_driver_gets_its_own_back(monkeypatch) -> None:
    monkeypatch.setenv("SPECCTL_BENCH_A", "a")
    monkeypatch.setenv("SPECCTL_BENCH_GONE", "x")
    with steady.environment({"SPECCTL_BENCH_A": "b", "SPECCTL_BENCH_GONE": None, "SPECCTL_BENCH_NEW": "n"}):
        assert (os.environ["SPECCTL_BENCH_A"], os.environ.get("SPECCTL_BENCH_GONE"),
                os.environ["SPECCTL_BENCH_NEW"]) == ("b", None, "n")
    assert (os.environ["SPECCTL_BENCH_A"], os.environ["SPECCTL_BENCH_GONE"]) == ("a", "x")
    assert "SPECCTL_BENCH_NEW" not in os.environ


class Core:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def call_utility(self, method: str, *args) -> None:
        self.log.append((self.name, method, args))


class Engine:
    def __init__(self, name: str, log: list) -> None:
        self.engine_core = Core(name, log)


class Load:
    """Counts what the driver asks of the load; a warm-up adds 10 tokens a second."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log
        self.tokens: dict[str, int] = {}
        self.workload = plan.WORKLOADS[plan.DEFAULT_WORKLOAD]

    def begin(self, point) -> None:
        self.log.append((self.name, "begin", point.label))

    def run_for(self, seconds: float) -> None:
        self.tokens = {"low": int(10 * seconds)}
        self.log.append((self.name, "warm-up", seconds))


def test_one_engine_runs_at_a_time_in_alternating_order_and_the_rows_say_who_was_paired(monkeypatch) -> None:
    log: list = []
    rates = {"test": iter([90.0, 100.0, 95.0]), "ref": iter([100.0, 100.0, 100.0])}

    def fake_round(llm, load, watch, round_s, aligned=False):
        name = llm.engine_core.name
        assert log[-1] == (name, "resume_scheduler", ())  # only the engine just resumed is measured
        log.append((name, "round"))
        rate = next(rates[name])
        return Round(seconds=1.0, tokens=int(rate), tokens_by_category={"low": int(rate)}, driver_steps=10,
                     model_steps=None, window_s=None, spec={}, dispatch={}), True

    monkeypatch.setattr(steady, "timed_round", fake_round)
    sides = [steady.Side(engine=plan.PREMISE_ENGINE, llm=Engine("test", log), load=Load("test", log), watch=None,
                         meta={}),
             steady.Side(engine=plan.SteadyEngine(name=plan.PLAIN, k=0), llm=Engine("ref", log),
                         load=Load("ref", log), watch=None, meta={})]
    point = plan.Point(label="premise-k0", profile="low", concurrency=64, warmup_s=2.0, pins=(("low", 0),))
    args = argparse.Namespace(rounds=3, round_s=1.0, name="premise")
    test_row, ref_row = steady.measure_pair(sides, point, args, 0)
    measured = [entry[0] for entry in log if entry[1:] == ("round",)]
    assert measured == ["test", "ref", "ref", "test", "test", "ref"]
    # every resume is followed by that engine's work and then its pause: never two engines running
    running = None
    for entry in log:
        if entry[1] == "resume_scheduler":
            assert running is None
            running = entry[0]
        elif entry[1] == "pause_scheduler":
            assert entry == (running, "pause_scheduler", ("keep", False))
            running = None
        else:
            assert entry[0] == running
    assert (test_row["engine"], ref_row["engine"], ref_row["pins"], ref_row["paired_with"]) == (
        "premise-k0", "plain", {}, "premise-k0")
    assert test_row["pair"]["ratios"] == pytest.approx([0.9, 1.0, 0.95])
    assert test_row["pair"]["ratio_median"] == pytest.approx(0.95)
    assert test_row["warmup_tokens"] == 20 and test_row["tok_per_s_median"] == pytest.approx(95.0)


def test_with_profiling_each_engine_is_profiled_alone_after_the_rounds(monkeypatch) -> None:
    log: list = []

    def fake_round(llm, load, watch, round_s, aligned=False):
        log.append((llm.engine_core.name, "round"))
        return Round(seconds=1.0, tokens=100, tokens_by_category={"low": 100}, driver_steps=10, model_steps=None,
                     window_s=None, spec={}, dispatch={}), True

    def fake_profile(llm, load, point, steps):
        assert log[-1] == (llm.engine_core.name, "resume_scheduler", ())
        log.append((llm.engine_core.name, "profile", point.label, steps))

    monkeypatch.setattr(steady, "timed_round", fake_round)
    monkeypatch.setattr(steady, "profile_point", fake_profile)
    monkeypatch.setenv(steady.PROFILE_DIR_ENV, "/p")
    monkeypatch.setenv(steady.PROFILE_STEPS_ENV, "7")
    sides = [steady.Side(engine=plan.PREMISE_ENGINE, llm=Engine("test", log), load=Load("test", log), watch=None,
                         meta={}),
             steady.Side(engine=plan.SteadyEngine(name=plan.PLAIN, k=0), llm=Engine("ref", log),
                         load=Load("ref", log), watch=None, meta={})]
    point = plan.Point(label="premise-k0", profile="low", concurrency=64, warmup_s=1.0)
    rows = steady.measure_pair(sides, point, argparse.Namespace(rounds=2, round_s=1.0, name="premise"), 0)
    profiled = [entry for entry in log if entry[1] == "profile"]
    assert profiled == [("test", "profile", "premise-k0", 7), ("ref", "profile", "plain", 7)]
    assert log.index(profiled[0]) > max(i for i, e in enumerate(log) if e[1] == "round")
    assert [row["profiled_steps"] for row in rows] == [7, 7]
