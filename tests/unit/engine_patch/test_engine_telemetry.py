"""Step rows: packed counts unfolded off the engine loop, read without changing the row."""

from __future__ import annotations

import copy

import pytest

from specctl_vllm.engine_patch.telemetry import (
    KEY_SHIFT,
    CategoryTally,
    PackedCounts,
    StepRow,
    add_attempt,
    add_counterfactual,
    pack,
    row_to_wire,
    step_aggregate,
)

KEYS = [("json", "eagle3"), ("prose", "eagle3")]


def code(key: int, drafted: int, accepted: int) -> int:
    return (key << KEY_SHIFT) + pack(drafted, accepted)


def tally(requests: int, hists: dict[int, list[int]] | None = None, cf: bool = False) -> CategoryTally:
    entry = CategoryTally()
    entry.requests = requests
    entry.hists = hists or {}
    if cf:
        add_counterfactual(entry, "ngram", 3, 1)
        add_attempt(entry, "ngram")
    return entry


def row(agg: dict, codes: dict[int, int] | None) -> StepRow:
    return StepRow(t=1.0, wall_s=0.01, batch_size=8, scheduled_tokens=40, draft_tokens=32, prefill_tokens=0,
                   draft_depth=4, agg=agg, width=4, packed=None if codes is None else PackedCounts(codes, KEYS))


def plain(agg: dict) -> dict:
    """(requests, hists, counterfactual, attempts) per key, to compare aggregates by value."""
    return {key: (e.requests, e.hists, e.counterfactual, e.attempts) for key, e in agg.items()}


CASES = [
    pytest.param({}, {code(0, 4, 2): 3, code(0, 4, 4): 1},
                 {KEYS[0]: (4, {4: [0, 0, 3, 0, 1]}, None, None)}, id="codes-only"),
    pytest.param({("json", "off"): tally(2)}, {code(1, 2, 0): 2, code(0, 4, 4): 1},
                 {("json", "off"): (2, {}, None, None), KEYS[1]: (2, {2: [2, 0, 0]}, None, None),
                  KEYS[0]: (1, {4: [0, 0, 0, 0, 1]}, None, None)}, id="beside-undrafted"),
    pytest.param({KEYS[0]: tally(1, {4: [1, 0, 0, 0, 0]}, cf=True)}, {code(0, 4, 3): 2},
                 {KEYS[0]: (3, {4: [1, 0, 0, 2, 0]}, {"ngram": {3: [0, 1, 0, 0]}}, {"ngram": 1})},
                 id="into-an-entry-with-counterfactuals"),
    pytest.param({}, {code(0, 0, 0): 2, code(0, 2, 1): 1},
                 {KEYS[0]: (3, {2: [0, 1, 0]}, None, None)}, id="all-drafts-invalid-counts-the-request-only"),
    pytest.param({}, {code(1, 40, 50): 1},
                 {KEYS[1]: (1, {32: [0] * 32 + [1]}, None, None)}, id="clamped-to-max-k"),
    pytest.param({KEYS[0]: tally(5)}, {}, {KEYS[0]: (5, {}, None, None)}, id="no-codes"),
    pytest.param({KEYS[0]: tally(5)}, None, {KEYS[0]: (5, {}, None, None)}, id="not-packed"),
]


@pytest.mark.parametrize(("agg", "codes", "expected"), CASES)
def test_packed_counts_unfold_into_a_copy_of_the_rows_aggregate(agg: dict, codes: dict | None,
                                                                 expected: dict) -> None:
    step = row(agg, codes)
    before = copy.deepcopy(plain(agg))
    first = step_aggregate(step)
    assert plain(first) == expected
    assert plain(step.agg) == before  # the row is read, not changed
    assert plain(step_aggregate(step)) == expected  # so a second read counts the same
    assert sum(c["requests"] for c in row_to_wire(step)["categories"]) == sum(e[0] for e in expected.values())
