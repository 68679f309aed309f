"""Model-free drafters: table of known cases, and equality with a plain-Python reference on random texts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specctl_vllm.engine_patch.proposers import TokenHistory, propose_ngram, propose_suffix


def reference_ngram(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Most recent earlier occurrence of the longest suffix n-gram (n in [min_n, max_n]), its continuation."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for end in range(length - 1, n - 1, -1):  # end exclusive, leaves >= 1 continuation token
            if tokens[end - n:end] == suffix:
                return tokens[end:end + k]
    return []


def arr(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


@pytest.mark.parametrize(
    ("tokens", "k", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], 2, [3, 4]),  # bigram [1, 2] seen before: continue with what followed
        ([1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3], 3, [7, 1, 2]),  # most recent occurrence wins
        ([5, 1, 2, 3, 8, 0, 1, 2, 3], 1, [8]),  # longest match (3-gram) preferred
        ([1, 2, 3, 4], 4, []),  # no repetition
        ([7, 7], 3, []),  # a 1-token match is below min_n
        ([4, 4, 4], 2, [4]),  # overlapping match, continuation bounded by the text
        ([1, 2, 3, 1, 2], 0, []),  # k = 0 proposes nothing
    ],
)
def test_ngram_cases(tokens: list[int], k: int, expected: list[int]) -> None:
    assert propose_ngram(arr(tokens), k) == expected


@pytest.mark.parametrize(
    ("tokens", "k", "expected"),
    [
        # [1 2] was followed by 3 twice and by 4 once: propose 3; after "1 2 3" came 5 once and 6 once: stop
        ([1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 4, 0, 1, 2], 2, [3]),
        ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # single occurrence: its continuation
        ([1, 2, 5, 1, 2, 6, 1, 2], 2, []),  # 50/50 split: no majority, no guess
        ([1, 2, 3, 4], 2, []),  # no repetition
    ],
)
def test_suffix_cases(tokens: list[int], k: int, expected: list[int]) -> None:
    assert propose_suffix(arr(tokens), k) == expected


texts = st.lists(st.integers(min_value=0, max_value=5), min_size=0, max_size=60)


@settings(max_examples=300, deadline=None)
@given(tokens=texts, k=st.integers(min_value=0, max_value=6))
def test_ngram_matches_reference(tokens: list[int], k: int) -> None:
    expected = reference_ngram(tokens, k, 2, 4) if k > 0 else []
    assert propose_ngram(arr(tokens), k, min_n=2, max_n=4) == expected


@settings(max_examples=300, deadline=None)
@given(tokens=texts, k=st.integers(min_value=1, max_value=6))
def test_suffix_proposal_continues_an_earlier_occurrence(tokens: list[int], k: int) -> None:
    got = propose_suffix(arr(tokens), k)
    assert len(got) <= k
    if got:
        # Some earlier position continues the context's last two tokens with the proposal's first token.
        context = tokens[-2:]
        assert any(tokens[i:i + 2] == context and tokens[i + 2] == got[0] for i in range(len(tokens) - 2))


def test_window_limits_the_search() -> None:
    tokens = [1, 2, 3] + [9] * 50 + [0, 5, 1, 2]
    assert propose_ngram(arr(tokens), 1) == [3]
    assert propose_ngram(arr(tokens), 1, window=10) == []  # the earlier [1, 2] is outside the window


def test_history_appends_only_new_tokens() -> None:
    history = TokenHistory(capacity=16)
    tokens = list(range(10))
    assert history.sync(tokens).tolist() == tokens
    tokens += list(range(10, 100))  # grows past the capacity
    assert history.sync(tokens).tolist() == tokens
    assert history.sync(tokens).shape == (100,)
