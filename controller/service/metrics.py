"""Prometheus collector: reads the Brain's :class:`~specctl_vllm.controller.core.views.MetricsSnapshot` at scrape time.

Nothing is mutated in request handlers; every scrape builds fresh metric families from one snapshot
taken under the Brain lock, so a scrape is consistent across families. Labels reuse vLLM's
``model_name`` and ``engine``; vLLM's ``position`` label is 0-based and so is ours.

Counters of counterfactual drafters (model-free drafters scored against the target's tokens but not
run) go to ``specctl_counterfactual_*`` so that ``specctl_draft_tokens_total`` and
``specctl_accepted_tokens_total`` reconcile exactly with vLLM's own spec-decode counters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

#: Engine label for rejected batches whose engine id could not be read (cannot clash: ids start alnum).
UNKNOWN_ENGINE = "_unknown"

CAT = ["model_name", "category"]
CAT_METHOD = ["model_name", "category", "method"]


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _method_families(snapshot: Any) -> list[Metric]:
    real = {
        "drafts": _counter("specctl_drafts", "Draft proposals scheduled (requests x steps with k > 0)", CAT_METHOD),
        "draft_tokens": _counter("specctl_draft_tokens", "Draft tokens scheduled for verification", CAT_METHOD),
        "accepted_tokens": _counter("specctl_accepted_tokens", "Draft tokens accepted by the target", CAT_METHOD),
    }
    per_pos = _counter("specctl_accepted_tokens_per_pos", "Draft tokens accepted at each position (0-based)",
                       CAT_METHOD + ["position"])
    scored = {
        "drafts": _counter("specctl_counterfactual_drafts", "Drafts of model-free drafters scored, not run",
                           CAT_METHOD),
        "draft_tokens": _counter("specctl_counterfactual_draft_tokens", "Draft tokens scored, not run", CAT_METHOD),
        "accepted_tokens": _counter("specctl_counterfactual_accepted_tokens",
                                    "Scored draft tokens that matched the target's tokens", CAT_METHOD),
    }
    for row in snapshot.methods:
        labels = [row.model, row.category, row.method]
        families = scored if row.counterfactual else real
        for field, family in families.items():
            family.add_metric(labels, getattr(row, field))
        if not row.counterfactual:
            for position, count in enumerate(row.accepted_per_pos):
                per_pos.add_metric(labels + [str(position)], count)
    match = _gauge("specctl_match_rate", "Share of a model-free drafter's asks that drafted (it proposes only on a "
                   "match); the policy scales E(k) - 1 and the drafted tokens by it", CAT_METHOD)
    for model, category, method, rate in snapshot.match_rates:
        match.add_metric([model, category, method], rate)
    return [*real.values(), per_pos, *scored.values(), match]


def _accepted_per_draft(snapshot: Any) -> HistogramMetricFamily:
    family = HistogramMetricFamily(
        "specctl_accepted_tokens_per_draft",
        "Accepted draft tokens per verified draft, 0..k (real drafts, all methods); the acceptance length is 1 + this",
        labels=CAT
    )
    for row in snapshot.categories:
        buckets, running = [], 0
        for length, count in enumerate(row.accepted_length_counts):
            running += count
            buckets.append((floatToGoString(length), running))
        buckets.append(("+Inf", running))
        family.add_metric([row.model, row.category], buckets, sum_value=row.accepted_tokens)
    return family


def _category_families(snapshot: Any) -> list[Metric]:
    totals = {
        "request_steps": _counter("specctl_request_steps", "Request-steps seen (a request in one engine step)", CAT),
        "committed_tokens": _counter("specctl_committed_tokens", "Tokens committed (accepted drafts + 1 per "
                                     "request-step)", CAT),
        "spec_off_request_steps": _counter("specctl_spec_off_request_steps", "Request-steps run without drafts",
                                           CAT),
    }
    k = _gauge("specctl_current_k", "Proposal length the controller sends for the category (0 = off)", CAT)
    method = _gauge("specctl_current_method_info", "Draft method sent for the category and what decided it",
                    CAT + ["method", "source"])
    entropy_class = _gauge("specctl_entropy_class_info", "Entropy class of the category", CAT + ["entropy_class"])
    bits = _gauge("specctl_acceptance_entropy", "Shannon entropy of the acceptance-length distribution (unit: bits; the name avoids promtool's bits-vs-bytes lint)", CAT)
    mean_len = _gauge("specctl_mean_acceptance_length", "Mean acceptance length, vLLM's definition: 1 + accepted "
                      "draft tokens per verified draft (posterior, decayed)", CAT)
    beta = _gauge("specctl_conditional_acceptance", "Posterior P(accept position | all before accepted)",
                  CAT + ["position"])
    speedup = _gauge("specctl_estimated_speedup", "Estimated goodput of the decision over plain decoding", CAT)
    best = _gauge("specctl_best_method_info", "Draft method that would serve the category best", CAT + ["method"])
    for row in snapshot.categories:
        labels = [row.model, row.category]
        for field, family in totals.items():
            family.add_metric(labels, getattr(row, field))
        if row.current_k is not None:
            k.add_metric(labels, row.current_k)
        if row.method is not None:
            method.add_metric(labels + [row.method, row.source or ""], 1)
        entropy_class.add_metric(labels + [row.entropy_class], 1)
        for family, value in ((bits, row.entropy_bits), (mean_len, row.mean_acceptance_length),
                              (speedup, row.estimated_speedup)):
            if value is not None:
                family.add_metric(labels, value)
        for position, value in enumerate(row.conditional_acceptance):
            beta.add_metric(labels + [str(position)], value)
        if row.best_method is not None:
            best.add_metric(labels + [row.best_method], 1)
    return [*totals.values(), _accepted_per_draft(snapshot), k, method, entropy_class, bits, mean_len, beta, speedup,
            best]


def _engine_families(snapshot: Any) -> list[Metric]:
    batches = _counter("specctl_telemetry_batches", "Telemetry batches by outcome", ["engine", "outcome"])
    gaps = _counter("specctl_telemetry_gaps", "Telemetry batches missing (gaps in seq)", ["engine"])
    dropped = _counter("specctl_engine_dropped_steps", "Steps the engine dropped from its bounded queue",
                       ["engine"])
    age = _gauge("specctl_policy_age_seconds", "Seconds since the engine was last sent a policy", ["engine"])
    steps = _counter("specctl_steps", "Engine steps reported", ["model_name", "engine"])
    step_s = _counter("specctl_step_seconds", "Engine step wall time reported, seconds", ["model_name", "engine"])
    conflicts = _counter("specctl_engine_id_conflicts", "Batches from a second running engine with the same engine "
                         "id (refused with 409): two engines share one SPECCTL_ENGINE_ID", ["engine"])
    widths = _counter("specctl_engine_width_steps", "Steps of a graph-shaped engine per proposal width it ran "
                      "(0: plain decoding): where the width rule and its measured check put the engine",
                      ["engine", "width"])
    for row in snapshot.engines:
        for width, count in row.width_steps:
            widths.add_metric([row.engine, str(width)], count)
        for outcome, count in sorted(row.batches.items()):
            batches.add_metric([row.engine, outcome], count)
        gaps.add_metric([row.engine], row.gaps)
        dropped.add_metric([row.engine], row.dropped_steps)
        if row.policy_age_s is not None:
            age.add_metric([row.engine], row.policy_age_s)
        steps.add_metric([row.model, row.engine], row.steps)
        step_s.add_metric([row.model, row.engine], row.step_seconds)
        conflicts.add_metric([row.engine], row.id_conflicts)  # zero too: "conflicts in range" reads 0, not no data
    if snapshot.rejected_unknown_engine:
        batches.add_metric([UNKNOWN_ENGINE, "rejected"], snapshot.rejected_unknown_engine)
    return [batches, gaps, dropped, age, steps, step_s, conflicts, widths]


def _other_families(snapshot: Any) -> list[Metric]:
    ratio = _gauge("specctl_draft_cost_ratio", "Draft cost per draft token relative to one target step token",
                   ["model_name", "method"])
    for model, method, value in snapshot.draft_cost_ratio:
        ratio.add_metric([model, method], value)
    overrides = _gauge("specctl_override_active", "Operator override in force (1) by what it pins",
                       ["category", "kind"])
    for category, kind in snapshot.overrides:
        overrides.add_metric([category, kind], 1)
    overflow = _counter("specctl_overflow_category_steps", "Category-steps pooled into the overflow category "
                        "because the model hit its category cap", ["model_name"])
    for model, count in snapshot.overflow_steps:
        overflow.add_metric([model], count)
    errors = _counter("specctl_decision_errors", "Decisions (or reads) of a model that could not be computed; the "
                      "last good decision was served instead (each is logged)", ["model_name"])
    for model, count in snapshot.decision_errors:
        errors.add_metric([model], count)
    series = _gauge("specctl_series", "Series the learned state is charged against the budget (an upper bound on "
                    "what this endpoint exports)", [])
    series.add_metric([], snapshot.series)
    budget = _gauge("specctl_series_budget", "The learned-state budget, in series (SPECCTL_BUDGET_MAX_SERIES)", [])
    budget.add_metric([], snapshot.series_budget)
    evictions = _counter("specctl_evictions", "Engines, models and categories forgotten (idle, or by an operator)",
                         [])
    evictions.add_metric([], snapshot.evictions)
    refusals = _counter("specctl_budget_refusals", "Telemetry batches refused (429) because the learned-state "
                        "budget or an engine/model cap was full", [])
    refusals.add_metric([], snapshot.budget_refusals)
    return [ratio, overrides, overflow, errors, series, budget, evictions, refusals]


@dataclass(frozen=True)
class ServiceStats:
    """The service's own figures at scrape time (plain data: it travels to the render process)."""

    internal_errors: int = 0
    client_disconnects: int = 0
    snapshot_age_s: float | None = None
    #: (batches, dropped, errors, bytes on disk, lost) of the telemetry recorder; None while recording is off
    recorder: tuple[int, int, int, int, int] | None = None
    #: (body class, bucket bounds, counts per bucket with the one above them last, sum) of telemetry posts'
    #: handling time; None without the connection guard (an app served by something else than ``specctl serve``)
    telemetry_seconds: tuple[tuple[str, tuple[float, ...], tuple[int, ...], float], ...] | None = None

    @classmethod
    def of(cls, runtime: Any) -> ServiceStats:
        age = None if runtime.last_snapshot_ts is None else max(0.0, runtime.clock.now() - runtime.last_snapshot_ts)
        rec = getattr(runtime, "recorder", None)
        recorder = None
        if rec is not None:
            st = rec.stats
            recorder = (st.batches, st.dropped, st.errors, st.bytes_on_disk, st.lost)
        conns = getattr(runtime, "connections", None)
        timing = None if conns is None else tuple((body, h.bounds, tuple(h.counts), h.total_s)
                                                  for body, h in conns.telemetry.items())
        return cls(runtime.internal_errors, runtime.client_disconnects, age, recorder, timing)


