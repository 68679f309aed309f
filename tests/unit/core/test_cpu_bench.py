"""The CPU engine benchmark's own machinery (bench/cpu): workload, measurement, equality, traces, oracle, EMA driver."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.cpu import measure, oracle, report, traces
from bench.cpu.driver import Phase, Record
from bench.cpu.ema_driver import EmaOverrideDriver
from bench.cpu.workload import bench_workload, key
from bench.support.workload import CATEGORIES, build_workload
from specctl_vllm.controller.core.offline import token_traces, whatif
from specctl_vllm.kernel.cost import CostCoefficients


# --- workload ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("per_category", [1, 2, 22])
def test_bench_workload_is_distinct_interleaved_and_keeps_request_shapes(per_category) -> None:
    prompts = bench_workload(per_category)
    assert len(prompts) == per_category * len(CATEGORIES)
    assert len({key(p) for p in prompts}) == len(prompts)
    assert [p.category for p in prompts[: len(CATEGORIES)]] == list(CATEGORIES)
    shape = {p.category: (p.explicit_category, sorted(p.extra), p.max_tokens) for p in build_workload(1)}
    for p in prompts:
        assert (p.explicit_category, sorted(p.extra), p.max_tokens) == shape[p.category]


def test_warm_up_set_is_disjoint_from_the_measured_set() -> None:
    measured = bench_workload(22)
    warm = bench_workload(3, seed=1, exclude={key(p) for p in measured})
    assert not {key(p) for p in warm} & {key(p) for p in measured}


def test_bench_workload_is_deterministic() -> None:
    assert [key(p) for p in bench_workload(5)] == [key(p) for p in bench_workload(5)]


# --- measurement -----------------------------------------------------------------------------------------------
def rec(pid: str, cat: str, tokens: list[int], start: float, end: float, status: int = 200, **kw) -> Record:
    return Record(pid, cat, status, start, end, token_ids=tokens, **kw)


def test_summary_goodput_overall_and_per_category() -> None:
    phase = Phase(2, [rec("a", "x", [1] * 10, 0.0, 2.0), rec("b", "y", [1] * 30, 0.0, 3.0),
                      rec("c", "x", [1] * 10, 2.0, 4.0), rec("d", "y", [], 3.0, 4.0, status=500)], 0.0, 4.0)
    s = measure.summarise(phase)
    assert s.goodput == pytest.approx(50 / 4.0)
    assert s.per_category == {"x": pytest.approx(20 / 4.0), "y": pytest.approx(30 / 3.0)}
    assert (s.requests, s.failed) == (4, 1)


@pytest.mark.parametrize(("ref", "got", "position"), [
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 3], [1, 9, 3], 1),
    ([1, 2, 3], [1, 2], 2),  # a shorter output differs where it stops
    ([1, 2], [1, 2, 3], 2),
])
def test_mismatches_report_the_first_differing_position(ref, got, position) -> None:
    margins = {"p": [(-0.1, -3.0), (-0.5, -0.5004), (-0.2, -2.0)]}
    mm = measure.mismatches([rec("p", "c", ref, 0, 1)], [rec("p", "c", got, 0, 1)], margins)
    if position is None:
        assert mm == []
    else:
        assert [m.position for m in mm] == [position]
        expected = margins["p"][position][0] - margins["p"][position][1] if position < 3 else None
        assert mm[0].margin == (pytest.approx(expected) if expected is not None else None)


# --- traces ------------------------------------------------------------------------------------------------------
def spec(drafted: list[int], accepted: list[int]) -> dict:
    return {"per_step_drafted": drafted, "per_step_accepted": accepted}


def test_engine_histograms_bucket_every_verify_step_by_drafted_length() -> None:
    records = [rec("a", "c", [1], 0, 1, spec=spec([4, 4, 2], [4, 1, 0])), rec("b", "c", [1], 0, 1, spec=None),
               rec("d", "c", [1], 0, 1, spec={"per_step_drafted": None, "per_step_accepted": None})]  # vLLM: no steps
    assert traces.engine_histograms(records) == {"c": {4: [0, 1, 0, 0, 1], 2: [1, 0, 0]}}


@pytest.mark.parametrize(("hists", "expected"), [
    ({2: [0, 0, 10]}, [1.0, 1.0, 0.0]),  # never reached position 3
    ({2: [5, 5, 0]}, [0.5, 0.0, 0.0]),
    ({1: [2, 2], 3: [0, 4, 0, 4]}, [0.8333, 0.5, 1.0]),
])
def test_conditional_acceptance_per_position(hists, expected) -> None:
    assert traces.conditional(hists, 3) == expected


def test_heterogeneity_is_zero_for_identical_requests_and_positive_for_spread() -> None:
    same = [rec(str(i), "c", [1], 0, 1, spec=spec([2] * 40, [1, 0] * 20)) for i in range(6)]
    spread = [rec(str(i), "d", [1], 0, 1, spec=spec([2] * 40, [1] * (4 * i) + [0] * (40 - 4 * i)))
              for i in range(1, 9)]
    h = traces.heterogeneity(same + spread)
    assert h["c"] == 0.0
    assert h["d"] > 0.5


def test_sim_trace_is_loadable_by_the_simulator(tmp_path) -> None:
    from bench.sim.profiles import load

    records = [rec("a", "code", [5, 5, 5, 5], 0, 1, spec=spec([3, 3], [3, 0]), prompt_token_ids=[1, 5, 5]),
               rec("b", "prose", [7, 8, 9], 0, 1, spec=spec([2], [0]), prompt_token_ids=[1, 2])]
    trs = traces.request_traces(records)
    doc = traces.sim_trace(records, trs, lambda t, k: [int(t[-1])] * k, 4, "unit test")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    trace = load(path)
    assert [c.name for c in trace.categories] == ["code", "prose"]
    assert trace.engine_method == "ngram" and trace.model_free_methods == ("suffix",)
    code, prose = trace.categories
    # the simulator reads the histograms with the controller's estimator (prior mean 0.5, weight 1)
    assert code.betas["engine"][0] == pytest.approx(0.5)  # 1 of 2 first drafts accepted
    assert prose.betas["engine"][0] == pytest.approx(0.25)  # 0 of 1


def test_request_traces_round_trip(tmp_path) -> None:
    from specctl_vllm.controller.core.offline.replay import parse_requests

    trs = traces.request_traces([rec("a", "c", [4, 5], 0, 1, prompt_token_ids=[1, 2]), rec("b", "c", [], 0, 1)])
    path = tmp_path / "r.jsonl"
    traces.write_request_traces(path, trs)
    assert parse_requests(path.read_text().splitlines()) == trs


# --- oracle --------------------------------------------------------------------------------------------------------
def test_measured_argmax_picks_each_category_s_best_static_run() -> None:
    per = {"no_spec": {"a": 10.0, "b": 10.0}, "k=2": {"a": 15.0, "b": 9.0}, "k=4": {"a": 14.0, "b": 8.0},
           "specctl": {"a": 99.0, "b": 99.0}}
    assert oracle.measured_argmax(per) == {"a": (2, "ngram"), "b": (0, "off")}


def test_fit_cost_recovers_a_linear_step_cost() -> None:
    work = whatif.Workload({"c": 1000.0}, 500.0, 4.0, 0, 0.0)
    profiles = {"c": {("ngram", k): token_traces.Profile("ngram", k, 1 + 0.5 * k, float(k), "trace") for k in range(1, 9)}}
    a, b = 2e-3, 1e-4
    walls = {}
    for k in (0, 1, 2, 4, 8):
        load = whatif.step_load(work, whatif.uniform(work, profiles, "ngram", k))
        walls[k] = load.steps * (a + b * load.tokens)
    cost, fit = oracle.fit_cost(work, profiles, walls)
    assert (cost.base, cost.per_token) == (pytest.approx(a), pytest.approx(b))
    assert all(r["model_wall_s"] == pytest.approx(r["measured_wall_s"]) for r in fit["runs"].values())
    assert isinstance(cost, CostCoefficients)


def test_model_choice_turns_off_what_does_not_pay() -> None:
    work = whatif.Workload({"copy": 500.0, "chat": 500.0}, 0.0, 8.0, 0, 0.0)
    profiles = {c: {("ngram", k): token_traces.Profile("ngram", k, 1 + sum(b ** i for i in range(1, k + 1)), k, "trace")
                    for k in range(1, 5)} for c, b in (("copy", 0.95), ("chat", 0.02))}
    cost = CostCoefficients(1e-3, 0, 1e-4, 0, 0, 0, 0, 0, 0, 0)
    choice = oracle.model_choice(work, profiles, cost)
    assert choice["chat"] == (0, "off") and choice["copy"][0] >= 1


# --- ratios and targets ------------------------------------------------------------------------------------------
def _ph(g: float, per: dict[str, float]) -> dict:
    return {"goodput": g, "per_category": per, "tokens": 1000}


def _run(g: float, per: dict[str, float], sp: float, sp_per: dict[str, float]) -> dict:
    """A configuration measured at ``g`` while specctl, in the alternating chunks, measured ``sp``."""
    return {"phases": {"8": _ph(g, per)}, "paired_specctl": {"8": _ph(sp, sp_per)}}


def _runs(specctl_scale: float = 1.0) -> dict:
    s = specctl_scale
    return {
        "specctl": {"phases": {"8": _ph(124, {"a": 15, "b": 10.1})}},
        # no_spec ran while the machine was slow (specctl paired at 100): normalised it is 124/100 faster
        "no_spec": _run(80, {"a": 8, "b": 8}, 100 * s, {"a": 12 * s, "b": 8.1 * s}),
        "k=2": _run(120, {"a": 14, "b": 9}, 124 * s, {"a": 15 * s, "b": 10.1 * s}),
        "k=4": _run(110, {"a": 14.5, "b": 8}, 124 * s, {"a": 15 * s, "b": 10.1 * s}),
        "oracle-model": _run(125, {"a": 15, "b": 10}, 124 * s, {"a": 15 * s, "b": 10.1 * s}),
    }


def test_normalised_goodput_removes_the_machine_s_pace() -> None:
    runs = _runs()
    assert report.normalized(runs, "no_spec", "8")["goodput"] == pytest.approx(80 * 124 / 100)
    assert report.normalized(runs, "no_spec", "8")["per_category"]["a"] == pytest.approx(8 * 15 / 12)
    assert report.normalized(runs, "specctl", "8")["goodput"] == 124
    assert report.oracle_name(runs, "8") == "oracle-model"


def test_ratios_are_paired_and_targets_checked() -> None:
    r = report.ratios(_runs(), "8")
    assert r["best_static"] == "k=2"
    assert r["specctl_vs_best_static"] == pytest.approx(124 / 120)
    assert r["specctl_vs_oracle"] == pytest.approx(124 / 125)
    assert r["vs_no_spec"]["specctl"] == pytest.approx(100 / 80)  # paired, not normalised
    assert r["per_category"]["b"]["vs_no_spec"] == pytest.approx(8.1 / 8)
    assert r["per_category"]["a"]["best_static_for_category"] == "k=4"
    assert r["per_category"]["a"]["vs_best_static_for_category"] == pytest.approx(15 / 14.5)
    t = report.check_targets(r)
    assert t["met"] == {"vs_best_static": True, "vs_oracle": True, "vs_no_spec_every_category": True}


def test_targets_missed_when_specctl_trails_in_the_same_minutes() -> None:
    t = report.check_targets(report.ratios(_runs(specctl_scale=0.95), "8"))
    assert t["met"] == {"vs_best_static": False, "vs_oracle": False, "vs_no_spec_every_category": False}


# --- EMA driver (observer only: no controller needed) -------------------------------------------------------------
def _batch(batch_size: int, accepted: list[int], k: int) -> dict:
    return {"steps": [{"batch_size": batch_size, "categories": [
        {"category": "c", "method": "ngram", "requests": batch_size,
         "hists": [{"k": k, "accepted": [accepted.count(j) for j in range(k + 1)]}]}]}]}


def test_ema_driver_drops_to_off_at_batch_8_when_nothing_is_accepted_then_probes() -> None:
    d = EmaOverrideDriver("http://127.0.0.1:9", "t", ["c"], k_max=8)
    for _ in range(15):
        d.observe(_batch(8, [0] * 8, 3))
    assert d.applied == 0  # first re-evaluation after warm-up: 3 -> 1 -> 0 in one go
    for _ in range(5):
        d.observe(_batch(8, [0] * 8, 3))
    assert d.applied == 1  # SGLang probes the next candidate after a zero-step interval
    assert [k for _, k in d.changes] == [3, 0, 1]  # SGLang starts at the configured steps (3)
    assert sum(d.steps_at_k.values()) == 20


def test_ema_driver_climbs_at_batch_1_when_everything_is_accepted() -> None:
    d = EmaOverrideDriver("http://127.0.0.1:9", "t", ["c"], k_max=8)
    for _ in range(16):
        d.observe(_batch(1, [7], 7))
    assert d.applied == 7
    assert np.isclose(sum(d.steps_at_k.values()), 16)


def _phase(tokens, wall, cats):
    """A measured phase: ``cats`` maps category -> (tokens, summed latency)."""
    return {"goodput": tokens / wall, "tokens": tokens, "wall_s": wall,
            "per_category": {c: t / lat for c, (t, lat) in cats.items()},
            "tokens_per_category": {c: t for c, (t, _) in cats.items()}}


def _doc(scale):
    def run(tok, wall):
        return {"phases": {"8": _phase(tok, wall, {"a": (tok / 2, wall), "b": (tok / 2, 2 * wall)})},
                "paired_specctl": {"8": _phase(100 * scale, 10.0, {"a": (50 * scale, 10.0), "b": (50 * scale, 20.0)})}}
    return {"runs": {"specctl": {"phases": {"8": _phase(300 * scale, 30.0, {"a": (150 * scale, 30.0),
                                                                           "b": (150 * scale, 60.0)})}},
                     "no_spec": run(80.0, 10.0), "k=2": run(90.0 * scale, 10.0), "oracle-model": run(95.0, 10.0)}}


def test_pooling_a_run_with_itself_changes_no_ratio_and_keeps_oracles_apart():
    from bench.cpu import pool

    one = report.ratios(_doc(1.0)["runs"], "8")
    runs = pool.pool_runs([_doc(1.0), _doc(1.0)])
    assert set(runs) == {"specctl", "no_spec", "k=2", "oracle-model@1", "oracle-model@2"}
    twice = report.ratios(runs, "8")
    assert twice["specctl_vs"]["k=2"] == pytest.approx(one["specctl_vs"]["k=2"])
    assert twice["per_category"]["a"]["vs_no_spec"] == pytest.approx(one["per_category"]["a"]["vs_no_spec"])
    assert runs["k=2"]["phases"]["8"]["tokens"] == 180.0


def test_pooling_sums_tokens_and_time_before_dividing():
    from bench.cpu import pool

    runs = pool.pool_runs([_doc(1.0), _doc(2.0)])
    # k=2: 90 + 180 tokens over 10 + 10 s; its paired specctl chunks: 100 + 200 tokens over 20 s
    assert runs["k=2"]["phases"]["8"]["goodput"] == pytest.approx(13.5)
    assert report.ratios(runs, "8")["specctl_vs"]["k=2"] == pytest.approx(15.0 / 13.5)


# --- chunk-pair statistics (bench/cpu/stats.py) ---------------------------------------------------------------
def _rec(i: int, start: float, end: float, tokens: int, ok: bool = True) -> Record:
    return Record(f"p-{i}", "prose", 200 if ok else 500, start, end, [], list(range(tokens)))


def test_chunk_figures_take_tokens_and_wall_from_each_chunk_s_records() -> None:
    from bench.cpu import stats

    recs = [_rec(0, 10.0, 12.0, 5), _rec(1, 10.5, 13.0, 7), _rec(2, 20.0, 21.0, 4), _rec(3, 20.0, 24.0, 3, ok=False)]
    assert stats.chunk_figures(recs, 2) == [[12, 3.0], [4, 4.0]]


@pytest.mark.parametrize(("x", "s", "expected"), [
    ([(100, 10.0)], [(100, 5.0)], 2.0),                       # same tokens in half the time
    ([(100, 10.0), (100, 30.0)], [(100, 10.0), (100, 10.0)], 2.0),  # sums first, then the ratio
    ([(100, 10.0)], [(100, 10.0)], 1.0),
])
def test_paired_ratio_is_a_ratio_of_summed_goodputs(x, s, expected) -> None:
    from bench.cpu import stats

    assert stats.paired_ratio(list(zip(x, s))) == pytest.approx(expected)


def test_bootstrap_interval_holds_the_ratio_and_collapses_when_every_pair_agrees() -> None:
    from bench.cpu import stats

    same = [((100, 10.0), (100, 8.0))] * 6
    lo, hi = stats.bootstrap(same)
    assert lo == pytest.approx(1.25) and hi == pytest.approx(1.25)
    noisy = [((100, 10.0), (100, w)) for w in (7.0, 8.0, 9.0, 10.0, 11.0, 8.5)]
    lo, hi = stats.bootstrap(noisy)
    assert lo < stats.paired_ratio(noisy) < hi
    assert all(math.isnan(v) for v in stats.bootstrap(noisy[:1]))  # one pair has no interval


def test_split_best_does_not_let_a_lucky_chunk_pick_and_grade_its_own_winner() -> None:
    from bench.cpu import stats

    # "lucky" beats specctl on its even chunks only (one fast chunk); "steady" is the truly better one.
    lucky = [((100, 5.0), (100, 10.0)), ((100, 12.0), (100, 10.0))]
    steady = [((100, 9.0), (100, 10.0)), ((100, 9.0), (100, 10.0))]
    naive_best = min({"lucky": lucky, "steady": steady}.items(), key=lambda kv: stats.paired_ratio(kv[1]))[0]
    assert naive_best == "lucky"  # the plain maximum picks the lucky run ...
    out = stats.split_best({"lucky": lucky, "steady": steady})
    picks = {h["chosen_on"]: h["best"] for h in out["halves"]}
    assert picks == {"even": "lucky", "odd": "steady"}
    # ... and grades specctl against it on the very chunk that made it look best; the split estimate grades
    # each pick on the other half: lucky's odd chunk (10/12 -> 1.2) and steady's even chunk (0.9).
    assert out["ratio"] == pytest.approx(stats.paired_ratio([lucky[1], steady[0]]))
    assert out["pairs"] == 2


def test_pairs_pool_runs_per_configuration_and_keep_oracles_apart() -> None:
    from bench.cpu import stats

    def doc(w):
        phase = {"chunks": [[100, w]]}
        paired = {"chunks": [[100, 10.0]]}
        return {"runs": {"specctl": {"phases": {"8": {}}},
                         "k=2": {"phases": {"8": phase}, "paired_specctl": {"8": paired}},
                         "oracle-model": {"phases": {"8": phase}, "paired_specctl": {"8": paired}},
                         "no_chunks": {"phases": {"8": {"goodput": 1.0}}, "paired_specctl": {"8": {}}}}}

    pairs = stats.pairs_of([doc(10.0), doc(20.0)], "8")
    assert sorted(pairs) == ["k=2", "oracle-model@1", "oracle-model@2"]
    assert len(pairs["k=2"]) == 2
    res = stats.analyse([doc(10.0), doc(20.0)], "8", draws=200)
    assert res["configurations"]["oracle-model@2"]["ratio"] == pytest.approx(2.0)
    assert res["split_best_static"]["halves"][0]["best"] == "k=2"


def test_stats_cli_refuses_results_without_chunks(tmp_path, capsys) -> None:
    from bench.cpu import stats

    p = tmp_path / "r.json"
    p.write_text(json.dumps({"runs": {"k=2": {"phases": {"8": {"goodput": 1.0}}}}}))
    assert stats.main([str(p)]) == 2
    assert "no chunk figures" in capsys.readouterr().err
    assert stats.main([str(tmp_path / "missing.json")]) == 2
    with pytest.raises(SystemExit) as exc:
        stats.main([str(p), "--level", "1.5"])
    assert exc.value.code == 2


def test_worst_category_counts_the_categories_a_configuration_slows() -> None:
    def phase(prose, json_):
        return {"goodput": prose + json_, "tokens": 100, "per_category": {"prose": prose, "json": json_}}

    runs = {"specctl": {"phases": {"8": phase(9.0, 30.0)}},
            "no_spec": {"phases": {"8": phase(10.0, 10.0)}, "paired_specctl": {"8": phase(9.0, 30.0)}},
            "k=3": {"phases": {"8": phase(8.0, 20.0)}, "paired_specctl": {"8": phase(9.0, 30.0)}}}
    worst = report.worst_categories(runs, "8")
    assert worst["k=3"]["category"] == "prose" and worst["k=3"]["ratio"] == pytest.approx(0.8)
    assert worst["k=3"]["below"] == 1 and worst["specctl"]["ratio"] == pytest.approx(0.9)
    assert "no_spec" not in worst
