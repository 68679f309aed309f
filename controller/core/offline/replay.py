"""``specctl replay``: what each policy would have done on recorded traffic, and its estimated goodput.

A what-if tool for operators. Input: telemetry the engines posted (``TelemetryBatch`` JSON, one batch per
line, e.g. recorded by ``bench/cpu/record.py``) and, where available, request token traces (JSON lines
``{"category": ..., "prompt_token_ids": [...], "output_token_ids": [...]}``). Output, per request category:
the proposal length and drafter each policy picks, and the goodput the recorded work would get with it
(model in :mod:`specctl_vllm.controller.core.offline.whatif`):

  * ``recorded``  -- what ran, priced with the same model (its gap to the measured goodput shows how far
                     to trust the other rows);
  * ``off``       -- no speculation;
  * ``k=N``       -- every category at the engine's drafter with N draft tokens (vLLM's static config);
  * ``goodput``   -- specctl's policy: the real :class:`~specctl_vllm.controller.core.brain.Brain` fed with the
                     recording and asked after every batch as the engine's acks ask it, its last decision
                     priced (``--timeline`` also lists how its decision moved along the recording);
  * ``ema_tiers`` -- SGLang-style acceptance-EMA tiers (:mod:`specctl_vllm.controller.core.offline.ema_tiers`) stepped through
                     the recorded steps; its time-weighted mix of k;
  * ``oracle``    -- the best static (drafter, k) per category in hindsight, under the same model.

    specctl replay telemetry.jsonl --requests requests.jsonl [--batch-size 32] [--preset h200] [--json out.json]

Pure functions only (:func:`replay`, :func:`format_report`, parsing of lines already read); reading files,
choosing the drafters that score traces and printing live in :mod:`specctl_vllm.controller.replay_cli`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from pydantic import ValidationError

from specctl_vllm.controller.core.brain import Brain, IngestRejected
from specctl_vllm.controller.core.config import BrainConfig, LearnerSettings, PolicySettings
from specctl_vllm.controller.core.learn.cost_fit import corrections
from specctl_vllm.controller.core.offline import ema_tiers, token_traces, whatif, whatif_graph
from specctl_vllm.kernel.cost import PRESETS
from specctl_vllm.kernel.drafters import resolve
from specctl_vllm.kernel.model.budget import recorded_budget
from specctl_vllm.kernel.protocol import MAX_K, METHOD_OFF, SpecConfig, TelemetryBatch

DEFAULT_POLICIES = ("recorded", "off", "static", "goodput", "ema_tiers", "oracle")
DEFAULT_KS = (1, 2, 3, 4, 6, 8)
#: Half-lives long enough that a recording of minutes to hours is weighted evenly (the maxima allowed).
REPLAY_LEARNER = LearnerSettings(half_life_s=86_400, mix_half_life_s=3_600, cost_half_life_s=86_400)


class ReplayError(ValueError):
    """Input that cannot be replayed; the message says which line and why."""


# --- engine time --------------------------------------------------------------------------------------------------
#: A step later than this after the one before on the same engine clock is a clock jump, not time that passed.
MAX_STEP_GAP_S = 3600.0


def engine_clock(batches: Sequence[TelemetryBatch], max_gap_s: float = MAX_STEP_GAP_S
                 ) -> tuple[list[tuple[float, TelemetryBatch]], list[str]]:
    """Each batch with its time in seconds on the recording's engine time, in that order, and notes on clock jumps.

    Time comes from the engine's own step clock (``t``, ``wall_s``), never from ``sent_at`` (informational, set
    by whoever posted the batch). Each (engine, boot) is read in ``seq`` order; a batch's time is the end of its
    last step. An engine's boots follow one another; different engines start together (their monotonic clocks
    share no origin). A step that goes back in time, or comes more than ``max_gap_s`` after the one before, is a
    clock jump: it is noted and counted as its own ``wall_s``, so a jump never stretches the recording."""
    streams: dict[tuple[str, str], list[TelemetryBatch]] = {}
    for b in batches:
        streams.setdefault((b.engine_id, b.boot_id), []).append(b)
    engine_end: dict[str, float] = {}
    timed: list[tuple[float, int, TelemetryBatch]] = []
    notes: list[str] = []
    order = 0
    for (engine, boot), items in streams.items():
        clock = engine_end.get(engine, 0.0)
        last_t: float | None = None
        for b in sorted(items, key=lambda b: b.seq):
            for s in b.steps:
                gap = None if last_t is None else s.t - last_t
                if gap is not None and not 0.0 <= gap <= max_gap_s:
                    notes.append(f"engine {engine} boot {boot}: the step clock jumps {gap:+.3f} s at seq {b.seq}; "
                                 f"counted as the step's {s.wall_s:.3f} s")
                clock += s.wall_s if gap is None or not 0.0 <= gap <= max_gap_s else gap
                last_t = s.t
            timed.append((clock, order, b))
            order += 1
        engine_end[engine] = clock
    timed.sort(key=lambda item: (item[0], item[1]))
    return [(t, b) for t, _, b in timed], notes


# --- parsing (strings in, plain data out) --------------------------------------------------------------------
def parse_telemetry(lines: Iterable[str], source: str = "telemetry") -> list[TelemetryBatch]:
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(TelemetryBatch.model_validate_json(line))
        except ValidationError as exc:
            raise ReplayError(f"{source}:{i}: not a TelemetryBatch: {exc.errors()[0]['msg']}") from None
    return out


def parse_requests(lines: Iterable[str], source: str = "requests") -> list[token_traces.RequestTrace]:
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(token_traces.RequestTrace(str(d["category"]), tuple(int(x) for x in d["prompt_token_ids"]),
                                           tuple(int(x) for x in d["output_token_ids"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ReplayError(f"{source}:{i}: not a request trace ({type(exc).__name__}: {exc})") from None
    return out


def select_model(batches: Sequence[TelemetryBatch], model: str | None) -> list[TelemetryBatch]:
    models = sorted({b.model_name for b in batches})
    if model is None:
        if len(models) > 1:
            raise ReplayError(f"the recording holds several models {models}: choose one with --model")
        return list(batches)
    chosen = [b for b in batches if b.model_name == model]
    if not chosen:
        raise ReplayError(f"no telemetry for model {model!r} (found {models})")
    return chosen


# --- policies -------------------------------------------------------------------------------------------------
def goodput_decisions(batches: Sequence[TelemetryBatch], spec: SpecConfig, preset: str,
                      timeline: bool = False, category_floor: float | None = None
                      ) -> tuple[dict[str, tuple[int, str, str]], list[dict], int]:
    """The goodput policy's per-category (k, drafter, source) after the recording (and along it).

    Returns (final choice, timeline of changes, rejected batches).
    """
    config = BrainConfig(REPLAY_LEARNER, PolicySettings(cost_preset=preset, category_floor=category_floor or 0.0))
    brain = Brain(config)
    model, engine_id = batches[-1].model_name, batches[-1].engine_id
    timed, _ = engine_clock(batches)
    now = t0 = 0.0
    rejected = 0
    changes: list[dict] = []
    last: dict[str, tuple[int, str, str]] | None = None
    next_ask = t0
    for now, b in timed:
        try:
            brain.ingest(b, now)
        except IngestRejected:
            rejected += 1
            continue
        # asked after every batch, as every ack of the live controller carries its policy: what it decided
        # before (hysteresis, the previous default) is part of the decision, with or without ``timeline``
        current = _wire_choice(brain, model, spec, now, engine_id)
        if timeline and now >= next_ask:
            if current != last:
                changes.append({"t_s": round(now - t0, 3),
                                "categories": {c: f"{m}:{k}" for c, (k, m, _) in sorted(current.items())}})
                last = current
            next_ask = now + config.policy.interval_s
    return _wire_choice(brain, model, spec, now, engine_id), changes, rejected


def _wire_choice(brain: Brain, model: str, spec: SpecConfig, now: float,
                 engine_id: str) -> dict[str, tuple[int, str, str]]:
    policy = brain.policy_for(model, spec, now, engine_id)
    out = {}
    for name, cp in {"_default": policy.default, **policy.categories}.items():
        method = resolve(cp.method, spec.method)
        out[name] = (cp.k, method if cp.k > 0 else METHOD_OFF, cp.source)
    return out


def _choice_from(decisions: Mapping[str, tuple[int, str, str]], work: whatif.Workload,
                 profiles: Mapping[str, Mapping[tuple[str, int], token_traces.Profile]]) -> tuple[dict, list[str]]:
    choice, notes = {}, []
    default = decisions.get("_default", (0, METHOD_OFF, "default"))
    for c in work.categories:
        k, m, _ = decisions.get(c, default)
        p = whatif.profile_for(profiles, c, m, k)
        if p is None:
            notes.append(f"goodput: no profile for {c} at {m}:{k}; counted as off")
            p = token_traces.OFF
        choice[c] = p
    return choice, notes


def _ema(batches, profiles_est, work, profiles, cost, corr, k_max, initial_steps, batch_size, method):
    betas = {c: np.asarray(per[method].betas(max(k_max, 1), 0.5, 4.0))
             for c, per in profiles_est.items() if method in per}
    counts = ema_tiers.recorded_steps(batches, betas, k_max, initial_steps)
    parts = []
    for k, steps in sorted(counts.items()):
        est = whatif.estimate(work, whatif.uniform(work, profiles, method, k), cost, batch_size, corr)
        parts.append((steps * est.goodput * est.step_ms, est))  # committed tokens done at this k
    return whatif.mixed_estimate(parts), counts


# --- the replay ------------------------------------------------------------------------------------------------
def replay(batches: Sequence[TelemetryBatch], traces: Sequence[token_traces.RequestTrace] = (),
           proposers: Mapping[str, token_traces.Proposer] | None = None, *, policies: Sequence[str] = DEFAULT_POLICIES,
           ks: Sequence[int] = DEFAULT_KS, k_max: int | None = None, batch_size: float | None = None,
           preset: str = "cpu", ema_initial_steps: int = 3, timeline: bool = False,
           category_floor: float | None = None) -> dict:
    """The what-if report (plain JSON-able dict). ``proposers`` score token traces per drafter name."""
    if not batches:
        raise ReplayError("no telemetry batches")
    if preset not in PRESETS:
        raise ReplayError(f"unknown cost preset {preset!r} (known: {sorted(PRESETS)})")
    spec0 = batches[-1].spec
    k_top = k_max if k_max is not None else max(spec0.k_max, max(ks, default=0))
    k_top = max(0, min(k_top, MAX_K))
    # a graph-shaped engine runs one width of its set per step: its rows are priced by the cell table
    widths = [w for w in spec0.graph_widths if w <= k_top]
    graph = bool(widths)
    shape = {"full_cuda_graphs": spec0.full_cuda_graphs, "graph_widths": widths} if graph else {}
    spec = SpecConfig(method=spec0.method, k_max=k_top, model_free_methods=list(spec0.model_free_methods), **shape)
    all_ks = list(range(1, k_top + 1))
    work = whatif.workload_from_telemetry(batches)
    fit = whatif.fit_cost_model(batches, PRESETS[preset])
    cost = fit.coefficients()
    # the depth factors and mixed-k penalty the policy would have priced the recorded batch with
    corr = corrections(fit, float(batch_size or work.batch_size or 1.0), k_top, spec0.full_cuda_graphs)
    est, _ = whatif.acceptance(batches)
    tel = whatif.telemetry_profiles(batches, all_ks)
    scored = token_traces.trace_profiles(traces, proposers or {}, all_ks) if traces and proposers else {}
    profiles = whatif.merge_profiles(scored, tel)
    timed, clock_notes = engine_clock(batches)
    notes: list[str] = list(clock_notes)
    rows: dict[str, dict] = {}
    if graph:
        view = whatif_graph.cell_view(batches, widths, PRESETS[preset])
        budget = recorded_budget(batches)
        curves = whatif_graph.graph_curves(work, profiles, spec.method, k_top)

        def at(width: int) -> whatif.Estimate:
            return whatif_graph.graph_estimate(work, curves, view, width, batch_size, budget)

    def row(name: str, choice: Mapping[str, token_traces.Profile], e: whatif.Estimate | None = None, **extra) -> None:
        e = e or whatif.estimate(work, choice, cost, batch_size, corr)
        rows[name] = {"goodput": e.goodput, "step_ms": e.step_ms, "per_category": dict(e.per_category),
                      "choice": {c: {"method": p.method, "k": p.k, "e": round(p.e, 4), "d": round(p.d, 4), "source": p.source}
                                 for c, p in choice.items()},
                      **extra}

    row("off", {c: token_traces.OFF for c in work.categories}, at(0) if graph else None)
    for name in policies:
        if name == "recorded":
            row("recorded", dict(work.recorded), whatif_graph.graph_recorded(batches, view) if graph else None)
        elif name == "static":
            for k in (widths[1:] if graph else ks):
                if k <= k_top:
                    row(f"k={k}", whatif.uniform(work, profiles, spec.method, k), at(k) if graph else None)
        elif name == "goodput":
            decisions, changes, rejected = goodput_decisions(batches, spec, preset, timeline, category_floor)
            choice, miss = _choice_from(decisions, work, profiles)
            notes += miss
            if rejected:
                notes.append(f"goodput: {rejected} batches rejected by the controller logic and skipped")
            extra = {}
            if graph:  # every category runs the step's width, which the engine's own rule picks (the policy
                # sends its inputs and caps, not a width): the rule on the recording's cells and mix
                width = whatif_graph.graph_plan(work, curves, view, batch_size, budget).width
                choice = whatif.uniform(work, profiles, spec.method, width)
                extra = {"width": width}
            row("goodput", choice, at(extra["width"]) if graph else None, timeline=changes,
                sources={c: decisions.get(c, decisions.get("_default", (0, "", "default")))[2]
                         for c in work.categories}, **extra)
        elif name == "ema_tiers":
            e, counts = _ema(batches, est, work, profiles, cost, corr, k_top, ema_initial_steps, batch_size,
                             spec.method)
            total = sum(counts.values()) or 1
            row("ema_tiers", {}, e, steps_at_k={str(k): round(n / total, 4) for k, n in sorted(counts.items())})
            if graph:
                notes.append("ema_tiers: per-request k, priced with the batch model (a graph-shaped engine "
                             "cannot run it)")
        elif name == "oracle":
            if graph:  # the best width in hindsight, without the rule's margin
                best = max(whatif_graph.graph_plan(work, curves, view, batch_size, budget).rows, key=lambda r: r.goodput)
                row("oracle", whatif.uniform(work, profiles, spec.method, best.width), at(best.width),
                    width=best.width)
            else:
                starts = [whatif.uniform(work, profiles, spec.method, k) for k in all_ks]
                row("oracle", whatif.best_static(work, profiles, cost, batch_size, starts, corr))
        elif name != "off":
            raise ReplayError(f"unknown policy {name!r} (known: {', '.join(DEFAULT_POLICIES)})")
    off = rows["off"]["goodput"]
    for r in rows.values():
        r["vs_off"] = r["goodput"] / off if off > 0 else None
        r["per_category_vs_off"] = {c: v / rows["off"]["per_category"][c]
                                    for c, v in r["per_category"].items() if rows["off"]["per_category"].get(c)}
    sources = {c: sorted({p.source for p in profiles.get(c, {}).values()}) for c in work.categories}
    return {
        "model": batches[-1].model_name,
        "engine": {"method": spec.method, "k_max": spec0.k_max, "what_if_k_max": k_top,
                   "model_free_methods": list(spec.model_free_methods)},
        "batches": len(batches), "span_s": round(timed[-1][0], 3), "steps": work.steps, "step_seconds": round(work.step_seconds, 6),
        "batch_size": batch_size or work.batch_size, "recorded_batch_size": work.batch_size,
        "measured_goodput": work.measured_goodput, "committed_tokens": dict(work.committed),
        "cost_preset": preset, "cost": cost.to_dict(),
        "cost_corrections": {"depth_factor": [round(f, 4) for f in corr.depth_factor],
                             "mixed_penalty": round(corr.mixed_penalty, 4)}, "profile_sources": sources,
        "requests_scored": len(traces) if scored else 0, "policies": rows, "notes": notes,
        "step_model": "cells" if graph else "batch_model",
    }


# --- output ---------------------------------------------------------------------------------------------------
def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def format_report(report: dict) -> str:
    cats = sorted(report["committed_tokens"])
    pol = report["policies"]
    eng = report["engine"]
    head = (f"model {report['model']}: engine drafter {eng['method']} k_max {eng['k_max']}, "
            f"{report['steps']} steps, batch {report['batch_size']:.2f} (recorded {report['recorded_batch_size']:.2f}), "
            f"measured {report['measured_goodput']:.1f} tok/s of step time; cost preset {report['cost_preset']}")
    if report.get("step_model") == "cells":
        head += "; graph-shaped engine: steps priced by the recording's cell table"
    rows = []
    for name, r in pol.items():
        rows.append([name, f"{r['goodput']:.1f}", f"{r['vs_off']:.3f}" if r["vs_off"] else "-", f"{r['step_ms']:.2f}"]
                    + [f"{r['per_category_vs_off'].get(c, 0):.2f}" for c in cats])
    out = [head, "", "estimated goodput (tok/s), and per category tokens/s of one request vs off:",
           _table(rows, ["policy", "tok/s", "vs off", "step ms", *cats]), "", "choice per category (drafter:k):"]
    rows = []
    for name, r in pol.items():
        if not r["choice"]:
            mix = r.get("steps_at_k", {})
            rows.append([name] + [" ".join(f"{k}:{v:.0%}" for k, v in mix.items())] + [""] * (len(cats) - 1))
            continue
        marks = {c: "*" for c, src in r.get("sources", {}).items() if src == "default"}
        rows.append([name] + [_fmt_choice(r["choice"].get(c)) + marks.get(c, "") for c in cats])
    out.append(_table(rows, ["policy", *cats]))
    if any(src == "default" for src in pol.get("goodput", {}).get("sources", {}).values()):
        out.append("* the goodput policy's default: the category lacks the evidence its guardrail asks for")
    if pol.get("goodput", {}).get("timeline"):
        out += ["", "goodput policy along the recording:"]
        out += [f"  t={ch['t_s']:>8.1f}s  " + ", ".join(f"{c}={v}" for c, v in ch["categories"].items())
                for ch in pol["goodput"]["timeline"]]
    out += [f"note: {n}" for n in report["notes"]]
    return "\n".join(out)


def _fmt_choice(c: dict | None) -> str:
    if c and c["source"] == "recorded":
        return f"E={c['e']:.2f}"
    if not c or c["k"] == 0:
        return "off"
    return f"{c['method']}:{c['k']}"