def _service_families(stats: ServiceStats) -> list[Metric]:
    errors = _counter("specctl_http_internal_errors", "Requests answered 500 (a bug: each is logged with an id)",
                      [])
    errors.add_metric([], stats.internal_errors)
    gone = _counter("specctl_http_client_disconnects", "Requests whose client went away before its body arrived "
                    "(not an error of the controller)", [])
    gone.add_metric([], stats.client_disconnects)
    families: list[Metric] = [errors, gone]
    if stats.telemetry_seconds is not None:
        families.append(_telemetry_seconds(stats.telemetry_seconds))
    if stats.snapshot_age_s is not None:
        age = _gauge("specctl_snapshot_age_seconds", "Seconds since the learned state was last written to SQLite "
                     "(learning a crash would lose)", [])
        age.add_metric([], stats.snapshot_age_s)
        families.append(age)
    if stats.recorder is not None:  # only while recording is on (SPECCTL_RECORD_DIR)
        batches, dropped, errors_, bytes_on_disk, lost = stats.recorder
        for name, doc, value in (
            ("specctl_recorder_batches", "Telemetry batches written to the recording (flushed to the file)", batches),
            ("specctl_recorder_lost", "Telemetry batches lost to a failed write (disk full, I/O error)", lost),
            ("specctl_recorder_dropped", "Telemetry batches not recorded: the recorder's queue was full", dropped),
            ("specctl_recorder_errors", "Recorder write or delete failures (logged)", errors_),
        ):
            family = _counter(name, doc, [])
            family.add_metric([], value)
            families.append(family)
        size = _gauge("specctl_recorder_bytes", "Bytes the recordings take in SPECCTL_RECORD_DIR (closed files; "
                      "refreshed at each rotation)", [])
        size.add_metric([], bytes_on_disk)
        families.append(size)
    return families


