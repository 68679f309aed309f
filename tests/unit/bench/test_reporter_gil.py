"""``bench reporter_gil``: the engine-loop stand-in beside the reporter, its arms and its arguments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import reporter_gil as rg


def test_a_graph_row_is_a_valid_telemetry_step_at_the_bench_width() -> None:
    from specctl_vllm.engine_patch.telemetry import row_to_wire
    from specctl_vllm.kernel import protocol

    row = rg.graph_row(3, 0.008)
    step = protocol.StepRecord.model_validate(row_to_wire(row))
    assert step.batch_size == 60 and step.draft_tokens == 240 and step.width == rg.WIDTH
    assert sorted(c.category for c in step.categories) == sorted(rg.CATEGORIES)
    assert all(c.requests == rg.REQUESTS_PER_CATEGORY for c in step.categories)


def test_the_summary_pairs_each_arm_with_off_round_by_round() -> None:
    rounds = {"off": [1.0, 2.0, 1.0], "stretch": [1.02, 2.0, 1.01], "paused": [1.0, 2.02, 0.99]}
    out = rg.summarise(rounds)
    assert out["stretch_over_off"] == {"median": pytest.approx(1.01), "min": pytest.approx(1.0),
                                       "max": pytest.approx(1.02), "rounds": 3}
    assert out["paused_over_off"]["median"] == pytest.approx(1.0)
    assert out["paused_over_off"]["min"] == pytest.approx(0.99) and out["paused_over_off"]["max"] == pytest.approx(1.01)
    assert out["step_us"]["off"] == [1e6, 2e6, 1e6]


@pytest.mark.parametrize(
    ("raw", "regimes"),
    [("7500:200", [(7500.0, 200.0)]), ("7500:200, 2500:6000", [(7500.0, 200.0), (2500.0, 6000.0)]),
     ("100:0", [(100.0, 0.0)])],
)
def test_regimes_parse(raw: str, regimes: list) -> None:
    assert rg.parse_regimes(raw) == regimes


@pytest.mark.parametrize(
    "argv",
    [["--regimes", "0:100"], ["--regimes", "100"], ["--regimes", "x:1"], ["--regimes", "100:-1"],
     ["--regimes", "2000000:0"], ["--rounds", "0"], ["--rounds", "101"], ["--round-s", "0.1"],
     ["--round-s", "1e9"], ["--interval-s", "0"], ["--regimes", "nan:1"]],
)
def test_bad_arguments_exit_2_with_a_message(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        rg.main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_one_short_round_per_arm_against_a_real_controller(tmp_path: Path) -> None:
    """The bench end to end, shortened: the reporter arms attach to a real ``specctl serve`` (a round raises
    where they do not) and every arm is timed."""
    out = tmp_path / "results" / "gil.json"  # a folder not there yet is made
    assert rg.main(["--regimes", "2000:1000", "--rounds", "1", "--round-s", "0.5", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    (regime,) = result["regimes"]
    assert (regime["busy_us"], regime["wait_us"]) == (2000.0, 1000.0)
    assert all(len(regime["step_us"][arm]) == 1 and regime["step_us"][arm][0] >= 3000 for arm in rg.ARMS)
    assert regime["paused_over_off"]["rounds"] == 1


def test_a_reporter_that_cannot_attach_fails_the_round_with_a_reason(monkeypatch) -> None:
    """No controller behind the URL: the warm-up waits for the reporter's first policy up to its timeout, then
    the round fails saying so (never a round timed without the reporter it claims to measure)."""
    from bench.harness import free_port

    monkeypatch.setattr(rg, "ATTACH_TIMEOUT_S", 0.3)
    with pytest.raises(RuntimeError, match="did not attach"):
        rg.one_round(f"http://127.0.0.1:{free_port()}", "paused", "t", 1000.0, 1000.0, 0.5, 0.05)
