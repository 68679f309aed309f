"""The token-budget model of a steady point against static rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.gpu import budget_model as bm


def test_expected_length_of_mixed_averages_its_categories():
    assert bm.expected_length("high", 0) == 1.0
    assert bm.expected_length("high", 2) == pytest.approx(1 + 0.85 + 0.85**2)
    assert bm.expected_length("mixed", 1) == pytest.approx((1.85 + 1.45) / 2)


@pytest.mark.parametrize(
    ("profile", "k", "c", "binds"),
    [
        ("high", 2, 256, True),  # 256 * (3 + 2 * 2.57) = 2085 tokens a step would need
        ("mixed", 2, 256, False),  # 256 * (3 + 2 * 2.11) = 1850
        ("high", 7, 64, False),  # 64 * (8 + 2 * 4.84) = 1131
        ("low", 7, 256, True),
    ],
)
def test_the_budget_binds_where_the_uncapped_step_exceeds_it(profile, k, c, binds):
    assert bm.binds(profile, k, c, rho=2.0, budget=2048) is binds


def test_goodput_is_capacity_over_tokens_per_committed_token_where_the_width_fills_the_budget():
    e4 = bm.expected_length("high", 4)
    pure = bm.StepCost(capacity=36000.0, fixed_s=0.0, full_steps=1, steps=1).budget(2048, 2.0)
    assert bm.goodput("high", 4, pure) == pytest.approx(36000.0 / (5 / e4 + 2.0))
    # with no fixed cost wider widths only verify more tokens per committed token: goodput falls with K
    values = [bm.goodput("mixed", k, pure) for k in (0, 1, 2, 4, 7)]
    assert values == sorted(values, reverse=True)
    # with the fixed cost session 5 measured, K2 is the best width of every profile but low (K1)
    s5 = bm.StepCost(capacity=36185.0, fixed_s=0.010, full_steps=1, steps=1).budget(2048, 2.0)
    best = {p: max((1, 2, 4, 7), key=lambda k, p=p: bm.goodput(p, k, s5)) for p in ("high", "low", "mixed")}
    assert best == {"high": 2, "low": 1, "mixed": 2}


def test_step_cost_is_the_engine_estimator_over_large_batches():
    steps = [{"scheduled_tokens": 2048, "interval_s": 0.0565, "batch_size": 200},
             {"scheduled_tokens": 2040, "interval_s": 0.0565, "batch_size": 200},
             {"scheduled_tokens": 1024, "interval_s": 0.010 + 0.0465 / 2, "batch_size": 250},
             {"scheduled_tokens": 300, "interval_s": 0.5, "batch_size": 64},  # a small batch: another regime
             {"scheduled_tokens": 2048, "batch_size": 200}]  # no interval: not timed
    cost = bm.step_cost([{"steps": steps}, {"steps": []}], 2048)
    assert cost.full_steps == 2 and cost.steps == 3
    assert cost.capacity == pytest.approx(2048 / 0.0565)
    assert cost.fixed_s == pytest.approx(0.010, abs=3e-4)
    assert bm.step_cost([{"steps": [{"scheduled_tokens": 10, "interval_s": 0.01}]}], 2048).full_steps == 0


def row(engine: str, profile: str, c: int, tok: float) -> dict:
    return {"kind": "row", "engine": engine, "profile": profile, "concurrency": c, "tok_per_s_median": tok}


def test_cli_prints_predicted_against_measured_where_the_engine_uses_the_model(tmp_path: Path, capsys):
    results, steps = tmp_path / "r.jsonl", tmp_path / "s.jsonl.gz"
    rows = [row("k4", "high", 256, 10951.0), row("k2", "high", 256, 11339.0), row("k2", "mixed", 256, 10351.0),
            row("k7", "high", 64, 8941.0), row("plain", "high", 256, 9513.0), row("specctl", "high", 256, 11314.0),
            {"kind": "engine_error", "engine": "ktable"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(steps, "wt") as fh:
        fh.write(json.dumps({"steps": [{"scheduled_tokens": 2048, "interval_s": 0.0567, "batch_size": 220}]}) + "\n")
    assert bm.main([str(results), "--steps", str(steps)]) == 0
    out = capsys.readouterr().out
    assert "C = 36120 tokens/s" in out and "a_0 = 0.0 ms, a_K = a_0 + 0.0 + 0.00 K ms for K >= 1" in out
    assert "| k4 | high | 256 | yes | 10788 | 10951 | 1.02 |" in out
    assert "| k2 | mixed | 256 | no |" in out  # the engine prices it with the model though it does not fill
    assert "c = 64" not in out and "| 64 |" not in out  # 64 requests: no width fills the budget
    assert "plain" not in out and "specctl" not in out
    assert "3 rows where the engine prices widths with the model" in out
    assert "high c=256: model k2, measured k2 (same)" in out


def test_cli_refuses_missing_files_and_steps_without_a_full_one(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as missing:
        bm.main([str(tmp_path / "none.jsonl"), "--steps", str(tmp_path / "none.gz")])
    assert missing.value.code == 2 and "no such file" in capsys.readouterr().err
    results, steps = tmp_path / "r.jsonl", tmp_path / "s.jsonl.gz"
    results.write_text(json.dumps(row("k4", "high", 256, 1.0)) + "\n")
    with gzip.open(steps, "wt") as fh:
        fh.write(json.dumps({"steps": [{"scheduled_tokens": 100, "interval_s": 0.01}]}) + "\n")
    with pytest.raises(SystemExit) as empty:
        bm.main([str(results), "--steps", str(steps)])
    assert empty.value.code == 2 and "no step filled" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bm.main([str(results), "--steps", str(steps), "--budget", "0"])
