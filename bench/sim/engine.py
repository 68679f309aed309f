"""A simulated engine: closed-loop batch of ``batch`` request slots, one verify step at a time.

Per step every slot either prefills (a new request: ``prompt_tokens`` scheduled, first token committed, no
drafting) or decodes with its (k, drafter): the number of accepted drafts is the run of leading successes
of Bernoulli(beta_r,i) draws, beta_r,i = sigmoid(logit(beta_c,i) + shift_r) with a per-request shift drawn
from N(0, heterogeneity_c). Committed tokens = 1 + accepted (capped by what the request has left). Model-free
drafters are also scored counterfactually at depth k_max on every decoding request, as the engine patch
does. Step time = the *truth* cost model x lognormal noise; a model-based drafter runs at the batch's
deepest k (vLLM drafts one depth for the whole batch). A finished request is replaced at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bench.sim.profiles import Trace
from specctl_vllm.kernel.cost import CostCoefficients


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


@dataclass
class StepResult:
    wall_s: float
    batch_size: int
    scheduled_tokens: int
    draft_tokens: int
    prefill_tokens: int
    depth: int
    cat: np.ndarray  # per slot category index
    method: np.ndarray  # per slot drafter index (0 = engine's own)
    k: np.ndarray  # per slot drafts scheduled (0 for prefill or off)
    accepted: np.ndarray  # per slot accepted drafts
    committed: np.ndarray  # per slot committed tokens
    decoding: np.ndarray  # per slot: True if it decoded (False: prefill)
    cf_accepted: np.ndarray  # (slots, free methods) accepted at depth k_max, -1 where not scored
    finished: np.ndarray  # slots whose request finished this step (replaced before the next)
    width: int | None = None  # graph-shaped engines: the width every decoding slot verified (decode steps only)


class SimEngine:
    def __init__(self, trace: Trace, truth: CostCoefficients, batch: int, seed: int, noise: float = 0.03) -> None:
        self.trace = trace
        self.truth = truth
        self.batch = batch
        self.noise = noise
        # two streams: requests (category, length, shift) come in the same order for every strategy run with
        # the same seed (common random numbers), acceptance draws and timing noise come from the other
        self.req_rng = np.random.default_rng([seed, 0])
        self.rng = np.random.default_rng([seed, 1])
        self.k_max = trace.k_max
        self.n_methods = len(trace.methods)
        cats = trace.categories
        self.shares = np.array([c.share for c in cats])
        self.lengths = np.array([c.output_tokens for c in cats])
        self.hetero = np.array([c.heterogeneity for c in cats])
        # logit of the category profile: (categories, methods, k_max)
        self.base_logit = np.stack([np.stack([_logit(c.betas[m]) for m in trace.methods]) for c in cats])
        self.cat = np.zeros(batch, dtype=int)
        self.remaining = np.zeros(batch, dtype=int)
        self.betas = np.zeros((batch, self.n_methods, self.k_max))
        self.prefill = np.zeros(batch, dtype=bool)
        self.admitted = np.zeros(batch, dtype=np.int64)  # request id per slot
        self.next_id = 0
        for s in range(batch):
            self._admit(s, steady=True)

    def _admit(self, slot: int, steady: bool = False) -> None:
        rng = self.req_rng
        c = int(rng.choice(len(self.shares), p=self.shares))
        mean = self.lengths[c]
        length = max(8, int(rng.gamma(4.0, mean / 4.0)))
        self.cat[slot] = c
        # start in steady state: initial requests are part-way through (no synchronised prefill burst)
        self.remaining[slot] = int(rng.integers(1, length + 1)) if steady else length
        self.prefill[slot] = not steady
        shift = rng.normal(0.0, self.hetero[c])
        self.betas[slot] = 1.0 / (1.0 + np.exp(-(self.base_logit[c] + shift)))
        self.admitted[slot] = self.next_id
        self.next_id += 1

    def step_seconds(self, batch: int, tokens: int, depth: int, free_tokens: float, prefill_tokens: int) -> float:
        """Noise-free seconds of one step: the truth cost model (graph-shaped engines: the cell table)."""
        return self.truth.step_time(batch, tokens, depth, free_tokens)

    def step(self, k: np.ndarray, method: np.ndarray) -> StepResult:
        b, kmax = self.batch, self.k_max
        decoding = ~self.prefill
        k = np.where(decoding, np.clip(k, 0, kmax), 0).astype(int)
        method = np.where(k > 0, method, 0).astype(int)
        u = self.rng.random((b, kmax))
        beta = self.betas[np.arange(b), method]
        lead = np.cumprod(u < beta, axis=1)
        positions = np.arange(kmax)[None, :] < k[:, None]
        accepted = (lead * positions).sum(axis=1)
        committed = np.minimum(1 + accepted, self.remaining)
        # counterfactual scoring of model-free drafters at depth k_max (not for the drafter actually run)
        n_free = self.n_methods - 1
        cf = np.full((b, n_free), -1, dtype=int)
        if n_free:
            u2 = self.rng.random((b, n_free, kmax))
            lead2 = np.cumprod(u2 < self.betas[:, 1:, :], axis=2).sum(axis=2)
            cf = np.where(decoding[:, None], lead2, -1)
            ran = (method[:, None] == np.arange(1, self.n_methods)[None, :]) & (k[:, None] > 0)
            cf = np.where(ran, -1, cf)
        n_pref = int((~decoding).sum())
        prefill_tokens = n_pref * self.trace.prompt_tokens
        drafts = int(k.sum())
        engine_k = np.where(method == 0, k, 0)
        depth = int(engine_k.max()) if b else 0
        free_tokens = float(np.where(method > 0, k, 0).sum())
        tokens = int(decoding.sum()) + drafts + prefill_tokens
        t = self.step_seconds(b, tokens, depth, free_tokens, prefill_tokens)
        wall = t * float(np.exp(self.rng.normal(0.0, self.noise))) if self.noise > 0 else t
        self.remaining -= committed
        finished = self.remaining <= 0
        res = StepResult(wall, b, tokens, drafts, prefill_tokens, depth, self.cat.copy(), method, k, accepted,
                         committed, decoding, cf, finished)
        self.prefill[:] = False
        for s in np.flatnonzero(finished):
            self._admit(int(s))
        return res
