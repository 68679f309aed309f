"""Plan, order, resume, budget and oracle choice of the steady-load sweep (no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import steady_plan as plan
from bench.gpu.shapes import model_config


def row(engine: str, profile: str, c: int, tps: float, **extra) -> dict:
    return {"kind": "row", "engine": engine, "profile": profile, "concurrency": c, "tok_per_s_median": tps, **extra}


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_engine_order_and_roles():
    names = [e.name for e in plan.engines()]
    assert names == ["plain", "k1", "k2", "k4", "k7", "ktable", "specctl"]
    by_name = {e.name: e for e in plan.engines()}
    assert by_name["plain"].plugins == ("specctl_bench",)
    assert by_name["k4"].plugins == ("specctl_bench",)
    assert by_name["ktable"].plugins == ("specctl", "specctl_bench") and not by_name["ktable"].specctl
    assert by_name["ktable"].k == 4 and by_name["ktable"].k_table == plan.K_TABLE
    assert by_name["specctl"].k == 7 and by_name["specctl"].specctl


def test_points_run_concurrency_outermost_with_every_profile_inside():
    points = plan.engine_points(plan.engines()[0], concurrency=(1, 4))
    assert [(p.concurrency, p.profile) for p in points] == [
        (1, "high"), (1, "low"), (1, "mixed"), (4, "high"), (4, "low"), (4, "mixed")]


def test_warmups_static_specctl_and_pinned():
    timing = plan.Timing(warmup_s=3, learn_s=10, relearn_s=6, pin_warmup_s=4)
    specctl = next(e for e in plan.engines() if e.specctl)
    assert [p.warmup_s for p in plan.engine_points(specctl, concurrency=(1, 4), timing=timing)] == [10, 6, 6, 6, 6, 6]
    assert {p.warmup_s for p in plan.engine_points(plan.engines()[1], timing=timing)} == {3}
    assert {p.warmup_s for p in plan.premise_points(timing)} == {4}


def test_pending_skips_points_already_measured(tmp_path):
    points = plan.engine_points(plan.engines()[0], concurrency=(1, 4))
    rows, _ = plan.load_results(write_rows(tmp_path / "r.jsonl", [row("plain", "high", 1, 100.0),
                                                                 row("plain", "mixed", 4, 90.0)]))
    left = plan.pending(points, set(rows))
    assert [p.key for p in left] == [("plain", "low", 1), ("plain", "mixed", 1), ("plain", "high", 4),
                                     ("plain", "low", 4)]


def test_load_results_later_rows_win_and_failures_are_kept_apart(tmp_path):
    path = write_rows(tmp_path / "r.jsonl", [row("k4", "high", 1, 100.0), row("k4", "high", 1, 120.0),
                                             {"kind": "engine_error", "engine": "ktable", "error": "boom"}])
    path.write_text(path.read_text() + '{"kind": "row", "engine": "cut sho')  # a line cut by a killed call
    rows, failures = plan.load_results(path)
    assert rows[("k4", "high", 1)]["tok_per_s_median"] == 120.0
    assert failures["ktable"]["error"] == "boom"


def test_planned_duration_is_startup_plus_warmup_and_rounds():
    timing = plan.Timing(round_s=5, rounds=3, warmup_s=3, learn_s=10, relearn_s=6)
    static = plan.engines()[1]
    specctl = plan.engines()[-1]
    layout = [(static, plan.engine_points(static, timing=timing)), (specctl, plan.engine_points(specctl, timing=timing))]
    assert plan.planned_seconds(layout, timing) == pytest.approx((170 + 15 * (3 + 15)) + (170 + 10 + 14 * 6 + 15 * 15))
    assert plan.planned_seconds([(static, [])], timing) == 0  # nothing left: no start either
    with_slack = plan.planned_seconds(layout, timing, slack_s=plan.ROUND_SLACK_S)
    assert with_slack == pytest.approx(plan.planned_seconds(layout, timing) + 30 * 3 * plan.ROUND_SLACK_S)


def test_startup_guess_uses_the_slowest_measured_start():
    assert plan.startup_guess({}) == plan.STARTUP_GUESS_S
    rows = {("a", "high", 1): {"meta": {"startup_s": 40.0}}, ("b", "high", 1): {"meta": {"startup_s": 70.0}}}
    assert plan.startup_guess(rows) == 70.0 + plan.STARTUP_MARGIN_S


def test_best_static_k_includes_plain_and_prefers_shorter_on_ties():
    rows = {("plain", "low", 64): row("plain", "low", 64, 7000.0), ("k1", "low", 64): row("k1", "low", 64, 6000.0),
            ("k4", "high", 64): row("k4", "high", 64, 9000.0), ("k2", "high", 64): row("k2", "high", 64, 9000.0),
            ("specctl", "high", 64): row("specctl", "high", 64, 99999.0)}
    assert plan.best_static_k(rows, "low", 64) == 0
    assert plan.best_static_k(rows, "high", 64) == 2
    assert plan.best_static_k(rows, "high", 1) is None


def test_plain_measured_on_one_profile_stands_for_every_profile_in_the_oracle():
    # the sweep measures plain on high only; at low c = 256 plain (9513) beats every drafting k measured there
    rows = {("plain", "high", 256): row("plain", "high", 256, 9513.0),
            ("k2", "high", 256): row("k2", "high", 256, 11339.0),
            ("k2", "low", 256): row("k2", "low", 256, 9022.0), ("k4", "low", 256): row("k4", "low", 256, 7543.0)}
    assert plan.best_static_k(rows, "low", 256) == 0
    (point,) = plan.oracle_points(rows, concurrency=(256,))
    assert dict(point.pins) == {"high": 2, "low": 0}


def test_oracle_pins_each_category_to_its_own_profile_best():
    rows = {("k4", "high", 1): row("k4", "high", 1, 500.0), ("plain", "high", 1): row("plain", "high", 1, 200.0),
            ("plain", "low", 1): row("plain", "low", 1, 200.0), ("k1", "low", 1): row("k1", "low", 1, 190.0),
            ("k4", "high", 4): row("k4", "high", 4, 1500.0)}  # no low row at c=4: no oracle point there
    (point,) = plan.oracle_points(rows, concurrency=(1, 4))
    assert point.key == ("oracle", "mixed", 1)
    assert dict(point.pins) == {"high": 4, "low": 0}


def test_premise_points_pin_every_category_at_k():
    points = plan.premise_points()
    assert [(p.label, p.concurrency) for p in points[:4]] == [("premise-k0", 1), ("premise-k2", 1),
                                                              ("premise-k4", 1), ("premise-k7", 1)]
    assert all(dict(p.pins) == {"high": int(p.label.split("-k")[1])} for p in points)
    assert {p.concurrency for p in points} == set(plan.PREMISE_CONCURRENCY)
    mixed = plan.premise_points(ks=(0, 1), concurrency=(256,), profile="mixed")
    assert [(p.label, p.profile, p.concurrency) for p in mixed] == [("premise-k0", "mixed", 256),
                                                                    ("premise-k1", "mixed", 256)]
    assert dict(mixed[1].pins) == {"high": 1, "low": 1}


def test_engine_and_point_survive_json():
    for engine in (*plan.engines(), *plan.optional_engines(), plan.ORACLE_ENGINE):
        assert plan.SteadyEngine.from_json(engine.to_json()) == engine
    point = plan.oracle_points({("k4", "high", 1): row("k4", "high", 1, 1.0),
                                ("plain", "low", 1): row("plain", "low", 1, 1.0)}, concurrency=(1,))[0]
    from dataclasses import asdict

    assert plan.Point.from_dict(json.loads(json.dumps(asdict(point)))) == point


def test_engine_kwargs_eagle3_synthetic_at_the_high_rates(tmp_path):
    by_name = {e.name: e for e in plan.engines()}
    kw = plan.engine_kwargs(by_name["specctl"], tmp_path / "t", tmp_path / "d")
    spec = kw["speculative_config"]
    assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 7
    assert spec["rejection_sample_method"] == "synthetic"
    assert spec["synthetic_acceptance_rates"] == pytest.approx([0.85 ** (i + 1) for i in range(7)], abs=1e-6)
    assert kw["scheduler_cls"] == plan.SPECCTL_SCHEDULER
    assert (kw["max_num_seqs"], kw["max_model_len"], kw["disable_log_stats"]) == (256, 256 + 224 + 64, False)
    assert "async_scheduling" not in kw and "compilation_config" not in kw  # vLLM's defaults
    table = plan.engine_kwargs(by_name["ktable"], tmp_path, tmp_path)["speculative_config"]
    assert table["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 64, 2], [65, 256, 0]]
    assert "scheduler_cls" not in plan.engine_kwargs(by_name["ktable"], tmp_path, tmp_path)
    assert plan.engine_kwargs(by_name["plain"], tmp_path, tmp_path)["speculative_config"] is None
    assert "rejection_sample_method" not in plan.engine_kwargs(by_name["k2"], tmp_path, tmp_path,
                                                               synthetic=False)["speculative_config"]


def test_eagle3_head_config_matches_the_target():
    head, target = model_config("8b", "eagle3"), model_config("8b", "target")
    assert head["architectures"] == ["LlamaForCausalLMEagle3"]
    assert head["num_hidden_layers"] == 1
    assert (head["hidden_size"], head["vocab_size"]) == (target["hidden_size"], target["vocab_size"]) == (4096, 128256)
    assert head["num_attention_heads"] == target["num_attention_heads"]
    assert model_config("8b", "draft")["architectures"] == ["LlamaForCausalLM"]  # the old draft shape is kept


def test_code_digest_changes_with_the_sources(tmp_path):
    (tmp_path / "controller").mkdir()
    (tmp_path / "controller" / "a.py").write_text("x = 1\n")
    first = plan.code_digest(tmp_path)
    (tmp_path / "controller" / "a.py").write_text("x = 2\n")
    assert plan.code_digest(tmp_path) != first


@pytest.mark.parametrize("shape", ["8b", "tiny"])
def test_other_drafters_configs_fit_the_target(shape):
    """vLLM 0.26's constraints (read from its sources): MiMo's MTP layer on a Qwen2-typed target; DFlash and DSpark
    drafts of the target's width and vocabulary, reading hidden states after layer id + 1 (inside the target),
    a mask token inside the vocabulary, and for DSpark as many layer ids as layers."""
    target = model_config(shape, "target")
    mimo = model_config(shape, "mimo")
    assert mimo["architectures"] == ["MiMoForCausalLM"] and mimo["model_type"] == "qwen2"
    assert mimo["num_nextn_predict_layers"] == 1 and mimo["num_hidden_layers"] == target["num_hidden_layers"]
    for role, arch in (("dflash", "DFlashDraftModel"), ("dspark", "Qwen3DSparkModel")):
        draft = model_config(shape, role)
        assert draft["architectures"] == [arch] and draft["model_type"] == "qwen3"
        assert (draft["hidden_size"], draft["vocab_size"]) == (target["hidden_size"], target["vocab_size"])
        assert draft["target_hidden_size"] == target["hidden_size"]
        assert draft["head_dim"] * draft["num_attention_heads"] == draft["hidden_size"]
        mask = draft["dflash_config"]["mask_token_id"] if role == "dflash" else draft["mask_token_id"]
        ids = draft["dflash_config"]["target_layer_ids"] if role == "dflash" else draft["target_layer_ids"]
        assert 0 <= mask < target["vocab_size"]
        assert all(0 <= i and i + 1 < target["num_hidden_layers"] for i in ids)
        if role == "dspark":
            assert len(ids) == draft["num_hidden_layers"] and draft["markov_rank"] > 0


def test_drafter_smoke_engines_start_their_own_drafter(tmp_path):
    from bench.gpu.steady import model_dirs

    by_name = {e.name: e for e in plan.optional_engines()}
    for d in plan.SMOKE_DRAFTERS:
        static, specctl = by_name[f"{d}_k4"], by_name[f"{d}_specctl"]
        assert (static.k, static.specctl, static.drafter) == (4, False, d)
        assert (specctl.k, specctl.specctl, specctl.drafter) == (7, True, d)
        target, draft = model_dirs(tmp_path, "8b", d)
        spec = plan.engine_kwargs(static, target, draft)["speculative_config"]
        assert spec["method"] == d and spec["model"] == str(draft)  # not the sweep's --draft-method
        assert len(spec["synthetic_acceptance_rates"]) == 4
        assert json.loads((target / "config.json").read_text())["architectures"] == (
            ["MiMoForCausalLM"] if d == "mtp" else ["LlamaForCausalLM"])
        if d == "mtp":
            assert draft == target  # the MTP layer lives in the target's folder
        else:
            assert d in draft.name  # vLLM re-detects the method from the folder name: it must find the same
            assert "eagle" not in str(draft) and "eagle" not in str(target)
    assert dict(by_name["mtp_specctl"].env) == {plan.DRAFT_AT_ZERO_ENV: "skip"}
    assert not by_name["dflash_specctl"].env  # the skip wrapper covers autoregressive drafters only
    eagle = plan.engine_kwargs(plan.engines()[1], *model_dirs(tmp_path, "8b", "eagle3"))["speculative_config"]
    assert eagle["method"] == "eagle3" and eagle["model"].endswith("8b-eagle3")


@pytest.mark.parametrize(("name", "scheduler", "plugins"), [
    ("av", False, ("specctl_bench",)),
    ("specctl_av", True, ("specctl", "specctl_bench")),
])
def test_adaptive_verification_engines_enable_vllm_s_budget_at_k_max(tmp_path, name, scheduler, plugins):
    engine = {e.name: e for e in plan.optional_engines()}[name]
    kw = plan.engine_kwargs(engine, tmp_path / "t", tmp_path / "d")
    spec = kw["speculative_config"]
    assert spec["enable_adaptive_verification"] is True and spec["num_speculative_tokens"] == plan.SPECCTL_K_MAX
    assert spec["rejection_sample_method"] == "synthetic"  # acceptance still set per category by the plugin
    assert ("scheduler_cls" in kw) is scheduler and engine.plugins == plugins
    assert plan.SteadyEngine.from_json(engine.to_json()) == engine


def test_no_other_engine_enables_adaptive_verification(tmp_path):
    for engine in (*plan.engines(), *plan.optional_engines()):
        spec = plan.engine_kwargs(engine, tmp_path, tmp_path)["speculative_config"] or {}
        assert ("enable_adaptive_verification" in spec) == (engine.name in ("av", "specctl_av"))
