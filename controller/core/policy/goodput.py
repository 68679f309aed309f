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
and T the learned step-cost model (controller/core/cost.py), at each depth d times its measured depth-cell
factor f(d) at batch n (E[T] = sum_d P(d) f(d) T(d); f = 1 where the engine never ran that cell), and
times P_uni + (1 - P_uni) * p where p is the measured mixed-k penalty and P_uni = sum_x q_x ** n the chance
that all n requests draft the same k (q_x: share at model depth x; model-free drafts count as depth 0). Finished requests are replaced, so prefill
grows with goodput: extra = rho * sum_c n_c E_c(k_c) with rho the observed prefill tokens per committed
token, and the expectation runs over the observed step-to-step spread of prefill (the cost bends at the
knee). Plain decoding is every k_c = 0.

Search. Each category's options are off and every k in 1..k_max for every drafter the engine can run
with enough evidence. Batched coordinate ascent: every category's best option given the others is found
in one vectorised evaluation; all improving moves are tried together and kept if that beats the best
single move, else the best single move is made (so goodput rises at every iteration). Restarts: every
category at its deepest option under a model-drafter depth cap x for x in {k_max, k_max/2, 2, 1, 0} (one
category alone may not pay for a drafting pass that several together would), all off, and the previous
decision; the best end point wins. "All off" is a start, so the result is never below plain decoding
under the model (except for a category being measured on the engine's drafter, see min evidence).

Guardrails, applied on top:
  * min evidence: a drafter is an option for a category only after ``min_evidence`` drafts seen. A
    category not yet measured on the engine's own drafter runs it (k >= 1, priced with the pooled profile
    of all categories) when that takes at most ``explore_window_s``; a category with no eligible drafter
    keeps the default (the pooled choice, or the engine's static config while the pool lacks evidence);
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

Inputs: :class:`PolicySnapshot`; config: :class:`controller.core.config.PolicySettings`.
Defaults: min_evidence 50 drafts, hysteresis 3 %, probe 5 % at k=1 within 1 % cost, band 3 %.
Trade-offs: the mean mix (not its step-to-step spread) is optimised; a category's requests share one
starting k and drafter (the engine's fast loop covers per-request spread); the knee is a preset constant.
Cost: O(restarts x iterations x categories x options x k_max) in numpy, about 0.1 ms per category.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controller.core.config import PolicySettings
from controller.core.cost import CostCoefficients, is_model_free
from controller.core.estimator import expected_committed
from controller.core.policy.types import (
    CategoryDecision,
    CategoryInput,
    Choice,
    Decision,
    KRow,
    MethodProfile,
    PolicySnapshot,
)
from controller.protocol import METHOD_OFF

#: Requests per step assumed for a category absent from the current mix: its decision is then the
#: marginal one (what one such request would gain in this batch).
MIN_SHARE = 1e-3
_MAX_ITERS = 200
#: Exponent of the floor penalty: a configuration that leaves a category at r < floor of its plain-decoding
#: goodput counts (r / floor) ** this of its batch goodput (1 % short costs a third: the search moves off it).
_FLOOR_PENALTY = 40.0


@dataclass(frozen=True)
class _Options:
    """One category's options as arrays (index 0 is 'off', except while measuring the engine's drafter)."""

    k: np.ndarray
    e: np.ndarray
    model: np.ndarray
    free: np.ndarray
    methods: tuple[str, ...]
    drafted: np.ndarray | None = None  # draft tokens per request step (k times the match rate; None: k)

    @property
    def d(self) -> np.ndarray:
        return self.k if self.drafted is None else self.drafted

    def tail(self) -> _Options:
        """Every option but the first ('off')."""
        return _Options(self.k[1:], self.e[1:], self.model[1:], self.free[1:], self.methods[1:], self.d[1:])

    def __len__(self) -> int:
        return len(self.k)


def _options(profiles: list[MethodProfile], k_max: int) -> _Options:
    ks, es, model, free, methods = [np.zeros(1)], [np.ones(1)], [np.zeros(1, bool)], [np.zeros(1, bool)], [METHOD_OFF]
    drafted = [np.zeros(1)]
    for p in profiles:
        kk = min(k_max, len(p.betas))
        if kk <= 0:
            continue
        k = np.arange(1, kk + 1, dtype=float)
        m = _match(p)
        ks.append(k)
        es.append(1.0 + m * np.cumsum(np.cumprod(np.asarray(p.betas[:kk], dtype=float))))
        drafted.append(m * k)
        model.append(np.full(kk, not p.model_free))
        free.append(np.full(kk, p.model_free))
        methods.extend([p.method] * kk)
    return _Options(np.concatenate(ks), np.concatenate(es), np.concatenate(model), np.concatenate(free),
                    tuple(methods), np.concatenate(drafted))


def _match(p: MethodProfile | None) -> float:
    """Share of a model-free drafter's request steps that draft (it proposes only on a match); 1 otherwise."""
    if p is None or not p.model_free:
        return 1.0
    return min(max(p.match_rate, 0.0), 1.0)


def _fixed_option(choice: Choice, profile: MethodProfile | None) -> _Options:
    """A category pinned at ``choice``: E from its own posterior, else the pool's, else 0.5 per position."""
    k = choice.k
    if k == 0:
        return _Options(np.zeros(1), np.ones(1), np.zeros(1, bool), np.zeros(1, bool), (METHOD_OFF,))
    betas = tuple(profile.betas) if profile is not None else ()
    betas = (betas + (betas[-1] if betas else 0.5,) * k)[:k]
    free = profile.model_free if profile is not None else is_model_free(choice.method)
    m = _match(profile)
    return _Options(np.array([float(k)]), np.array([1.0 + m * (expected_committed(betas)[-1] - 1.0)]),
                    np.array([not free]), np.array([free]), (choice.method,), np.array([m * k]))


class _Problem:
    """Padded option arrays for U categories x O options; a configuration is one option index per row."""

    def __init__(self, names: list[str], shares: list[float], options: list[_Options], movable: list[bool],
                 extra: _Prefill, cost: CostCoefficients, k_max: int, demand: list[float] | None = None,
                 depth_factor: np.ndarray | None = None, mixed_penalty: float = 1.0, floor: float = 0.0,
                 protected: list[bool] | None = None) -> None:
        self.names = names
        self.options = options
        u, o = len(options), max(len(x) for x in options)
        self.levels = np.arange(max(k_max, 1) + 1, dtype=float)
        self.valid = np.zeros((u, o), dtype=bool)
        self.e = np.ones((u, o))
        self.k = np.zeros((u, o))
        self.d = np.zeros((u, o))  # draft tokens per request step (k times the drafter's match rate)
        self.free_k = np.zeros((u, o))
        self.model_k = np.zeros((u, o))
        for i, op in enumerate(options):
            n = len(op)
            self.valid[i, :n] = True
            self.e[i, :n], self.k[i, :n], self.d[i, :n] = op.e, op.k, op.d
            self.free_k[i, :n] = np.where(op.free, op.d, 0.0)
            self.model_k[i, :n] = np.where(op.model, op.k, 0.0)
        self.at_or_below = (self.levels[None, None, :] >= self.model_k[:, :, None]).astype(float)
        self.share = np.array(shares, dtype=float)
        self.n = float(self.share.sum())
        self.movable = np.array(movable, dtype=bool)
        # committed tokens per step each category asks for; a finished request is replaced by one of the
        # same mix, so a category that decodes faster holds fewer slots: n_c = n * (w_c / E_c) / sum(w / E)
        w = np.array(demand if demand is not None else shares, dtype=float)
        self.w = np.where(w > 0, w, self.share)
        self.prefill = extra
        c, n = cost, self.n
        self.cost = cost
        self.consts = (c.base + c.per_request * n, c.per_token, c.per_token_above_knee, c.knee,
                       c.draft_fixed + c.draft_fixed_per_request * n, c.draft_pass + c.draft_pass_per_request * n,
                       c.free_draft_token)
        self.depth_factor = _depth_factor(depth_factor, len(self.levels))
        self.mixed_penalty = max(1.0, float(mixed_penalty))
        self.rows = np.arange(u)
        # per option, the terms each category adds to the sums below (w / E weighs by slots held)
        self.slot = np.where(self.valid, self.w[:, None] / self.e, 0.0)
        self.slot_tok = self.slot * (1.0 + self.d)
        self.slot_free = self.slot * self.free_k
        self.slot_aob = self.slot[:, :, None] * self.at_or_below
        # per-category floor: each protected category's goodput per request, E_c / T, at least ``floor`` times
        # plain decoding's 1 / T_plain
        self.protected = np.array(protected if protected is not None else [False] * u, dtype=bool)
        self.floor = float(floor) if self.protected.any() else 0.0
        self.t_plain = float(self.time(self.n, self.n, 0.0, np.ones(len(self.levels))))

    def own_ratios(self, e, d, free, t, tok, free_tot):
        """Each category's goodput per request over plain decoding's, E_c * T_plain / T_c, where T_c is the
        step time a request of c sees: the mean step ``t`` (with ``tok`` verified and ``free_tot`` model-free
        draft tokens) with one average request swapped for c's own (``d`` drafts, ``free`` of them model-free).
        At batch 1 that is c's own step, at large batches the mix's. Trailing axis: categories."""
        per_token, free_cost = self.consts[1], self.consts[6]
        n = max(self.n, 1.0)
        t = np.asarray(t)[..., None]
        t_c = t + per_token * ((1.0 + d) - np.asarray(tok)[..., None] / n) + free_cost * (free - np.asarray(free_tot)[..., None] / n)
        return e * self.t_plain / np.maximum(t_c, 1e-12)

    def _floor_factor(self, r):
        """Penalty on goodput for the worst protected category's ratio ``r`` to plain decoding (1 when it holds)."""
        r_min = np.where(self.protected, r, np.inf).min(axis=-1)
        return np.where(r_min >= self.floor, 1.0, np.clip(r_min / self.floor, 0.0, 1.0) ** _FLOOR_PENALTY)

    def ratios_at(self, cfg: np.ndarray) -> np.ndarray:
        """Every category's modelled goodput per request over plain decoding's at ``cfg``."""
        num, tok, free, le = self.totals(cfg)
        t = float(self.time(tok, num, free, le))
        r = self.rows
        return self.own_ratios(self.e[r, cfg], self.d[r, cfg], self.free_k[r, cfg], t, tok, free)

    # -- evaluation -------------------------------------------------------------------------------------------
    def time(self, tok, num, free, le):
        """Expected step time for ``tok`` decode + draft tokens committing ``num`` tokens per step.

        Prefill rides along: fixed + rate * num tokens per step (finished requests are replaced, so prefill
        grows with goodput), spread over steps as observed; ``le`` (..., K+1) = share of requests at model
        depth <= d.
        """
        fixed, per_token, above_rate, knee, on_cost, pass_cost, free_cost = self.consts
        pre = self.prefill.fixed + self.prefill.rate * np.asarray(num)
        t = fixed + per_token * (tok + pre) + free_cost * free
        if above_rate:
            over = np.maximum(np.asarray(tok)[..., None] + pre[..., None] * self.prefill.rel - knee, 0.0)
            t = t + above_rate * (over @ self.prefill.w)
        below = np.clip(le, 0.0, 1.0) ** self.n
        if self.depth_factor is None:
            t = t + on_cost * (1.0 - below[..., 0]) + pass_cost * ((below.shape[-1] - 1) - below[..., :-1].sum(-1))
        else:  # E over the step's depth d of factor(d) * (t + drafting cost at d)
            p_depth = np.diff(below, axis=-1, prepend=0.0)
            at_depth = np.asarray(t)[..., None] + on_cost * (self.levels > 0) + pass_cost * self.levels
            t = (p_depth * self.depth_factor * at_depth).sum(-1)
        if self.mixed_penalty > 1.0:  # a step is uniform when all its n requests draft the same k
            at_k = np.clip(np.diff(np.clip(le, 0.0, 1.0), axis=-1, prepend=0.0), 0.0, 1.0)
            uniform = np.clip((at_k ** self.n).sum(-1), 0.0, 1.0)
            t = t * (uniform + (1.0 - uniform) * self.mixed_penalty)
        return t

    def _sums(self, cfg: np.ndarray):
        r = self.rows
        return (float(self.slot[r, cfg].sum()), float(self.slot_tok[r, cfg].sum()),
                float(self.slot_free[r, cfg].sum()), self.slot_aob[r, cfg].sum(axis=0))

    def shares_at(self, cfg: np.ndarray) -> np.ndarray:
        """Requests per step of each category when every category runs its option in ``cfg``."""
        slots = self.slot[self.rows, cfg]
        return self.n * slots / slots.sum()

    def totals(self, cfg: np.ndarray):
        d, st, sf, sv = self._sums(cfg)
        return self.n * float(self.w.sum()) / d, self.n * st / d, self.n * sf / d, sv / d

    def goodput(self, cfg: np.ndarray) -> tuple[float, float]:
        """Batch goodput of ``cfg`` (discounted where it breaks the category floor) and its step time."""
        num, tok, free, le = self.totals(cfg)
        t = float(self.time(tok, num, free, le))
        g = num / t
        if self.floor > 0:
            r = self.rows
            g *= float(self._floor_factor(self.own_ratios(self.e[r, cfg], self.d[r, cfg], self.free_k[r, cfg], t, tok,
                                                          free)))
        return g, t

    def all_options(self, cfg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Goodput and step time for every (category, option), the other categories at ``cfg``."""
        r = self.rows
        d, st, sf, sv = self._sums(cfg)
        d_o = d + (self.slot - self.slot[r, cfg][:, None])
        d_o = np.where(self.valid, d_o, 1.0)
        st_o = st + (self.slot_tok - self.slot_tok[r, cfg][:, None])
        sf_o = sf + (self.slot_free - self.slot_free[r, cfg][:, None])
        sv_o = sv[None, None, :] + (self.slot_aob - self.slot_aob[r, cfg][:, None, :])
        num_o = self.n * float(self.w.sum()) / d_o
        tok_o, free_o = self.n * st_o / d_o, self.n * sf_o / d_o
        t = self.time(tok_o, num_o, free_o, sv_o / d_o[:, :, None])
        g = num_o / t
        if self.floor > 0:
            # (U, O, U): every category's (E, drafts, free drafts) when row u takes option o, the rest at cfg
            u, o = self.e.shape
            swap = (r[:, None, None] == r[None, None, :])
            e3 = np.where(swap, self.e[:, :, None], self.e[r, cfg][None, None, :])
            d3 = np.where(swap, self.d[:, :, None], self.d[r, cfg][None, None, :])
            f3 = np.where(swap, self.free_k[:, :, None], self.free_k[r, cfg][None, None, :])
            g = g * self._floor_factor(self.own_ratios(e3, d3, f3, t, tok_o, free_o))
        g = np.where(self.valid, g, -np.inf)
        return g, t

    # -- search -----------------------------------------------------------------------------------------------
    def ascend(self, cfg: np.ndarray) -> tuple[np.ndarray, float]:
        cfg = cfg.copy()
        g_cur, _ = self.goodput(cfg)
        for _ in range(_MAX_ITERS):
            g, _t = self.all_options(cfg)
            g = np.where(self.movable[:, None], g, -np.inf)
            best = np.argmax(g, axis=1)
            best_g = g[self.rows, best]
            improving = self.movable & (best_g > g_cur * (1 + 1e-9))
            if not improving.any():
                break
            joint = np.where(improving, best, cfg)
            g_joint, _ = self.goodput(joint)
            u = int(np.argmax(np.where(improving, best_g, -np.inf)))
            if g_joint >= best_g[u]:
                cfg, g_cur = joint, g_joint
            else:
                cfg[u] = best[u]
                g_cur = float(best_g[u])
        return cfg, g_cur

    def search(self, k_max: int, previous: np.ndarray | None) -> np.ndarray:
        if len(self.rows) == 1:  # one category: every option scored at once is the whole search
            g, _ = self.all_options(np.zeros(1, dtype=int))
            return np.array([int(np.argmax(g[0]))])
        caps = sorted({k_max, (k_max + 1) // 2, min(2, k_max), min(1, k_max), 0}, reverse=True)
        if not (self.model_k[self.movable] > 0).any():
            caps = [k_max]
        starts = []
        for cap in caps:
            e = np.where(self.valid & (self.model_k <= cap), self.e, -np.inf)
            starts.append(np.where(self.movable, np.argmax(e, axis=1), 0))
        starts.append(np.zeros(len(self.rows), dtype=int))
        if previous is not None:
            starts.append(previous)
        best_cfg, best_g, seen = starts[-1], -1.0, set()
        for s in starts:
            key = s.tobytes()
            if key in seen:
                continue
            seen.add(key)
            cfg, g = self.ascend(s)
            if g > best_g * (1 + 1e-12):
                best_cfg, best_g = cfg, g
        return best_cfg


# --- guardrails on a found configuration ------------------------------------------------------------------------
def _hysteresis(pb: _Problem, cfg: np.ndarray, previous: np.ndarray | None, h: float) -> tuple[np.ndarray, dict]:
    """Keep the previous decision unless moving gains more than ``h`` of the movers' own goodput.

    First per category (the others at the new decision), then for the movers together: categories share
    the drafting pass, so several can each look worth moving while the batch as a whole gains next to
    nothing, and two such configurations would alternate.
    """
    notes: dict[int, str] = {}
    if previous is None:
        return cfg, notes
    cfg = cfg.copy()
    known = pb.movable & (previous >= 0)
    for u in np.flatnonzero(known & (previous != cfg)):
        g_new, _ = pb.goodput(cfg)
        old = cfg.copy()
        old[u] = previous[u]
        g_old, t_old = pb.goodput(old)
        own = pb.shares_at(old)[u] * pb.e[u, previous[u]] / t_old
        gain = (g_new - g_old) / own if own > 0 else 0.0
        if gain < h:
            cfg = old
            notes[int(u)] = f"kept previous (gain {gain:.1%} of own goodput < hysteresis {h:.0%})"
    movers = np.flatnonzero(known & (previous != cfg))
    if len(movers) > 1:
        old = cfg.copy()
        old[movers] = previous[movers]
        g_new, _ = pb.goodput(cfg)
        g_old, t_old = pb.goodput(old)
        own = float(np.sum(pb.shares_at(old)[movers] * pb.e[movers, previous[movers]])) / t_old
        gain = (g_new - g_old) / own if own > 0 else 0.0
        if gain < h:
            cfg = old
            for u in movers:
                notes[int(u)] = (f"kept previous ({len(movers)} categories would move together for "
                                 f"{gain:.1%} of their goodput < hysteresis {h:.0%})")
    return cfg, notes


def _bands(pb: _Problem, cfg: np.ndarray, g: np.ndarray, t: np.ndarray, tol: float) -> list[tuple[int, int]]:
    out = []
    shares = pb.shares_at(cfg)
    for u in pb.rows:
        c = cfg[u]
        k0 = int(pb.k[u, c])
        if k0 == 0:
            out.append((0, 0))
            continue
        own = shares[u] * pb.e[u, c] / t[u, c]
        opts = pb.options[u]
        method = opts.methods[c]
        ok = {int(opts.k[j]) for j in range(len(opts)) if (opts.methods[j] == method or opts.k[j] == 0)
              and g[u, c] - g[u, j] <= tol * own}
        lo = hi = k0
        while lo - 1 in ok:
            lo -= 1
        while hi + 1 in ok:
            hi += 1
        out.append((lo, hi))
    return out


#: Probe rates tried (as fractions of probe_rate): 1 and 63 geometric steps down to 1e-4 of it.
_PROBE_GRID = np.concatenate([[1.0], np.geomspace(1.0, 1e-4, 64)[1:]])


def _probe_rates(pb: _Problem, cfg: np.ndarray, units: np.ndarray, e: np.ndarray, model: np.ndarray, pk: int,
                 cfg_: PolicySettings, budget: np.ndarray | float | None = None) -> np.ndarray:
    """Largest rate <= probe_rate per unit whose modelled cost stays within its budget (one evaluation)."""
    budget = cfg_.probe_budget if budget is None else budget
    num, tok, free, le = pb.totals(cfg)
    g0 = num / float(pb.time(tok, num, free, le))
    rate = cfg_.probe_rate * _PROBE_GRID[None, :]  # (1, G)
    n_p = pb.shares_at(cfg)[units][:, None] * rate  # (U, G) probing requests per step
    below_pk = (pb.levels < pk).astype(float)
    le_r = le[None, None, :] - (np.where(model[:, None], n_p / pb.n, 0.0))[:, :, None] * below_pk
    num_r = num + n_p * (e[:, None] - 1.0)
    t = pb.time(tok + n_p * pk, num_r, free + np.where(model[:, None], 0.0, n_p * pk), le_r)
    loss = 1.0 - (num_r / t) / g0
    ok = loss <= np.reshape(budget, (-1, 1))
    first = np.argmax(ok, axis=1)  # the grid falls, so the first acceptable rate is the largest
    return np.where(ok.any(axis=1), np.round(rate[0, first], 6), 0.0)


# --- building ------------------------------------------------------------------------------------------------------
def _usable(p: MethodProfile, snap: PolicySnapshot, cfg: PolicySettings) -> bool:
    """Evidence ever seen counts: a drafter not run keeps its (decayed, prior-shrunk) estimate usable."""
    return p.method in snap.methods and p.eligible_evidence >= cfg.min_evidence


def _profile_for(profiles: tuple[MethodProfile, ...], method: str) -> MethodProfile | None:
    return next((p for p in profiles if p.method == method), None)


def _static_choice(snap: PolicySnapshot) -> Choice:
    if snap.k_max <= 0 or snap.engine_method == METHOD_OFF:
        return Choice.off()
    return Choice(snap.k_max, snap.engine_method)


@dataclass(frozen=True)
class _Prefill:
    """Prefill tokens per step = fixed + rate * committed tokens per step, spread by ``rel`` (mean 1)."""

    fixed: float
    rate: float
    rel: np.ndarray
    w: np.ndarray


def _extra(snap: PolicySnapshot) -> _Prefill:
    dist = [(float(v), float(w)) for v, w in snap.extra_tokens_dist if w > 0]
    vals = np.array([v for v, _ in dist] or [1.0])
    w = np.array([w for _, w in dist] or [1.0])
    w = w / w.sum()
    mean = float(vals @ w)
    rel = vals / mean if mean > 0 else np.ones_like(vals)
    if snap.extra_per_committed > 0:
        return _Prefill(0.0, float(snap.extra_per_committed), rel, w)
    return _Prefill(float(snap.extra_tokens), 0.0, rel, w)


def _index(options: _Options, choice: Choice | None) -> int:
    if choice is None:
        return -1
    for j in range(len(options)):
        if int(options.k[j]) == choice.k and (options.methods[j] == choice.method or choice.k == 0):
            return j
    return -1


def _engine_drafter(snap: PolicySnapshot) -> str | None:
    """The engine's own drafter, if it has one it can run."""
    return snap.engine_method if snap.engine_method in snap.methods and snap.k_max > 0 else None


def _default_choice(snap: PolicySnapshot, cfg: PolicySettings) -> tuple[Choice, str]:
    """What a category without evidence of its own runs (also: the policy's default entry).

    With an engine drafter: that drafter at the k the pooled profile of all categories earns in this batch
    (so new categories are measured on it, at a cost the batch can afford; k = 0 means probing). Without
    one: the pooled decision over the model-free drafters. The engine's static config while the pool
    itself lacks evidence.
    """
    pooled = [p for p in snap.pooled if _usable(p, snap, cfg)]
    engine = _engine_drafter(snap)
    if engine is not None:
        pooled = [p for p in pooled if p.method == engine]
    if not pooled or snap.k_max <= 0:
        return _static_choice(snap), f"engine static config (pooled evidence below {cfg.min_evidence:g} drafts)"
    opts = _options(pooled, snap.k_max)
    pb = _Problem(["_default"], [max(snap.batch_size, 1.0)], [opts], [True], _extra(snap), snap.cost, snap.k_max,
                  depth_factor=snap.depth_factor, mixed_penalty=snap.mixed_penalty)
    prev_i = _index(opts, snap.previous_default)
    prev = np.array([prev_i]) if prev_i >= 0 else None
    best, _ = _hysteresis(pb, pb.search(snap.k_max, prev), prev, cfg.hysteresis)
    j = int(best[0])
    k = int(opts.k[j])
    what = f"pooled profile of {engine}" if engine is not None else "pooled decision of all categories"
    return Choice(k, opts.methods[j] if k else METHOD_OFF), what


def _best_standalone(cats: list[CategoryInput], snap: PolicySnapshot, cfg: PolicySettings) -> list[tuple[str, float]]:
    """Per category: the drafter (any pool) that serves it best alone at this batch size, and its speedup."""
    known = [[p for p in c.profiles if p.eligible_evidence >= cfg.min_evidence] for c in cats]
    out: list[tuple[str, float]] = [(METHOD_OFF, 1.0)] * len(cats)
    idx = [i for i, k in enumerate(known) if k]
    if not idx:
        return out
    k = max(snap.k_max, 1)
    n = max(snap.batch_size, 1.0)
    opts = [_options(known[i], k) for i in idx]
    pb = _Problem([cats[i].name for i in idx], [n] * len(idx), opts, [True] * len(idx), _extra(snap), snap.cost, k,
                  depth_factor=snap.depth_factor, mixed_penalty=snap.mixed_penalty)
    # every row alone: a batch of n requests all of that category
    t = pb.time(n * (1.0 + pb.d), n * pb.e, n * pb.free_k, pb.at_or_below)
    g = np.where(pb.valid, n * pb.e / t, -np.inf)
    best = np.argmax(g, axis=1)
    for row, i in enumerate(idx):
        j = int(best[row])
        out[i] = (opts[row].methods[j] if opts[row].k[j] else METHOD_OFF, float(g[row, j] / g[row, 0]))
    return out


def decide(snap: PolicySnapshot, cfg: PolicySettings) -> Decision:
    default, default_reason = _default_choice(snap, cfg)
    names, shares, options, movable, inputs, demand = [], [], [], [], [], []
    engine = _engine_drafter(snap)
    pooled_engine = _profile_for(snap.pooled, engine) if engine else None
    explore_ok = pooled_engine is not None and pooled_engine.eligible_evidence >= cfg.min_evidence
    b0 = max(snap.batch_size, 1.0)
    t_plain0 = snap.cost.step_time(b0, b0 + (snap.extra_per_committed * b0 or snap.extra_tokens))
    t_plain0 *= snap.depth_factor[0] if snap.depth_factor else 1.0
    exploring: set[int] = set()
    for c in snap.categories:
        usable = [p for p in c.profiles if _usable(p, snap, cfg)] if snap.k_max > 0 else []
        names.append(c.name)
        shares.append(max(c.share, MIN_SHARE))
        demand.append(c.committed if c.share >= MIN_SHARE and c.committed > 0 else max(c.share, MIN_SHARE))
        inputs.append(c)
        own = _profile_for(c.profiles, engine) if engine else None
        missing = cfg.min_evidence - (own.eligible_evidence if own is not None else 0.0)
        if engine is not None and missing > 0 and explore_ok and \
                missing / max(c.share, MIN_SHARE) * t_plain0 <= cfg.explore_window_s:
            # the engine's drafter is unmeasured on this category and measuring it is quick: run it (k >= 1,
            # priced with the pool's profile). Otherwise a category on a model-free drafter (scored for
            # free on every request) would never be measured on the engine's own drafter.
            exploring.add(len(names) - 1)
            opts = _options([pooled_engine], snap.k_max)
            options.append(opts.tail())
            movable.append(True)
        elif usable:
            options.append(_options(usable, snap.k_max))
            movable.append(True)
        else:
            own = _profile_for(c.profiles, default.method) or _profile_for(snap.pooled, default.method)
            options.append(_fixed_option(default, own))
            movable.append(False)
    rest = snap.batch_size - sum(shares)
    if rest > 1e-9 or not names:  # requests the mix does not attribute (e.g. an engine that reports none)
        names.append("_rest")
        shares.append(max(rest, MIN_SHARE) if names[:-1] else max(snap.batch_size, 1.0))
        options.append(_fixed_option(default, _profile_for(snap.pooled, default.method)))
        demand.append(shares[-1] * float(options[-1].e[0]))
        movable.append(False)
    protected = [i < len(inputs) and inputs[i].share > MIN_SHARE for i in range(len(names))]
    pb = _Problem(names, shares, options, movable, _extra(snap), snap.cost, snap.k_max, demand, snap.depth_factor,
                  snap.mixed_penalty, cfg.category_floor, protected)
    prev = np.array([_index(options[i], inputs[i].previous) if i < len(inputs) else -1 for i in range(len(names))])
    has_prev = bool((prev >= 0).any())
    start_prev = np.where(prev >= 0, prev, 0) if has_prev else None
    cfg_best = pb.search(snap.k_max, start_prev)
    cfg_best, notes = _hysteresis(pb, cfg_best, prev if has_prev else None, cfg.hysteresis)

    g_all, t_all = pb.all_options(cfg_best)
    g, t = pb.goodput(cfg_best)
    t_plain = float(pb.time(pb.n, pb.n, 0.0, np.ones(len(pb.levels))))
    g_plain = pb.n / t_plain
    bands = _bands(pb, cfg_best, g_all, t_all, cfg.adapt_tolerance)
    if pb.mixed_penalty > 1.0 + cfg.adapt_tolerance:
        # per-request adaptation would make steps mixed-k, which this engine runs measurably slower
        bands = [(int(pb.k[u, cfg_best[u]]),) * 2 for u in pb.rows]
    probes = _probes(pb, cfg_best, inputs, snap, cfg)
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
        out.append(CategoryDecision(c.name, k, method if k else METHOD_OFF, source, reason[:512],
                                    round(e, 4), round(speedup, 4), lo, hi, rate, pk, pm, standalone[u][0],
                                    round(standalone[u][1], 4), table))
    dflt = _default_decision(pb, cfg_best, default, default_reason, snap, cfg, t, t_plain)
    return Decision(tuple(out), dflt, pb.n, g, g_plain, t * 1e3, t_plain * 1e3)


def _probe_method(profiles: tuple[MethodProfile, ...], snap: PolicySnapshot, cfg: PolicySettings) -> str | None:
    """The first drafter of this engine with no counterfactual signal (None: all are scored for free)."""
    for m in snap.methods:
        p = _profile_for(profiles, m)
        if not (p is not None and p.counterfactual and p.evidence >= cfg.min_evidence):
            return m
    return None


#: z of the optimistic bound that decides whether a probe can change anything (about 97.5 % one-sided).
_PROBE_Z = 2.0


def _optimistic_e(profile: MethodProfile | None, k_max: int) -> np.ndarray:
    """E(0..k_max) with every beta raised to an upper confidence bound (all 1 without a profile)."""
    if profile is None:
        return np.arange(k_max + 1, dtype=float) + 1.0
    b = np.asarray((tuple(profile.betas) + (profile.betas[-1],) * k_max)[:k_max], dtype=float)
    up = np.minimum(1.0, b + _PROBE_Z * np.sqrt(b * (1 - b) / (profile.evidence + 1.0)))
    return np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(up))])


