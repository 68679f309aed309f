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

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from specctl_vllm.controller.core.brain import Brain, IngestRejected
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.controller.core.replay import engine_clock
from specctl_vllm.controller.drafters import resolve
from specctl_vllm.controller.protocol import METHOD_OFF, TelemetryBatch

#: Half-lives as long as allowed: a recording is weighted evenly (as in ``specctl replay``).
REPORT_LEARNER = LearnerSettings(half_life_s=86_400, mix_half_life_s=3_600, cost_half_life_s=86_400)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


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


# --- SVG -------------------------------------------------------------------------------------------------------

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 420, 220, 56, 34, 22, 12


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if abs(x) < 1e6 else f"{x:.3g}"


def _axes(title: str, x_label: str, y_label: str, y_max: float, y_ticks: int = 4, y_fmt=_num) -> list[str]:
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">',
           f"<title>{_esc(title)}</title>",
           f'<text x="{W / 2}" y="14" text-anchor="middle" class="t">{_esc(title)}</text>',
           f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" class="ax"/>',
           f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" class="ax"/>',
           f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - 4}" text-anchor="middle" class="l">{_esc(x_label)}</text>',
           (f'<text x="10" y="{(PAD_T + H - PAD_B) / 2}" text-anchor="middle" class="l" '
            f'transform="rotate(-90 10 {(PAD_T + H - PAD_B) / 2})">{_esc(y_label)}</text>')]
    for i in range(y_ticks + 1):
        v = y_max * i / y_ticks
        y = _y(v, y_max)
        out.append(f'<line x1="{PAD_L - 3}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="g"/>')
        out.append(f'<text x="{PAD_L - 5}" y="{y + 3:.1f}" text-anchor="end" class="n">{_esc(y_fmt(v))}</text>')
    return out


def _y(v: float, y_max: float) -> float:
    return H - PAD_B - (v / y_max if y_max > 0 else 0.0) * (H - PAD_B - PAD_T)


def _x(v: float, x_min: float, x_max: float) -> float:
    span = (x_max - x_min) or 1.0
    return PAD_L + (v - x_min) / span * (W - PAD_L - PAD_R)


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], *, x_label: str, y_label: str,
              y_max: float | None = None, errors: Sequence[tuple[float, float]] | None = None,
              percent: bool = False, marker: tuple[float, str] | None = None) -> str:
    """Vertical bars; ``errors`` (low, high) whiskers; ``marker`` (x in label units from 0, text): a line."""
    top = y_max if y_max is not None else max([*values, 1e-9]) * 1.15
    fmt = (lambda v: f"{v * 100:.0f}%") if percent else _num
    out = _axes(title, x_label, y_label, top, y_fmt=fmt)
    n = max(len(values), 1)
    slot = (W - PAD_L - PAD_R) / n
    for i, (label, v) in enumerate(zip(labels, values)):
        x = PAD_L + i * slot + slot * 0.15
        y = _y(v, top)
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{H - PAD_B - y:.1f}" '
                   f'class="b"><title>{_esc(label)}: {_esc(fmt(v))}</title></rect>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{H - PAD_B + 12}" text-anchor="middle" class="n">'
                   f"{_esc(label)}</text>")
        if errors is not None and i < len(errors):
            lo, hi = errors[i]
            cx = x + slot * 0.35
            out.append(f'<line x1="{cx:.1f}" y1="{_y(lo, top):.1f}" x2="{cx:.1f}" y2="{_y(hi, top):.1f}" class="e"/>')
    if marker is not None:
        pos, text = marker
        mx = PAD_L + pos * slot
        out.append(f'<line x1="{mx:.1f}" y1="{PAD_T}" x2="{mx:.1f}" y2="{H - PAD_B}" class="m"/>')
        out.append(f'<text x="{mx + 3:.1f}" y="{PAD_T + 10}" class="n">{_esc(text)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def line_chart(title: str, series: Mapping[str, Sequence[tuple[float, float]]], *, x_label: str, y_label: str,
               step: bool = False, y_max: float | None = None, notes: Mapping[str, str] | None = None) -> str:
    """One polyline per series (``step``: held until the next point); a legend under the title."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        return f"<p class=\"empty\">{_esc(title)}: no data</p>"
    x_min = min(p[0] for p in points)
    x_max = max(p[0] for p in points)
    top = y_max if y_max is not None else max(max(p[1] for p in points) * 1.15, 1e-9)
    out = _axes(title, x_label, y_label, top)
    out.append(f'<text x="{PAD_L}" y="{H - PAD_B + 12}" class="n">{_esc(_num(x_min))}</text>')
    out.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 12}" text-anchor="end" class="n">{_esc(_num(x_max))}</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        coords: list[str] = []
        last_y = None
        for x, y in sorted(pts):
            px, py = _x(x, x_min, x_max), _y(y, top)
            if step and last_y is not None:
                coords.append(f"{px:.1f},{last_y:.1f}")
            coords.append(f"{px:.1f},{py:.1f}")
            last_y = py
        if len(coords) == 1:
            cx, cy = coords[0].split(",")
            out.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"/>')
        else:
            out.append(f'<polyline points="{" ".join(coords)}" fill="none" stroke="{colour}" stroke-width="1.6">'
                       f"<title>{_esc(name)}</title></polyline>")
        label = name + (f" ({notes[name]})" if notes and name in notes else "")
        out.append(f'<text x="{PAD_L + 6}" y="{PAD_T + 10 + 11 * i}" class="n" fill="{colour}">{_esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


# --- the page --------------------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}
.row{display:flex;flex-wrap:wrap;gap:12px}.card{border:1px solid #ddd;border-radius:4px;padding:6px}
svg .t{font-size:12px;font-weight:600}svg .l{font-size:10px;fill:#444}svg .n{font-size:9px;fill:#333}
svg .ax{stroke:#444}svg .g{stroke:#eee}svg .b{fill:#4c78a8}svg .e{stroke:#222}svg .m{stroke:#d62728;stroke-dasharray:3 2}
table{border-collapse:collapse;font-size:0.85em}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
.empty{color:#888}.note{color:#555;font-size:0.9em}
"""


