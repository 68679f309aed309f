"""Workload traces for the simulator: per-category acceptance profiles, shares and lengths.

Trace format (JSON, ``"format": "specctl-sim-trace/1"``)::

    {
      "format": "specctl-sim-trace/1",
      "name": "mixed",
      "source": "where the numbers come from",
      "engine": {"method": "draft_model", "k_max": 8, "model_free_methods": ["ngram", "suffix"]},
      "prompt_tokens": 256,
      "categories": [
        {"name": "code", "share": 0.3, "output_tokens": 256, "heterogeneity": 0.8,
         "acceptance": {"engine": [0.81, 0.79, ...], "ngram": [...], "suffix": [...]},
         "hists": {"engine": [{"k": 4, "accepted": [a0, a1, a2, a3, a4]}]}}
      ]
    }

Per category and drafter either ``acceptance`` (conditional acceptance per position 1..k_max; shorter lists
repeat their last value) or ``hists`` (recorded accepted-length histograms, exactly the wire protocol's
``DraftHistogram``; converted with the controller's own estimator). ``engine`` names the engine's own
drafter. ``heterogeneity`` is the standard deviation, in logits, of a per-request shift of all positions
(requests of one category differ: one JSON body copies, another invents), 0 for identical requests.
:func:`trace_from_telemetry` turns recorded controller telemetry (TelemetryBatch JSON lines, e.g. from
the CPU engine) into a trace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specctl_vllm.controller.core.learn.estimator import AcceptanceEstimator
from specctl_vllm.kernel.protocol import TelemetryBatch

FORMAT = "specctl-sim-trace/1"
ENGINE = "engine"


@dataclass(frozen=True)
class CategoryProfile:
    name: str
    share: float  # share of arriving requests
    output_tokens: int
    heterogeneity: float
    betas: dict[str, np.ndarray]  # drafter -> conditional acceptance per position (length k_max)


@dataclass(frozen=True)
class Trace:
    name: str
    source: str
    engine_method: str
    k_max: int
    model_free_methods: tuple[str, ...]
    prompt_tokens: int
    categories: tuple[CategoryProfile, ...]

    @property
    def methods(self) -> tuple[str, ...]:
        """Drafter names in simulator order: index 0 is the engine's own drafter."""
        return (ENGINE, *self.model_free_methods)


def _pad(values: list[float], k_max: int) -> np.ndarray:
    vals = [float(v) for v in values] or [0.0]
    if any(not 0.0 <= v <= 1.0 for v in vals):
        raise ValueError("acceptance must be within [0, 1]")
    return np.array((vals + [vals[-1]] * k_max)[:k_max])


def _betas_from_hists(hists: list[dict], k_max: int) -> np.ndarray:
    est = AcceptanceEstimator()
    est.decay_to(0.0, 1.0)
    for h in hists:
        est.add(int(h["k"]), [int(x) for x in h["accepted"]], counterfactual=False)
    return np.array(est.betas(k_max, 0.5, 1.0))


def parse(data: dict) -> Trace:
    if data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} trace")
    eng = data["engine"]
    k_max = int(eng["k_max"])
    free = tuple(eng.get("model_free_methods", []))
    cats = []
    for c in data["categories"]:
        betas: dict[str, np.ndarray] = {}
        for m, vals in c.get("acceptance", {}).items():
            betas[m] = _pad(vals, k_max)
        for m, hs in c.get("hists", {}).items():
            betas[m] = _betas_from_hists(hs, k_max)
        for m in (ENGINE, *free):
            if m not in betas:
                betas[m] = np.zeros(k_max)  # a drafter with no profile never matches
        cats.append(CategoryProfile(c["name"], float(c["share"]), int(c.get("output_tokens", 256)),
                                    float(c.get("heterogeneity", 0.0)), betas))
    total = sum(c.share for c in cats)
    if total <= 0:
        raise ValueError("category shares must sum to > 0")
    cats = [CategoryProfile(c.name, c.share / total, c.output_tokens, c.heterogeneity, c.betas) for c in cats]
    return Trace(data.get("name", "trace"), data.get("source", ""), eng.get("method", "draft_model"), k_max, free,
                 int(data.get("prompt_tokens", 256)), tuple(cats))


