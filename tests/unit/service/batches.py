"""Telemetry batches for the service tests, as JSON-able dicts (what an engine would post)."""

from __future__ import annotations

from typing import Any

MODEL = "test-model"


def hist(k: int, accepted: list[int]) -> dict[str, Any]:
    return {"k": k, "accepted": list(accepted)}


def step(categories: dict[str, list[dict[str, Any]]], *, t: float = 0.0, wall_s: float = 0.02,
         method: str = "ngram", extra_requests: int = 0) -> dict[str, Any]:
    """One engine step; ``categories`` maps a name to its histograms (requests = drafted + extra)."""
    cats, requests, drafts = [], 0, 0
    for name, hists in categories.items():
        drafted = sum(sum(h["accepted"]) for h in hists)
        n = drafted + extra_requests
        cats.append({"category": name, "method": method, "requests": n, "hists": hists})
        requests += n
        drafts += sum(h["k"] * sum(h["accepted"]) for h in hists)
    return {"t": t, "wall_s": wall_s, "batch_size": requests, "scheduled_tokens": requests + drafts,
            "draft_tokens": drafts, "categories": cats}


def batch(seq: int, steps: list[dict[str, Any]] | None = None, *, engine_id: str = "engine-a", k_max: int = 4,
          method: str = "ngram", boot_id: str = "boot-1", model: str = MODEL, sent_at: float = 1000.0,
          **extra: Any) -> dict[str, Any]:
    if steps is None:
        steps = [step({"code": [hist(k_max, [1] + [0] * (k_max - 1) + [3])]}, method=method)]
    return {"protocol": 1, "engine_id": engine_id, "boot_id": boot_id, "model_name": model, "seq": seq,
            "sent_at": sent_at, "spec": {"method": method, "k_max": k_max}, "steps": steps, **extra}
