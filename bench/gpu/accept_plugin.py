"""Benchmark-only vLLM general plugin: per-category synthetic acceptance and CUDA-graph dispatch counts.

Entry point ``specctl_bench = bench.gpu.accept_plugin:register`` (group ``vllm.general_plugins``; the steady-load
sweep writes a dist-info folder that declares it, ``plugin_dist.py``). vLLM calls :func:`register` in every
process it starts, possibly more than once: it is idempotent, never raises, and does nothing unless
``SPECCTL_BENCH_ACCEPT`` is set. It then wraps two functions of model runner V2 (vLLM 0.26; on 0.34 the
acceptance mask reads the device layout instead, ``accept_device.py``), where they exist:

**Acceptance per category.** vLLM's synthetic rejection sampler accepts draft position i (0-based) with one
engine-wide conditional rate ``r_i`` (the engine is started with the high profile's unconditional rates
``beta_high**(i+1)``, so ``r_i = beta_high``). ``SPECCTL_BENCH_ACCEPT`` (JSON, e.g. ``{"high": 0.85, "low":
0.45}``) gives each category's per-position conditional acceptance ``beta_cat``; a request belongs to the
category its id starts with (``"low-17"``: ``low``). Before the sampler runs, each draft token of such a request
is kept with probability ``q_i = beta_cat / r_i`` and otherwise replaced by -1, which the synthetic kernel always
rejects (``rejection_sampler_utils.py``, ``_rejection_kernel``: ``accepted &= (u < rate) & (draft_sampled >=
0)``); the ids are restored after the call. The kernel stops at the first rejection, so with ``K`` = the
request's draft count::

    P(position i accepted | positions < i accepted) = P(u_i < r_i) * P(kept_i) = r_i * q_i = beta_cat
    P(accepted length >= j) = beta_cat**j,   E[accepted drafts] = sum_{j=1..K} beta_cat**j

(``u_i`` and the keep draw are independent: the kernel's ``u`` comes from the request's seed and position, the
keep draw from this plugin's own generator). A ``beta_cat`` above ``r_i`` cannot be reached (``q_i`` is capped at
1). Layout read from vLLM 0.26 (``model_runner.py`` ``prepare_inputs``, ``input_batch.py``): batch row ``b`` is
request ``input_batch.req_ids[b]``; its logits are ``cu_num_logits[b] .. cu_num_logits[b+1]-1`` and the kernel
reads the draft judged at logit ``start + i`` from ``input_ids[logits_indices[start + i + 1]]`` for ``i <
end - start - 1``: so the first logit of each row carries the last committed token and every later one a draft
(draft index = position in the row - 1).

**CUDA-graph dispatch counts.** Every ``CudaGraphManager.dispatch`` result is counted by ``(manager class,
decode_query_len, graph mode, uniform token count)`` and the counts are written atomically (tmp + rename) as
JSON to ``SPECCTL_BENCH_DISPATCH_FILE`` at most every 0.5 s (the clock is read every 64 dispatches): one entry
per key ``"ModelCudaGraphManager|5|FULL|5"`` (class|decode_query_len|mode|uniform tokens), plus ``"_snapshot"``
(seq, monotonic and wall clock of the write, captured graphs per manager). The ``ModelCudaGraphManager`` total
is the number of target forward steps: the driver reads the file around each timed round for the mean step time.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.gpu import accept_device

# Under "vllm.": in a vLLM process the lines use vLLM's handler and format.
logger = logging.getLogger("vllm.specctl.bench")

ACCEPT_ENV = "SPECCTL_BENCH_ACCEPT"
DISPATCH_FILE_ENV = "SPECCTL_BENCH_DISPATCH_FILE"
DISPATCH_INTERVAL_ENV = "SPECCTL_BENCH_DISPATCH_INTERVAL_S"
SEED_ENV = "SPECCTL_BENCH_SEED"
DEFAULT_DISPATCH_INTERVAL_S = 0.5
#: Dispatches between two reads of the clock (a dispatch is on the engine's hot path).
CLOCK_EVERY = 64
MODEL_MANAGER = "ModelCudaGraphManager"
_SAMPLER = ("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler", "__call__")
_DISPATCH = ("vllm.v1.worker.gpu.cudagraph_utils", "CudaGraphManager", "dispatch")
_MARK = "_specctl_bench_wrapped"


def register() -> None:
    """Idempotent, never raises; a no-op unless ``SPECCTL_BENCH_ACCEPT`` is set."""
    try:
        _install_once()
    except Exception:  # a plugin must never break the process that loads it
        logger.debug("specctl-bench: install failed", exc_info=True)


@functools.cache
def _install_once() -> tuple[str, ...]:
    raw = os.environ.get(ACCEPT_ENV)
    if raw is None:
        return ()
    installed = []
    betas = parse_betas(raw)
    if betas and accept_device.install(betas, AcceptanceMask, _wrap):  # vLLM >= 0.34: the device layout
        installed.append("acceptance (device layout)")
    elif betas and _wrap(_SAMPLER, lambda original: wrap_rejection_sampler(original, AcceptanceMask(betas))):
        installed.append("acceptance")
    path = os.environ.get(DISPATCH_FILE_ENV)
    if path:
        interval = float(os.environ.get(DISPATCH_INTERVAL_ENV, DEFAULT_DISPATCH_INTERVAL_S))
        if _wrap(_DISPATCH, lambda original: wrap_dispatch(original, DispatchCounter(path, interval))):
            installed.append("dispatch")
    if installed:
        logger.info("specctl-bench: wrapped %s (pid %d)", ", ".join(installed), os.getpid())
    return tuple(installed)


def parse_betas(raw: str) -> dict[str, float | tuple[float, ...]]:
    """``{"high": 0.85, "json": [0.9, 0.8, ...]}`` -> category -> conditional acceptance in [0, 1], one rate for
    every position or one per position (a shorter list repeats its last rate); anything malformed is left out."""
    try:
        data = json.loads(raw) if raw.strip() else {}
    except ValueError:
        logger.warning("specctl-bench: %s is not JSON: %r", ACCEPT_ENV, raw)
        return {}
    if not isinstance(data, Mapping):
        return {}
    out: dict[str, float | tuple[float, ...]] = {}
    for name, beta in data.items():
        if not isinstance(name, str):
            continue
        if _rate(beta):
            out[name] = float(beta)
        elif isinstance(beta, list) and beta and all(_rate(b) for b in beta):
            out[name] = tuple(float(b) for b in beta)
    return out


def _rate(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= float(value) <= 1.0


def _wrap(target: tuple[str, str, str], make: Callable[[Callable], Callable]) -> bool:
    """Replace ``module.cls.attr`` by ``make(original)``, once; False when the target does not exist here."""
    import importlib

    module_name, cls_name, attr = target
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
        original = getattr(cls, attr)
    except Exception:  # another vLLM (CPU build, other release): nothing to wrap
        logger.debug("specctl-bench: %s.%s.%s not available", module_name, cls_name, attr, exc_info=True)
        return False
    if getattr(original, _MARK, False):
        return True
    wrapped = make(original)
    setattr(wrapped, _MARK, True)
    setattr(cls, attr, wrapped)
    return True


# -- acceptance ---------------------------------------------------------------------------------------------------
def request_category(request_id: str, known: Mapping[str, Any]) -> str | None:
    """The category a request id starts with (``"low-17"`` or vLLM's internal ``"low-17-1a2b3c4d"``)."""
    head = request_id.split("-", 1)[0]
    return head if head in known else None


def keep_table(engine_rates: Sequence[float], betas: Mapping[str, float | Sequence[float]]):
    """Per category, per draft position i: the probability ``min(1, beta_cat_i / r_i)`` of keeping the draft
    (``beta_cat`` one rate for all positions, or per position with the last repeated)."""
    import numpy as np

    rates = np.asarray(engine_rates, dtype=np.float64)
    safe = np.where(rates > 0, rates, 1.0)

    def per_position(beta: float | Sequence[float]):
        if isinstance(beta, int | float):
            return np.full(len(rates), float(beta))
        values = list(beta)[: len(rates)]
        values += [values[-1]] * (len(rates) - len(values))
        return np.asarray(values, dtype=np.float64)

    return {name: np.where(rates > 0, np.minimum(1.0, per_position(beta) / safe), 1.0)
            for name, beta in betas.items()}


def logit_keep_probs(row_tables: Sequence[Any], cu_num_logits):
    """Per logit of the batch, the probability that its draft token is kept (1 for each row's first logit, which
    holds no draft, and for rows without a table); None when every entry is 1 (nothing to mask).

    ``row_tables[b]`` is row b's per-position keep table (or None), ``cu_num_logits`` the batch's
    ``cu_num_logits_np``.
    """
    import numpy as np

    if all(t is None for t in row_tables):
        return None
    cu = np.asarray(cu_num_logits, dtype=np.int64)
    counts = np.diff(cu)
    total = int(cu[-1])
    width = max(len(t) for t in row_tables if t is not None)
    table = np.ones((len(row_tables), max(width, 1)), dtype=np.float64)
    for b, t in enumerate(row_tables):
        if t is not None:
            table[b, : len(t)] = t
    row_of = np.repeat(np.arange(len(row_tables)), counts)
    local = np.arange(total) - np.repeat(cu[:-1], counts)
    draft_index = np.minimum(local - 1, table.shape[1] - 1)
    keep = np.where(local >= 1, table[row_of, np.maximum(draft_index, 0)], 1.0)
    return None if bool(np.all(keep >= 1.0)) else keep


def drop_drafts(input_ids, logits_indices, keep_probs, generator=None):
    """Set each draft at ``input_ids[logits_indices]`` to -1 with probability ``1 - keep_probs`` (in place, on the
    tensors' device, no host sync); returns the ids to put back with :func:`restore_drafts`."""
    import torch

    saved = input_ids[logits_indices]
    draw = torch.rand(saved.shape[0], device=saved.device, generator=generator)
    input_ids[logits_indices] = torch.where(draw < keep_probs, saved, torch.full_like(saved, -1))
    return saved


def restore_drafts(input_ids, logits_indices, saved) -> None:
    input_ids[logits_indices] = saved


class AcceptanceMask:
    """What the wrapped sampler needs per step: the batch's per-logit keep probabilities on the device."""

    def __init__(self, betas: Mapping[str, float], seed: int | None = None) -> None:
        self.betas = dict(betas)
        self.seed = int(os.environ.get(SEED_ENV, "0")) if seed is None else seed
        self.tables: dict[int, dict[str, Any]] = {}  # per sampler instance (its engine-wide rates)
        self.categories: dict[str, str | None] = {}
        self.generators: dict[Any, Any] = {}
        self.warned = False

    def tables_for(self, sampler: Any) -> dict[str, Any] | None:
        """Keep tables against the sampler's synthetic conditional rates (read once: one host sync)."""
        key = id(sampler)
        if key not in self.tables:
            rates = getattr(sampler, "synthetic_conditional_rates", None)
            if rates is None:
                if not self.warned:
                    logger.warning("specctl-bench: the rejection sampler is not synthetic; acceptance left as is")
                    self.warned = True
                self.tables[key] = {}
            else:
                self.tables[key] = keep_table(rates.detach().cpu().tolist(), self.betas)
        return self.tables[key] or None

    def category(self, request_id: str) -> str | None:
        if request_id not in self.categories:
            if len(self.categories) > 65536:  # finished requests never come back
                self.categories.clear()
            self.categories[request_id] = request_category(request_id, self.betas)
        return self.categories[request_id]

    def generator(self, device: Any):
        import torch

        if device not in self.generators:
            gen = torch.Generator(device=device)
            gen.manual_seed(self.seed)
            self.generators[device] = gen
        return self.generators[device]

    def keep_probs(self, sampler: Any, input_batch: Any):
        """Device tensor of per-logit keep probabilities, or None when this batch needs no masking."""
        import torch

        if int(input_batch.cu_num_logits_np[-1]) <= len(input_batch.req_ids):
            # one logit a request: nothing drafted (a K = 0 step). Answered in O(1), so the mask's per-request
            # work is not charged to a speculative engine's K = 0 steps, which a plain engine never pays
            return None
        tables = self.tables_for(sampler)
        if not tables:
            return None
        rows = [tables.get(self.category(r)) if self.category(r) else None for r in input_batch.req_ids]
        keep = logit_keep_probs(rows, input_batch.cu_num_logits_np)
        if keep is None:
            return None
        device = input_batch.logits_indices.device
        return torch.from_numpy(keep.astype("float32")).to(device, non_blocking=True)


def _capturing(device: Any) -> bool:
    import torch

    return getattr(device, "type", "") == "cuda" and torch.cuda.is_current_stream_capturing()


def wrap_rejection_sampler(original: Callable, mask: AcceptanceMask) -> Callable:
    @functools.wraps(original)
    def __call__(self: Any, logits: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            # never during CUDA-graph capture (no host copies there; vLLM only captures dummy batches anyway)
            keep = None if _capturing(input_batch.logits_indices.device) else mask.keep_probs(self, input_batch)
        except Exception:  # a broken mask must not break the engine: run the stock sampler
            logger.warning("specctl-bench: acceptance mask failed; step left unmasked", exc_info=True)
            keep = None
        if keep is None:
            return original(self, logits, input_batch, *args, **kwargs)
        ids, where = input_batch.input_ids, input_batch.logits_indices
        saved = drop_drafts(ids, where, keep, mask.generator(keep.device))
        try:
            return original(self, logits, input_batch, *args, **kwargs)
        finally:
            # the drafter reads the step's input ids after sampling
            restore_drafts(ids, where, saved)

    return __call__


# -- dispatch counts ----------------------------------------------------------------------------------------------
def dispatch_key(manager_cls: str, decode_query_len: int, mode: str, uniform_token_count: int | None) -> str:
    return f"{manager_cls}|{decode_query_len}|{mode}|{uniform_token_count}"


def parse_dispatch_key(key: str) -> tuple[str, int, str, int | None]:
    cls, dql, mode, uniform = key.split("|")
    return cls, int(dql), mode, (None if uniform == "None" else int(uniform))


#: The dispatch file is flat, ``{dispatch_key: count, ..., META_KEY: {...}}``: a reader that diffs its numeric
#: entries gets the counts; the snapshot's seq, clocks and captured graphs sit under this one key.
META_KEY = "_snapshot"


def snapshot_counts(data: Mapping[str, Any]) -> dict[str, int]:
    return {k: v for k, v in data.items() if k != META_KEY and isinstance(v, int)}


def snapshot_meta(data: Mapping[str, Any]) -> dict:
    meta = data.get(META_KEY)
    return meta if isinstance(meta, dict) else {}


def capture_summary(manager: Any) -> dict:
    """What a manager captured: graphs per (mode, uniform token count), for the record."""
    out: dict[str, int] = {}
    for mode, descs in getattr(manager, "_capture_descs", {}).items():
        for desc in descs:
            name = f"{getattr(mode, 'name', mode)}|u={desc.uniform_token_count}"
            out[name] = out.get(name, 0) + 1
    return {"cls": type(manager).__name__, "decode_query_len": manager.decode_query_len, "captured": out}


class DispatchCounter:
    """Counts dispatches in the worker and publishes them to a file the driver polls (tmp + rename)."""

    def __init__(self, path: str, interval_s: float = DEFAULT_DISPATCH_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, every: int = CLOCK_EVERY) -> None:
        self.path = path
        self.interval_s = interval_s
        self.clock = clock
        self.every = every
        self.counts: dict[str, int] = {}
        self.managers: dict[int, dict] = {}
        self.calls = 0
        self.seq = 0
        self.last_write = float("-inf")

    def count(self, manager: Any, desc: Any) -> None:
        key = dispatch_key(type(manager).__name__, manager.decode_query_len, desc.cg_mode.name,
                           desc.uniform_token_count)
        self.counts[key] = self.counts.get(key, 0) + 1
        if id(manager) not in self.managers and getattr(manager, "_graphs_captured", False):
            self.managers[id(manager)] = capture_summary(manager)
        self.calls += 1
        if self.calls % self.every == 0:
            self.maybe_write()

    def maybe_write(self) -> bool:
        now = self.clock()
        if now - self.last_write < self.interval_s:
            return False
        self.write(now)
        return True

    def write(self, now: float) -> None:
        self.seq += 1
        self.last_write = now
        meta = {"pid": os.getpid(), "seq": self.seq, "t_mono": now, "t_wall": time.time(), "calls": self.calls,
                "managers": list(self.managers.values())}
        data = {**self.counts, META_KEY: meta}
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, self.path)


def wrap_dispatch(original: Callable, counter: DispatchCounter) -> Callable:
    @functools.wraps(original)
    def dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        desc = original(self, *args, **kwargs)
        try:
            counter.count(self, desc)
        except Exception:  # counting is for the record only
            logger.debug("specctl-bench: dispatch count failed", exc_info=True)
        return desc

    return dispatch
