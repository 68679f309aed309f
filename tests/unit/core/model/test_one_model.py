"""One batch model: the policy's scorer, ``specctl replay``'s estimate and the simulator's oracle price a
configuration with the same number, and that number is the closed form of controller/core/model/batch.py.
One cell model for graph-shaped engines: the policy's decision, replay's estimate and the graph simulator's step
price one width through the same cell table, sum_c n_c E_c(K) / T(b, K)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim import oracle
from bench.sim.graph import GraphEngine, gpu_profile_trace
from bench.sim.profiles import CategoryProfile, Trace
from specctl_vllm.controller.core.config import PolicySettings
from specctl_vllm.controller.core.learn.cost_fit import NO_CORRECTIONS, OnlineCostModel, corrections
from specctl_vllm.controller.core.model.batch import BatchModel
from specctl_vllm.controller.core.offline import token_traces, whatif, whatif_graph
from specctl_vllm.controller.core.policy import goodput, graph
from specctl_vllm.controller.core.policy.types import CategoryInput, Choice, MethodProfile, PolicySnapshot
from specctl_vllm.kernel.cost import CPU, H200, MIXED, UNIFORM, CostCoefficients
from specctl_vllm.kernel.model.cells import CellTable, CellView
from specctl_vllm.kernel.model.widths import COLD_BETA, geometric_lengths

K_MAX = 6
ENGINE, FREE = "draft_model", "ngram"
#: name: (share of arrivals, output tokens, acceptance per position of the engine's drafter, of n-gram)
CATEGORIES = {
    "code": (0.3, 200, (0.85, 0.8, 0.78, 0.75, 0.7, 0.7), (0.6, 0.5, 0.5, 0.4, 0.4, 0.4)),
    "chat": (0.4, 100, (0.4, 0.3, 0.25, 0.2, 0.2, 0.2), (0.1, 0.1, 0.1, 0.1, 0.1, 0.1)),
    "edit": (0.2, 300, (0.6, 0.5, 0.5, 0.5, 0.5, 0.5), (0.95, 0.9, 0.9, 0.9, 0.85, 0.85)),
    "json": (0.1, 50, (0.9, 0.9, 0.85, 0.8, 0.8, 0.8), (0.3, 0.3, 0.3, 0.3, 0.3, 0.3)),
}
PROMPT_TOKENS = 128


def e_of(betas, k: int) -> float:
    return 1.0 + float(np.sum(np.cumprod(betas[:k])))


def demand() -> dict[str, float]:
    return {c: s * length for c, (s, length, _, _) in CATEGORIES.items()}


def rho() -> float:
    """Prompt tokens per committed token of the workload."""
    return PROMPT_TOKENS * sum(s for s, *_ in CATEGORIES.values()) / sum(demand().values())


def via_policy(choice, batch: float, cost: CostCoefficients) -> float:
    cats = tuple(CategoryInput(name, batch * s, (
        MethodProfile(ENGINE, eng, 1e4, False, False), MethodProfile(FREE, free, 1e4, True, True)),
        committed=demand()[name]) for name, (s, _, eng, free) in CATEGORIES.items())
    snap = PolicySnapshot(categories=cats, pooled=(), batch_size=batch, extra_tokens=0.0, cost=cost, k_max=K_MAX,
                          engine_method=ENGINE, methods=(ENGINE, FREE), extra_per_committed=rho())
    g, _ = goodput.score(snap, PolicySettings(), {c: Choice(k, m if k else "off") for c, (k, m) in choice.items()})
    return g


def via_replay(choice, batch: float, cost: CostCoefficients) -> float:
    committed = {c: 1000.0 * w for c, w in demand().items()}
    work = whatif.Workload(committed, rho() * sum(committed.values()), batch, 0, 0.0)
    picked = {}
    for c, (k, m) in choice.items():
        betas = CATEGORIES[c][2 if m == ENGINE else 3]
        picked[c] = token_traces.Profile(m, k, e_of(betas, k), float(k), "telemetry") if k else token_traces.OFF
    return whatif.estimate(work, picked, cost, batch).goodput


def oracle_inputs() -> tuple[Trace, np.ndarray]:
    cats = tuple(CategoryProfile(c, s, length, 0.0, {"engine": np.array(eng), FREE: np.array(free)})
                 for c, (s, length, eng, free) in CATEGORIES.items())
    exp = np.array([[[e_of(betas, k) for k in range(K_MAX + 1)] for betas in (c[2], c[3])]
                    for c in CATEGORIES.values()])
    return Trace("t", "test", ENGINE, K_MAX, (FREE,), PROMPT_TOKENS, cats), exp


def via_oracle(choice, batch: float, cost: CostCoefficients) -> float:
    trace, exp = oracle_inputs()
    cfg = np.array([[(k, 0 if m == ENGINE else 1) for k, m in choice.values()]])
    return float(oracle.goodput(trace, exp, cost, int(batch), cfg)[0])


def closed_form(choice, batch: float, cost: CostCoefficients) -> float:
    """The formula of controller/core/model/batch.py, written out for one configuration (no spread, factors 1)."""
    w = demand()
    e = {c: e_of(CATEGORIES[c][2 if m == ENGINE else 3], k) if k else 1.0 for c, (k, m) in choice.items()}
    slots = {c: w[c] / e[c] for c in w}
    n_c = {c: batch * slots[c] / sum(slots.values()) for c in w}
    committed = sum(n_c[c] * e[c] for c in w)
    tokens = sum(n_c[c] * (1 + choice[c][0]) for c in w) + rho() * committed
    free = sum(n_c[c] * choice[c][0] for c in w if choice[c][1] == FREE)
    t = cost.base + cost.per_request * batch + cost.per_token * tokens
    t += cost.per_token_above_knee * max(tokens - cost.knee, 0.0) + cost.free_draft_token * free
    for x in range(K_MAX):  # P(depth > x) pays the pass at depth x + 1 (and the fixed part at x = 0)
        below = sum(n_c[c] for c, (k, m) in choice.items() if m != ENGINE or k <= x) / batch
        above = 1.0 - below ** batch
        t += above * (cost.draft_pass + cost.draft_pass_per_request * batch)
        if x == 0:
            t += above * (cost.draft_fixed + cost.draft_fixed_per_request * batch)
    return committed / t


CHOICES = [
    {"code": (4, ENGINE), "chat": (1, ENGINE), "edit": (3, FREE), "json": (0, "off")},  # mixed k and drafters
    {"code": (6, ENGINE), "chat": (0, "off"), "edit": (6, FREE), "json": (2, ENGINE)},
    {"code": (0, "off"), "chat": (0, "off"), "edit": (0, "off"), "json": (0, "off")},  # plain decoding
    {"code": (2, FREE), "chat": (1, FREE), "edit": (5, FREE), "json": (1, FREE)},  # model-free only
]


@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize(("batch", "cost"), [(1, H200), (8, H200), (64, H200), (256, H200), (16, CPU)])
def test_policy_replay_and_oracle_price_a_configuration_alike(choice, batch, cost) -> None:
    want = closed_form(choice, float(batch), cost)
    got = {"policy": via_policy(choice, float(batch), cost), "replay": via_replay(choice, float(batch), cost),
           "oracle": via_oracle(choice, float(batch), cost)}
    assert got == pytest.approx({k: want for k in got}, rel=1e-9)


@pytest.mark.parametrize("batch", [1, 4, 32, 256])
def test_the_search_finds_what_the_oracle_s_exhaustive_ranking_finds(batch) -> None:
    """Replay's hindsight choice (the policy's coordinate ascent) reaches the best of all 13**4 configurations."""
    committed = {c: 1000.0 * w for c, w in demand().items()}
    work = whatif.Workload(committed, rho() * sum(committed.values()), float(batch), 0, 0.0)
    profiles = {c: {(m, k): token_traces.Profile(m, k, e_of(CATEGORIES[c][2 if m == ENGINE else 3], k), float(k), "t")
                    for m in (ENGINE, FREE) for k in range(1, K_MAX + 1)} for c in CATEGORIES}
    searched = whatif.estimate(work, whatif.best_static(work, profiles, H200), H200).goodput
    trace, exp = oracle_inputs()
    ((exhaustive, _),) = oracle.best_static(trace, exp, H200, batch, top=1)
    assert searched == pytest.approx(exhaustive, rel=1e-9)


@pytest.mark.parametrize("choice", CHOICES[:2])
def test_all_three_price_the_step_through_the_batch_model_s_one_step_model(choice, monkeypatch) -> None:
    """Doubling BatchModel.time halves what every path reports, and the preset's own formula is never asked:
    no path prices a step with a model of its own (the preset directly, or the engine's cell table)."""
    before = {"policy": via_policy(choice, 8.0, H200), "replay": via_replay(choice, 8.0, H200),
              "oracle": via_oracle(choice, 8.0, H200)}
    time = BatchModel.time
    monkeypatch.setattr(BatchModel, "time", lambda self, *a: 2.0 * time(self, *a))

    def elsewhere(*_a, **_k):
        raise AssertionError("a step priced outside the batch model")

    monkeypatch.setattr(CostCoefficients, "step_time", elsewhere)
    monkeypatch.setattr(CellTable, "view", elsewhere)
    after = {"policy": via_policy(choice, 8.0, H200), "replay": via_replay(choice, 8.0, H200),
             "oracle": via_oracle(choice, 8.0, H200)}
    assert after == pytest.approx({k: v / 2.0 for k, v in before.items()}, rel=1e-12)


@pytest.mark.parametrize("choice", CHOICES[:2])
@pytest.mark.parametrize("batch", [4.0, 64.0])
def test_policy_and_replay_price_with_the_same_measured_corrections(choice, batch) -> None:
    """A fit whose steps ran dearer at depth and with mixed k: the policy's snapshot and replay take its depth
    factors and mixed-k penalty from the same ``corrections`` and still price the configuration alike (replay
    once priced with the coefficients alone)."""
    corr = corrections_of_a_measured_engine(batch)
    assert corr != NO_CORRECTIONS and corr.mixed_penalty > 1.05 and max(abs(f - 1.0) for f in corr.depth_factor) > 0.05
    cats = tuple(CategoryInput(name, batch * s, (
        MethodProfile(ENGINE, eng, 1e4, False, False), MethodProfile(FREE, free, 1e4, True, True)),
        committed=demand()[name]) for name, (s, _, eng, free) in CATEGORIES.items())
    snap = PolicySnapshot(categories=cats, pooled=(), batch_size=batch, extra_tokens=0.0, cost=H200, k_max=K_MAX,
                          engine_method=ENGINE, methods=(ENGINE, FREE), extra_per_committed=rho(),
                          depth_factor=corr.depth_factor, mixed_penalty=corr.mixed_penalty)
    policy, _ = goodput.score(snap, PolicySettings(), {c: Choice(k, m if k else "off") for c, (k, m) in choice.items()})
    committed = {c: 1000.0 * w for c, w in demand().items()}
    work = whatif.Workload(committed, rho() * sum(committed.values()), batch, 0, 0.0)
    picked = {c: token_traces.Profile(m, k, e_of(CATEGORIES[c][2 if m == ENGINE else 3], k), float(k), "telemetry")
              if k else token_traces.OFF for c, (k, m) in choice.items()}
    replay = whatif.estimate(work, picked, H200, batch, corr).goodput
    assert replay == pytest.approx(policy, rel=1e-9)
    assert replay != pytest.approx(whatif.estimate(work, picked, H200, batch).goodput, rel=1e-3)  # they do count


def corrections_of_a_measured_engine(batch: float):
    """The online fit after steps that ran 30 % dearer at every depth above 0 and 40 % dearer with mixed k."""
    fit = OnlineCostModel(H200, 10.0)
    rows = []
    for depth in range(K_MAX + 1):
        for kind, slow in ((UNIFORM, 1.0), (MIXED, 1.4)):
            n, tok = int(batch), int(batch) * (1 + depth)
            t = H200.step_time(n, tok, depth, 0) * (1.3 if depth else 1.0) * (slow if depth else 1.0)
            rows += [(n, tok, depth, 0, t, kind if depth else UNIFORM)] * 200
    fit.add_many(rows)
    return corrections(fit, batch, K_MAX, full_cuda_graphs=False)


# --- graph-shaped engines: one cell table ------------------------------------------------------------------
GRAPH_WIDTHS = (0, 1, 2, 4, 6)


def graph_view() -> CellView:
    """A cell table measured at some cells (the rest from the calibrated prior), as the controller learns it."""
    table = CellTable()
    for n, width, seconds in [(1, 0, 0.005), (1, 4, 0.0072), (8, 0, 0.0061), (8, 2, 0.0074), (8, 6, 0.0101),
                              (64, 0, 0.011), (64, 1, 0.0139), (64, 4, 0.0232), (256, 0, 0.024), (256, 2, 0.052)]:
        for _ in range(40):
            table.add(n, width, seconds)
    return table.view(GRAPH_WIDTHS, H200)


def graph_curves() -> dict[str, tuple[float, ...]]:
    return {c: tuple(e_of(eng, k) for k in range(K_MAX + 1)) for c, (_, _, eng, _) in CATEGORIES.items()}


def graph_via_policy(width: int, batch: int) -> tuple[float, int]:
    """The decision's goodput at ``width``: its own figure where it forecasts that width, else its goodput-table
    row (every category's rows are the batch's; rounded to 3 decimals), and the width it forecasts."""
    cats = tuple(CategoryInput(name, batch * s, (MethodProfile(ENGINE, eng, 1e4, False, False),))
                 for name, (s, _, eng, _) in CATEGORIES.items())
    snap = PolicySnapshot(categories=cats, pooled=(), batch_size=float(batch), extra_tokens=0.0, cost=H200,
                          k_max=K_MAX, engine_method=ENGINE, methods=(ENGINE,))
    d = graph.decide(snap, graph_view(), graph_curves(), geometric_lengths(COLD_BETA, K_MAX))
    row = next(r for r in d.categories[0].table if r.k == width)
    assert all(c.k == d.default.k == K_MAX for c in d.categories)  # the cap: the engine's rule picks the width
    return (d.goodput if width == d.width else row.goodput), d.width


def graph_via_replay(width: int, batch: int) -> float:
    # the recording's request steps in the categories' shares (each request step committing one token)
    work = whatif.Workload({c: 1000.0 * s for c, (s, *_) in CATEGORIES.items()}, 0.0, float(batch), 0, 0.0,
                           {c: token_traces.Profile(ENGINE, 0, 1.0, 0.0, "recorded") for c in CATEGORIES})
    return whatif_graph.graph_estimate(work, graph_curves(), graph_view(), width, float(batch)).goodput


def graph_via_simulator(width: int, batch: int) -> float:
    """The graph simulator's engine: a decode step of ``batch`` slots at ``width`` costs its cell."""
    eng = GraphEngine(gpu_profile_trace("mixed", K_MAX), graph_view(), H200, batch, seed=0, noise=0.0)
    t = eng.step_seconds(batch, batch * (1 + width), width, 0.0, 0)
    return sum(batch * s * e_of(eng_b, width) for s, _, eng_b, _ in CATEGORIES.values()) / t


@pytest.mark.parametrize("width", GRAPH_WIDTHS)
@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_policy_replay_and_graph_simulator_price_a_width_through_the_same_cells(width, batch) -> None:
    view = graph_view()
    t = view.row(batch)[0][GRAPH_WIDTHS.index(width)]
    want = sum(batch * s * e_of(eng, width) for s, _, eng, _ in CATEGORIES.values()) / t  # written out
    policy, _ = graph_via_policy(width, batch)
    got = {"replay": graph_via_replay(width, batch), "simulator": graph_via_simulator(width, batch)}
    assert got == pytest.approx({k: want for k in got}, rel=1e-9)
    assert policy == pytest.approx(want, rel=1e-9, abs=1e-3)  # the decision's rows are rounded to 3 decimals


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_the_policy_s_width_is_the_rule_s_on_the_same_cells(batch, monkeypatch) -> None:
    """What the policy reports as the engine's width is choose_width on the cells (never a width worse than
    plain under them), and the batch model is not asked."""

    def elsewhere(*_a, **_k):
        raise AssertionError("a graph-shaped step priced by the batch model")

    monkeypatch.setattr(BatchModel, "time", elsewhere)
    _, width = graph_via_policy(0, batch)
    plain = graph_via_replay(0, batch)
    assert graph_via_replay(width, batch) >= plain
