"""Per-point widths of the specctl engine from its recorded telemetry batches."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.gpu import steady_widths as sw


def step(t: float, *, width: int | None = None, depth: int = 0, prefill: int = 0, batch: int = 4,
         tokens: int = 20) -> dict:
    out = {"t": t, "prefill_tokens": prefill, "draft_depth": depth, "batch_size": batch, "scheduled_tokens": tokens}
    if width is not None:
        out["width"] = width
    return out


def write(tmp_path: Path, rows: list[dict], batches: list[dict]) -> tuple[Path, Path]:
    results, steps = tmp_path / "r.jsonl", tmp_path / "s.jsonl.gz"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(steps, "wt") as fh:
        fh.write("".join(json.dumps(b) + "\n" for b in batches))
    return results, steps


def row(profile: str, c: int, time: float, engine: str = "specctl") -> dict:
    return {"kind": "row", "engine": engine, "profile": profile, "concurrency": c, "tok_per_s_median": 100.0,
            "time": time}


def test_steps_are_assigned_to_the_row_whose_window_holds_them(tmp_path):
    # engine clock 10..; the batch was sent at wall 1000 with its last step at engine t = 13, so t = 10 is 997
    first = {"sent_at": 1000.0, "steps": [step(10.0, width=2), step(11.0, width=2), step(12.0, width=4),
                                          step(13.0, depth=4, prefill=300, tokens=2048, batch=200)]}
    # a later point: 100 s after
    second = {"sent_at": 1100.0, "steps": [step(112.0, width=0), step(113.0, width=0)]}
    results, steps = write(tmp_path, [row("high", 4, 1000.5), row("low", 4, 1100.5), row("high", 4, 1000.5, "k7")],
                           [second, {"sent_at": 999.0, "steps": []}, first])
    rows, times, recorded = sw.load(results, steps, "specctl")
    assert [r["profile"] for r in rows] == ["high", "low"] and times == sorted(times)
    high, low = (sw.point_steps(r, times, recorded) for r in rows)
    assert high.steps == 4 and high.prompt_share == pytest.approx(0.25)
    assert high.decode_widths == pytest.approx({2: 2 / 3, 4: 1 / 3})
    assert high.prompt_depths == {4: 1.0}
    assert high.mean_tokens == pytest.approx((20 * 3 + 2048) / 4)
    assert low.steps == 2 and low.decode_widths == {0: 1.0} and low.prompt_depths == {}


def test_a_window_without_steps_renders_dashes(tmp_path):
    results, steps = write(tmp_path, [row("mixed", 256, 5000.0)], [{"sent_at": 10.0, "steps": [step(1.0, width=7)]}])
    rows, times, recorded = sw.load(results, steps, "specctl")
    text = sw.render([sw.point_steps(rows[0], times, recorded)])
    assert "| mixed | 256 | 100 | 0 (0%) | - | - | 0 | 0 |" in text


def test_cli_refuses_missing_files_and_engines_without_rows(tmp_path, capsys):
    with pytest.raises(SystemExit) as missing:
        sw.main([str(tmp_path / "none.jsonl"), str(tmp_path / "none.gz")])
    assert missing.value.code == 2 and "no such file" in capsys.readouterr().err
    results, steps = write(tmp_path, [row("high", 1, 10.0, "k7")], [])
    with pytest.raises(SystemExit) as empty:
        sw.main([str(results), str(steps)])
    assert empty.value.code == 2 and "no specctl rows" in capsys.readouterr().err


def test_step_intervals_are_binned_by_the_tokens_each_step_carried(tmp_path, capsys):
    def timed(t: float, tokens: int, interval: float, width: int = 2) -> dict:
        return {**step(t, width=width, tokens=tokens, batch=256), "interval_s": interval}

    batch = {"sent_at": 1000.0, "steps": [timed(10.0, 2048, 0.056), timed(11.0, 2000, 0.058), timed(12.0, 700, 0.044),
                                          timed(13.0, 600, 0.040), timed(14.0, 650, 0.048), step(14.5, tokens=30)]}
    results, steps = write(tmp_path, [row("low", 256, 1000.5), row("low", 64, 1000.5)], [batch])
    rows, times, recorded = sw.load(results, steps, "specctl")
    window = sw.window_of(rows[0], times, recorded)
    # the step without an interval (the first of a batch the engine timed) is left out
    assert sw.interval_by_tokens(window, 256) == {512: (3, pytest.approx(0.044)), 1792: (1, 0.058),
                                                  2048: (1, 0.056)}
    assert sw.main([str(results), str(steps), "--by-tokens", "1024"]) == 0
    out = capsys.readouterr().out
    assert "| low | 256 | 100 | K0 17% K2 83% | 0: 44.0 (3) 1024: 58.0 (1) 2048: 56.0 (1) |" in out
    assert "| low | 64 |" not in out  # below --min-concurrency
    with pytest.raises(SystemExit):
        sw.main([str(results), str(steps), "--by-tokens", "-1"])


def test_goodput_by_width_counts_each_decoding_request_and_its_accepted_drafts(tmp_path, capsys):
    def timed(t: float, width: int | None, interval: float, *, drafts: int, prefill: int = 0,
              accepted: list[int] | None = None) -> dict:  # 4 requests; a step commits one token each + accepted
        out = {**step(t, width=width, prefill=prefill, batch=4, tokens=4 + drafts + prefill),
               "draft_tokens": drafts, "interval_s": interval, "wall_s": interval}
        out["categories"] = [{"category": "low", "method": "eagle3", "requests": 4,
                              "hists": [{"k": 2, "accepted": accepted}] if accepted else []}]
        return out

    batch = {"sent_at": 1000.0, "steps": [
        timed(10.0, 0, 0.010, drafts=0),  # 4 requests, 1 token each
        timed(11.0, 0, 0.010, drafts=0),
        timed(12.0, 2, 0.020, drafts=8, accepted=[1, 2, 1]),  # 4 + (0 + 2 + 2) accepted
        timed(13.0, None, 0.060, drafts=4, prefill=500, accepted=[2, 0, 0]),  # mixed widths, a prompt chunk
        step(14.0, width=0),  # untimed: left out
    ]}
    results, steps = write(tmp_path, [row("low", 64, 1000.5)], [batch])
    rows, times, recorded = sw.load(results, steps, "specctl")
    by = sw.goodput_by_width(sw.window_of(rows[0], times, recorded))
    assert by["K0"] == (pytest.approx(8 / 0.020), pytest.approx(0.2))
    assert by["K2"] == (pytest.approx(8 / 0.020), pytest.approx(0.2))
    assert by["mixed"] == (pytest.approx(4 / 0.060), pytest.approx(0.6))
    assert sw.main([str(results), str(steps), "--goodput"]) == 0
    assert "| low | 64 | 100 | K0: 400 (20%) K2: 400 (20%) mixed: 67 (60%) |" in capsys.readouterr().out
