"""Reading and steering a running controller over its HTTP API (e2e tests, demo, benchmarks).

Counters come from the controller's ``/metrics`` (parsed with prometheus_client), per ``(category, method)``;
overrides go through ``PUT/DELETE /v1/overrides/{category}`` with the admin token.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

_COUNTERS = {
    "specctl_drafts": "drafts",
    "specctl_draft_tokens": "draft_tokens",
    "specctl_accepted_tokens": "accepted_tokens",
}
_PER_CATEGORY = {
    "specctl_request_steps": "request_steps",
    "specctl_spec_off_request_steps": "spec_off_request_steps",
    "specctl_committed_tokens": "committed_tokens",
}


@dataclass(frozen=True)
class CategoryCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    request_steps: float = 0.0
    spec_off_request_steps: float = 0.0
    committed_tokens: float = 0.0

    def __sub__(self, other: CategoryCounters) -> CategoryCounters:
        return CategoryCounters(*(a - b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[float, ...]:
        return (self.drafts, self.draft_tokens, self.accepted_tokens, self.request_steps,
                self.spec_off_request_steps, self.committed_tokens)

    @property
    def tokens_per_draft(self) -> float:
        return self.draft_tokens / self.drafts if self.drafts else 0.0


class Counters(dict[str, CategoryCounters]):
    """category -> counters (all draft methods summed), from one ``/metrics`` scrape."""

    def total(self) -> CategoryCounters:
        out = CategoryCounters()
        for value in self.values():
            out = CategoryCounters(*(a + b for a, b in zip(out.astuple(), value.astuple())))
        return out

    def get_or_zero(self, category: str) -> CategoryCounters:
        return self.get(category, CategoryCounters())

    def __sub__(self, other: Counters) -> Counters:
        return Counters({c: self.get_or_zero(c) - other.get_or_zero(c) for c in set(self) | set(other)})


def read_counters(url: str, model: str | None = None) -> Counters:
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10.0).text
    fields: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            base = sample.name[: -len("_total")]
            name = _COUNTERS.get(base) or _PER_CATEGORY.get(base)
            if name is None or "category" not in sample.labels:
                continue
            if model is not None and sample.labels.get("model_name") != model:
                continue
            fields[sample.labels["category"]][name] += sample.value
    return Counters({c: CategoryCounters(**v) for c, v in fields.items()})


def read_method_counters(url: str) -> dict[tuple[str, str], CategoryCounters]:
    """(category, method) -> draft counters (drafts, draft tokens, accepted tokens) of drafts actually run."""
    text = httpx.get(url.rstrip("/") + "/metrics", timeout=10.0).text
    fields: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = _COUNTERS.get(sample.name[: -len("_total")]) if sample.name.endswith("_total") else None
            if name is not None and "category" in sample.labels and "method" in sample.labels:
                fields[(sample.labels["category"], sample.labels["method"])][name] += sample.value
    return {key: CategoryCounters(**v) for key, v in fields.items()}


def wait_stable(url: str, *, settle_s: float = 0.6, timeout_s: float = 20.0, model: str | None = None) -> Counters:
    """Counters once they stopped changing for ``settle_s`` (the engine's last batches have arrived)."""
    deadline = time.monotonic() + timeout_s
    last = read_counters(url, model)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = read_counters(url, model)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= settle_s:
            return now
    return last


def category(url: str, name: str, model: str | None = None) -> dict[str, Any]:
    """``GET /v1/categories/{name}`` (optionally of one model)."""
    params = {"model": model} if model else None
    response = httpx.get(f"{url.rstrip('/')}/v1/categories/{name}", params=params, timeout=10.0)
    response.raise_for_status()
    return response.json()


def categories(url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url.rstrip('/')}/v1/categories", timeout=10.0)
    response.raise_for_status()
    return response.json()


def engines(url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url.rstrip('/')}/v1/engines", timeout=10.0)
    response.raise_for_status()
    return response.json()


def set_override(url: str, admin_token: str, name: str, *, k: int | None = None, method: str | None = None,
                 off: bool = False, ttl_s: float | None = None, reason: str = "test", actor: str = "e2e") -> dict:
    body = {"k": k, "method": method, "off": off, "ttl_s": ttl_s, "reason": reason, "actor": actor}
    response = httpx.put(f"{url.rstrip('/')}/v1/overrides/{name}", json=body,
                         headers={"Authorization": f"Bearer {admin_token}"}, timeout=10.0)
    response.raise_for_status()
    return response.json()


def clear_override(url: str, admin_token: str, name: str, *, reason: str = "test", actor: str = "e2e") -> None:
    response = httpx.delete(f"{url.rstrip('/')}/v1/overrides/{name}", params={"reason": reason, "actor": actor},
                            headers={"Authorization": f"Bearer {admin_token}"}, timeout=10.0)
    if response.status_code not in (200, 204, 404):
        response.raise_for_status()
