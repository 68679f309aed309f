"""``specctl report``: one self-contained HTML page about the controller's categories (pure functions).

Input is plain data (:func:`from_recording` builds it from telemetry batches; ``specctl_vllm.controller.report_cli`` builds
it from a live controller's API): the category views of ``GET /v1/categories``, the overrides in force, and a
timeline of (k, method) per category. Output (:func:`render_html`): one HTML file with inline SVG charts, no
script, no external file, no network:

* per category, the distribution of the acceptance length (1 ... k+1 tokens per verified draft; vLLM's
  definition) and the mean;
* per category, the learned conditional acceptance per draft position (with its 95 % interval);
* k and method over time per category (what ran, from the recording; what the policy chose);
* the estimated goodput against k at the current load (the decision's goodput table);
* the overrides in force.

Time is injected (``generated_at``); nothing here reads a clock, a file or the network.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specctl_vllm.controller.core.brain import Brain, IngestRejected
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.controller.core.offline.replay import engine_clock
from specctl_vllm.controller.report_svg import PAD_L, bar_chart, esc, line_chart
from specctl_vllm.kernel.drafters import resolve
from specctl_vllm.kernel.protocol import METHOD_OFF, TelemetryBatch

__all__ = ["PAD_L", "ReportError", "bar_chart", "decision_row", "from_live", "from_recording", "line_chart",
           "render_html"]

#: Half-lives as long as allowed: a recording is weighted evenly (as in ``specctl replay``).
REPORT_LEARNER = LearnerSettings(half_life_s=86_400, mix_half_life_s=3_600, cost_half_life_s=86_400)


class ReportError(ValueError):
    """Input a report cannot be built from; the message says why."""


# --- data ------------------------------------------------------------------------------------------------------


def ran_per_batch(batch: TelemetryBatch) -> dict[str, tuple[float, str]]:
    """Per category, the mean k drafted in the batch's steps (real drafts, weighted by drafts) and the method
    that drafted most; categories that ran without drafts get ``(0, "off")``."""
    weights: dict[str, dict[str, float]] = {}
    ks: dict[str, float] = {}
    drafts: dict[str, float] = {}
    seen: set[str] = set()
    for step in batch.steps:
        for cat in step.categories:
            seen.add(cat.category)
            for h in cat.hists:
                n = float(sum(h.accepted))
                if n <= 0:
                    continue
                ks[cat.category] = ks.get(cat.category, 0.0) + h.k * n
                drafts[cat.category] = drafts.get(cat.category, 0.0) + n
                per = weights.setdefault(cat.category, {})
                per[cat.method] = per.get(cat.method, 0.0) + n
    out = {}
    for name in seen:
        if drafts.get(name):
            method = max(weights[name].items(), key=lambda kv: kv[1])[0]
            out[name] = (ks[name] / drafts[name], method)
        else:
            out[name] = (0.0, METHOD_OFF)
    return out


def from_recording(batches: Sequence[TelemetryBatch], *, model: str | None = None, preset: str = "cpu",
                   generated_at: float = 0.0, source: str = "recording", max_points: int = 400) -> dict[str, Any]:
    """Feed the recording through the controller's Brain (on the engines' own step clock: ``engine_clock``) and describe the end
    state, with the k/method that ran and that the policy chose along the way."""
    if not batches:
        raise ReportError("no telemetry batches")
    models = sorted({b.model_name for b in batches})
    if model is None:
        if len(models) > 1:
            raise ReportError(f"the recording holds several models {models}: choose one with --model")
        model = models[0]
    batches = [b for b in batches if b.model_name == model]
    if not batches:
        raise ReportError(f"no telemetry for model {model!r} (found {models})")
    brain = Brain(BrainConfig(REPORT_LEARNER, PolicySettings(cost_preset=preset)))
    timed, clock_notes = engine_clock(batches)  # the engines' step clock, never sent_at
    now = 0.0
    every = max(timed[-1][0] / max(max_points, 1), brain.config.policy.interval_s)
    next_sample = 0.0
    timeline: list[dict[str, Any]] = []
    rejected = 0
    for now, b in timed:
        try:
            brain.ingest(b, now)
        except IngestRejected:
            rejected += 1
            continue
        t = round(now, 3)
        for name, (k, method) in sorted(ran_per_batch(b).items()):
            timeline.append({"t_s": t, "category": name, "k": round(k, 3), "method": method, "series": "ran"})
        if now >= next_sample:
            policy = brain.policy_for(model, b.spec, now, b.engine_id)
            for name, cp in sorted(policy.categories.items()):
                method = resolve(cp.method, b.spec.method)
                timeline.append({"t_s": t, "category": name, "k": cp.k, "method": method if cp.k else METHOD_OFF,
                                 "series": "policy"})
            next_sample = now + every
    notes = list(clock_notes)
    notes += [f"{rejected} batches refused by the controller logic and skipped"] if rejected else []
    notes.append("overrides are not part of a recording: the live report (--url) lists them")
    return {
        "source": source, "model": model, "generated_at": generated_at,
        "span_s": round(now, 3), "batches": len(batches),
        "categories": [v.to_dict() for v in brain.categories(now) if v.model == model],
        "overrides": None, "timeline": _thin(timeline, max_points), "notes": notes,
    }


def from_live(categories: Sequence[Mapping[str, Any]], overrides: Sequence[Mapping[str, Any]],
              samples: Sequence[tuple[float, Sequence[Mapping[str, Any]]]], *, source: str,
              model: str | None = None, generated_at: float = 0.0) -> dict[str, Any]:
    """From a live controller's answers: ``categories`` (the last ``GET /v1/categories``), ``overrides``
    (``GET /v1/overrides``) and ``samples`` ((time, categories) answers taken along the way)."""
    models = sorted({c["model"] for c in categories})
    if model is None and len(models) > 1:
        raise ReportError(f"the controller serves several models {models}: choose one with --model")
    model = model or (models[0] if models else "")
    t0 = samples[0][0] if samples else generated_at
    timeline = []
    for t, answer in samples:
        for view in answer:
            decision = view.get("decision") or {}
            if view.get("model") == model and decision:
                timeline.append({"t_s": round(t - t0, 3), "category": view["category"], "k": decision.get("k", 0),
                                 "method": decision.get("method", METHOD_OFF), "series": "policy"})
    return {
        "source": source, "model": model, "generated_at": generated_at, "span_s": round(
            (samples[-1][0] - t0) if samples else 0.0, 3), "batches": None,
        "categories": [dict(c) for c in categories if c["model"] == model],
        "overrides": [dict(o) for o in overrides], "timeline": timeline,
        "notes": [] if len(samples) > 1 else ["one sample: take more (--samples, --interval) for k over time"],
    }


def _thin(rows: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """At most ``max_points`` rows per (series, category), evenly spaced."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["series"], row["category"]), []).append(row)
    out = []
    for group in groups.values():
        step = max(1, math.ceil(len(group) / max_points))
        out += group[::step]
        if group[-1] is not out[-1]:
            out.append(group[-1])
    return sorted(out, key=lambda r: (r["t_s"], r["series"], r["category"]))


