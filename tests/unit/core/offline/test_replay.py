"""``specctl replay`` and its pure parts: EMA tiers, token-trace scoring, the what-if estimate, the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from specctl_vllm.controller.core.offline import ema_tiers, replay, token_traces, whatif
from specctl_vllm.kernel.cost import CPU, CostCoefficients
from specctl_vllm.kernel.protocol import CategoryStep, DraftHistogram, SpecConfig, StepRecord, TelemetryBatch
from tests.unit.core.factories import length_counts

NGRAM_SPEC = SpecConfig(method="ngram", k_max=8, model_free_methods=["suffix"])


def linear_cost(base: float, per_token: float) -> CostCoefficients:
    return CostCoefficients(base=base, per_request=0.0, per_token=per_token, per_token_above_knee=0.0, draft_fixed=0.0,
                            draft_fixed_per_request=0.0, draft_pass=0.0, draft_pass_per_request=0.0,
                            free_draft_token=0.0, knee=0.0)


# --- EMA tiers (SGLang's adaptive steps) ---------------------------------------------------------------------
@pytest.mark.parametrize(("keys", "batch", "slot"), [
    ((1, 8, 32, 64), 0, 1), ((1, 8, 32, 64), 1, 1), ((1, 8, 32, 64), 7, 1), ((1, 8, 32, 64), 8, 8),
    ((1, 8, 32, 64), 31, 8), ((1, 8, 32, 64), 32, 32), ((1, 8, 32, 64), 500, 64), ((4, 16), 2, 4),
])
def test_slot_routing_is_the_largest_key_not_above_the_batch(keys, batch, slot) -> None:
    assert ema_tiers.slot_key(keys, batch) == slot


def _run_slot(cfg: ema_tiers.SlotConfig, initial: int, batches: list[list[float]]) -> list[int]:
    s = ema_tiers.init_slot(initial, cfg)
    out = []
    for accepted in batches:
        s = ema_tiers.update_slot(s, cfg, accepted)
        out.append(s.steps)
    return out


SLOT1 = ema_tiers.DEFAULT_SLOTS[1]
SLOT8 = ema_tiers.DEFAULT_SLOTS[8]


@pytest.mark.parametrize(("cfg", "initial", "batches", "expected_at"), [
    # warm-up: nothing moves during the first 10 batches whatever the acceptance
    (SLOT1, 3, [[7.0]] * 10, {9: 3}),
    # first re-evaluation at batch 15: ema = 7 - 5*0.8^15 = 6.82 climbs 3 -> 5 -> 7 in one go
    (SLOT1, 3, [[7.0]] * 15, {13: 3, 14: 7}),
    # all rejected: ema = 2*0.8^15 = 0.07 <= 1 - 0.5 - 0.25 drops to the floor candidate 1
    (SLOT1, 3, [[0.0]] * 15, {14: 1}),
    # ema 1.0 after decay from 2 stays above the drop threshold 0.25 of candidate 1 and below 2.5
    (SLOT1, 3, [[1.0]] * 20, {14: 3, 19: 3}),
    # initial steps not a candidate: the middle candidate (index 2 of 1/3/5/7 -> 5)
    (SLOT1, 4, [[4.0]] * 1, {0: 5}),
    # slot 8 (0/1/3): zero acceptance reaches 0 (drop threshold 0.5 for a zero candidate)...
    (SLOT8, 1, [[0.0]] * 15, {14: 0}),
    # ... and a zero-step slot probes the next candidate at its next re-evaluation
    (SLOT8, 1, [[0.0]] * 20, {14: 0, 19: 1}),
    # moves only every update_interval batches after warm-up
    (SLOT8, 1, [[3.0]] * 19, {14: 3, 18: 3}),
])
def test_slot_follows_sglang_rules(cfg, initial, batches, expected_at) -> None:
    steps = _run_slot(cfg, initial, batches)
    for i, k in expected_at.items():
        assert steps[i] == k, (i, steps)


def test_zero_step_slot_resets_a_negative_ema_when_it_probes() -> None:
    s = ema_tiers.init_slot(0, SLOT8)  # steps 0, ema -1
    assert (s.steps, s.ema) == (0, -1.0)
    for _ in range(15):
        s = ema_tiers.update_slot(s, SLOT8, [0.0])
    assert (s.steps, s.ema) == (1, 0.0)


@pytest.mark.parametrize(("k_max", "slot1"), [(8, (1, 3, 5, 7)), (4, (1, 3, 4)), (2, (1, 2)), (1, (1,))])
def test_candidates_are_clamped_to_the_engine_k_max(k_max, slot1) -> None:
    assert ema_tiers.clamp_slots(ema_tiers.DEFAULT_SLOTS, k_max)[1].candidate_steps == slot1


def test_update_touches_only_the_routed_slot() -> None:
    state = ema_tiers.init_state(3)
    new = ema_tiers.update(state, ema_tiers.DEFAULT_SLOTS, 8, [2.0])
    assert new.slots[1] == state.slots[1]
    assert new.slots[8].count == 1 and new.slots[8] != state.slots[8]
    assert ema_tiers.update(state, ema_tiers.DEFAULT_SLOTS, 8, []) is state


# --- token traces ------------------------------------------------------------------------------------------------
def repeat_last(tokens: np.ndarray, k: int) -> list[int]:
    """Proposes the last token k times (prefix-consistent)."""
    return [int(tokens[-1])] * k


TRACE = token_traces.RequestTrace("c", (1, 2, 3), (5, 5, 5, 5, 5, 5, 6))


@pytest.mark.parametrize(("k", "steps", "drafted"), [
    (0, 6, 0),  # plain decoding: one token per step after the prefill token
    (1, 3, 3),  # 5|5 5|5 5|5 -> three steps each accepting its single draft
    (2, 2, 4),  # accepts 2 then 2 (5,5 ; 5,5) plus a bonus token each
    (4, 2, 8),  # step 1: 5555 accepted -> pos 6; step 2: proposes 5555 vs [6] -> rejected at once
    (8, 1, 8),  # one step: five of the eight drafts accepted, the bonus token is the final 6
])
def test_score_request_counts_steps_and_drafts(k, steps, drafted) -> None:
    assert token_traces.score_request(TRACE, repeat_last, [k], 8)[k] == (steps, drafted)


def test_trace_profiles_pool_tokens_over_steps_per_category() -> None:
    traces = [TRACE, token_traces.RequestTrace("c", (9,), (7, 8)), token_traces.RequestTrace("d", (1,), (2,))]
    prof = token_traces.trace_profiles(traces, {"rep": repeat_last}, [1, 2])
    # category c at k=2: (6 + 1) decode tokens over (2 + 1) steps; the 1-token request has nothing to decode
    assert prof["c"][("rep", 2)].e == pytest.approx(7 / 3)
    assert prof["c"][("rep", 2)].d == pytest.approx((4 + 2) / 3)
    assert "d" not in prof


def test_trace_histograms_lists_drafted_and_accepted_per_step() -> None:
    assert token_traces.trace_histograms(TRACE, repeat_last, 4) == [(4, 4), (4, 0)]


# --- the estimate ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("e", "d", "batch", "prefill", "base", "per_token"), [
    (1.0, 0.0, 1, 0, 1e-3, 1e-4),
    (2.0, 2.0, 1, 0, 1e-3, 1e-4),
    (2.0, 2.0, 8, 800, 1e-3, 1e-4),
    (3.0, 8.0, 4, 100, 2e-3, 5e-5),
])
def test_estimate_matches_the_closed_form(e, d, batch, prefill, base, per_token) -> None:
    work = whatif.Workload({"c": 1000.0}, float(prefill), float(batch), 0, 0.0)
    choice = {"c": token_traces.Profile("ngram", 4, e, d, "trace")}
    got = whatif.estimate(work, choice, linear_cost(base, per_token))
    steps = 1000.0 / e / batch
    tokens = (prefill + 1000.0 / e * (1 + d)) / steps
    t = base + per_token * tokens
    assert got.goodput == pytest.approx(1000.0 / (steps * t))
    assert got.per_category["c"] == pytest.approx(e / t)


def test_a_category_that_speeds_up_takes_fewer_slots() -> None:
    """Closed loop: doubling E of one category halves its request steps, so it weighs less in the batch."""
    work = whatif.Workload({"a": 100.0, "b": 100.0}, 0.0, 2.0, 0, 0.0)
    load = whatif.step_load(work, {"a": token_traces.Profile("ngram", 1, 2.0, 1.0, "trace")})
    assert load.request_steps == {"a": 50.0, "b": 100.0}
    assert load.steps == pytest.approx(75.0)


def test_best_static_beats_every_uniform_choice() -> None:
    work = whatif.Workload({"copy": 500.0, "chat": 500.0}, 0.0, 8.0, 0, 0.0)
    profiles = {c: {("ngram", k): token_traces.Profile("ngram", k, 1 + sum(b ** i for i in range(1, k + 1)), k, "trace")
                    for k in range(1, 5)} for c, b in (("copy", 0.9), ("chat", 0.1))}
    cost = linear_cost(1e-3, 2e-4)
    best = whatif.best_static(work, profiles, cost)
    g_best = whatif.estimate(work, best, cost).goodput
    for k in range(1, 5):
        assert g_best >= whatif.estimate(work, whatif.uniform(work, profiles, "ngram", k), cost).goodput
    assert best["chat"].k < best["copy"].k


def test_recorded_steps_extrapolate_a_fully_accepted_shorter_draft() -> None:
    """Recorded k=2 drafts all accepted, tier k=3: 2 + beta_3 expected; rejected ones stay as recorded."""
    steps = [StepRecord(t=i * 0.01, wall_s=0.01, batch_size=1, scheduled_tokens=3, draft_tokens=2,
                        categories=[CategoryStep(category="c", method="ngram", requests=1,
                                                 hists=[DraftHistogram(k=2, accepted=[0, 0, 1])])])
             for i in range(30)]
    batch = TelemetryBatch(engine_id="e", boot_id="b", model_name="m", seq=0, sent_at=0.0, spec=NGRAM_SPEC,
                           steps=steps)
    slots = {1: ema_tiers.SlotConfig((3,), warmup_batches=0, update_interval=1)}
    counts = ema_tiers.recorded_steps([batch], {"c": np.array([1.0, 1.0, 0.5])}, 8, 3, slots)
    assert counts == {3: 30}


# --- replay end to end ---------------------------------------------------------------------------------------------
def _batches(n_batches: int = 30) -> list[TelemetryBatch]:
    """Two categories on an n-gram engine at k=4 (code accepts, chat does not); the machine is the cpu preset."""
    out = []
    for seq in range(n_batches):
        steps = []
        for i in range(20):
            cats = []
            for name, beta in (("code", 0.85), ("chat", 0.05)):
                counts = length_counts([beta] * 4, 4, 8)
                cats.append(CategoryStep(category=name, method="ngram", requests=8,
                                         hists=[DraftHistogram(k=4, accepted=counts)],
                                         counterfactual={"suffix": [DraftHistogram(k=8, accepted=length_counts(
                                             [beta] * 8, 8, 8))]}))
            tokens = 16 + 16 * 4
            steps.append(StepRecord(t=seq + i * 0.01, wall_s=CPU.step_time(16, tokens, 0, 64), batch_size=16,
                                    scheduled_tokens=tokens, draft_tokens=64, categories=cats))
        out.append(TelemetryBatch(engine_id="e1", boot_id="b1", model_name="m", seq=seq, sent_at=1000.0 + seq * 0.5,
                                  spec=NGRAM_SPEC, steps=steps))
    return out


@pytest.fixture(scope="module")
def report() -> dict:
    """The batch objective alone (floor 0): the what-if of the policy that trades categories."""
    return replay.replay(_batches(), policies=replay.DEFAULT_POLICIES, timeline=True, category_floor=0.0)


def test_category_floor_keeps_the_unpredictable_category_at_plain_or_better() -> None:
    """Floor 1: code's drafts may not slow chat below plain decoding, so code drafts less (or not at all)
    than with the batch objective alone (the default)."""
    floored = replay.replay(_batches(), policies=["goodput"], category_floor=1.0)["policies"]["goodput"]["choice"]
    free = replay.replay(_batches(), policies=["goodput"])["policies"]["goodput"]["choice"]
    assert floored["chat"]["k"] == 0
    assert floored["code"]["k"] < free["code"]["k"]


def test_replay_lists_every_policy_with_a_choice_per_category(report) -> None:
    pol = report["policies"]
    assert set(pol) == {"off", "recorded", "k=1", "k=2", "k=3", "k=4", "k=6", "k=8", "goodput", "ema_tiers", "oracle"}
    assert pol["off"]["vs_off"] == pytest.approx(1.0)
    for name in ("k=4", "goodput", "oracle"):
        assert set(pol[name]["choice"]) == {"code", "chat"}


def test_oracle_is_at_least_every_static_row_and_the_goodput_policy(report) -> None:
    pol = report["policies"]
    for name, row in pol.items():
        assert pol["oracle"]["goodput"] >= row["goodput"] * (1 - 1e-9), name


def test_goodput_policy_drafts_for_the_predictable_category_only(report) -> None:
    choice = report["policies"]["goodput"]["choice"]
    assert choice["code"]["k"] >= 1
    assert choice["chat"]["k"] == 0
    assert report["policies"]["goodput"]["timeline"], "the decision along the recording is listed"


def test_recorded_row_prices_what_ran_close_to_the_measured_goodput(report) -> None:
    """The cost fit reproduces the recorded step times, so the recorded row matches the measurement."""
    assert report["policies"]["recorded"]["goodput"] == pytest.approx(report["measured_goodput"], rel=0.05)


def test_ema_tiers_row_reports_its_time_at_each_k(report) -> None:
    mix = report["policies"]["ema_tiers"]["steps_at_k"]
    assert sum(mix.values()) == pytest.approx(1.0, abs=1e-3)
    assert set(mix) <= {"0", "1", "3"}  # batch 16 routes to slot 8: candidates 0/1/3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"policies": ["nonsense"]}, "unknown policy"),
    ({"preset": "tpu"}, "unknown cost preset"),
])
def test_replay_rejects_bad_options(kwargs, message) -> None:
    with pytest.raises(replay.ReplayError, match=message):
        replay.replay(_batches(2), **kwargs)


@pytest.mark.parametrize(("lines", "message"), [
    (["{}"], "telemetry:1: not a TelemetryBatch"),
    (["", "not json"], "telemetry:2: not a TelemetryBatch"),
])
def test_parse_telemetry_names_the_bad_line(lines, message) -> None:
    with pytest.raises(replay.ReplayError, match=message):
        replay.parse_telemetry(lines)


@pytest.mark.parametrize(("line", "ok"), [
    ('{"category": "c", "prompt_token_ids": [1, 2], "output_token_ids": [3]}', True),
    ('{"category": "c", "prompt_token_ids": [1, 2]}', False),
    ('{"category": "c", "prompt_token_ids": ["x"], "output_token_ids": [3]}', False),
])
def test_parse_requests(line, ok) -> None:
    if ok:
        assert replay.parse_requests([line]) == [token_traces.RequestTrace("c", (1, 2), (3,))]
    else:
        with pytest.raises(replay.ReplayError, match="requests:1"):
            replay.parse_requests([line])


def test_select_model_asks_to_choose_among_several() -> None:
    a = _batches(1)[0]
    b = a.model_copy(update={"model_name": "other"})
    with pytest.raises(replay.ReplayError, match="--model"):
        replay.select_model([a, b], None)
    assert replay.select_model([a, b], "other") == [b]


def test_format_report_shows_rows_choices_and_the_timeline(report) -> None:
    text = replay.format_report(report)
    for needle in ("estimated goodput", "choice per category", "goodput policy along the recording", "ema_tiers"):
        assert needle in text
    assert "the category lacks the evidence" not in text  # every category has enough drafts in this recording


# --- graph-shaped recordings: priced by the recording's cell table ---------------------------------------------
GRAPH_SPEC = SpecConfig(method="eagle3", k_max=7, full_cuda_graphs=True, graph_widths=[0, 1, 2, 4, 7])
#: measured seconds per decode step of 16 requests at each width
GRAPH_STEP_S = {0: 0.010, 1: 0.0115, 2: 0.0125, 4: 0.0150, 7: 0.0200}


def _graph_batches(n_batches: int = 30) -> list[TelemetryBatch]:
    """A graph-shaped eagle3 engine cycling through its widths, 8 code (accepts) and 8 chat (does not) per step."""
    out = []
    for seq in range(n_batches):
        steps = []
        for i in range(20):
            width = GRAPH_SPEC.graph_widths[(seq * 20 + i) % 5]
            cats = [CategoryStep(category=name, method="eagle3" if width else "off", requests=8,
                                 hists=[DraftHistogram(k=width, accepted=length_counts([beta] * width, width, 8))]
                                 if width else [])
                    for name, beta in (("code", 0.85), ("chat", 0.2))]
            seconds = GRAPH_STEP_S[width]
            steps.append(StepRecord(t=seq + i * 0.02, wall_s=seconds, interval_s=seconds, batch_size=16,
                                    scheduled_tokens=16 * (1 + width), draft_tokens=16 * width, draft_depth=width,
                                    width=width, categories=cats))
        out.append(TelemetryBatch(engine_id="e1", boot_id="b1", model_name="m", seq=seq, sent_at=1000.0 + seq * 0.5,
                                  spec=GRAPH_SPEC, steps=steps))
    return out


@pytest.fixture(scope="module")
def graph_report() -> dict:
    return replay.replay(_graph_batches(), policies=replay.DEFAULT_POLICIES, preset="h200")


def test_a_per_request_recording_is_priced_by_the_batch_model(report) -> None:
    assert report["step_model"] == "batch_model"


def test_graph_recording_rows_are_the_widths_priced_by_their_cells(graph_report) -> None:
    pol = graph_report["policies"]
    assert graph_report["step_model"] == "cells"
    assert {n for n in pol if n.startswith("k=")} == {"k=1", "k=2", "k=4", "k=7"}  # the engine's widths only
    for name in ("off", "k=1", "k=2", "k=4", "k=7"):
        row = pol[name]
        width = int(name[2:]) if name != "off" else 0
        # 600 measured steps per cell against a prior of 5: the cell is the measurement, within the prior's pull
        assert row["step_ms"] == pytest.approx(GRAPH_STEP_S[width] * 1e3, rel=0.02)
        committed = sum(8 * row["choice"][c]["e"] for c in ("code", "chat")) if width else 16.0
        assert row["goodput"] == pytest.approx(committed / (row["step_ms"] / 1e3), rel=1e-3)


def test_graph_recording_oracle_is_the_best_width_and_the_policy_runs_one_width(graph_report) -> None:
    pol = graph_report["policies"]
    widths = {"off": 0, "k=1": 1, "k=2": 2, "k=4": 4, "k=7": 7}
    best = max(widths, key=lambda n: pol[n]["goodput"])
    assert pol["oracle"]["width"] == widths[best]
    assert pol["oracle"]["goodput"] == pytest.approx(pol[best]["goodput"], rel=1e-12)
    width = pol["goodput"]["width"]
    assert {c["k"] for c in pol["goodput"]["choice"].values()} == {width}
    assert pol["goodput"]["goodput"] == pytest.approx(pol["off" if width == 0 else f"k={width}"]["goodput"],
                                                      rel=1e-12)
    assert pol["goodput"]["goodput"] >= pol["off"]["goodput"]


def test_graph_recording_recorded_row_prices_what_ran_close_to_the_measurement(graph_report) -> None:
    assert graph_report["policies"]["recorded"]["goodput"] == pytest.approx(graph_report["measured_goodput"], rel=0.02)
    assert "cell table" in replay.format_report(graph_report)
