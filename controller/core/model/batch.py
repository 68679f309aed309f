"""Closed-loop batch goodput: committed tokens per second of one engine batch under a configuration.

A configuration gives every category one option (a proposal length k with a drafter, or off). An option fixes
what a request step of the category does: it commits ``e`` tokens, verifies ``d`` draft tokens (k times the
drafter's match rate), ``d`` of them drafted model-free or at model depth ``k``. Then

    G = sum_c n_c e_c / E[T(n, N, d, D_free)]
    n_c = n * (w_c / e_c) / sum_c' (w_c' / e_c')        a finished request is replaced by one of the same mix,
                                                      so a category that commits more per step holds fewer slots
    N = prefill + sum_c n_c (1 + d_c),   D_free = sum_{c model-free} n_c d_c,   prefill = fixed + rate * sum n_c e_c
    P(depth <= x) = (sum_{c: k_c <= x or not model-drafted} n_c / n) ** n

with ``w_c`` the category's committed tokens per step (the workload's demand, which the configuration does not
change) and ``T`` the step-cost model of :mod:`specctl_vllm.kernel.cost`, taken in expectation over the step's
model-drafting depth (times a per-depth factor where the engine measured one), over the observed spread of
prefill (the cost bends at the knee), and times ``P_uni + (1 - P_uni) * p`` with ``p`` the measured mixed-k
penalty and ``P_uni`` the chance that all n requests draft the same k.

An optional floor protects categories: a configuration that leaves a protected category below ``floor`` times
its plain-decoding goodput per request counts ``(r / floor) ** 40`` of its goodput.

This one model is what the goodput policy maximises, what ``specctl replay`` prices its rows with and what the
simulator's hindsight oracle ranks candidates by. Pure numpy on plain data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specctl_vllm.kernel.cost import CostCoefficients

#: Exponent of the floor penalty: a configuration that leaves a category at r < floor of its plain-decoding
#: goodput counts (r / floor) ** this of its batch goodput (1 % short costs a third: the search moves off it).
FLOOR_PENALTY = 40.0
#: Configurations scored per vectorised chunk by :meth:`BatchModel.goodput_many` (bounds its memory).
_CHUNK = 32_768


@dataclass(frozen=True)
class Options:
    """One category's options as arrays: proposal length, committed tokens per request step, model-drafted,
    model-free, drafter name; ``drafted`` the draft tokens per request step (None: k, every step drafts)."""

    k: np.ndarray
    e: np.ndarray
    model: np.ndarray
    free: np.ndarray
    methods: tuple[str, ...]
    drafted: np.ndarray | None = None

    @property
    def d(self) -> np.ndarray:
        return self.k if self.drafted is None else self.drafted

    def tail(self) -> Options:
        """Every option but the first ('off')."""
        return Options(self.k[1:], self.e[1:], self.model[1:], self.free[1:], self.methods[1:], self.d[1:])

    def __len__(self) -> int:
        return len(self.k)

    @classmethod
    def of(cls, rows: Sequence[tuple[int, float, float, bool, str]]) -> Options:
        """From ``(k, e, d, model_free, method)`` rows. A row may verify drafts without a k (a recorded mix of
        k, priced by its draft tokens alone): it adds no model-drafting depth."""
        k = np.array([float(r[0]) for r in rows])
        free = np.array([bool(r[3]) for r in rows])
        return cls(k, np.array([float(r[1]) for r in rows]), (k > 0) & ~free, free,
                   tuple(r[4] for r in rows), np.array([float(r[2]) for r in rows]))


@dataclass(frozen=True)
class Prefill:
    """Prefill tokens per step = fixed + rate * committed tokens per step, spread by ``rel`` (mean 1, weights w)."""

    fixed: float
    rate: float
    rel: np.ndarray
    w: np.ndarray

    @classmethod
    def steady(cls, fixed: float = 0.0, rate: float = 0.0) -> Prefill:
        """No step-to-step spread."""
        return cls(float(fixed), float(rate), np.ones(1), np.ones(1))


def depth_factor(factors: Sequence[float] | None, levels: int) -> np.ndarray | None:
    """Per-depth factors padded to ``levels`` (None when they are all 1: the cheaper path)."""
    if factors is None or len(factors) == 0:
        return None
    f = np.ones(levels)
    f[: min(levels, len(factors))] = np.asarray(factors, dtype=float)[:levels]
    return None if np.allclose(f, 1.0) else f


class BatchModel:
    """Padded option arrays for U categories x O options; a configuration is one option index per category.

    ``shares``: requests per step per category (their sum is the batch n); ``demand``: committed tokens per
    step per category (None: the shares); ``movable``: which categories a search may change.
    """

    def __init__(self, names: list[str], shares: Sequence[float], options: list[Options], movable: Sequence[bool],
                 prefill: Prefill, cost: CostCoefficients, k_max: int, demand: Sequence[float] | None = None,
                 depth_factors: Sequence[float] | None = None, mixed_penalty: float = 1.0, floor: float = 0.0,
                 protected: Sequence[bool] | None = None) -> None:
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
        w = np.array(demand if demand is not None else shares, dtype=float)
        self.w = np.where(w > 0, w, self.share)
        self.prefill = prefill
        c, n = cost, self.n
        self.cost = cost
        self.consts = (c.base + c.per_request * n, c.per_token, c.per_token_above_knee, c.knee,
                       c.draft_fixed + c.draft_fixed_per_request * n, c.draft_pass + c.draft_pass_per_request * n,
                       c.free_draft_token)
        self.depth_factor = depth_factor(depth_factors, len(self.levels))
        self.mixed_penalty = max(1.0, float(mixed_penalty))
        self.rows = np.arange(u)
        # per option, the terms each category adds to the sums of :meth:`totals` (w / e weighs by slots held)
        self.slot = np.where(self.valid, self.w[:, None] / self.e, 0.0)
        self.slot_tok = self.slot * (1.0 + self.d)
        self.slot_free = self.slot * self.free_k
        self.slot_aob = self.slot[:, :, None] * self.at_or_below
        self.protected = np.array(protected if protected is not None else [False] * u, dtype=bool)
        self.floor = float(floor) if self.protected.any() else 0.0
        self.t_plain = float(self.time(self.n, self.n, 0.0, np.ones(len(self.levels))))

    # -- the step ---------------------------------------------------------------------------------------------
    def time(self, tok, num, free, le):
        """Expected step time for ``tok`` decode + draft tokens committing ``num`` tokens per step with ``free``
        model-free draft tokens; ``le`` (..., K+1) = share of requests at model depth <= d. Leading axes
        broadcast (many configurations at once)."""
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
        """(committed tokens, decode + draft tokens, model-free draft tokens, share at depth <= d) per step."""
        d, st, sf, sv = self._sums(cfg)
        return self.n * float(self.w.sum()) / d, self.n * st / d, self.n * sf / d, sv / d

    # -- the category floor -----------------------------------------------------------------------------------
    def own_ratios(self, e, d, free, t, tok, free_tot):
        """Each category's goodput per request over plain decoding's, E_c * T_plain / T_c, where T_c is the
        step time a request of c sees: the mean step ``t`` (with ``tok`` verified and ``free_tot`` model-free
        draft tokens) with one average request swapped for c's own (``d`` drafts, ``free`` of them model-free).
        At batch 1 that is c's own step, at large batches the mix's. Trailing axis: categories."""
        per_token, free_cost = self.consts[1], self.consts[6]
        n = max(self.n, 1.0)
        t = np.asarray(t)[..., None]
        t_c = (t + per_token * ((1.0 + d) - np.asarray(tok)[..., None] / n)
               + free_cost * (free - np.asarray(free_tot)[..., None] / n))
        return e * self.t_plain / np.maximum(t_c, 1e-12)

    def floor_factor(self, r):
        """Penalty on goodput for the worst protected category's ratio ``r`` to plain decoding (1 when it holds)."""
        r_min = np.where(self.protected, r, np.inf).min(axis=-1)
        return np.where(r_min >= self.floor, 1.0, np.clip(r_min / self.floor, 0.0, 1.0) ** FLOOR_PENALTY)

    def ratios_at(self, cfg: np.ndarray) -> np.ndarray:
        """Every category's modelled goodput per request over plain decoding's at ``cfg``."""
        num, tok, free, le = self.totals(cfg)
        t = float(self.time(tok, num, free, le))
        r = self.rows
        return self.own_ratios(self.e[r, cfg], self.d[r, cfg], self.free_k[r, cfg], t, tok, free)

    # -- goodput ----------------------------------------------------------------------------------------------
    def goodput(self, cfg: np.ndarray) -> tuple[float, float]:
        """Batch goodput of ``cfg`` (discounted where it breaks the category floor) and its step time."""
        num, tok, free, le = self.totals(cfg)
        t = float(self.time(tok, num, free, le))
        g = num / t
        if self.floor > 0:
            r = self.rows
            g *= float(self.floor_factor(self.own_ratios(self.e[r, cfg], self.d[r, cfg], self.free_k[r, cfg], t, tok,
                                                         free)))
        return g, t

    def goodput_many(self, cfgs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`goodput` of every row of ``cfgs`` (M, U) at once: (goodput, step time), each (M,)."""
        cfgs = np.asarray(cfgs, dtype=int).reshape(-1, len(self.rows))
        gs, ts = [], []
        for lo in range(0, len(cfgs), _CHUNK):
            c = cfgs[lo: lo + _CHUNK]
            r = self.rows[None, :]
            d = self.slot[r, c].sum(-1)
            num = self.n * float(self.w.sum()) / d
            tok = self.n * self.slot_tok[r, c].sum(-1) / d
            free = self.n * self.slot_free[r, c].sum(-1) / d
            le = self.slot_aob[r, c].sum(-2) / d[:, None]
            t = self.time(tok, num, free, le)
            g = num / t
            if self.floor > 0:
                g = g * self.floor_factor(self.own_ratios(self.e[r, c], self.d[r, c], self.free_k[r, c], t, tok, free))
            gs.append(g)
            ts.append(t)
        return np.concatenate(gs), np.concatenate(ts)

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
        with np.errstate(divide="ignore", invalid="ignore"):  # an option of zero time is no option: inf/nan
            g = num_o / t
        if self.floor > 0:
            # (U, O, U): every category's (E, drafts, free drafts) when row u takes option o, the rest at cfg
            swap = (r[:, None, None] == r[None, None, :])
            e3 = np.where(swap, self.e[:, :, None], self.e[r, cfg][None, None, :])
            d3 = np.where(swap, self.d[:, :, None], self.d[r, cfg][None, None, :])
            f3 = np.where(swap, self.free_k[:, :, None], self.free_k[r, cfg][None, None, :])
            g = g * self.floor_factor(self.own_ratios(e3, d3, f3, t, tok_o, free_o))
        g = np.where(self.valid, g, -np.inf)
        return g, t

    def plain(self) -> tuple[float, float]:
        """Goodput and step time with speculation off everywhere."""
        t = float(self.time(self.n, self.n, 0.0, np.ones(len(self.levels))))
        return self.n / t, t
