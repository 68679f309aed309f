"""``specctl bench``: "should I turn it on?" measured on your own requests, against your own endpoint (pure parts).

The request file is JSON lines, one request per line::

    {"messages": [{"role": "user", "content": "..."}], "category": "chat", "max_tokens": 256}
    {"prompt": "def fib(n):", "max_tokens": 128}                                   # completions endpoint
    {"messages": [...], "response_format": {"type": "json_object"}, "category": "structured"}
    {"messages": [...], "tools": [...], "tool_choice": "auto"}

``messages`` (chat) or ``prompt`` (completions) is required; ``category``, ``max_tokens`` (default 256),
``response_format``, ``tools``, ``tool_choice`` and ``temperature`` (default 0) are optional. Any other key is
refused, so a typo does not silently change what is measured. Without ``category`` a request is named the way
the engine's middleware would (``tools`` -> ``tool_call``, ``response_format`` -> ``structured``, else
``default``).

Configurations (``--config``, repeatable; each is measured on the same requests):

* ``NAME=URL``: an OpenAI-compatible endpoint (e.g. one vLLM started without speculation, one with it);
* ``off``, ``k=N``, ``k=CAT:N,CAT:N,...``, ``specctl``: one endpoint with a specctl controller (``--controller``):
  the bench pins operator overrides for every category of the file (off / that k), or clears them (specctl: the
  controller's own policy), before each run.

Runs are interleaved and repeated: round r measures every configuration once, in an order rotated by r, so
drift (thermal, other tenants, cache warm-up) spreads over all of them; the spread across rounds is reported.

This module has no I/O: parsing, the schedule, percentiles and the summary. ``specctl_vllm.controller.bench_cli`` sends
the requests and reads the metrics.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specctl_vllm.kernel.protocol import CATEGORY_PATTERN, MAX_K, category_name

REQUEST_KEYS = {"messages", "prompt", "category", "max_tokens", "response_format", "tools", "tool_choice",
                "temperature"}
DEFAULT_MAX_TOKENS = 256
PERCENTILES = (50, 90, 99)


class BenchError(ValueError):
    """Bad input (request file, configuration); the message says where."""


@dataclass(frozen=True)
class BenchRequest:
    index: int
    category: str
    kind: str  # chat | completion
    body: dict[str, Any]  # the OpenAI body without model/stream (added when sent)
    max_tokens: int


@dataclass(frozen=True)
class Config:
    name: str
    kind: str  # endpoint | override
    url: str | None = None  # endpoint
    ks: Mapping[str, int] | None = None  # override: category -> k (None: clear = specctl's policy)
    k_all: int | None = None  # override: the same k for every category (0 = off)


@dataclass
class Result:
    """One request's outcome."""

    category: str
    ok: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)  # gaps between streamed chunks after the first
    error: str | None = None


def default_category(body: Mapping[str, Any]) -> str:
    if body.get("tools") and body.get("tool_choice") != "none":
        return "tool_call"
    if body.get("response_format") and (body["response_format"] or {}).get("type") != "text":
        return "structured"
    return "default"


