"""The goodput policy along a recording: decisions per batch, priced run by run against every static k, on the
engines' step clock (never ``sent_at``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig, PolicySettings
from specctl_vllm.controller.core.learn.cost_fit import NO_CORRECTIONS
from specctl_vllm.controller.core.offline import replay, replay_path, whatif
from specctl_vllm.controller.recording import read_recording
from specctl_vllm.kernel.cost import CPU
from tests.unit.core.offline.test_replay import _batches as synthetic
from tests.unit.core.offline.test_replay_recordings import RECORDINGS

CONFIG = BrainConfig(replay.REPLAY_LEARNER, PolicySettings(cost_preset="cpu"))


def _read(path: Path):
    return [b for source, lines in read_recording([path]).parts for b in replay.parse_telemetry(lines, source)]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_path_that_holds_one_static_k_is_priced_as_that_k(k) -> None:
    batches = synthetic(6)
    profiles = whatif.telemetry_profiles(batches, list(range(1, 9)))
    choices = [{"_default": (k, "ngram")}] * len(batches)
    f = replay_path.price_along(replay.engine_clock(batches)[0], choices, [1, 2, 4], profiles, CPU, NO_CORRECTIONS, "ngram")
    assert f.goodput == pytest.approx(f.static[k], rel=1e-12)
    assert f.vs_best_static <= 1.0 + 1e-12


def _engine_end(batches, seq: int) -> float:
    """Engine time at the end of batch ``seq`` of one boot: the first step's own wall_s, then the clock's gaps."""
    return batches[0].steps[0].wall_s + batches[seq].steps[-1].t - batches[0].steps[0].t


# sent_at every 0.5 s as recorded; one early batch (a clock set late); reversed; all equal
SENT_AT = [lambda i: 1000.0 + 0.5 * i, lambda i: 1_700_000_000.0 if i == 0 else 1_796_460_090.0 + i,
           lambda i: 1009.0 - i, lambda i: 5.0]


@pytest.mark.parametrize("sent_at", SENT_AT, ids=["recorded", "early-batch", "reversed", "equal"])
@pytest.mark.parametrize(("until_s", "kept"), [(1.5, 2), (2.5, 3), (None, 10)])
def test_the_window_keeps_the_batches_that_end_within_it_on_engine_time(sent_at, until_s, kept) -> None:
    """The engine steps 1 s per batch (0.19 s of steps each); sent_at says nothing about when a batch ran."""
    batches = [b.model_copy(update={"sent_at": sent_at(i)}) for i, b in enumerate(synthetic(10))]
    profiles = whatif.telemetry_profiles(batches, [1])
    choices = [{"_default": (1, "ngram")}] * len(batches)
    f = replay_path.price_along(replay.engine_clock(batches)[0], choices, [1], profiles, CPU, NO_CORRECTIONS,
                                "ngram", until_s=until_s)
    assert f.batches == kept
    assert f.seconds == pytest.approx(_engine_end(batches, kept - 1), rel=1e-12)


@pytest.mark.parametrize("sent_at", SENT_AT[1:], ids=["early-batch", "reversed", "equal"])
def test_the_path_is_priced_the_same_whatever_sent_at_says(sent_at) -> None:
    batches = synthetic(10)
    moved = [b.model_copy(update={"sent_at": sent_at(i)}) for i, b in enumerate(batches)]
    figures = replay_path.path_figures(batches, Brain(CONFIG), windows=(3.0, None))
    assert replay_path.path_figures(moved, Brain(CONFIG), windows=(3.0, None)) == figures
    assert figures[3.0].batches == 3 and figures[None].batches == 10


def test_each_batch_runs_what_was_served_before_it() -> None:
    """The first batch runs the cold start's default (nothing learned yet); the last runs a decision on evidence."""
    batches = synthetic(10)
    choices = replay_path.decisions_along(replay.engine_clock(batches)[0], batches[-1].spec, Brain(CONFIG))
    assert len(choices) == len(batches)
    assert set(choices[0]) == {"_default"} and choices[0]["_default"][0] >= 1
    assert {"code", "chat"} <= set(choices[-1])
    assert choices[-1]["chat"][0] == 0 < choices[-1]["code"][0]


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_a_cold_controller_costs_at_most_3_percent_over_the_first_minute(path: Path) -> None:
    f = replay_path.path_figures(_read(path), Brain(CONFIG), windows=(60.0,))[60.0]
    assert f.vs_best_static >= 0.97, (f.best_static, f.goodput)


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_a_restart_from_a_snapshot_starts_warm(path: Path) -> None:
    """Restored from the snapshot of a pass over the recording, the controller serves decisions on evidence from
    the first batch of the next pass (a new engine boot) and does at least as well as a cold one."""
    batches = _read(path)
    first = Brain(CONFIG)
    timed, _ = replay.engine_clock(batches)
    for t, b in timed:
        first.ingest(b, t)
    again = [b.model_copy(update={"boot_id": "restart"}) for b in batches]
    warm = replay_path.path_figures(again, Brain.load(first.dump(), CONFIG), windows=(60.0,),
                                    origin_s=timed[-1][0] + 1.0)[60.0]
    cold = replay_path.path_figures(batches, Brain(CONFIG), windows=(60.0,))[60.0]
    assert warm.vs_best_static >= cold.vs_best_static
    assert warm.vs_best_static >= 1.0
