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


def test_goodput_is_capacity_over_tokens_per_committed_token():
    e4 = bm.expected_length("high", 4)
    assert bm.goodput("high", 4, capacity=36000.0, rho=2.0) == pytest.approx(36000.0 / (5 / e4 + 2.0))
    # wider widths verify more tokens per committed token: goodput falls with K when the budget binds
    values = [bm.goodput("mixed", k, 36000.0, 2.0) for k in (1, 2, 4, 7)]
    assert values == sorted(values, reverse=True)


def test_capacity_is_the_budget_over_the_mean_full_step():
    batches = [{"steps": [{"scheduled_tokens": 2048, "interval_s": 0.05}, {"scheduled_tokens": 2040, "interval_s": 0.06},
                          {"scheduled_tokens": 900, "interval_s": 0.02}, {"scheduled_tokens": 2048, "interval_s": 0.07}]},
               {"steps": []}]
    capacity, n = bm.full_step_capacity(batches, 2048)
    assert n == 3 and capacity == pytest.approx(2048 * 3 / (0.05 + 0.06 + 0.07))
    assert bm.full_step_capacity([{"steps": [{"scheduled_tokens": 10, "interval_s": 0.01}]}], 2048) == (0.0, 0)


def row(engine: str, profile: str, c: int, tok: float) -> dict:
    return {"kind": "row", "engine": engine, "profile": profile, "concurrency": c, "tok_per_s_median": tok}


def test_cli_prints_predicted_against_measured_where_the_budget_binds(tmp_path: Path, capsys):
    results, steps = tmp_path / "r.jsonl", tmp_path / "s.jsonl.gz"
    rows = [row("k4", "high", 256, 10951.0), row("k2", "mixed", 256, 10351.0), row("plain", "high", 256, 9513.0),
            row("specctl", "high", 256, 11314.0), {"kind": "engine_error", "engine": "ktable"}]
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(steps, "wt") as fh:
        fh.write(json.dumps({"steps": [{"scheduled_tokens": 2048, "interval_s": 0.0567}]}) + "\n")
    assert bm.main([str(results), "--steps", str(steps)]) == 0
    out = capsys.readouterr().out
    assert "C = 36120 tokens/s" in out
    assert "| k4 | high | 256 | 10788 | 10951 | 1.02 |" in out
    assert "mixed" not in out.split("| engine |")[1] and "plain" not in out and "specctl" not in out
    assert "1 rows where the budget binds" in out


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