def _category_section(view: Mapping[str, Any]) -> str:
    name = view["category"]
    dist = list(view.get("acceptance_length_distribution") or [])
    mal = view.get("mean_acceptance_length")
    parts = [f"<h2>{_esc(name)}</h2>"]
    decision = view.get("decision") or {}
    if decision:
        parts.append(f"<p>decision: k={_esc(decision.get('k'))} method={_esc(decision.get('method'))} "
                     f"source={_esc(decision.get('source'))}; estimated {_esc(decision.get('estimated_speedup'))}x "
                     f"plain decoding; {_esc(decision.get('reason', ''))}</p>")
    charts = []
    if dist and sum(dist) > 0:
        labels = [str(j + 1) for j in range(len(dist))]
        marker = (mal - 0.5, f"mean {mal:.2f}") if mal else None
        charts.append(bar_chart(f"Acceptance length: {name}", labels, dist, x_label="acceptance length "
                                "(tokens per verified draft = 1 + accepted)", y_label="share of drafts",
                                percent=True, marker=marker))
    else:
        charts.append(f'<p class="empty">{_esc(name)}: no drafts yet</p>')
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
        rows = "".join(f"<tr><td>{r['k']}</td><td>{_esc(r['method'])}</td><td>{r['expected_committed']:.3f}</td>"
                       f"<td>{r['step_ms']:.2f}</td><td>{r['goodput_tokens_per_s']:.1f}</td>"
                       f"<td>{r['speedup']:.3f}</td></tr>" for r in table)
        charts.append("<table><tr><th>k</th><th>method</th><th>E(k)</th><th>step ms</th><th>goodput tok/s</th>"
                      f"<th>vs plain</th></tr>{rows}</table>")
    parts.append('<div class="row">' + "".join(f'<div class="card">{c}</div>' for c in charts) + "</div>")
    return "\n".join(parts)


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
            charts.append(line_chart(label, by_cat, x_label="seconds", y_label="k", step=series == "policy",
                                     notes=notes))
    changes = []
    last: dict[str, str] = {}
    for r in rows:
        if r["series"] == "policy":
            value = f"{r['method']}:{r['k']}"
            if last.get(r["category"]) != value:
                changes.append(f"<tr><td>{r['t_s']:.1f}</td><td>{_esc(r['category'])}</td><td>{_esc(value)}</td></tr>")
                last[r["category"]] = value
    table = ("<table><tr><th>t (s)</th><th>category</th><th>method:k</th></tr>" + "".join(changes[:200])
             + "</table>") if changes else ""
    return ("<h2>k and method over time</h2><div class=\"row\">"
            + "".join(f'<div class="card">{c}</div>' for c in charts) + f"</div><h3>policy changes</h3>{table}")


def _overrides_section(overrides: Sequence[Mapping[str, Any]] | None) -> str:
    if overrides is None:
        return '<h2>Overrides</h2><p class="empty">not known from a recording (use --url on a live controller)</p>'
    if not overrides:
        return "<h2>Overrides</h2><p>none in force</p>"
    keys = sorted({k for o in overrides for k in o})
    head = "".join(f"<th>{_esc(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{_esc(o.get(k, ''))}</td>" for k in keys) + "</tr>" for o in overrides)
    return f"<h2>Overrides</h2><table><tr>{head}</tr>{body}</table>"


def render_html(data: Mapping[str, Any]) -> str:
    """The whole page (UTF-8 text)."""
    cats = sorted(data.get("categories") or [], key=lambda v: v["category"])
    summary = "".join(
        f"<tr><td>{_esc(v['category'])}</td><td>{_esc((v.get('decision') or {}).get('k', ''))}</td>"
        f"<td>{_esc((v.get('decision') or {}).get('method', ''))}</td>"
        f"<td>{'' if v.get('mean_acceptance_length') is None else format(v['mean_acceptance_length'], '.2f')}</td>"
        f"<td>{_esc(v.get('request_steps', ''))}</td><td>{_esc((v.get('entropy') or {}).get('class', ''))}</td></tr>"
        for v in cats)
    notes = "".join(f'<p class="note">note: {_esc(n)}</p>' for n in data.get("notes") or [])
    span = data.get("span_s")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>specctl report: {_esc(data.get('model', ''))}</title>", f"<style>{CSS}</style></head><body>",
        f"<h1>specctl report: {_esc(data.get('model', ''))}</h1>",
        (f"<p>source: {_esc(data.get('source', ''))}; span {_esc(span)} s; "
         f"{len(cats)} categories. Mean acceptance length = 1 + accepted draft tokens per verified draft "
         "(vLLM's definition).</p>"), notes,
        ("<table><tr><th>category</th><th>k</th><th>method</th><th>mean acceptance length</th>"
         f"<th>request-steps</th><th>entropy</th></tr>{summary}</table>"),
        _overrides_section(data.get("overrides")),
        _timeline_section(data.get("timeline") or []),
        *(_category_section(v) for v in cats),
        "</body></html>", ""])
