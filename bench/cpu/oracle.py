"""Per-category hindsight oracle: which static (drafter, k) per category to pin, chosen after the fact.

Two candidates per concurrency, both then *run* on the patched engine with per-category pins (overrides)
and measured like every other configuration; the oracle reported is the best measured configuration among
the candidates and the uniform static runs (a uniform k is a per-category choice too):

* ``measured``: for each category, the static run (no speculation or n-gram k) with the best measured
  category goodput. Only n-gram and off can be chosen this way (vLLM's static config has no other drafter).
* ``model``: the per-category choice over {off, n-gram k, suffix k} (k = 1..8) that maximises the whole
  batch's goodput under the what-if model of :mod:`specctl_vllm.controller.core.offline.whatif`: committed tokens and draft
  tokens per step from re-running each request's real tokens through the drafter (vLLM's own n-gram, the
  patch's suffix), and a step cost ``T = a + b * tokens`` fitted to the wall times of the static runs at this
  concurrency (:func:`fit_cost`). It can pick the suffix drafter, and it accounts for the batch coupling
  (one category's k slows every request of the step).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from specctl_vllm.controller.core.offline import token_traces, whatif
from specctl_vllm.kernel.cost import CostCoefficients
from specctl_vllm.kernel.protocol import METHOD_OFF


def static_k(name: str) -> int | None:
    if name == "no_spec":
        return 0
    if name.startswith("k="):
        return int(name[2:])
    return None


def measured_argmax(per_category: Mapping[str, Mapping[str, float]]) -> dict[str, tuple[int, str]]:
    """``per_category[run][category]`` goodput of the static runs -> category -> (k, method)."""
    best: dict[str, tuple[float, int]] = {}
    for run, cats in per_category.items():
        k = static_k(run)
        if k is None:
            continue
        for c, g in cats.items():
            if c not in best or g > best[c][0]:
                best[c] = (g, k)
    return {c: (k, "ngram" if k else METHOD_OFF) for c, (_, k) in best.items()}


def workload(traces: Sequence[token_traces.RequestTrace], concurrency: int) -> whatif.Workload:
    """The measured phase's work: decode tokens per category, prefill tokens, the batch it ran at."""
    committed: dict[str, float] = {}
    prefill = 0.0
    for t in traces:
        committed[t.category] = committed.get(t.category, 0.0) + max(len(t.output) - 1, 0)
        prefill += len(t.prompt)
    return whatif.Workload(committed, prefill, float(concurrency), 0, 0.0)


def fit_cost(work: whatif.Workload, profiles, walls: Mapping[int, float]) -> tuple[CostCoefficients, dict]:
    """Least squares ``wall_k = a * S_k + b * S_k * N_k`` over the static runs (k -> measured wall seconds)."""
    rows, ys, loads = [], [], {}
    for k, wall in sorted(walls.items()):
        load = whatif.step_load(work, whatif.uniform(work, profiles, "ngram", k))
        loads[k] = load
        rows.append([load.steps, load.steps * load.tokens])
        ys.append(wall)
    x, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    a, b = (float(max(c, 0.0)) for c in coef)
    if len(ys) < 2 or a + b <= 0:
        a, b = float(y.sum() / x[:, 0].sum()), 0.0
    cost = CostCoefficients(base=a, per_request=0.0, per_token=b, per_token_above_knee=0.0, draft_fixed=0.0,
                            draft_fixed_per_request=0.0, draft_pass=0.0, draft_pass_per_request=0.0,
                            free_draft_token=0.0, knee=0.0)
    fit = {str(k): {"measured_wall_s": walls[k], "model_wall_s": loads[k].steps * cost.step_time(
        work.batch_size, loads[k].tokens), "steps": loads[k].steps, "tokens_per_step": loads[k].tokens}
        for k in walls}
    return cost, {"base_s": a, "per_token_s": b, "runs": fit}


def model_choice(work: whatif.Workload, profiles, cost: CostCoefficients) -> dict[str, tuple[int, str]]:
    ks = sorted({k for per in profiles.values() for (_, k) in per})
    starts = [whatif.uniform(work, profiles, "ngram", k) for k in ks]
    best = whatif.best_static(work, profiles, cost, starts=starts)
    return {c: (p.k, p.method if p.k else METHOD_OFF) for c, p in best.items()}


def predicted_goodput(work: whatif.Workload, profiles, cost: CostCoefficients,
                      pins: Mapping[str, tuple[int, str]]) -> float:
    choice = {c: whatif.profile_for(profiles, c, m, k) or token_traces.OFF for c, (k, m) in pins.items()}
    return whatif.estimate(work, choice, cost).goodput
