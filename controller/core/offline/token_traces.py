"""Token traces for ``specctl replay``: a drafter re-run on a finished request's real tokens.

Greedy outputs do not depend on the speculative policy, so the speculative loop can be replayed on each
request's prompt and output: propose with the drafter, accept the common prefix with what the target
produced, commit accepted + 1. Steps and drafted tokens are then counted, not modelled (exact for model-free
drafters). Proposers are assumed prefix-consistent (the first ``k`` tokens of a ``k+1`` proposal are the
``k`` proposal), which holds for n-gram prompt lookup and suffix matching, so a position's proposal is
computed once at the largest k and truncated.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specctl_vllm.kernel.proposers import common_prefix
from specctl_vllm.kernel.protocol import METHOD_OFF

#: A drafter: (context tokens, k) -> up to k proposed tokens.
Proposer = Callable[[np.ndarray, int], list[int]]


@dataclass(frozen=True)
class RequestTrace:
    """One finished request: its category and token ids (prompt as scheduled, output as produced)."""

    category: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """Committed tokens ``e`` and verified draft tokens ``d`` per request step of one (category, method, k)."""

    method: str
    k: int
    e: float
    d: float
    source: str  # trace | telemetry | off | recorded


OFF = Profile(METHOD_OFF, 0, 1.0, 0.0, "off")


def score_request(trace: RequestTrace, propose: Proposer, ks: Iterable[int], k_cap: int) -> dict[int, tuple[int, int]]:
    """(decode steps, drafted tokens) to produce ``trace.output`` at each proposal length in ``ks``.

    The first output token comes from the prefill step (the same for every k) and is not counted. Proposals
    are computed once per position at ``k_cap`` and truncated (prefix-consistent proposers).
    """
    tokens = np.asarray(trace.prompt + trace.output, dtype=np.int32)
    base = len(trace.prompt)
    length = len(trace.output)
    cache: dict[int, list[int]] = {}
    out: dict[int, tuple[int, int]] = {}
    for k in ks:
        pos, steps, drafted = 1, 0, 0
        while pos < length:
            proposal: list[int] = []
            if k > 0:
                full = cache.get(pos)
                if full is None:
                    full = cache[pos] = list(propose(tokens[: base + pos], k_cap))
                proposal = full[:k]
            accepted = common_prefix(proposal, trace.output[pos : pos + len(proposal)])
            pos += accepted + 1
            steps += 1
            drafted += len(proposal)
        out[k] = (steps, drafted)
    return out


def trace_profiles(traces: Sequence[RequestTrace], proposers: Mapping[str, Proposer],
                   ks: Sequence[int]) -> dict[str, dict[tuple[str, int], Profile]]:
    """Per category, per (method, k): E and D pooled over its requests (sum tokens / sum steps)."""
    k_cap = max(ks, default=0)
    acc: dict[tuple[str, str, int], list[int]] = defaultdict(lambda: [0, 0, 0])  # tokens, steps, drafted
    for tr in traces:
        if len(tr.output) < 2:
            continue
        for method, propose in proposers.items():
            for k, (steps, drafted) in score_request(tr, propose, ks, k_cap).items():
                a = acc[(tr.category, method, k)]
                a[0] += len(tr.output) - 1
                a[1] += steps
                a[2] += drafted
    out: dict[str, dict[tuple[str, int], Profile]] = defaultdict(dict)
    for (cat, method, k), (tokens, steps, drafted) in acc.items():
        if steps:
            out[cat][(method, k)] = Profile(method, k, tokens / steps, drafted / steps, "trace")
    return dict(out)


def trace_histograms(trace: RequestTrace, propose: Proposer, k: int) -> list[tuple[int, int]]:
    """(drafted, accepted) of every decode step when the request runs at ``k`` (for per-position traces)."""
    tokens = np.asarray(trace.prompt + trace.output, dtype=np.int32)
    base, length = len(trace.prompt), len(trace.output)
    pos, out = 1, []
    while pos < length:
        proposal = list(propose(tokens[: base + pos], k))[:k] if k > 0 else []
        accepted = common_prefix(proposal, trace.output[pos : pos + len(proposal)])
        if proposal:
            out.append((len(proposal), accepted))
        pos += accepted + 1
    return out
