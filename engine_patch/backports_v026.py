"""The part of the ``full_graph_dispatch`` backport that is pure on vLLM 0.26.0's candidate tables.

0.26.0's ``CudaGraphManager._init_candidates`` stages, per token count, the graphs a batch of that count may run;
:func:`full_graphs_first` reorders and completes those lists (applied by :mod:`specctl_vllm.engine_patch.backports`).
0.34 dispatches per query length and needs none of it (:mod:`specctl_vllm.engine_patch.backports_v034`).
"""

from __future__ import annotations

from typing import Any


def full_graphs_first(candidates: dict, capture_descs: dict) -> None:
    """For every staged token count, the smallest full graph of each captured width that can hold it, ahead of
    the entries vLLM staged there; and, where vLLM staged only decode graphs, the smallest mixed-batch graph that
    holds the count behind them (pure on the two dicts; mutates ``candidates``, never the lists it holds, which
    vLLM shares between token counts).

    The second part closes holes the width set opens: vLLM stages a decode graph of width K at
    ``round_up(size, 1 + K)`` for each capture size, so with widths 2 and 4 it stages counts such as 66 or 75
    with decode graphs only, and a mixed batch (prompt chunks beside decodes) of 65-66 or 73-75 tokens found no
    piecewise graph there and ran eager, where a plain engine runs the piecewise graph of the next capture size
    (111 of the 512 counts up to 512 at 256 requests, read from 0.26's ``_init_candidates``)."""
    def tokens(d: Any) -> int:
        return d.num_tokens

    descs = [d for group in capture_descs.values() for d in group]
    full = [d for d in descs
            if getattr(d, "uniform_token_count", None) is not None and getattr(d, "num_reqs", None) is not None]
    mixed = sorted((d for d in descs if hasattr(d, "uniform_token_count") and d.uniform_token_count is None),
                   key=tokens)
    by_width: dict[tuple[int, int], list] = {}
    for d in full:
        by_width.setdefault((d.uniform_token_count, d.num_active_loras), []).append(d)
    for group in by_width.values():
        group.sort(key=tokens)
    for (num_tokens, loras), staged in candidates.items():
        extra = []
        for (_, w_loras), group in by_width.items():
            if w_loras != loras:
                continue
            best = next((d for d in group if d.num_tokens >= num_tokens), None)
            if best is not None and best not in staged:
                extra.append(best)
        kept_full = [d for d in staged if d in full]
        rest = [d for d in staged if d not in full]
        if not any(getattr(d, "uniform_token_count", 0) is None for d in rest):
            fallback = next((d for d in mixed if d.num_tokens >= num_tokens and d.num_active_loras == loras), None)
            if fallback is not None:
                rest.append(fallback)
        if extra or len(kept_full) + len(rest) != len(staged):
            candidates[(num_tokens, loras)] = kept_full + sorted(extra, key=tokens) + rest