def parse_requests(lines: Iterable[str], source: str = "requests") -> list[BenchRequest]:
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source}:{i}"
        try:
            d = json.loads(line)
        except ValueError as exc:
            raise BenchError(f"{where}: not JSON ({exc})") from None
        if not isinstance(d, dict):
            raise BenchError(f"{where}: not a JSON object")
        unknown = set(d) - REQUEST_KEYS
        if unknown:
            raise BenchError(f"{where}: unknown keys {sorted(unknown)} (allowed: {sorted(REQUEST_KEYS)})")
        has_messages, has_prompt = "messages" in d, "prompt" in d
        if has_messages == has_prompt:
            raise BenchError(f"{where}: give exactly one of messages (chat) or prompt (completions)")
        if has_messages and not (isinstance(d["messages"], list) and d["messages"]
                                 and all(isinstance(m, dict) and "role" in m for m in d["messages"])):
            raise BenchError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
        if has_prompt and not (isinstance(d["prompt"], str) and d["prompt"]):
            raise BenchError(f"{where}: prompt must be a non-empty string")
        max_tokens = d.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= 1_000_000:
            raise BenchError(f"{where}: max_tokens must be an integer >= 1")
        raw = d.get("category") or default_category(d)
        category = category_name(raw)  # the one rule: ASCII case folds (protocol.category_name)
        if category is None:
            raise BenchError(f"{where}: category {raw!r} does not match {CATEGORY_PATTERN} (ASCII case folds)")
        body = {k: v for k, v in d.items() if k != "category"}
        body["max_tokens"] = max_tokens
        body.setdefault("temperature", 0)
        # The engine's middleware reads the category from vllm_xargs (docs/engine.md).
        body["vllm_xargs"] = {"specctl_category": category}
        out.append(BenchRequest(len(out), category, "chat" if has_messages else "completion", body, max_tokens))
    if not out:
        raise BenchError(f"{source}: no requests")
    return out


def parse_config(text: str) -> Config:
    """``NAME=URL``, ``off``, ``specctl``, ``k=N`` or ``k=CAT:N,CAT:N``."""
    text = text.strip()
    if text in ("off", "specctl"):
        return Config(text, "override", k_all=0 if text == "off" else None)
    name, sep, value = text.partition("=")
    if not sep or not value:
        raise BenchError(f"--config {text!r}: expected NAME=URL, off, specctl, k=N or k=CAT:N,...")
    if name == "k":
        if ":" not in value:
            k = _k(value, text)
            return Config(f"k={k}", "override", k_all=k)
        ks = {}
        for part in value.split(","):
            raw, _, num = part.partition(":")
            cat = category_name(raw)
            if cat is None:
                raise BenchError(f"--config {text!r}: bad category {raw!r}")
            if cat in ks:
                raise BenchError(f"--config {text!r}: category {cat!r} given twice")
            ks[cat] = _k(num, text)
        return Config(text, "override", ks=ks)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}", name):
        raise BenchError(f"--config {text!r}: the name must be letters, digits, '_', '.', '-'")
    if not re.match(r"^https?://", value):
        raise BenchError(f"--config {text!r}: the URL must start with http:// or https://")
    return Config(name, "endpoint", url=value.rstrip("/"))


