"""Model-free drafters, pure functions of a request's own tokens (prompt + output so far): ``(tokens, k)`` -> up
to k proposed tokens; no model, no device, no I/O. The engine patch drafts with them (``specctl_vllm.engine_patch.proposers``
keeps the per-request token buffer) and ``specctl replay`` re-runs them on recorded token traces, so both sides
import them from here. Verification stays vLLM's, so a bad proposal costs verify work, never correctness.

* :func:`propose_ngram` -- prompt lookup (the method vLLM calls ``ngram``): find the most recent earlier
  occurrence of the longest suffix n-gram, ``min_n <= n <= max_n``, and propose the (up to) ``k`` tokens that
  followed it. Good on copy-heavy text (code edits, summaries quoting the source, JSON echoing keys).
* :func:`propose_suffix` -- suffix matching with frequency voting (in the spirit of SuffixDecoding): take the
  longest suffix of the context that occurred before (up to ``max_depth`` tokens, so longer than n-gram's),
  then walk forward over *all* its earlier occurrences, each step proposing the continuation most of them
  agree on and keeping only those that agree; stop when no continuation has more than ``min_share``. Proposals are
  shorter but surer where the text repeats with variations (tool-call arguments, templated JSON).

Cost: both vectorise over the last ``window`` tokens with numpy: O(window) element operations per call at C
speed, a handful of numpy calls (~5-30 µs for a few thousand tokens), independent of batch size.
"""


from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specctl_vllm.kernel.protocol import METHOD_NGRAM, METHOD_SUFFIX

NGRAM_MIN_N = 2
NGRAM_MAX_N = 4
SUFFIX_MAX_DEPTH = 16
SUFFIX_MIN_DEPTH = 2
SUFFIX_MIN_SHARE = 0.5
DEFAULT_WINDOW = 4096


def _suffix_match_ends(tokens: np.ndarray, depth: int) -> list[np.ndarray]:
    """``ends[n-1]``: positions ``e`` (``n <= e <= L-1``) where ``tokens[e-n:e]`` equals the last ``n`` tokens.

    Grows ``n`` from 1 while matches remain, up to ``depth``. ``e <= L-1`` keeps at least one continuation
    token after every match.
    """
    length = tokens.shape[0]
    ends: list[np.ndarray] = []
    if length < 2:
        return ends
    # n = 1: every earlier position holding the last token.
    candidates = np.flatnonzero(tokens[: length - 1] == tokens[length - 1]) + 1
    n = 1
    while candidates.size and n <= depth:
        ends.append(candidates)
        if n == depth:
            break
        # Extend the match one token to the left: candidate e keeps if tokens[e-n-1] == tokens[L-n-1].
        candidates = candidates[candidates >= n + 1]
        if length - n - 1 < 0:
            break
        candidates = candidates[tokens[candidates - n - 1] == tokens[length - n - 1]]
        n += 1
    return ends


def propose_ngram(
    tokens: np.ndarray,
    k: int,
    min_n: int = NGRAM_MIN_N,
    max_n: int = NGRAM_MAX_N,
    window: int = DEFAULT_WINDOW,
) -> list[int]:
    """Prompt lookup: continuation of the most recent earlier occurrence of the longest matching n-gram."""
    if k <= 0:
        return []
    view = tokens[-window:]
    ends = _suffix_match_ends(view, max_n)
    if len(ends) < min_n:
        return []
    end = int(ends[-1][-1])  # longest n found, most recent occurrence
    return view[end : end + k].tolist()


def propose_suffix(
    tokens: np.ndarray,
    k: int,
    max_depth: int = SUFFIX_MAX_DEPTH,
    min_depth: int = SUFFIX_MIN_DEPTH,
    min_share: float = SUFFIX_MIN_SHARE,
    window: int = DEFAULT_WINDOW,
) -> list[int]:
    """Longest earlier suffix match, continuation chosen token by token by majority of its occurrences."""
    if k <= 0:
        return []
    view = tokens[-window:]
    ends = _suffix_match_ends(view, max_depth)
    if len(ends) < min_depth:
        return []
    positions = ends[-1]
    length = view.shape[0]
    proposal: list[int] = []
    for _ in range(k):
        positions = positions[positions < length]
        if positions.size == 0:
            break
        nxt = view[positions]
        values, counts = np.unique(nxt, return_counts=True)
        best = int(np.argmax(counts))
        if counts[best] <= min_share * nxt.size:
            break  # no strict majority: the occurrences disagree, stop rather than guess
        token = int(values[best])
        proposal.append(token)
        positions = positions[nxt == token] + 1
    return proposal


PROPOSERS = {METHOD_NGRAM: propose_ngram, METHOD_SUFFIX: propose_suffix}


def common_prefix(proposal: Sequence[int], actual: Sequence[int]) -> int:
    """Drafts a greedy verifier accepts: the leading tokens of ``proposal`` that ``actual`` repeats."""
    n = 0
    for a, b in zip(proposal, actual):
        if a != b:
            break
        n += 1
    return n
