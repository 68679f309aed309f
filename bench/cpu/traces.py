"""Traces the CPU benchmark leaves behind for the simulator and for ``specctl replay``.

* request token traces (JSON lines ``{category, prompt_token_ids, output_token_ids}``): what ``specctl
  replay --requests`` scores model-free drafters on;
* ``bench/results/cpu_traces.json`` in the simulator's ``specctl-sim-trace/1`` format (bench/sim/profiles.py):
  per category its share of requests, mean output length, per-request heterogeneity and accepted-length
  histograms per drafter:
    - ``engine`` (vLLM's n-gram): every verify step of every static-k and batch-table run, from vLLM's own
      per-request metrics (``per_step_drafted`` / ``per_step_accepted``), as ``DraftHistogram`` rows;
    - ``suffix`` (the patch's drafter): scored on the same requests' tokens at k = 8 by re-running the
      speculative loop (:func:`specctl_vllm.controller.core.offline.token_traces.trace_histograms`), since greedy outputs do not depend
      on the drafter.
  Heterogeneity (the simulator's per-request logit shift, standard deviation) is a method-of-moments
  estimate from the per-request position-1 acceptance of the n-gram drafter: the variance of the requests'
  logits minus the binomial sampling variance.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from bench.cpu.driver import Record
from specctl_vllm.controller.core.offline import token_traces

FORMAT = "specctl-sim-trace/1"


def request_traces(records: Iterable[Record]) -> list[token_traces.RequestTrace]:
    return [token_traces.RequestTrace(r.category, tuple(r.prompt_token_ids), tuple(r.token_ids))
            for r in records if r.ok and r.prompt_token_ids and r.token_ids]


def write_request_traces(path: Path, traces: Sequence[token_traces.RequestTrace]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"category": t.category, "prompt_token_ids": list(t.prompt),
                                "output_token_ids": list(t.output)}, separators=(",", ":")) + "\n" for t in traces)


def _add(hists: dict[int, list[int]], drafted: int, accepted: int) -> None:
    if drafted <= 0:
        return
    row = hists.setdefault(drafted, [0] * (drafted + 1))
    row[min(accepted, drafted)] += 1


def engine_histograms(records: Iterable[Record]) -> dict[str, dict[int, list[int]]]:
    """category -> {drafted k: accepted-count buckets} from vLLM's per-request detailed metrics."""
    out: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for r in records:
        spec = r.spec or {}
        for d, a in zip(spec.get("per_step_drafted") or [], spec.get("per_step_accepted") or []):
            _add(out[r.category], int(d), int(a))
    return dict(out)


def scored_histograms(traces: Sequence[token_traces.RequestTrace], propose: token_traces.Proposer, k: int
                      ) -> dict[str, dict[int, list[int]]]:
    out: dict[str, dict[int, list[int]]] = defaultdict(dict)
    for t in traces:
        for d, a in token_traces.trace_histograms(t, propose, k):
            _add(out[t.category], d, a)
    return dict(out)


def heterogeneity(records: Iterable[Record], min_drafts: int = 8) -> dict[str, float]:
    """Per category: sd of per-request logit(position-1 acceptance) beyond binomial noise (0 if none)."""
    logits: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        spec = r.spec or {}
        pairs = [(int(d), int(a))
                 for d, a in zip(spec.get("per_step_drafted") or [], spec.get("per_step_accepted") or [])
                 if int(d) > 0]
        if len(pairs) < min_drafts:
            continue
        p = sum(a > 0 for _, a in pairs) / len(pairs)
        p = min(max(p, 0.5 / len(pairs)), 1 - 0.5 / len(pairs))
        logits[r.category].append((math.log(p / (1 - p)), 1.0 / (len(pairs) * p * (1 - p))))
    out = {}
    for c, vals in logits.items():
        if len(vals) < 3:
            out[c] = 0.0
            continue
        xs = [x for x, _ in vals]
        mean = sum(xs) / len(xs)
        var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
        noise = sum(v for _, v in vals) / len(vals)
        out[c] = round(math.sqrt(max(0.0, var - noise)), 3)
    return out


def _wire(hists: dict[int, list[int]]) -> list[dict]:
    return [{"k": k, "accepted": v} for k, v in sorted(hists.items())]


def conditional(hists: dict[int, list[int]], k_max: int) -> list[float]:
    """Empirical conditional acceptance per position 1..k_max (0 where never reached)."""
    reached = [0] * k_max
    accepted = [0] * k_max
    for k, buckets in hists.items():
        for j, n in enumerate(buckets):
            for i in range(min(k, k_max)):  # position i+1 reached if j >= i; accepted if j >= i+1
                if j >= i:
                    reached[i] += n
                if j >= i + 1:
                    accepted[i] += n
    return [round(a / r, 4) if r else 0.0 for a, r in zip(accepted, reached)]


def sim_trace(static_records: Sequence[Record], traces: Sequence[token_traces.RequestTrace], suffix: token_traces.Proposer,
              k_max: int, source: str) -> dict:
    """The ``specctl-sim-trace/1`` document (see the module docstring)."""
    engine = engine_histograms(static_records)
    scored = scored_histograms(traces, suffix, k_max)
    hetero = heterogeneity(static_records)
    counts: dict[str, int] = defaultdict(int)
    out_len: dict[str, list[int]] = defaultdict(list)
    prompt_len: list[int] = []
    for t in traces:
        counts[t.category] += 1
        out_len[t.category].append(len(t.output))
        prompt_len.append(len(t.prompt))
    total = sum(counts.values()) or 1
    cats = []
    for c in sorted(counts):
        cats.append({
            "name": c, "share": round(counts[c] / total, 6),
            "output_tokens": round(sum(out_len[c]) / len(out_len[c])),
            "heterogeneity": hetero.get(c, 0.0),
            "hists": {"engine": _wire(engine.get(c, {})), "suffix": _wire(scored.get(c, {}))},
            "conditional_acceptance_info": {"engine": conditional(engine.get(c, {}), k_max),
                                            "suffix": conditional(scored.get(c, {}), k_max)},
        })
    return {
        "format": FORMAT, "name": "cpu-smollm2-mixed", "source": source,
        "engine": {"method": "ngram", "k_max": k_max, "model_free_methods": ["suffix"]},
        "prompt_tokens": round(sum(prompt_len) / max(len(prompt_len), 1)),
        "categories": cats,
    }
