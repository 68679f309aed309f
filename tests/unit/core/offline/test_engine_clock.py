"""Replay and report run on the engines' step clock (``t``, ``wall_s``), never on ``sent_at``; a clock that jumps
is reported, not stretched."""

from __future__ import annotations

import pytest

from specctl_vllm.controller import report
from specctl_vllm.controller.core.offline.replay import engine_clock, replay
from specctl_vllm.kernel.protocol import TelemetryBatch
from tests.unit.service.batches import batch, hist, step


def recording(sent_at: list[float], ts: list[float] | None = None, **kw) -> list[TelemetryBatch]:
    """One batch per entry, two steps each, 1 s apart on the engine clock (unless ``ts`` says otherwise)."""
    ts = ts if ts is not None else [float(i) for i in range(len(sent_at))]
    return [TelemetryBatch.model_validate(batch(i, [step({"code": [hist(2, [1, 1, 4])]}, t=t),
                                                    step({"code": [hist(2, [1, 1, 4])]}, t=t + 0.5)],
                                                sent_at=s, **kw))
            for i, (s, t) in enumerate(zip(sent_at, ts))]


# sent_at: ordinary; one early batch (the docs' curl example); shuffled; all equal
SENT_AT = [[1000.0 + i for i in range(10)], [1_700_000_000.0] + [1_796_460_090.0 + i for i in range(9)],
           [1009.0 - i for i in range(10)], [5.0] * 10]


@pytest.mark.parametrize("sent_at", SENT_AT, ids=["ordinary", "early-batch", "reversed", "equal"])
def test_the_span_and_order_are_the_engines(sent_at):
    batches = recording(sent_at)
    timed, notes = engine_clock(batches)
    assert [b.seq for _, b in timed] == list(range(10)) and notes == []
    assert timed[-1][0] == pytest.approx(9.0 + 0.02 + 0.5)  # first step's wall_s, then the clock's own gaps
    data = report.from_recording(batches)
    assert data["span_s"] == pytest.approx(9.52, abs=1e-3)
    assert max(r["t_s"] for r in data["timeline"]) <= data["span_s"]
    assert replay(batches, policies=["recorded", "goodput"], ks=[1, 2])["span_s"] == pytest.approx(9.52, abs=1e-3)


def test_a_clock_jump_is_reported_not_stretched():
    ts = [0.0, 1.0, 2.0, 96_460_090.0, 96_460_091.0]
    batches = recording([1000.0 + i for i in range(5)], ts)
    timed, notes = engine_clock(batches)
    assert timed[-1][0] < 10.0
    assert len(notes) == 1 and "jumps +96460087.500 s at seq 3" in notes[0]
    data = report.from_recording(batches)
    assert data["span_s"] < 10.0 and any("jumps" in n for n in data["notes"])
    assert any("jumps" in n for n in replay(batches, policies=["recorded"], ks=[1])["notes"])


def test_boots_follow_each_other_and_engines_start_together():
    first = recording([0.0] * 3, [100.0, 101.0, 102.0], boot_id="boot-1")
    second = recording([0.0] * 2, [5.0, 6.0], boot_id="boot-2")
    other = recording([0.0] * 2, [7000.0, 7001.0], engine_id="engine-b")
    timed, notes = engine_clock(second + other + first)  # file order differs from time order
    assert notes == []
    by = {(b.engine_id, b.boot_id, b.seq): t for t, b in timed}
    assert by[("engine-a", "boot-2", 0)] > by[("engine-a", "boot-1", 2)] or \
        by[("engine-a", "boot-1", 0)] > by[("engine-a", "boot-2", 1)]  # one boot after the other, never overlapping
    assert by[("engine-b", "boot-1", 0)] == pytest.approx(0.52)
    assert [t for t, _ in timed] == sorted(t for t, _ in timed)
