"""The goodput policy along a recording, priced window by window: what learning costs from a cold start.

``specctl replay``'s ``goodput`` row prices the policy's decision at the end of the recording over all of it.
A controller that starts cold runs other decisions first: the cold-start default until the pool has evidence
(:func:`specctl_vllm.controller.core.policy.goodput.decide`), then decisions on a few drafts. This module prices the decision each engine would have been serving
while each recorded batch ran, against every static k over the same batches:

  * :func:`decisions_along` feeds a :class:`~specctl_vllm.controller.core.brain.Brain` the recording batch by
    batch (``brain``: a fresh one, or one restored from a snapshot: a warm start) and returns, for every batch,
    the per-category (k, drafter) the engine held while that batch's steps ran (the policy served after the batch
    before; a fresh Brain's first answer for the first);
  * :func:`price_along` prices consecutive runs of batches under one choice with the replay's model
    (:func:`specctl_vllm.controller.core.offline.whatif.estimate` on each run's own recorded work, profiles of the whole
    recording: hindsight acceptance, so the figure is the cost of the choices, not of the noise) and adds their
    times; every static k is priced over the same runs.

Pure: batches, a Brain and plain data in, figures out; the time base is the recording's engine time
(:func:`specctl_vllm.controller.core.offline.replay.engine_clock`: the engines' step clock, never ``sent_at``), as the
replay's and the report's. Only per-request engines (no ``graph_widths``) are priced here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specctl_vllm.controller.core.brain import Brain, IngestRejected
from specctl_vllm.controller.core.learn.cost_fit import Corrections, corrections
from specctl_vllm.controller.core.offline import token_traces, whatif
from specctl_vllm.controller.core.offline.replay import ReplayError, engine_clock
from specctl_vllm.kernel.cost import PRESETS, CostCoefficients
from specctl_vllm.kernel.drafters import resolve
from specctl_vllm.kernel.protocol import MAX_K, METHOD_OFF, SpecConfig, TelemetryBatch

Choice = Mapping[str, tuple[int, str]]  # category (and "_default") -> (k, drafter or off)
Timed = Sequence[tuple[float, TelemetryBatch]]  # engine_clock's answer: (engine time in seconds, batch), in time order


def served_choice(brain: Brain, model: str, spec: SpecConfig, now: float, engine_id: str) -> dict[str, tuple[int, str]]:
    """What the engine applies from the policy the brain serves it now."""
    policy = brain.policy_for(model, spec, now, engine_id)
    out = {}
    for name, cp in {"_default": policy.default, **policy.categories}.items():
        out[name] = (cp.k, resolve(cp.method, spec.method) if cp.k > 0 else METHOD_OFF)
    return out


def decisions_along(timed: Timed, spec: SpecConfig, brain: Brain,
                    origin_s: float = 0.0) -> list[dict[str, tuple[int, str]]]:
    """Per batch of ``timed``, the choice the engine held while its steps ran (see the module docstring).

    The brain sees engine time plus ``origin_s`` (a brain restored from a pass that ended at ``origin_s``
    goes on from there rather than back in time)."""
    model, engine_id = timed[-1][1].model_name, timed[-1][1].engine_id
    now = origin_s
    held = served_choice(brain, model, spec, now, engine_id)
    out = []
    for t, b in timed:
        out.append(held)
        now = origin_s + t
        try:
            brain.ingest(b, now)
        except IngestRejected:
            continue
        held = served_choice(brain, model, spec, now, engine_id)
    return out


@dataclass(frozen=True)
class PathFigures:
    """Committed tokens over modelled seconds of the batches in a window, per policy."""

    seconds: float  # engine time of the window's last batch (the recording starts at 0)
    batches: int
    goodput: float  # the policy along the path, tokens/s
    static: Mapping[int, float]  # k -> tokens/s over the same batches
    off: float

    @property
    def best_static(self) -> tuple[int, float]:
        return max(self.static.items(), key=lambda kv: kv[1]) if self.static else (0, self.off)

    @property
    def vs_best_static(self) -> float:
        best = self.best_static[1]
        return self.goodput / best if best > 0 else 0.0


def _priced(work: whatif.Workload, choice: Mapping[str, token_traces.Profile], cost: CostCoefficients,
            corr: Corrections) -> float:
    """Modelled seconds of this work under ``choice``."""
    est = whatif.estimate(work, choice, cost, None, corr)
    return sum(work.committed.values()) / est.goodput if est.goodput > 0 else 0.0


Profiles = Mapping[str, Mapping[tuple[str, int], token_traces.Profile]]


def _as_profiles(choice: Choice, work: whatif.Workload, profiles: Profiles) -> dict[str, token_traces.Profile]:
    default = choice.get("_default", (0, METHOD_OFF))
    out = {}
    for c in work.categories:
        k, m = choice.get(c, default)
        p = whatif.profile_for(profiles, c, m, k)
        out[c] = p if p is not None else token_traces.OFF  # no evidence of it anywhere in the recording: off
    return out


def price_along(timed: Timed, choices: Sequence[Choice], ks: Sequence[int],
                profiles: Profiles, cost: CostCoefficients, corr: Corrections,
                method: str, until_s: float | None = None) -> PathFigures:
    """The path's goodput and every static k's over the batches of ``timed`` that end within the first
    ``until_s`` seconds of engine time (``choices[i]``: what batch ``timed[i]`` ran under)."""
    keep = [i for i, (t, _) in enumerate(timed) if until_s is None or t <= until_s]
    runs: list[tuple[list[TelemetryBatch], Choice]] = []
    for i in keep:
        if runs and choices[i] == runs[-1][1]:
            runs[-1][0].append(timed[i][1])
        else:
            runs.append(([timed[i][1]], choices[i]))
    tokens = path_s = off_s = 0.0
    static_s = {k: 0.0 for k in ks}
    for group, choice in runs:
        work = whatif.workload_from_telemetry(group)
        if not any(v > 0 for v in work.committed.values()):
            continue
        tokens += sum(work.committed.values())
        path_s += _priced(work, _as_profiles(choice, work, profiles), cost, corr)
        off_s += _priced(work, {c: token_traces.OFF for c in work.categories}, cost, corr)
        for k in ks:
            static_s[k] += _priced(work, whatif.uniform(work, profiles, method, k), cost, corr)
    span = timed[keep[-1]][0] if keep else 0.0
    return PathFigures(span, len(keep), tokens / path_s if path_s else 0.0,
                       {k: tokens / s for k, s in static_s.items() if s > 0}, tokens / off_s if off_s else 0.0)


def path_figures(batches: Sequence[TelemetryBatch], brain: Brain, *, preset: str = "cpu",
                 ks: Sequence[int] = (1, 2, 3, 4, 6, 8), k_max: int | None = None,
                 windows: Sequence[float | None] = (60.0, None),
                 origin_s: float = 0.0) -> dict[float | None, PathFigures]:
    """The replay's setup (k_max the larger of the engine's and ``ks``, cost fitted to the recording, telemetry
    profiles, the policy's corrections at the recorded batch), the policy's path from ``brain`` (on engine time
    plus ``origin_s``), and its figures over the first ``w`` seconds of engine time for each window (None: the
    whole recording)."""
    spec0 = batches[-1].spec
    if spec0.graph_widths:
        raise ReplayError("a graph-shaped recording: its path is priced by its cells, not here")
    k_top = max(0, min(k_max if k_max is not None else max(spec0.k_max, max(ks, default=0)), MAX_K))
    spec = SpecConfig(method=spec0.method, k_max=k_top, model_free_methods=list(spec0.model_free_methods))
    fit = whatif.fit_cost_model(batches, PRESETS[preset])
    work = whatif.workload_from_telemetry(batches)
    corr = corrections(fit, float(work.batch_size or 1.0), k_top, spec0.full_cuda_graphs)
    profiles = whatif.telemetry_profiles(batches, list(range(1, k_top + 1)))
    timed, _ = engine_clock(batches)
    choices = decisions_along(timed, spec, brain, origin_s)
    ks = [k for k in ks if k <= k_top]
    return {w: price_along(timed, choices, ks, profiles, fit.coefficients(), corr, spec.method, w) for w in windows}
