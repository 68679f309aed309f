"""EngineBook: dedup per (boot, seq), and two running engines sharing one id told apart from a restart."""

import pytest

from specctl_vllm.controller.core.learn.engines import COUNTER_CAP, EngineBook


def feed(book, batches):
    outcomes = []
    for boot, seq in batches:
        outcome, gap = book.classify(boot, seq)
        if outcome == "accepted":
            book.record(boot, seq, gap, 0)
        elif outcome == "conflict":
            book.record_conflict(boot, seq, 0.0)
        elif outcome == "suspect":
            book.record_suspect(boot, seq)
        outcomes.append(outcome)
    return outcomes


@pytest.mark.parametrize(
    ("batches", "outcomes", "conflicts"),
    [
        # a restart: the old boot's late retry of a seq it had sent is a duplicate ("stale"), no conflict
        ([("a", 0), ("a", 1), ("b", 0), ("a", 1)], ["accepted", "accepted", "accepted", "stale"], 0),
        # a restart with one batch of the old boot still in flight: not a conflict
        ([("a", 0), ("b", 0), ("a", 1), ("b", 1)], ["accepted", "accepted", "suspect", "accepted"], 0),
        # two engines, one id: boot a keeps sending new seqs after boot b appeared
        ([("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("a", 3)],
         ["accepted", "accepted", "suspect", "accepted", "conflict", "conflict"], 2),
        # each new batch of the other engine counts once; a retry of it does not count again
        ([("a", 5), ("b", 0), ("a", 6), ("a", 7), ("a", 7)], ["accepted", "accepted", "suspect", "conflict", "stale"],
         1),
    ],
    ids=["restart", "in-flight", "interleaved", "retry-of-conflict"],
)
def test_shared_id_detected(batches, outcomes, conflicts):
    book = EngineBook("e")
    assert feed(book, batches) == outcomes
    assert book.id_conflicts == conflicts


def test_conflict_state_round_trips():
    book = EngineBook("e")
    feed(book, [("a", 0), ("b", 0), ("a", 1), ("a", 2)])
    back = EngineBook.from_dict(book.to_dict())
    assert (back.id_conflicts, back.conflict_boot, back.retired_max_seq) == (1, "a", {"a": 2})
    assert feed(back, [("a", 3), ("a", 4)]) == ["suspect", "conflict"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_seq", 10**400), ("max_seq", -5), ("step_seconds", float("inf")), ("seen", [-1]),
     ("width_steps", {"33": 5}), ("width_steps", {"-1": 5}), ("width_steps", {"x": 5}), ("width_steps", {"2": "x"})],
)
def test_out_of_range_snapshot_refused(field, value):
    d = EngineBook("e").to_dict()
    d[field] = value
    with pytest.raises((ValueError, OverflowError)):
        EngineBook.from_dict(d)


def test_restored_counters_capped():
    d = EngineBook("e").to_dict()
    d["gaps"] = 10**400
    assert EngineBook.from_dict(d).gaps == COUNTER_CAP


@pytest.mark.parametrize(("stored", "k_max", "want"), [
    ([0, 1, 2, 4, 7], 7, (0, 1, 2, 4, 7)),
    ([0, 4], 2, ()),  # wider than the engine: not a width set the protocol accepts
    ([1, 2], 7, ()),  # no K = 0
    ([0, 2, 2], 7, ()),
    ("junk", 7, ()),
])
def test_graph_width_set_round_trips_and_malformed_ones_are_per_request(stored, k_max, want):
    b = EngineBook("e1")
    b.spec_k_max = k_max
    d = {**b.to_dict(), "spec_graph_widths": stored}
    again = EngineBook.from_dict(d)
    assert again.spec_graph_widths == want
    assert ("spec_graph_widths" in again.to_dict()) == bool(want)
    assert "spec_graph_widths" not in EngineBook("e2").to_dict()  # per-request engines' snapshots are unchanged


def test_width_steps_add_up_capped_and_round_trip():
    from specctl_vllm.controller.core.learn.engines import record_width_steps

    book = EngineBook("e")
    assert "width_steps" not in book.to_dict()  # a per-request engine's snapshot stays what it was
    record_width_steps(book, {0: 3, 4: 2})
    record_width_steps(book, {0: 1, 7: COUNTER_CAP})
    record_width_steps(book, {7: 5})
    assert book.width_steps == {0: 4, 4: 2, 7: COUNTER_CAP}
    assert EngineBook.from_dict(book.to_dict()).width_steps == book.width_steps
    d = book.to_dict()
    d["width_steps"] = {"2": 10**400}
    assert EngineBook.from_dict(d).width_steps == {2: COUNTER_CAP}