def load(path: str | Path) -> Trace:
    return parse(json.loads(Path(path).read_text()))


def trace_from_telemetry(lines: list[str], name: str = "recorded", output_tokens: int = 256) -> dict:
    """A trace from recorded TelemetryBatch JSON lines: shares from request-steps, profiles from histograms."""
    hists: dict[str, dict[str, list[dict]]] = {}
    requests: dict[str, int] = {}
    engine_method, k_max, free = "ngram", 1, []
    for line in lines:
        b = TelemetryBatch.model_validate_json(line)
        engine_method, k_max, free = b.spec.method, max(k_max, b.spec.k_max), list(b.spec.model_free_methods)
        for step in b.steps:
            for cs in step.categories:
                requests[cs.category] = requests.get(cs.category, 0) + cs.requests
                per = hists.setdefault(cs.category, {})
                if cs.hists:
                    key = ENGINE if cs.method == engine_method else cs.method
                    per.setdefault(key, []).extend(h.model_dump() for h in cs.hists)
                for m, hs in cs.counterfactual.items():
                    per.setdefault(m, []).extend(h.model_dump() for h in hs)
    total = sum(requests.values()) or 1
    free = [m for m in free if m != engine_method]
    return {
        "format": FORMAT, "name": name, "source": "recorded controller telemetry",
        "engine": {"method": engine_method, "k_max": k_max, "model_free_methods": free},
        "prompt_tokens": 256,
        "categories": [{"name": c, "share": n / total, "output_tokens": output_tokens, "heterogeneity": 0.0,
                        "hists": hists.get(c, {})} for c, n in sorted(requests.items())],
    }


def _ramp(first: float, last: float, k: int = 8) -> list[float]:
    return [round(first + (last - first) * i / (k - 1), 4) for i in range(k)]


def builtin_mixed() -> dict:
    """Mixed workload matching published per-position acceptance of DSpark-class drafters.

    code/math 72-81 % per position, conversation 19-31 % (issue 4); a copy-heavy 'edit' category where
    model-free drafters shine. Model-free profiles are assumptions (documented in docs/policy.md).
    """
    return {
        "format": FORMAT, "name": "mixed-dspark",
        "source": "published per-position acceptance (code/math 72-81 %, conversation 19-31 %); "
                  "model-free profiles assumed",
        "engine": {"method": "draft_model", "k_max": 8, "model_free_methods": ["ngram", "suffix"]},
        "prompt_tokens": 256,
        "categories": [
            {"name": "code", "share": 0.3, "output_tokens": 320, "heterogeneity": 0.8,
             "acceptance": {ENGINE: _ramp(0.81, 0.72), "ngram": _ramp(0.3, 0.2), "suffix": _ramp(0.35, 0.25)}},
            {"name": "math", "share": 0.2, "output_tokens": 256, "heterogeneity": 0.6,
             "acceptance": {ENGINE: _ramp(0.80, 0.74), "ngram": _ramp(0.2, 0.15), "suffix": _ramp(0.25, 0.2)}},
            {"name": "conversation", "share": 0.4, "output_tokens": 200, "heterogeneity": 0.8,
             "acceptance": {ENGINE: _ramp(0.31, 0.19), "ngram": _ramp(0.12, 0.08), "suffix": _ramp(0.15, 0.1)}},
            {"name": "edit", "share": 0.1, "output_tokens": 256, "heterogeneity": 1.0,
             "acceptance": {ENGINE: _ramp(0.70, 0.65), "ngram": _ramp(0.85, 0.8), "suffix": _ramp(0.9, 0.85)}},
        ],
    }