def _telemetry_seconds(rows: tuple[tuple[str, tuple[float, ...], tuple[int, ...], float], ...]) -> Metric:
    family = HistogramMetricFamily("specctl_http_telemetry_seconds", "Telemetry posts' handling time in the "
                                   "server: first byte of the request read to first byte of the answer written; "
                                   "body small (<= 8 KiB declared, an engine's regular post) or large",
                                   labels=["body"])
    for body, bounds, counts, total_s in rows:
        cumulative, running = [], 0
        for bound, n in zip((*(str(b) for b in bounds), "+Inf"), counts, strict=True):
            running += n
            cumulative.append((bound, running))
        family.add_metric([body], cumulative, total_s)
    return family


#: Largest sample value written: a float64 holds every integer up to it exactly.
SAMPLE_CAP = float(2**53)


def _sample_value(value: Any) -> float | None:
    """A sample's value as a float the exposition can write, or None to leave the sample out.

    The learned state is bounded by construction (:mod:`specctl_vllm.kernel.protocol` caps, ``COUNTER_CAP``); this is
    the last line, so that no value can ever make the whole scrape fail (an int too large for a float raised
    OverflowError inside the text encoder and every later scrape answered 500). Counters and gauges are
    clamped to [-SAMPLE_CAP, SAMPLE_CAP]; NaN is left out.
    """
    try:
        v = float(value)
    except OverflowError:
        v = math.copysign(SAMPLE_CAP, value)
    except (TypeError, ValueError):
        return None
    if math.isnan(v):
        return None
    return max(-SAMPLE_CAP, min(SAMPLE_CAP, v))


