"""The sweep's plan per call, child environment, budget check and failure rows (no engine is started)."""

from __future__ import annotations

import json

import pytest

from bench.gpu import steady_plan as plan
from bench.gpu.sweep import (
    REPO,
    child_env,
    env_changes,
    error_row,
    pair_reference,
    parse,
    plan_line,
    should_start,
    sweep_plan,
    timing_of,
)

BY_NAME = {e.name: e for e in plan.engines() + plan.optional_engines()}


def env_for(name: str, tmp_path, **kw):
    url = "http://127.0.0.1:9" if BY_NAME[name].specctl else None
    return child_env(BY_NAME[name], {"PYTHONPATH": "/site"}, dist_dir=tmp_path / "dist",
                     dispatch_file=tmp_path / "d.json", controller_url=url, model_runner="v2", **kw)


def test_static_engines_load_only_the_bench_plugin_and_report_nowhere(tmp_path):
    env = env_for("k4", tmp_path)
    assert env["VLLM_PLUGINS"] == "specctl_bench"
    assert env["SPECCTL_CONTROLLER_URL"] == "off"
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "dist"), str(REPO), "/site"]
    assert json.loads(env["SPECCTL_BENCH_ACCEPT"]) == {"high": 0.85, "low": 0.45}
    assert env["SPECCTL_BENCH_DISPATCH_FILE"] == str(tmp_path / "d.json")
    assert "SPECCTL_BACKPORTS" not in env


def test_ktable_loads_specctl_for_its_backports_with_the_stock_scheduler(tmp_path):
    env = env_for("ktable", tmp_path)
    assert env["VLLM_PLUGINS"] == "specctl,specctl_bench" and env["SPECCTL_BACKPORTS"] == "1"
    assert env["SPECCTL_CONTROLLER_URL"] == "off"
    assert env_for("ktable", tmp_path, backports="drafter_graphs")["SPECCTL_BACKPORTS"] == "drafter_graphs"


def test_specctl_reports_to_the_controller_without_counterfactual_scoring(tmp_path):
    env = env_for("specctl", tmp_path)
    assert env["VLLM_PLUGINS"] == "specctl,specctl_bench"
    assert env["SPECCTL_CONTROLLER_URL"] == "http://127.0.0.1:9"
    assert env["SPECCTL_COUNTERFACTUAL_SHARE"] == "0"


def test_specctl_skip_is_specctl_with_the_drafter_skipped_at_k_0_and_runs_only_when_named(tmp_path):
    from specctl_vllm.engine_patch import backports

    env = env_for("specctl_skip", tmp_path)
    assert env[plan.DRAFT_AT_ZERO_ENV] == "skip" and backports.DRAFT_AT_ZERO_ENV == plan.DRAFT_AT_ZERO_ENV
    assert backports.skip_draft_at_zero(env)
    assert env["SPECCTL_CONTROLLER_URL"] == "http://127.0.0.1:9" and env["SPECCTL_ENGINE_ID"] == "gpu-steady-specctl_skip"
    assert plan.DRAFT_AT_ZERO_ENV not in env_for("specctl", tmp_path)
    assert "specctl_skip" not in [e.name for e, _ in sweep_plan(parse(["--results", "r.jsonl"]), {})]
    named = sweep_plan(parse(["--results", "r", "--only", "specctl_skip", "--profiles", "low",
                              "--concurrency", "64,256"]), {})
    assert [(e.name, [p.key for p in pts]) for e, pts in named] == [
        ("specctl_skip", [("specctl_skip", "low", 64), ("specctl_skip", "low", 256)])]


def test_default_plan_only_premise_and_oracle():
    args = parse(["--results", "r.jsonl"])
    assert [e.name for e, _ in sweep_plan(args, {})] == [e.name for e in plan.engines()]
    assert all(len(points) == 15 for _, points in sweep_plan(args, {}))
    args = parse(["--results", "r.jsonl", "--only", "plain,k4", "--profiles", "mixed", "--concurrency", "1,64"])
    assert [(e.name, [p.key for p in pts]) for e, pts in sweep_plan(args, {})] == [
        ("plain", [("plain", "mixed", 1), ("plain", "mixed", 64)]), ("k4", [("k4", "mixed", 1), ("k4", "mixed", 64)])]
    premise = sweep_plan(parse(["--results", "r.jsonl", "--premise"]), {})
    assert [e.name for e, _ in premise] == ["premise"] and len(premise[0][1]) == 8
    widths = sweep_plan(parse(["--results", "r.jsonl", "--premise", "--premise-profile", "mixed",
                               "--premise-concurrency", "256", "--premise-ks", "0,1,2,4"]), {})
    assert [(p.label, p.profile, p.concurrency) for p in widths[0][1]] == [
        (f"premise-k{k}", "mixed", 256) for k in (0, 1, 2, 4)]
    for bad in ("9", "-1", ""):
        with pytest.raises(SystemExit, match="--premise-ks"):
            sweep_plan(parse(["--results", "r.jsonl", "--premise", "--premise-ks", bad]), {})
    both = sweep_plan(parse(["--results", "r.jsonl", "--premise", "--premise-profile", "mixed,high",
                             "--premise-concurrency", "256", "--premise-ks", "1,2"]), {})
    assert [(p.label, p.profile) for p in both[0][1]] == [("premise-k1", "mixed"), ("premise-k2", "mixed"),
                                                          ("premise-k1", "high"), ("premise-k2", "high")]
    for bad in ("medium", ""):
        with pytest.raises(SystemExit, match="--premise-profile"):
            sweep_plan(parse(["--results", "r.jsonl", "--premise", "--premise-profile", bad]), {})
    rows = {("k4", "high", 1): {"tok_per_s_median": 5.0}, ("plain", "low", 1): {"tok_per_s_median": 2.0}}
    oracle = sweep_plan(parse(["--results", "r.jsonl", "--oracle", "--only", "plain"]), rows)
    assert [e.name for e, _ in oracle] == ["plain", "oracle"] and [p.pins for p in oracle[1][1]] == [
        (("high", 4), ("low", 0))]
    assert [e.name for e, _ in sweep_plan(parse(["--results", "r", "--only", "oracle"]), rows)] == ["oracle"]
    assert [e.name for e, _ in sweep_plan(parse(["--results", "r", "--only", "premise"]), rows)] == ["premise"]


