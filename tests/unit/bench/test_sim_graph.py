"""The graph-shaped simulator: cells read from recorded telemetry, the step cost, and the loop closing."""

from __future__ import annotations

import gzip
import json

import pytest

from bench.sim.graph import (
    WIDTHS,
    GraphEngine,
    GraphSpecctl,
    StaticWidth,
    gpu_profile_trace,
    measured_cells,
    run_graph,
)
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.kernel.cost import PRESETS
from specctl_vllm.kernel.model.cells import CellTable, bucket_of

H200 = PRESETS["h200"]


def _step(batch, width, wall, interval=None, prefill=0):
    s = {"t": 0.0, "wall_s": wall, "batch_size": batch, "scheduled_tokens": batch, "draft_tokens": 0,
         "prefill_tokens": prefill, "draft_depth": 0, "categories": []}
    if width is not None:
        s["width"] = width
    if interval is not None:
        s["interval_s"] = interval
    return s


def _batch(steps, seq=0, engine="e1"):
    return {"engine_id": engine, "boot_id": "b1", "model_name": "m", "seq": seq, "sent_at": 0.0,
            "spec": {"method": "eagle3", "k_max": 7, "graph_widths": [0, 1, 2, 4, 7]}, "steps": steps}


def test_measured_cells_keep_graph_shaped_decode_steps_only(tmp_path):
    """As the controller learns them: decode steps of a graph-shaped engine, not the one before a prompt step
    (charged for part of it), nor an engine's last (what followed it is unknown)."""
    path = tmp_path / "steps.jsonl.gz"
    steps = [_step(4, 2, 0.020, interval=0.006),  # under async scheduling the interval is the step's cost
             _step(4, 2, 0.006),
             _step(4, None, 0.5),  # not graph-shaped
             _step(4, 2, 0.016),  # before a prompt step
             _step(4, 2, 0.5, prefill=100),  # carries a prompt
             _step(4, 2, 0.006)]  # the last
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(_batch(steps[:3])) + "\n" + json.dumps(_batch(steps[3:], seq=1)) + "\n")
    table = measured_cells([path])
    assert table.sums == {(bucket_of(4), 2): [pytest.approx(0.012), 2.0]}


def test_a_step_costs_its_cell_plus_its_prompt_tokens():
    table = CellTable()
    for _ in range(500):
        table.add(8, 4, 0.010)
    view = table.view(WIDTHS, H200)
    eng = GraphEngine(gpu_profile_trace("high"), view, H200, batch=8, seed=1, noise=0.0)
    cell = view.row(8)[0][WIDTHS.index(4)]
    assert eng.step_seconds(8, 40, 4, 0.0, 0) == pytest.approx(cell)
    assert eng.step_seconds(8, 296, 4, 0.0, 256) == pytest.approx(cell + 256 * H200.per_token)
    res = eng.step_width(4)
    assert set(res.k[res.decoding].tolist()) == {4} and res.width == 4


def _linear_cells(per_width_ms):
    table = CellTable()
    for n in (1, 2, 4, 8):
        for w, ms in per_width_ms.items():
            for _ in range(300):
                table.add(n, w, ms / 1000)
    return table.view(WIDTHS, H200)


@pytest.mark.parametrize(("profile", "best"), [("high", "k7"), ("low", "plain")])
def test_the_loop_finds_the_best_width_from_a_cold_start(profile, best):
    # drafting is cheap enough for beta 0.85 at every width and too dear for beta 0.45 at any
    cells = _linear_cells({0: 5.0, 1: 9.0, 2: 9.5, 4: 10.5, 7: 12.0})
    trace = gpu_profile_trace(profile)
    rows = {}
    for strategy in [StaticWidth(w) for w in WIDTHS] + [
            GraphSpecctl(trace, BrainConfig(LearnerSettings(), PolicySettings(cost_preset="h200")), seed=3)]:
        rows[strategy.name] = run_graph(trace, cells, H200, 4, strategy, requests=160, warmup=0.5, seed=3)
    assert max((n for n in rows if n != "specctl"), key=lambda n: rows[n]["goodput"]) == best
    assert rows["specctl"]["goodput"] >= 0.95 * rows[best]["goodput"]
