"""How far the per-step standard error understates the spread between blocks of recorded steps."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.gpu import check_noise as cn
from specctl_vllm.kernel.model.cells import BATCH_EDGES, bucket_of

B64 = bucket_of(64, BATCH_EDGES)


def step(width: int | None, interval: float | None = 0.01, batch: int = 64, committed: int = 64) -> dict:
    """A recorded step whose requests each committed ``committed // batch`` tokens (K = 0 histogram-free)."""
    out = {"t": 0.0, "wall_s": 0.001, "batch_size": batch, "scheduled_tokens": batch, "draft_tokens": 0,
           "prefill_tokens": 0,
           "interval_s": interval, "draft_depth": width or 0,
           "categories": [{"category": "low", "method": "off", "requests": committed, "hists": []}]}
    if width is not None:
        out["width"] = width
    return out


@pytest.mark.parametrize(("widths", "runs"), [
    ([0] * 6, {(B64, 0): [3]}),  # settle 3: the first three steps of the run are not counted
    ([0] * 3 + [1] * 5 + [0] * 4, {(B64, 1): [2], (B64, 0): [1]}),
    ([0] * 5 + [None] + [0] * 5, {(B64, 0): [2, 2]}),  # a step of no single width ends the run
])
def test_counted_runs_follow_the_engine_s_meter(widths, runs) -> None:
    got = cn.counted_runs([step(w) for w in widths])
    assert {k: [len(r) for r in v] for k, v in got.items()} == runs


def test_an_untimed_step_is_skipped_but_keeps_its_run() -> None:
    steps = [step(0)] * 4 + [step(0, interval=None)] + [step(0)] * 2
    assert [len(r) for r in cn.counted_runs(steps)[(B64, 0)]] == [3]


def test_blocks_never_span_runs_and_drop_a_run_s_tail() -> None:
    runs = [[(1.0, 2.0)] * 5, [(1.0, 3.0)] * 3]
    assert cn.blocks_of(runs, 2) == [(2.0, 4.0), (2.0, 4.0), (2.0, 6.0)]


def test_ratio_rse_matches_the_ratio_estimator() -> None:
    rng = np.random.default_rng(2)
    x = rng.uniform(0.009, 0.011, 500)
    y = rng.integers(60, 70, 500).astype(float)
    r = x.sum() / y.sum()
    expected = math.sqrt(np.sum((x - r * y) ** 2) / 499 / 500) / x.mean()
    assert cn.pairs_rse(list(zip(x, y, strict=True))) == pytest.approx(expected)
    assert cn.pairs_rse([(0.01, 64.0)]) == math.inf


def write(path: Path, steps: list[dict], engine: str = "e") -> Path:
    with gzip.open(path, "wt") as fh:
        for i in range(0, len(steps), 50):
            chunk = [dict(s, t=float(i + j)) for j, s in enumerate(steps[i:i + 50])]
            fh.write(json.dumps({"engine_id": engine, "boot_id": "b", "sent_at": 1000.0 + i + len(chunk) - 1,
                                 "steps": chunk}) + "\n")
    return path


def test_runs_that_sit_apart_show_a_block_spread_above_the_step_spread(tmp_path, capsys) -> None:
    rng = np.random.default_rng(4)
    steps = []
    for i in range(20):
        level = 0.01 * (1.1 if i % 2 else 0.9)
        steps += [step(0, interval=level * (1 + rng.normal(0, 0.01))) for _ in range(35)] + [step(1)]
    path = write(tmp_path / "s.jsonl.gz", steps)
    out = tmp_path / "noise.json"
    assert cn.main([str(path), "--blocks", "8", "32", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (cell,) = [c for c in doc["cells"] if c["width"] == 0]
    assert cell["steps"] == 20 * 32
    assert cell["block_rse"]["32"] > 5 * cell["step_rse"]  # blocks of a whole run carry its level
    assert doc["summary"]["32"]["cells"] == 1
    assert "L=32" in capsys.readouterr().out


def test_no_cell_with_enough_steps_is_an_error(tmp_path, capsys) -> None:
    path = write(tmp_path / "s.jsonl.gz", [step(0)] * 50)
    assert cn.main([str(path)]) == 1
    assert "no (engine, bucket, width)" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--blocks", "1"], ["--blocks", "0"]])
def test_bad_block_sizes_are_refused(tmp_path, args) -> None:
    path = write(tmp_path / "s.jsonl.gz", [step(0)] * 10)
    with pytest.raises(SystemExit) as exc:
        cn.main([str(path), *args])
    assert exc.value.code == 2


def test_a_missing_file_is_refused(tmp_path) -> None:
    with pytest.raises(SystemExit) as exc:
        cn.main([str(tmp_path / "nope.jsonl.gz")])
    assert exc.value.code == 2


def test_positions_compare_a_run_s_early_steps_with_the_cell_s_steady_ones(tmp_path, capsys) -> None:
    """K = 0 runs whose first 10 steps after a switch take twice as long: positions 0-9 read 0.5, later ones 1."""
    steps = [step(1, interval=0.02)]  # a run before: every K = 0 run below follows a switch
    for _ in range(12):
        steps += [step(0, interval=0.02 if i < 10 else 0.01) for i in range(60)] + [step(1, interval=0.02)]
    ratios = cn.position_ratios(steps)
    by_bin = {b: r for (drafting, b), [(r, _)] in ratios.items() if not drafting}
    bins = dict(enumerate(cn.POSITION_BINS))
    assert sorted(by_bin) == list(bins)  # 12 runs: 12 steps in the smallest bin, 12 x 28 steady steps
    for b, ratio in by_bin.items():
        assert ratio == pytest.approx(0.5 if bins[b][1] <= 10 else 1.0), bins[b]
    assert not [key for key in ratios if key[0]]  # the K = 1 steps: runs of one, no steady steps
    path = write(tmp_path / "s.jsonl.gz", steps)
    assert cn.main([str(path), "--positions"]) == 0
    assert "| K = 0 | 10-14 | 1 |" in capsys.readouterr().out


@pytest.mark.parametrize("content", [b"not json\n", b'{"engine_id": "e", "steps": [{"t": 1}]}\n', b"\x1f\x8bnot gzip"])
def test_a_file_that_is_not_recorded_telemetry_is_a_clear_error(tmp_path, capsys, content) -> None:
    path = tmp_path / "s.jsonl.gz"
    path.write_bytes(content)
    assert cn.main([str(path)]) == 2
    assert "cannot read the recorded steps" in capsys.readouterr().err