def test_timing_follows_the_options():
    t = timing_of(parse(["--results", "r", "--round-s", "7", "--rounds", "4", "--learn-s", "12"]))
    assert (t.round_s, t.rounds, t.learn_s, t.relearn_s, t.warmup_s) == (7, 4, 12, 8, 8)


@pytest.mark.parametrize("allow_partial, budget_s, expected", [(False, 10_000, True), (False, 200, False),
                                                               (True, 200, True), (True, 50, False)])
def test_an_engine_starts_only_when_its_points_fit(allow_partial, budget_s, expected):
    timing = plan.Timing()
    points = plan.engine_points(BY_NAME["k2"], timing=timing)  # 90 s start + 15 x 21 s
    assert should_start(points, {}, timing, 1000.0 + budget_s, allow_partial, now=1000.0) is expected


def test_error_row_keeps_the_cause(tmp_path):
    log = tmp_path / "ktable.log"
    log.write_text("INFO fine\nWARNING something Error-ish\nAssertionError: 0 < num_reqs <= num_tokens\nbye\n")
    row = error_row(BY_NAME["ktable"], 1, log)
    assert row["kind"] == "engine_error" and row["engine"] == "ktable" and row["rc"] == 1
    assert row["error"] == "AssertionError: 0 < num_reqs <= num_tokens"
    rows, failures = plan.load_results(_write(tmp_path / "r.jsonl", row))
    assert not rows and failures["ktable"]["error"].startswith("AssertionError")


def _write(path, row):
    path.write_text(json.dumps(row) + "\n")
    return path


@pytest.mark.parametrize(("existing", "asked", "refused"), [
    ({"kind": "row", "engine": "k4", "profile": "high", "concurrency": 1}, "spread", True),  # no field: fixed
    ({"kind": "row", "engine": "k4", "profile": "high", "concurrency": 1, "workload": "fixed"}, "fixed", False),
    ({"kind": "row", "engine": "k4", "profile": "high", "concurrency": 1, "workload": "spread"}, "fixed", True),
    ({"kind": "engine_error", "engine": "ktable"}, "spread", False),  # failure rows carry no workload
])
def test_a_results_file_holds_one_workload(tmp_path, capsys, existing, asked, refused):
    from bench.gpu.sweep import main

    results = tmp_path / "r.jsonl"
    results.write_text(json.dumps(existing) + "\n")
    # a zero budget: a call that is not refused plans and then starts nothing
    rc = main(["--results", str(results), "--state-dir", str(tmp_path / "s"), "--budget-s", "0",
               "--workload", asked, "--only", "k4"])
    if refused:
        assert rc == 2 and "needs a results file of its own" in capsys.readouterr().err
    else:
        assert "needs a results file of its own" not in capsys.readouterr().err


@pytest.mark.parametrize(("base", "wanted", "changes"), [
    ({"A": "1", "B": "2"}, {"A": "1", "B": "3"}, {"B": "3"}),
    ({"A": "1", "B": "2"}, {"A": "1"}, {"B": None}),
    ({"A": "1"}, {"A": "1", "C": "4"}, {"C": "4"}),
    ({"A": "1"}, {"A": "1"}, {}),
])
def test_the_reference_gets_only_what_differs_from_the_engine_s_environment(base, wanted, changes):
    assert env_changes(base, wanted) == changes


def test_a_paired_reference_is_a_static_engine():
    assert pair_reference("") is None
    assert pair_reference("plain").name == "plain" and not pair_reference("k4").specctl
    for name in ("specctl_skip", "premise", "no-such-engine"):
        with pytest.raises(SystemExit, match="--pair-with"):
            pair_reference(name)


