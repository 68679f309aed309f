"""The goodput policy on the real recordings the project ships (``bench/results/*recording*``): in replay it
must be at least the best static k, on the recording's own evidence."""

from __future__ import annotations

from pathlib import Path

import pytest

from specctl_vllm.controller.core.offline import replay
from specctl_vllm.controller.recording import read_recording

ROOT = Path(__file__).resolve().parents[4]
RECORDINGS = sorted(p for p in (ROOT / "bench" / "results").glob("*recording*") if p.is_dir())


def _batches(path: Path):
    return [b for source, lines in read_recording([path]).parts for b in replay.parse_telemetry(lines, source)]


def test_the_project_ships_a_real_recording() -> None:
    assert RECORDINGS, "bench/results holds no recording: the test below would check nothing"


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_goodput_policy_is_at_least_the_best_static_k(path: Path) -> None:
    pol = replay.replay(_batches(path), policies=["static", "goodput"])["policies"]
    best = max((name for name in pol if name.startswith("k=")), key=lambda n: pol[n]["goodput"])
    assert pol["goodput"]["goodput"] >= pol[best]["goodput"], (best, pol[best]["vs_off"], pol["goodput"]["vs_off"])


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_goodput_row_does_not_depend_on_listing_the_timeline(path: Path) -> None:
    """The Brain is asked after every batch, as the live controller's acks ask it, so what it decided before
    (hysteresis, the previous default) shapes its last decision whether or not the timeline is listed."""
    batches = _batches(path)
    rows = [replay.replay(batches, policies=["goodput"], timeline=t)["policies"]["goodput"] for t in (False, True)]
    assert rows[0]["choice"] == rows[1]["choice"]
    assert rows[0]["goodput"] == rows[1]["goodput"]