# --- the page --------------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
.row{display:flex;flex-wrap:wrap;gap:12px}.card{border:1px solid #ddd;border-radius:4px;padding:6px}
svg .t{font-size:12px;font-weight:600}svg .l{font-size:10px;fill:#444}svg .n{font-size:9px;fill:#333}
svg .ax{stroke:#444}svg .g{stroke:#eee}svg .b{fill:#4c78a8}svg .e{stroke:#222}svg .m{stroke:#d62728;stroke-dasharray:3 2}
table{border-collapse:collapse;font-size:0.85em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
.empty{color:#888}.note{color:#555;font-size:0.9em}tr.chosen td{font-weight:600;background:#eef4fb}
"""


def _category_section(view: Mapping[str, Any]) -> str:
    name = view["category"]
    dist = list(view.get("acceptance_length_distribution") or [])
    mal = view.get("mean_acceptance_length")
    parts = [f"<h2>{esc(name)}</h2>"]
    decision = view.get("decision") or {}
    if decision:
        row = decision_row(decision)
        estimate = ("" if row is None else f"; estimated {row['speedup']:.2f}× plain decoding "
                    f"({row['goodput_tokens_per_s']:.1f} tokens/s, the table's k={row['k']} row)")
        parts.append(f"<p>decision: k={esc(decision.get('k'))}, method {esc(decision.get('method'))}, from "
                     f"{esc(decision.get('source'))}{esc(estimate)}. Why: {esc(decision.get('reason', ''))}</p>")
    charts = []
    if dist and sum(dist) > 0:
        labels = [str(j + 1) for j in range(len(dist))]
        marker = (mal - 0.5, f"mean {mal:.2f}") if mal else None
        charts.append(bar_chart(f"Acceptance length: {name}", labels, dist, x_label="acceptance length "
                                "(tokens per verified draft = 1 + accepted)", y_label="share of drafts",
                                percent=True, marker=marker))
    else:
        charts.append(f'<p class="empty">{esc(name)}: no drafts yet</p>')
    positions = view.get("positions") or []
    if positions:
        charts.append(bar_chart(
            f"Conditional acceptance by position: {name}", [str(p["position"]) for p in positions],
            [p["beta"] for p in positions], errors=[(p["ci_low"], p["ci_high"]) for p in positions],
            x_label="draft position", y_label="P(accept | earlier accepted)", y_max=1.0, percent=True))
    table = decision.get("goodput_table") or []
    if table:
        charts.append(line_chart(
            f"Estimated goodput vs k at batch {float(decision.get('batch_size') or 0):.1f}: {name}",
            {"goodput": [(row["k"], row["goodput_tokens_per_s"]) for row in table]},
            x_label="k (draft tokens per step)", y_label="tokens/s", y_max=None))
        # the page's estimate is the table's row for the decision: one source for the text and the table
        chosen = decision_row(decision)
        mark = ' class="chosen"'
        rows = "".join(f"<tr{mark if r is chosen else ''}><td>{r['k']}</td><td>{esc(r['method'])}</td>"
                       f"<td>{r['expected_committed']:.2f}</td><td>{r['step_ms']:.2f}</td>"
                       f"<td>{r['goodput_tokens_per_s']:.1f}</td><td>{r['speedup']:.2f}×</td></tr>" for r in table)
        charts.append("<table><tr><th>k</th><th>method</th><th>E(k)</th><th>step ms</th><th>goodput tok/s</th>"
                      f"<th>vs plain</th></tr>{rows}</table>")
    parts.append('<div class="row">' + "".join(f'<div class="card">{c}</div>' for c in charts) + "</div>")
    return "\n".join(parts)


def decision_row(decision: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The goodput-table row of the decision (its k and method; k = 0 is plain decoding), or None."""
    k = decision.get("k")
    for r in decision.get("goodput_table") or []:
        if r["k"] == k and (k == 0 or r["method"] == decision.get("method")):
            return r
    return None


def _timeline_section(timeline: Iterable[Mapping[str, Any]]) -> str:
    rows = list(timeline)
    if not rows:
        return '<h2>k and method over time</h2><p class="empty">no timeline</p>'
    charts = []
    for series, label in (("ran", "k that ran (mean drafted k per batch)"), ("policy", "k the policy chose")):
        by_cat: dict[str, list[tuple[float, float]]] = {}
        methods: dict[str, dict[str, int]] = {}
        for r in rows:
            if r["series"] != series:
                continue
            by_cat.setdefault(r["category"], []).append((r["t_s"], float(r["k"])))
            per = methods.setdefault(r["category"], {})
            per[r["method"]] = per.get(r["method"], 0) + 1
        if by_cat:
            notes = {c: ", ".join(f"{m} {n * 100 // sum(per.values())}%" for m, n in sorted(per.items()))
                     for c, per in methods.items()}
            charts.append(line_chart(label, by_cat, x_label="seconds of engine time", y_label="k",
                                     step=series == "policy", notes=notes, integer_y=True))
    changes = []
    last: dict[str, str] = {}
    for r in rows:
        if r["series"] == "policy":
            value = f"{r['method']}:{r['k']}"
            if last.get(r["category"]) != value:
                changes.append(f"<tr><td>{r['t_s']:.1f}</td><td>{esc(r['category'])}</td><td>{esc(value)}</td></tr>")
                last[r["category"]] = value
    table = ("<table><tr><th>t (s)</th><th>category</th><th>method:k</th></tr>" + "".join(changes[:200])
             + "</table>") if changes else ""
    return ("<h2>k and method over time</h2><div class=\"row\">"
            + "".join(f'<div class="card">{c}</div>' for c in charts) + f"</div><h3>policy changes</h3>{table}")


def when(ts: float | None) -> str:
    """A Unix time as a UTC date and time, to the second."""
    if ts is None:
        return "never"
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: float | None) -> str:
    """Seconds in the largest units that keep it readable: 42 s, 3 min 20 s, 2 h 5 min, 3 d 4 h."""
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f} s" if s < 10 and s != int(s) else f"{s:.0f} s"
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            whole, rest = divmod(round(s), size)
            return f"{whole} {unit}" + (f" {rest // sub_size} {sub}" if rest // sub_size else "")
    return f"{s:.0f} s"


def override_row(o: Mapping[str, Any]) -> dict[str, str]:
    """One override as a person reads it (no raw floats, None, lists or booleans)."""
    if o.get("off"):
        what = "speculation off"
    else:
        what = ", ".join(f"{name} = {o[name]}" for name in ("k", "method") if o.get(name) is not None) or "-"
    remaining = o.get("ttl_remaining_s")
    expires = when(o.get("expires_at")) if o.get("expires_at") is not None else "never"
    if remaining is not None:
        expires += f" (in {duration(remaining)})"
    return {"category": str(o.get("category", "")), "pins": what, "set by": str(o.get("actor") or "-"),
            "reason": str(o.get("reason") or "-"), "set at": when(o["created_at"]) if o.get("created_at") else "-",
            "expires": expires}


def _overrides_section(overrides: Sequence[Mapping[str, Any]] | None) -> str:
    if overrides is None:
        return '<h2>Overrides</h2><p class="empty">not known from a recording (use --url on a live controller)</p>'
    if not overrides:
        return "<h2>Overrides</h2><p>none in force</p>"
    rows = [override_row(o) for o in overrides]
    head = "".join(f"<th>{esc(k)}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r.values()) + "</tr>" for r in rows)
    return f"<h2>Overrides</h2><table><tr>{head}</tr>{body}</table>"


def render_html(data: Mapping[str, Any]) -> str:
    """The whole page (UTF-8 text)."""
    cats = sorted(data.get("categories") or [], key=lambda v: v["category"])
    summary = "".join(
        f"<tr><td>{esc(v['category'])}</td><td>{esc((v.get('decision') or {}).get('k', ''))}</td>"
        f"<td>{esc((v.get('decision') or {}).get('method', ''))}</td>"
        f"<td>{'' if v.get('mean_acceptance_length') is None else format(v['mean_acceptance_length'], '.2f')}</td>"
        f"<td>{esc(v.get('request_steps', ''))}</td><td>{esc((v.get('entropy') or {}).get('class', ''))}</td></tr>"
        for v in cats)
    notes = "".join(f'<p class="note">note: {esc(n)}</p>' for n in data.get("notes") or [])
    span = data.get("span_s")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>specctl report: {esc(data.get('model', ''))}</title>", f"<style>{CSS}</style></head><body>",
        f"<h1>specctl report: {esc(data.get('model', ''))}</h1>",
        (f"<p>source: {esc(data.get('source', ''))}; generated {esc(when(data.get('generated_at')))}; "
         f"span {esc(duration(span))} of engine time; "
         f"{len(cats)} categories. Mean acceptance length = 1 + accepted draft tokens per verified draft "
         "(vLLM's definition).</p>"), notes,
        ("<table><tr><th>category</th><th>k</th><th>method</th><th>mean acceptance length</th>"
         f"<th>request-steps</th><th>entropy</th></tr>{summary}</table>"),
        _overrides_section(data.get("overrides")),
        _timeline_section(data.get("timeline") or []),
        *(_category_section(v) for v in cats),
        "</body></html>", ""])