def test_paired_reference_environment_reports_nowhere_while_the_engine_reports(tmp_path):
    specctl = env_for("specctl_skip", tmp_path)
    plain = child_env(BY_NAME["plain"], {"PYTHONPATH": "/site"}, dist_dir=tmp_path / "dist",
                      dispatch_file=tmp_path / "ref.json", controller_url=None, model_runner="v2")
    changes = env_changes(specctl, plain)
    assert changes["SPECCTL_CONTROLLER_URL"] == "off"
    assert changes["SPECCTL_BENCH_DISPATCH_FILE"] == str(tmp_path / "ref.json")
    assert changes["SPECCTL_DRAFT_AT_ZERO"] is None  # the engine's own setting does not leak into plain


def test_a_pair_must_fit_two_starts_and_each_point_twice():
    timing = plan.Timing()
    points = plan.engine_points(BY_NAME["k2"], timing=timing)[:1]
    one = plan.engine_seconds(points, timing, plan.STARTUP_GUESS_S)
    assert should_start(points, {}, timing, 1000.0 + one + 1, False, now=1000.0, engines=1)
    assert not should_start(points, {}, timing, 1000.0 + one + 1, False, now=1000.0, engines=2)
    assert should_start(points, {}, timing, 1000.0 + 2 * one + 1, False, now=1000.0, engines=2)


@pytest.mark.parametrize("share", ["0", "0.6", "1.0"])
def test_two_engines_cannot_ask_for_more_than_half_the_gpu_each(share, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(["--results", "r.jsonl", "--pair-with", "plain", "--memory-share", share])
    assert exc.value.code == 2
    assert "--memory-share" in capsys.readouterr().err


def test_a_paired_child_gets_the_reference_its_environment_and_its_own_dispatch_file(tmp_path, monkeypatch):
    from bench.gpu import sweep

    started = {}

    def fake_process(name, cmd, env, log, deadline):
        started.update(name=name, cmd=cmd, env=env)
        return 0

    class FakeController:
        def engine_url(self):
            return "http://127.0.0.1:9"

    monkeypatch.setattr(sweep, "run_engine_process", fake_process)
    args = parse(["--results", str(tmp_path / "r.jsonl"), "--state-dir", str(tmp_path / "state"),
                  "--pair-with", "plain", "--memory-share", "0.4"])
    args.state_dir.mkdir()
    engine = BY_NAME["specctl_skip"]
    points = plan.engine_points(engine, ("low",), (64,), timing_of(args))
    assert sweep.run_child(engine, points, args, 1e12, FakeController(), pair_reference("plain")) == 0
    cmd = started["cmd"]
    arg = {flag: cmd[cmd.index(flag) + 1] for flag in ("--pair-engine", "--pair-env", "--pair-dispatch-file",
                                                      "--memory-share")}
    assert json.loads(arg["--pair-engine"])["name"] == "plain"
    assert arg["--memory-share"] == "0.4"
    changes = json.loads(arg["--pair-env"])
    assert changes["SPECCTL_CONTROLLER_URL"] == "off" and changes["VLLM_PLUGINS"] == "specctl_bench"
    assert changes["SPECCTL_BENCH_DISPATCH_FILE"] == arg["--pair-dispatch-file"] != started["env"][
        "SPECCTL_BENCH_DISPATCH_FILE"]
    assert started["env"]["SPECCTL_CONTROLLER_URL"] == "http://127.0.0.1:9"  # the engine under test reports


def test_an_unpaired_child_gets_no_pair_arguments(tmp_path, monkeypatch):
    from bench.gpu import sweep

    started = {}
    monkeypatch.setattr(sweep, "run_engine_process", lambda name, cmd, env, log, deadline: started.update(cmd=cmd))
    args = parse(["--results", str(tmp_path / "r.jsonl"), "--state-dir", str(tmp_path / "state")])
    args.state_dir.mkdir()
    engine = BY_NAME["k2"]
    sweep.run_child(engine, plan.engine_points(engine, ("low",), (64,), timing_of(args)), args, 1e12, None)
    assert not any(a.startswith("--pair") or a == "--memory-share" for a in started["cmd"])


@pytest.mark.parametrize(("engines", "starts", "minutes"), [(1, 1, 4.7), (2, 2, 9.4)])
def test_the_plan_line_counts_both_engines_of_a_paired_child(engines, starts, minutes):
    """4 points of 10 s warm-up and 6 rounds of 3 s, one engine at the 170 s guess: 170 + 4 * 28 = 282 s alone;
    paired, the reference starts too and runs every warm-up and round beside it."""
    timing = plan.Timing(round_s=3.0, rounds=6)
    points = [plan.Point(label="specctl_skip", profile=p, concurrency=c, warmup_s=10.0)
              for p in ("low", "mixed") for c in (64, 256)]
    line = plan_line([(BY_NAME["specctl_skip"], points)], [(BY_NAME["specctl_skip"], points)], {}, timing, 1450.0,
                     engines=engines)
    assert line.startswith(f"planned: full sweep {minutes:.1f} min (4 points, {starts} engine starts at 170 s")
    assert ("paired" in line) == (engines == 2)
    assert line.endswith("budget 24.2 min")
