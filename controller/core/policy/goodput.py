"""Goodput policy: per category k and draft method maximising committed tokens per second of the batch.

Formula. For a category c with conditional acceptance beta_{c,m,i} for drafter m at position i, a
request step at proposal length k commits

    E_c(k) = 1 + m_{c,m} * sum_{i=1..k} prod_{j<=i} beta_{c,m,j}        (E_c(0) = 1)

tokens, where m_{c,m} is the drafter's match rate: the share of the category's request steps on which it
drafts at all (a model-free drafter proposes only on a match; 1 for model drafters). The betas are learned
from the drafts that happened, so without m a rarely matching drafter looks as good as its matches.
All categories share one engine step, so the objective is the batch goodput

    G = sum_c n_c * E_c(k_c) / E[T(n, N, d, D_free)]
    n = sum_c n_c,  N = extra + sum_c n_c * (1 + m_c k_c),  D_free = sum_{c on a model-free drafter} n_c m_c k_c,
    d = drafting depth of the step = the largest k among its model-drafted requests; with n requests drawn
        from the mix, P(d <= x) = (sum_{c: d_c <= x} n_c / n) ** n  (batch 1: each request its own depth;
        large batches: the deepest category's k)

with n_c the category's requests per step on the asking engine: a finished request is replaced by one
of the same mix, so a category that commits more tokens per step holds fewer slots,
n_c = n * (w_c / E_c(k_c)) / sum_c' (w_c' / E_c'(k_c')) with w_c its observed committed tokens per step
(the workload's demand, which the decision does not change); ``extra`` the prefill tokens per step
and T the learned step-cost model (kernel/cost.py), at each depth d times its measured depth-cell
factor f(d) at batch n (E[T] = sum_d P(d) f(d) T(d); f = 1 where the engine never ran that cell), and
times P_uni + (1 - P_uni) * p where p is the measured mixed-k penalty and P_uni = sum_x q_x ** n the chance
that all n requests draft the same k (q_x: share at model depth x; model-free drafts count as depth 0). Finished requests are replaced, so prefill
grows with goodput: extra = rho * sum_c n_c E_c(k_c) with rho the observed prefill tokens per committed
token, and the expectation runs over the observed step-to-step spread of prefill (the cost bends at the
knee). Plain decoding is every k_c = 0.

Where it lives. The batch goodput G (slots, prefill, depth distribution, depth factors, mixed-k penalty, floor)
is :class:`specctl_vllm.controller.core.model.batch.BatchModel`, and the search (batched coordinate ascent with depth-cap
restarts, all off and the previous decision) is :func:`specctl_vllm.controller.core.model.search.search`: the same model and
search price ``specctl replay``'s rows and rank the simulator's oracle candidates. :func:`score` prices one
configuration of a snapshot. The options per category (off and every k in 1..k_max for every drafter the engine
can run with enough evidence) are :mod:`.candidates`; the guardrails below are :mod:`.guardrails`.

Guardrails, applied on top:
  * min evidence: a drafter is an option for a category only after ``min_evidence`` drafts seen. A
    category not yet measured on the engine's own drafter runs it (k >= 1, priced with the pooled profile
    of all categories) when that takes at most ``explore_window_s``; a category with no eligible drafter
    keeps the default (the pooled choice; while the pool lacks evidence, a cold start: the engine's drafter
    at the best k >= 1 for the prior acceptance at this batch and cost model, :func:`_cold_choice`);
  * hysteresis: a category leaves its previous decision only if the batch gains more than
    ``hysteresis`` times the category's own goodput (so small categories move too, noise does not);
  * probing: a category at k = 0 has ``probe_rate`` of its requests run at ``probe_k`` with a drafter
    that has no counterfactual signal (model-free drafters are scored counterfactually on every request
    and need none), throttled so the modelled cost stays below ``probe_budget`` of the batch goodput while
    the drafter could pay at the upper confidence bound of its acceptance, and below ``probe_idle_budget``
    (a keep-alive) while even that bound says it cannot;
  * category floor (``category_floor`` f, default 0 = off): no category with requests in the batch is
    modelled below f x its plain goodput per request, E_c T_plain / T_c, with T_c the mean step with one
    average request swapped for c's own (batch 1: its own step); a configuration short of it counts
    (r / f) ** 40 of its goodput, so "all off" stays a feasible start;
  * per-request adaptation band: the engine may move a request's k within the contiguous band of k whose
    batch goodput is within ``adapt_tolerance`` of the chosen k (relative to the category's goodput);
    no band (k only) where the mixed-k penalty exceeds 1 + ``adapt_tolerance``.

Inputs: :class:`PolicySnapshot`; config: :class:`specctl_vllm.controller.core.config.PolicySettings`.
Defaults: min_evidence 50 drafts, hysteresis 3 %, probe 5 % at k=1 within 1 % cost, band 3 %.
Trade-offs: the mean mix (not its step-to-step spread) is optimised; a category's requests share one
starting k and drafter (the engine's fast loop covers per-request spread); the knee is a preset constant.
Cost: O(restarts x iterations x categories x options x k_max) in numpy, about 0.1 ms per category.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from specctl_vllm.controller.core.config import PolicySettings
from specctl_vllm.controller.core.learn.estimator import expected_committed
from specctl_vllm.controller.core.model.batch import BatchModel, Options
from specctl_vllm.controller.core.model.search import search
from specctl_vllm.controller.core.policy import candidates as cand
from specctl_vllm.controller.core.policy import guardrails
from specctl_vllm.controller.core.policy.types import (
    CategoryDecision,
    CategoryInput,
    Choice,
    Decision,
    KRow,
    MethodProfile,
    PolicySnapshot,
)
from specctl_vllm.kernel.drafters import is_model_free
from specctl_vllm.kernel.protocol import METHOD_OFF

#: Requests per step assumed for a category absent from the current mix: its decision is then the
#: marginal one (what one such request would gain in this batch).
MIN_SHARE = 1e-3


def _default_choice(snap: PolicySnapshot, cfg: PolicySettings) -> tuple[Choice, str]:
    """What a category without evidence of its own runs (also: the policy's default entry).

    With an engine drafter: that drafter at the k the pooled profile of all categories earns in this batch
    (so new categories are measured on it, at a cost the batch can afford; k = 0 means probing). Without
    one: the pooled decision over the model-free drafters. While the pool itself lacks evidence (a cold
    start): the engine's drafter at the k this batch's cost model (the preset until timings are measured)
    prices best for the prior acceptance (:func:`_cold_choice`).
    """
    pooled = [p for p in snap.pooled if cand.usable(p, snap, cfg)]
    engine = cand.engine_drafter(snap)
    if engine is not None:
        pooled = [p for p in pooled if p.method == engine]
    if not pooled or snap.k_max <= 0:
        return _cold_choice(snap, cfg, engine)
    opts = cand.options(pooled, snap.k_max)
    pb = BatchModel(["_default"], [max(snap.batch_size, 1.0)], [opts], [True], cand.extra(snap), snap.cost, snap.k_max,
                  depth_factors=snap.depth_factor, mixed_penalty=snap.mixed_penalty)
    prev_i = cand.index(opts, snap.previous_default)
    prev = np.array([prev_i]) if prev_i >= 0 else None
    best, _ = guardrails.hysteresis(pb, search(pb, snap.k_max, prev), prev, cfg.hysteresis)
    j = int(best[0])
    k = int(opts.k[j])
    what = f"pooled profile of {engine}" if engine is not None else "pooled decision of all categories"
    return Choice(k, opts.methods[j] if k else METHOD_OFF), what


def _cold_choice(snap: PolicySnapshot, cfg: PolicySettings, engine: str | None) -> tuple[Choice, str]:
    """The default while the pool lacks ``min_evidence`` drafts of the engine's drafter.

    That drafter at the best k >= 1 of the batch model for its pooled posterior so far (the prior acceptance
    at every position, shrunk toward the few drafts seen; its match rate likewise), at this batch size and cost
    model: the preset's best static k for a prior acceptance, not the engine's k_max, which on the CPU
    recording ran 0.94x the best static k. k >= 1 so that the drafter is measured and the cold start ends.
    No engine drafter (or k_max 0): the engine's static config."""
    if engine is None or snap.k_max <= 0:
        return cand.static_choice(snap), f"engine static config (pooled evidence below {cfg.min_evidence:g} drafts)"
    prof = cand.profile_for(snap.pooled, engine) or MethodProfile(
        engine, (snap.prior_acceptance,) * snap.k_max, 0.0, False, is_model_free(engine))
    opts = cand.options([prof], snap.k_max).tail()
    pb = BatchModel(["_default"], [max(snap.batch_size, 1.0)], [opts], [True], cand.extra(snap), snap.cost, snap.k_max,
                    depth_factors=snap.depth_factor, mixed_penalty=snap.mixed_penalty)
    prev_i = cand.index(opts, snap.previous_default)
    prev = np.array([prev_i]) if prev_i >= 0 else None
    best, _ = guardrails.hysteresis(pb, search(pb, snap.k_max, prev), prev, cfg.hysteresis)
    k = int(opts.k[int(best[0])])
    return Choice(k, engine), (f"cold start (pooled evidence below {cfg.min_evidence:g} drafts): {engine} at the "
                               f"best k for acceptance {prof.betas[0]:.2f} at batch {pb.n:.1f}")


def _best_standalone(cats: list[CategoryInput], snap: PolicySnapshot, cfg: PolicySettings) -> list[tuple[str, float]]:
    """Per category: the drafter (any pool) that serves it best alone at this batch size, and its speedup."""
    known = [[p for p in c.profiles if p.eligible_evidence >= cfg.min_evidence] for c in cats]
    out: list[tuple[str, float]] = [(METHOD_OFF, 1.0)] * len(cats)
    idx = [i for i, k in enumerate(known) if k]
    if not idx:
        return out
    k = max(snap.k_max, 1)
    n = max(snap.batch_size, 1.0)
    opts = [cand.options(known[i], k) for i in idx]
    pb = BatchModel([cats[i].name for i in idx], [n] * len(idx), opts, [True] * len(idx), cand.extra(snap), snap.cost, k,
                  depth_factors=snap.depth_factor, mixed_penalty=snap.mixed_penalty)
    # every row alone: a batch of n requests all of that category
    t = pb.time(n * (1.0 + pb.d), n * pb.e, n * pb.free_k, pb.at_or_below)
    g = np.where(pb.valid, n * pb.e / t, -np.inf)
    best = np.argmax(g, axis=1)
    for row, i in enumerate(idx):
        j = int(best[row])
        out[i] = (opts[row].methods[j] if opts[row].k[j] else METHOD_OFF, float(g[row, j] / g[row, 0]))
    return out


def _model(snap: PolicySnapshot, cfg: PolicySettings, default: Choice, names: list[str], shares: list[float],
           options: list[Options], movable: list[bool], demand: list[float], inputs: list[CategoryInput]) -> BatchModel:
    """The batch the policy optimises: the categories' options, plus the requests the mix does not attribute
    (e.g. an engine that reports none) at the default."""
    rest = snap.batch_size - sum(shares)
    if rest > 1e-9 or not names:
        names.append("_rest")
        shares.append(max(rest, MIN_SHARE) if names[:-1] else max(snap.batch_size, 1.0))
        options.append(cand.fixed_option(default, cand.profile_for(snap.pooled, default.method)))
        demand.append(shares[-1] * float(options[-1].e[0]))
        movable.append(False)
    protected = [i < len(inputs) and inputs[i].share > MIN_SHARE for i in range(len(names))]
    return BatchModel(names, shares, options, movable, cand.extra(snap), snap.cost, snap.k_max, demand, snap.depth_factor,
                      snap.mixed_penalty, cfg.category_floor, protected)


def score(snap: PolicySnapshot, cfg: PolicySettings, choices: Mapping[str, Choice]) -> tuple[float, float]:
    """Modelled batch goodput (tokens/s) and step time (s) of one configuration, category -> choice (missing:
    the default), under the model :func:`decide` maximises: what ``specctl replay`` and the simulator's oracle
    must agree with."""
    default, _ = _default_choice(snap, cfg)
    names, shares, options, demand = [], [], [], []
    for c in snap.categories:
        choice = choices.get(c.name, default)
        names.append(c.name)
        shares.append(max(c.share, MIN_SHARE))
        demand.append(c.committed if c.share >= MIN_SHARE and c.committed > 0 else max(c.share, MIN_SHARE))
        options.append(cand.fixed_option(choice, cand.profile_for(c.profiles, choice.method)))
    pb = _model(snap, cfg, default, names, shares, options, [False] * len(names), demand, list(snap.categories))
    return pb.goodput(np.zeros(len(names), dtype=int))


def decide(snap: PolicySnapshot, cfg: PolicySettings) -> Decision:
    default, default_reason = _default_choice(snap, cfg)
    names, shares, options, movable, inputs, demand = [], [], [], [], [], []
    engine = cand.engine_drafter(snap)
    pooled_engine = cand.profile_for(snap.pooled, engine) if engine else None
    explore_ok = pooled_engine is not None and pooled_engine.eligible_evidence >= cfg.min_evidence
    b0 = max(snap.batch_size, 1.0)
    t_plain0 = snap.cost.step_time(b0, b0 + (snap.extra_per_committed * b0 or snap.extra_tokens))
    t_plain0 *= snap.depth_factor[0] if snap.depth_factor else 1.0
    exploring: set[int] = set()
    for c in snap.categories:
        usable = [p for p in c.profiles if cand.usable(p, snap, cfg)] if snap.k_max > 0 else []
        names.append(c.name)
        shares.append(max(c.share, MIN_SHARE))
        demand.append(c.committed if c.share >= MIN_SHARE and c.committed > 0 else max(c.share, MIN_SHARE))
        inputs.append(c)
        own = cand.profile_for(c.profiles, engine) if engine else None
        missing = cfg.min_evidence - (own.eligible_evidence if own is not None else 0.0)
        if engine is not None and missing > 0 and explore_ok and \
                missing / max(c.share, MIN_SHARE) * t_plain0 <= cfg.explore_window_s:
            # the engine's drafter is unmeasured on this category and measuring it is quick: run it (k >= 1,
            # priced with the pool's profile). Otherwise a category on a model-free drafter (scored for
            # free on every request) would never be measured on the engine's own drafter.
            exploring.add(len(names) - 1)
            opts = cand.options([pooled_engine], snap.k_max)
            options.append(opts.tail())
            movable.append(True)
        elif usable:
            options.append(cand.options(usable, snap.k_max))
            movable.append(True)
        else:
            own = cand.profile_for(c.profiles, default.method) or cand.profile_for(snap.pooled, default.method)
            options.append(cand.fixed_option(default, own))
            movable.append(False)
    pb = _model(snap, cfg, default, names, shares, options, movable, demand, inputs)
    prev = np.array([cand.index(options[i], inputs[i].previous) if i < len(inputs) else -1 for i in range(len(names))])
    has_prev = bool((prev >= 0).any())
    start_prev = np.where(prev >= 0, prev, 0) if has_prev else None
    cfg_best = search(pb, snap.k_max, start_prev)
    cfg_best, notes = guardrails.hysteresis(pb, cfg_best, prev if has_prev else None, cfg.hysteresis)

    g_all, t_all = pb.all_options(cfg_best)
    g, t = pb.goodput(cfg_best)
    g_plain, t_plain = pb.plain()
    bands = guardrails.bands(pb, cfg_best, g_all, t_all, cfg.adapt_tolerance)
    if pb.mixed_penalty > 1.0 + cfg.adapt_tolerance:
        # per-request adaptation would make steps mixed-k, which this engine runs measurably slower
        bands = [(int(pb.k[u, cfg_best[u]]),) * 2 for u in pb.rows]
    probes = guardrails.probes(pb, cfg_best, inputs, snap, cfg)
    standalone = _best_standalone(inputs, snap, cfg)
    own = pb.ratios_at(cfg_best)
    worst = float(np.where(pb.protected, own, np.inf).min())
    floor_note = (f"; category floor binds: worst category {worst:.2f}x plain (floor {pb.floor:.2f})"
                  if pb.floor > 0 and worst < pb.floor * 1.01 else "")
    out = []
    tables = _tables(pb, g_all, t_all, snap.k_max, g_plain)
    for u, c in enumerate(inputs):
        j = int(cfg_best[u])
        k, e, method = int(options[u].k[j]), float(options[u].e[j]), options[u].methods[j]
        speedup = float(own[u])  # its requests' own steps: at batch 1 they never share one with another category
        if movable[u]:
            source = "policy"
            reason = (f"max goodput: E({k})={e:.2f} tokens/step, step {t * 1e3:.2f} ms at batch {pb.n:.1f}, "
                      f"{speedup:.2f}x plain")
            match = float(options[u].d[j]) / k if k else 1.0
            if match < 0.995:
                reason += f"; {method} drafts on {match:.0%} of steps (match rate)"
            if u in exploring:
                source = "default"
                reason = (f"measuring {engine} (< {cfg.min_evidence:g} drafts of this category), priced with the "
                          f"pooled profile; " + reason)
            if u in notes:
                reason += f"; {notes[u]}"
            reason += floor_note
            table = tables[u]
            lo, hi = bands[u]
        else:
            source = "default"
            reason = f"insufficient evidence (< {cfg.min_evidence:g} drafts): {default_reason}"
            table, lo, hi = (), k, k
        rate, pk, pm = probes.get(u, (0.0, 0, METHOD_OFF))
        if rate > 0:
            source = "probe" if source == "policy" else source
            reason += f"; probing {rate:.2%} of requests at k={pk} ({pm})"
        out.append(CategoryDecision(
            name=c.name, k=k, method=method if k else METHOD_OFF, source=source, reason=reason[:512],
            expected_committed=round(e, 4), speedup=round(speedup, 4), adapt_k_min=lo, adapt_k_max=hi,
            probe_rate=rate, probe_k=pk, probe_method=pm, best_method=standalone[u][0],
            best_method_speedup=round(standalone[u][1], 4), table=table))
    dflt = _default_decision(pb, cfg_best, default, default_reason, snap, cfg, t, t_plain)
    return Decision(categories=tuple(out), default=dflt, batch_size=pb.n, goodput=g, plain_goodput=g_plain,
                    step_ms=t * 1e3, plain_step_ms=t_plain * 1e3)


def _tables(pb: BatchModel, g: np.ndarray, t: np.ndarray, k_max: int, g_plain: float) -> list[tuple[KRow, ...]]:
    """Per category and k: the best usable drafter at that k, the rest of the batch as decided."""
    levels = np.arange(k_max + 1)
    match = pb.valid[:, :, None] & (pb.k[:, :, None] == levels[None, None, :])
    best = np.argmax(np.where(match, g[:, :, None], -np.inf), axis=1)  # (U, K+1)
    present = match.any(axis=1)
    out = []
    for u in pb.rows:
        opts = pb.options[u]
        rows = []
        for k in levels[present[u]]:
            j = int(best[u, k])
            rows.append(KRow(k=int(k), method=opts.methods[j], expected_committed=round(float(opts.e[j]), 4),
                             step_ms=round(float(t[u, j]) * 1e3, 4), goodput=round(float(g[u, j]), 3),
                             speedup=round(float(g[u, j]) / g_plain, 4)))
        out.append(tuple(rows))
    return out


def _default_decision(pb: BatchModel, cfg_best: np.ndarray, choice: Choice, reason: str, snap: PolicySnapshot,
                      cfg: PolicySettings, t: float, t_plain: float) -> CategoryDecision:
    op = cand.fixed_option(choice, cand.profile_for(snap.pooled, choice.method))
    e0 = float(op.e[0])
    rate, pk, pm = 0.0, 0, METHOD_OFF
    m = guardrails.probe_method(snap.pooled, snap, cfg) if choice.k == 0 and cfg.probe_rate > 0 and snap.k_max > 0 else None
    if m is not None:
        # a category the policy does not know yet, with a marginal share of the batch
        pk = min(cfg.probe_k, snap.k_max)
        prof = cand.profile_for(snap.pooled, m)
        e = expected_committed((prof.betas if prof else (0.5,) * pk)[:pk])[-1]
        tmp = BatchModel(pb.names + ["_default"], list(pb.share) + [MIN_SHARE], pb.options + [op],
                         list(pb.movable) + [False], pb.prefill, snap.cost, snap.k_max, list(pb.w) + [MIN_SHARE],
                         snap.depth_factor, snap.mixed_penalty)
        r = guardrails.probe_rates(tmp, np.append(cfg_best, 0), np.array([len(pb.names)]), np.array([e]),
                                   np.array([not is_model_free(m)]), pk, cfg)
        if r[0] > 0:
            rate, pm = float(r[0]), m
        else:
            pk = 0
    return CategoryDecision(name="_default", k=choice.k, method=choice.method, source="default", reason=reason,
                            expected_committed=round(e0, 4), speedup=round(e0 * t_plain / t, 4),
                            adapt_k_min=choice.k, adapt_k_max=choice.k, probe_rate=rate, probe_k=pk, probe_method=pm)