def _k(text: str, where: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise BenchError(f"--config {where!r}: k must be an integer") from None
    if not 0 <= k <= MAX_K:
        raise BenchError(f"--config {where!r}: k must be within 0..{MAX_K}")
    return k


def overrides_for(config: Config, categories: Iterable[str]) -> dict[str, int | None]:
    """category -> pinned k (0 = off), or None to clear the override (the controller's policy decides)."""
    cats = sorted(set(categories))
    if config.kind != "override":
        return {}
    if config.ks is not None:
        return {c: config.ks.get(c) for c in cats}  # categories not listed run specctl's policy
    return {c: config.k_all for c in cats}


#: The actor the bench writes its overrides as (and recognises its own by).
BENCH_ACTOR = "specctl-bench"
#: An override action: (category, PUT body), or (category, None) for DELETE.
Action = tuple[str, "dict[str, Any] | None"]


def pinned_categories(configs: Sequence[Config], categories: Iterable[str]) -> list[str]:
    """Categories some configuration of the run would pin."""
    return sorted({c for config in configs for c, k in overrides_for(config, categories).items() if k is not None})


def operator_overrides(found: Sequence[Mapping[str, Any]], pinned: Iterable[str]) -> list[str]:
    """Categories the bench would pin that carry an override it did not set (``found``: GET /v1/overrides)."""
    wanted = set(pinned)
    return sorted(o["category"] for o in found if o["category"] in wanted and o.get("actor") != BENCH_ACTOR)


def put_back(override: Mapping[str, Any]) -> dict[str, Any]:
    """The PUT body that restores an override as GET /v1/overrides showed it (its remaining TTL)."""
    body: dict[str, Any] = {"reason": override["reason"], "actor": override["actor"], "off": override["off"]}
    if override.get("k") is not None and not override["off"]:
        body["k"] = override["k"]
    if override.get("method") is not None and not override["off"]:
        body["method"] = override["method"]
    remaining = override.get("ttl_remaining_s")
    if remaining is not None:
        body["ttl_s"] = max(1.0, float(remaining))
    return body


@dataclass
class OverrideLedger:
    """What the bench changed on the controller, so that it restores exactly that and nothing else.

    ``found``: the overrides in force before the run, by category. A category the bench never pinned is never
    written; one it pinned gets back what was found there (deleted if nothing was)."""

    found: dict[str, dict[str, Any]]
    pinned: set[str] = field(default_factory=set)

    def actions(self, config: Config, categories: Iterable[str]) -> list[Action]:
        out: list[Action] = []
        for category, k in overrides_for(config, categories).items():
            if k is None:
                if category in self.pinned:  # the policy decides again: what was there before comes back
                    out.append(self._restore(category))
                    self.pinned.discard(category)
                continue
            body = {"off": True} if k == 0 else {"k": k}
            out.append((category, {**body, "reason": f"specctl bench: {config.name}", "actor": BENCH_ACTOR,
                                   "ttl_s": 3600}))
            self.pinned.add(category)
        return out

    def restore(self) -> list[Action]:
        out = [self._restore(c) for c in sorted(self.pinned)]
        self.pinned.clear()
        return out

    def _restore(self, category: str) -> Action:
        held = self.found.get(category)
        return (category, None) if held is None else (category, put_back(held))


def schedule(configs: Sequence[Config], repeats: int) -> list[tuple[int, Config]]:
    """(round, config) in run order: every round measures each configuration once, rotated by the round."""
    n = len(configs)
    return [(r, configs[(r + i) % n]) for r in range(repeats) for i in range(n)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(results: Sequence[Result], wall_s: float, acceptance: Mapping[str, Mapping[str, float]] | None = None
              ) -> dict[str, Any]:
    """One run: per category and overall goodput (output tokens / wall second), TTFT/ITL percentiles, errors,
    and acceptance (from counter deltas: ``{category: {"drafts", "draft_tokens", "accepted"}}``)."""
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.category, []).append(r)
    out: dict[str, Any] = {}
    for name, rs in [*sorted(groups.items()), ("overall", list(results))]:
        ok = [r for r in rs if r.ok]
        tokens = sum(r.output_tokens for r in ok)
        ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
        itl = [x for r in ok for x in r.itl_s]
        tpot = [(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok
                if r.e2e_s is not None and r.ttft_s is not None and r.output_tokens > 1]
        row: dict[str, Any] = {
            "requests": len(rs), "errors": len(rs) - len(ok), "output_tokens": tokens,
            "goodput_tok_s": tokens / wall_s if wall_s > 0 else None,
            **{f"ttft_p{q}_ms": _ms(percentile(ttft, q)) for q in PERCENTILES},
            **{f"itl_p{q}_ms": _ms(percentile(itl, q)) for q in PERCENTILES},
            "tpot_mean_ms": _ms(sum(tpot) / len(tpot)) if tpot else None,
        }
        acc = _acceptance(acceptance, None if name == "overall" else name)
        if acc is not None:
            row.update(acc)
        out[name] = row
    errors = sorted({r.error for r in results if r.error})[:5]
    return {"wall_s": wall_s, "categories": out, "error_samples": errors}


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000.0, 3)


def _acceptance(acceptance: Mapping[str, Mapping[str, float]] | None, category: str | None) -> dict | None:
    if not acceptance:
        return None
    rows = [v for c, v in acceptance.items() if category is None or c == category]
    drafts = sum(v.get("drafts", 0.0) for v in rows)
    draft_tokens = sum(v.get("draft_tokens", 0.0) for v in rows)
    accepted = sum(v.get("accepted", 0.0) for v in rows)
    if drafts <= 0:
        return {"drafts": 0, "acceptance_rate": None, "mean_acceptance_length": None}
    return {"drafts": drafts, "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
            "mean_acceptance_length": 1.0 + accepted / drafts}


def aggregate(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per configuration, per category, per metric: mean, min, max and the values of every round."""
    by_config: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        by_config.setdefault(run["config"], []).append(run)
    out: dict[str, Any] = {}
    for config, rs in by_config.items():
        cats: dict[str, Any] = {}
        for cat in sorted({c for r in rs for c in r["summary"]["categories"]}):
            metrics: dict[str, Any] = {}
            for key in sorted({k for r in rs for k in r["summary"]["categories"].get(cat, {})}):
                values = [r["summary"]["categories"][cat].get(key) for r in rs if cat in r["summary"]["categories"]]
                nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
                if not nums:
                    continue
                mean = sum(nums) / len(nums)
                metrics[key] = {"mean": mean, "min": min(nums), "max": max(nums), "values": values}
            cats[cat] = metrics
        out[config] = cats
    return out


def format_table(agg: Mapping[str, Any], baseline: str | None = None) -> str:
    """The overall and per-category rows: goodput (mean, min-max, vs baseline), TTFT/ITL p50/p99, acceptance."""
    headers = ["config", "category", "goodput tok/s", "range", "vs " + (baseline or "-"), "TTFT p50/p99 ms",
               "ITL p50/p99 ms", "accept", "mean acc len", "errors"]
    rows = []
    for config, cats in agg.items():
        for cat in ["overall", *[c for c in cats if c != "overall"]]:
            m = cats.get(cat)
            if not m:
                continue
            g = m.get("goodput_tok_s", {})
            base = (agg.get(baseline) or {}).get(cat, {}).get("goodput_tok_s", {}).get("mean") if baseline else None
            rows.append([
                config, cat, _f(g.get("mean"), 1), f"{_f(g.get('min'), 1)}-{_f(g.get('max'), 1)}",
                _f(g["mean"] / base, 3) if base and g.get("mean") is not None else "-",
                f"{_f(_mean(m, 'ttft_p50_ms'), 1)}/{_f(_mean(m, 'ttft_p99_ms'), 1)}",
                f"{_f(_mean(m, 'itl_p50_ms'), 1)}/{_f(_mean(m, 'itl_p99_ms'), 1)}",
                _f(_mean(m, "acceptance_rate"), 3), _f(_mean(m, "mean_acceptance_length"), 2),
                _f(_mean(m, "errors"), 0),
            ])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _mean(m: Mapping[str, Any], key: str) -> float | None:
    v = m.get(key)
    return v["mean"] if v else None


def _f(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def parse_prometheus_counters(text: str, names: Mapping[str, str], label: str | None) -> dict[str, dict[str, float]]:
    """Sum counters from Prometheus text: ``names`` maps metric name -> key; grouped by ``label`` (or "all")."""
    out: dict[str, dict[str, float]] = {}
    pattern = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|\+Inf|-Inf)")
    for line in text.splitlines():
        match = pattern.match(line)
        if not match or match.group(1) not in names:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if labels.get("counterfactual") == "true":
            continue
        group = labels.get(label, "") if label else "all"
        value = float(match.group(3))
        if math.isfinite(value):
            row = out.setdefault(group, {})
            row[names[match.group(1)]] = row.get(names[match.group(1)], 0.0) + value
    return out


def counter_delta(after: Mapping[str, Mapping[str, float]], before: Mapping[str, Mapping[str, float]]
                  ) -> dict[str, dict[str, float]]:
    return {g: {k: v - before.get(g, {}).get(k, 0.0) for k, v in row.items()} for g, row in after.items()}


#: specctl controller counters (per category) and vLLM's own (aggregate), as acceptance inputs.
SPECCTL_COUNTERS = {"specctl_drafts_total": "drafts", "specctl_draft_tokens_total": "draft_tokens",
                    "specctl_accepted_tokens_total": "accepted"}
VLLM_COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total":
                 "draft_tokens", "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