def sanitized(families: Iterable[Metric]) -> Iterator[Metric]:
    """The families with every sample's value made writable (see :func:`_sample_value`)."""
    for family in families:
        clean = []
        for sample in family.samples:
            value = _sample_value(sample.value)
            if value is not None:
                clean.append(sample._replace(value=value) if value != sample.value or
                             not isinstance(sample.value, float) else sample)
        family.samples = clean
        yield family


def families(snapshot: Any, stats: ServiceStats) -> Iterator[Metric]:
    """Every family of a scrape, from the Brain's snapshot and the service's figures, values made writable."""
    yield from sanitized([*_method_families(snapshot), *_category_families(snapshot), *_engine_families(snapshot),
                          *_other_families(snapshot), *_service_families(stats)])


class _Families:
    """What ``generate_latest`` reads: an object whose ``collect()`` yields the families."""

    def __init__(self, snapshot: Any, stats: ServiceStats) -> None:
        self._snapshot, self._stats = snapshot, stats

    def collect(self) -> Iterator[Metric]:
        return families(self._snapshot, self._stats)


def render(snapshot: Any, stats: ServiceStats, accept: str) -> tuple[bytes, str]:
    """The exposition text for ``accept`` (classic text format for any Accept header the library refuses).

    A plain function of plain data, so it can run in the render process (see :class:`Renderer`)."""
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, choose_encoder, generate_latest

    try:
        encoder, content_type = choose_encoder(accept)
    except Exception:  # noqa: BLE001 -- any Accept header the library cannot parse gets the classic text format
        encoder, content_type = generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    return encoder(_Families(snapshot, stats)), content_type


class SpecctlCollector(Collector):
    """The same families on a registry (for tools that want a collector; the service renders via :func:`render`)."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        return families(self._runtime.metrics(), ServiceStats.of(self._runtime))
