"""``bench hook_sections``: the graph-shaped hook's sections under churn, alone and against another checkout."""

from __future__ import annotations

import argparse
import gc
import json
import math
from pathlib import Path

import pytest

from bench import hook_sections as hs

REPO = Path(__file__).resolve().parents[3]


def test_a_run_times_every_section_under_churn() -> None:
    """Short requests (16-48 tokens) at 16: requests finish and join while the sections are timed; the means of
    the sections the hook's cost is made of add up to the mean total."""
    row = hs.measure(16, 40, 32, "flat", evict_mb=1.0, reprice_every=8)
    assert set(row["median_us"]) == {*hs.SECTIONS, "total"}
    means = row["mean_us"]
    assert means["total"] == pytest.approx(sum(means[s] for s in hs.SUMMED))
    assert 0 < means["rule"] < means["after"]
    assert means["counting"] > 0  # drafts were counted in vLLM's loop
    assert row["prompt_step_share"] > 0  # finished requests were replaced
    assert 0 <= row["mean_width"] <= 7
    assert row["budget_full_steps"] > 0  # the widest width filled the token budget
    assert row["gc_ms_per_step"] >= 0
    assert gc.get_freeze_count() == 0  # the heap frozen for the measurement is let go after it


def test_the_engine_clock_advances_by_the_modelled_device_time() -> None:
    """Wider steps and prompt tokens cost modelled time; the host's own speed does not enter it."""
    from bench.support.engine_sim import SimOutput

    def output(batch: int, width: int, prompt: int = 0) -> SimOutput:
        spec = {f"r{i}": [0] * width for i in range(batch)} if width else {}
        return SimOutput({f"r{i}": 1 + width for i in range(batch)}, spec, batch * (1 + width) + prompt, [], width)

    plain, k4 = hs.modelled_step_s(output(256, 0)), hs.modelled_step_s(output(256, 4))
    assert plain == pytest.approx(0.02264)
    assert k4 == pytest.approx(plain * 1.48)
    assert hs.modelled_step_s(output(256, 0, prompt=1000)) == pytest.approx(plain + 0.002)


def test_the_comparison_runs_each_side_from_its_own_checkout(tmp_path) -> None:
    """This checkout as its own baseline, one round: both sides ran in their own process, each reporting the
    package it imported."""
    args = argparse.Namespace(sizes=[4], steps=10, length=16, cells="flat", evict_mb=0.5, rounds=1, baseline=REPO,
                              reprice_every=4, this=None)
    table = hs.compare(args)
    row = table["4"]
    assert {r["code"] for r in row["this_runs"] + row["baseline_runs"]} == {str(REPO)}
    assert math.isfinite(row["ratio_median"]) and row["ratio_median"] > 0


def test_a_repriced_policy_moves_the_cells_and_keeps_the_rules() -> None:
    """What the controller's learning sends: a new version, other cells, the same rules (the engine keeps its
    requests' resolved rules and computes the width again)."""
    from bench.overhead import GRAPH_ENGINE_WIDTHS, graph_policy
    from specctl_vllm.engine_patch.policy_table import EngineSpec, build_table

    engine = EngineSpec(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=GRAPH_ENGINE_WIDTHS)
    policy = graph_policy()
    moved = hs.repriced(policy, policy.version + 1)
    assert moved.version == policy.version + 1 and moved.step_cells != policy.step_cells
    assert moved.categories == policy.categories and moved.default == policy.default
    first = build_table(policy, engine, 0.0)
    second = build_table(moved, engine, 0.1, previous=first)
    assert second.rules_generation == first.rules_generation and second.generation != first.generation


@pytest.mark.parametrize("argv", [["--sizes", "x"], ["--sizes", "0"], ["--steps", "0"], ["--length", "2"],
                                  ["--reprice-every", "-1"], ["--baseline", ".", "--this", "/"],
                                  ["--sizes", str(hs.MAX_REQUESTS + 1)], ["--steps", str(hs.MAX_STEPS + 1)],
                                  ["--length", str(hs.MAX_LENGTH + 1)], ["--rounds", str(hs.MAX_ROUNDS + 1)],
                                  ["--cells", "round"], ["--baseline", "/"]])
def test_bad_arguments_exit_2_with_a_reason(argv, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        hs.main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip()


def test_a_run_writes_its_results(tmp_path) -> None:
    out = tmp_path / "sections.json"
    assert hs.main(["--sizes", "4", "--steps", "10", "--evict-mb", "0.5", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [row["requests"] for row in result["runs"]] == [4]