def _worth_probing(pb: _Problem, cfg_best: np.ndarray, u: int, e_plus: np.ndarray, model: bool) -> bool:
    """Could the drafter pay for this category at some k even at the optimistic bound of its acceptance?
    If not, a probe cannot change the decision and costs goodput for nothing."""
    num, tok, free, le = pb.totals(cfg_best)
    g0 = num / float(pb.time(tok, num, free, le))
    ks = np.arange(1, len(e_plus), dtype=float)
    s = pb.shares_at(cfg_best)[u]
    num_k = num + s * (e_plus[1:] - 1.0)
    below = (pb.levels[None, :] < ks[:, None]).astype(float)
    le_k = le[None, :] - (s / pb.n * below if model else 0.0)
    t = pb.time(tok + s * ks, num_k, free + (0.0 if model else s * ks), le_k)
    return bool((num_k / t).max() > g0 * (1 + 1e-9))


def _probes(pb: _Problem, cfg_best: np.ndarray, inputs: list[CategoryInput], snap: PolicySnapshot,
            cfg: PolicySettings) -> dict[int, tuple[float, int, str]]:
    if cfg.probe_rate <= 0 or snap.k_max <= 0:
        return {}
    pk = min(cfg.probe_k, snap.k_max)
    units, es, models, methods, budgets = [], [], [], [], []
    for u, c in enumerate(inputs):
        if pb.k[u, cfg_best[u]] != 0:
            continue
        m = _probe_method(c.profiles, snap, cfg)
        if m is None:
            continue
        prof = _profile_for(c.profiles, m)
        model = not is_model_free(m)
        worth = _worth_probing(pb, cfg_best, u, _optimistic_e(prof, snap.k_max), model)
        budgets.append(cfg.probe_budget if worth else cfg.probe_idle_budget)
        units.append(u)
        es.append(expected_committed((prof.betas if prof else (0.5,) * pk)[:pk])[-1])
        models.append(model)
        methods.append(m)
    if not units:
        return {}
    rates = _probe_rates(pb, cfg_best, np.array(units), np.array(es), np.array(models), pk, cfg, np.array(budgets))
    return {u: (float(r), pk, m) for u, r, m in zip(units, rates, methods) if r > 0}


