"""Tiny builders for core tests: deterministic histograms, steps and batches, a config and a brain."""

from __future__ import annotations

from specctl_vllm.controller.core.brain import Brain
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.kernel.cost import H200
from specctl_vllm.kernel.protocol import CategoryStep, DraftHistogram, SpecConfig, StepRecord, TelemetryBatch

SPEC = SpecConfig(method="eagle3", k_max=4, model_free_methods=[])


def length_counts(betas: list[float], k: int, n: int) -> list[int]:
    """Expected histogram of accepted lengths for n drafts at k under conditional acceptance ``betas``."""
    probs = []
    reach = 1.0
    for i in range(k):
        probs.append(reach * (1 - betas[i]))
        reach *= betas[i]
    probs.append(reach)
    counts = [round(p * n) for p in probs]
    counts[0] += n - sum(counts)  # rounding remainder to the zero bucket keeps sum == n
    return counts


def hist(betas: list[float], k: int, n: int) -> DraftHistogram:
    return DraftHistogram(k=k, accepted=length_counts(betas, k, n))


def cat_step(category: str, n: int, betas: list[float] | None, k: int = 4, method: str = "eagle3",
             cf: dict[str, list[float]] | None = None) -> CategoryStep:
    hists = [hist(betas, k, n)] if betas is not None and k > 0 else []
    counterfactual = {m: [hist(b, k, n)] for m, b in (cf or {}).items()}
    return CategoryStep(category=category, method=method if hists else "off", requests=n, hists=hists,
                        counterfactual=counterfactual)


def step(cats: list[CategoryStep], wall_s: float | None = None, depth: int = 4, t: float = 0.0) -> StepRecord:
    """A step; its wall time is what the H200 preset predicts unless given (the machine matches the preset)."""
    n = sum(c.requests for c in cats)
    drafts = sum(h.k * h.drafts for c in cats for h in c.hists)
    free = sum(h.k * h.drafts for c in cats if c.method in ("ngram", "suffix") for h in c.hists)
    d = depth if drafts > free else 0
    if wall_s is None:
        wall_s = H200.step_time(n, n + drafts, d, free)
    return StepRecord(t=t, wall_s=wall_s, batch_size=n, scheduled_tokens=n + drafts, draft_tokens=drafts,
                      draft_depth=d, categories=cats)


def batch(steps: list[StepRecord], seq: int, engine: str = "e1", boot: str = "b1", model: str = "m",
          spec: SpecConfig = SPEC, dropped: int = 0) -> TelemetryBatch:
    return TelemetryBatch(engine_id=engine, boot_id=boot, model_name=model, seq=seq, sent_at=0.0, spec=spec,
                          dropped_steps=dropped, steps=steps)


def config(preset: str = "h200", **policy) -> BrainConfig:
    return BrainConfig(LearnerSettings(), PolicySettings(cost_preset=preset, **policy))


def brain(preset: str = "h200", **policy) -> Brain:
    return Brain(config(preset, **policy))
