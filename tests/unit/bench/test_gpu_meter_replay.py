"""The engine's token-budget meter replayed over recorded steps, in the order they ran."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench.gpu import meter_replay as mr
from bench.gpu.steady_widths import load

# The specctl rows at 256 requests of the H200 sweep of 2026-12-02 and the steps recorded up to them (its files
# are in git history), slimmed: one category per step with its committed tokens, times to 10 us. The readings below
# are those of the full recording to 0.2 %.
DATA = Path(__file__).resolve().parent / "data"


def step(t: float, width: int, tokens: int, seconds: float, batch: int = 256) -> dict:
    prompt = max(tokens - batch * (1 + width), 0)
    accepted = [0] * (width + 1)
    accepted[min(1, width)] = batch  # every request accepts one draft (none at K = 0)
    return {"t": t, "wall_s": seconds, "batch_size": batch, "scheduled_tokens": tokens,
            "draft_tokens": batch * width, "prefill_tokens": prompt, "width": width, "interval_s": seconds,
            "categories": [{"category": "prose", "method": "eagle3", "requests": batch,
                            "hists": [{"k": width, "accepted": accepted}] if width else []}]}


def on_line(width: int, tokens: int, a0: float = 0.009, p: float = 0.0095, full_s: float = 0.054) -> float:
    a = min(a0 + p * width, full_s)
    return a + (full_s - a) * tokens / 2048


def write(tmp_path: Path, widths: list[int]) -> tuple[Path, Path]:
    steps, t = [], 0.0
    for i, w in enumerate(widths):
        tokens = 2048 if i % 3 == 0 else 256 * (1 + w) + 300  # every third step fills the budget
        seconds = on_line(w, tokens)
        t += seconds
        steps.append(step(t, w, tokens, seconds))
    batches = [{"sent_at": 1000.0 + t, "steps": steps}]
    results, steps_gz = tmp_path / "r.jsonl", tmp_path / "s.jsonl.gz"
    row = {"kind": "row", "engine": "specctl", "profile": "low", "concurrency": 256, "tok_per_s_median": 9000.0,
           "time": 1000.0 + t + 0.5}
    results.write_text(json.dumps(row) + "\n")
    with gzip.open(steps_gz, "wt") as fh:
        fh.write("".join(json.dumps(b) + "\n" for b in batches))
    return results, steps_gz


@pytest.mark.parametrize(("widths", "picked", "pass_near_engine"), [
    ([1] * 600, 1, False),  # one width timed: p is the prior's, and K = 1 looks cheap
    # every width timed in runs of two (the first step of a run is a switch, not timed): the fit finds the
    # passes, and K = 0 wins on low
    ([0, 0, 1, 1, 2, 2, 4, 4] * 75, 0, True),
    ([0, 1, 2, 4] * 150, 0, False),  # widths switched at every step: nothing timed, every token costs 1 / C
])
def test_the_reading_depends_on_the_widths_the_meter_timed(tmp_path, widths, picked, pass_near_engine):
    rows, times, steps = load(*write(tmp_path, widths), "specctl")
    (reading,) = mr.replay(rows, times, steps, 2048)
    assert reading.profile == "low" and reading.concurrency == 256
    assert reading.picked == picked
    assert (reading.pass_ms + reading.draft_ms / 2 == pytest.approx(9.5, rel=0.1)) is pass_near_engine
    assert (reading.width_steps[0] > 1) is pass_near_engine  # the very first step has no predecessor: timed
    assert "| low | 256 | 9000 |" in mr.render([reading])


def test_session_8_low_at_256_requests_read_one_width_and_kept_it():
    rows, times, steps = load(DATA / "meter_s8_rows.jsonl", DATA / "meter_s8_steps.jsonl.gz", "specctl")
    readings = {r.profile: r for r in mr.replay(rows, times, steps, 2048)}
    low = readings["low"]
    assert low.picked == 1 and low.pass_ms < 1.0  # the prior's p: K = 0 priced as dear as K = 1
    assert low.width_steps[1] > 10 * low.width_steps[0]
    assert readings["high"].picked == 2 == readings["mixed"].picked


def test_the_command_checks_its_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        mr.main([str(tmp_path / "none.jsonl"), str(tmp_path / "none.gz")])
    assert err.value.code == 2 and "no such file" in capsys.readouterr().err
    results, steps = write(tmp_path, [1] * 60)
    with pytest.raises(SystemExit) as err:
        mr.main([str(results), str(steps), "--budget", "0"])
    assert err.value.code == 2
    capsys.readouterr()
    steps.write_bytes(b"not gzip")  # a corrupt recording: a message and exit 2, not a traceback
    with pytest.raises(SystemExit) as err:
        mr.main([str(results), str(steps)])
    assert err.value.code == 2 and "not a sweep's results" in capsys.readouterr().err
    with gzip.open(steps, "wt") as fh:  # valid JSON, not a telemetry batch
        fh.write(json.dumps({"sent_at": 1.0, "steps": [{"t": 0.5, "scheduled_tokens": 10}]}) + "\n")
    with pytest.raises(SystemExit) as err:
        mr.main([str(results), str(steps), "--min-concurrency", "1"])
    assert err.value.code == 2


def test_an_engine_without_rows_is_a_usage_error(tmp_path, capsys):
    results, steps_gz = write(tmp_path, [1] * 60)
    with pytest.raises(SystemExit) as exc:
        mr.main([str(results), str(steps_gz), "--engine", "specctl_skip"])
    assert exc.value.code == 2
    assert "no specctl_skip rows" in capsys.readouterr().err