def _depth_factor(factors, levels: int) -> np.ndarray | None:
    """The snapshot's per-depth factors padded to ``levels`` (None when they are all 1: the cheaper path)."""
    if factors is None or len(factors) == 0:
        return None
    f = np.ones(levels)
    f[: min(levels, len(factors))] = np.asarray(factors, dtype=float)[:levels]
    return None if np.allclose(f, 1.0) else f


def _tables(pb: _Problem, g: np.ndarray, t: np.ndarray, k_max: int, g_plain: float) -> list[tuple[KRow, ...]]:
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
            rows.append(KRow(int(k), opts.methods[j], round(float(opts.e[j]), 4), round(float(t[u, j]) * 1e3, 4),
                             round(float(g[u, j]), 3), round(float(g[u, j]) / g_plain, 4)))
        out.append(tuple(rows))
    return out


def _default_decision(pb: _Problem, cfg_best: np.ndarray, choice: Choice, reason: str, snap: PolicySnapshot,
                      cfg: PolicySettings, t: float, t_plain: float) -> CategoryDecision:
    op = _fixed_option(choice, _profile_for(snap.pooled, choice.method))
    e0 = float(op.e[0])
    rate, pk, pm = 0.0, 0, METHOD_OFF
    m = _probe_method(snap.pooled, snap, cfg) if choice.k == 0 and cfg.probe_rate > 0 and snap.k_max > 0 else None
    if m is not None:
        # a category the policy does not know yet, with a marginal share of the batch
        pk = min(cfg.probe_k, snap.k_max)
        prof = _profile_for(snap.pooled, m)
        e = expected_committed((prof.betas if prof else (0.5,) * pk)[:pk])[-1]
        tmp = _Problem(pb.names + ["_default"], list(pb.share) + [MIN_SHARE], pb.options + [op],
                       list(pb.movable) + [False], pb.prefill, snap.cost, snap.k_max, list(pb.w) + [MIN_SHARE],
                       snap.depth_factor, snap.mixed_penalty)
        r = _probe_rates(tmp, np.append(cfg_best, 0), np.array([len(pb.names)]), np.array([e]),
                         np.array([not is_model_free(m)]), pk, cfg)
        if r[0] > 0:
            rate, pm = float(r[0]), m
        else:
            pk = 0
    return CategoryDecision("_default", choice.k, choice.method, "default", reason, round(e0, 4),
                            round(e0 * t_plain / t, 4), choice.k, choice.k, rate, pk, pm)
