"""Per-category acceptance on vLLM >= 0.34: the mask applied to the drafts vLLM gathers on the device.

vLLM 0.34's rejection sampler reads every logit row's token through ``gather_draft_sampled`` (module
``vllm.v1.worker.gpu.spec_decode.rejection_sampler``): row j gets ``input_ids[logits_indices[j]]``, with
``expanded_idx_mapping[j]`` (the request's state slot) and ``expanded_local_pos[j]`` (its position in the
request's rows; 0 holds the last committed token, l >= 1 the draft of index l - 1). The synthetic kernel judges
the draft of row ``start + i + 1`` and rejects any draft id below 0 (``rejection_sampler_utils.py``:
``accepted &= is_valid_draft``). Under adaptive verification the batch is trimmed on the device
(``AdaptiveVerificationManager.compact_batch``): the host's ``cu_num_logits_np`` is then an upper bound, not the
layout, so 0.26's host-side mask (``accept_plugin.logit_keep_probs``) would mark the wrong rows. These two
device tensors are the layout after trimming, so the mask is read from them:

    keep_j = table[category of slot expanded_idx_mapping[j]][expanded_local_pos[j] - 1]   (1 for local_pos 0)

with ``table`` the per-category keep probabilities of ``accept_plugin.keep_table``; a draft is replaced by -1
with probability ``1 - keep_j``. The per-slot table is built on the host from the batch's ``req_ids`` and
``idx_mapping_np`` (one small upload a step, no host sync).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

logger = logging.getLogger("vllm.specctl.bench")

GATHER = ("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "gather_draft_sampled")


def slot_keep_table(row_tables: Sequence[Any], slots: Sequence[int], width: int):
    """Host array [max slot + 1, width] of keep probabilities: row ``slots[b]`` holds batch row b's table (the
    last rate repeated past its end), every other slot keeps every draft; None when nothing is masked."""
    import numpy as np

    if not len(slots) or all(t is None for t in row_tables):
        return None
    table = np.ones((int(max(slots)) + 1, max(width, 1)), dtype=np.float32)
    for slot, t in zip(slots, row_tables, strict=True):
        if t is not None:
            values = np.asarray(t, dtype=np.float32)[:width]
            table[int(slot), : len(values)] = values
            if len(values) < width:
                table[int(slot), len(values):] = values[-1]
    return None if bool(np.all(table >= 1.0)) else table


def mask_drafts(draft_sampled, idx_mapping, local_pos, slot_table, generator=None):
    """``draft_sampled`` with each draft row (local position >= 1) set to -1 with probability 1 - keep; rows of
    slots past the table and placeholders (already -1) are left as they are. Device ops only."""
    import torch

    slots = idx_mapping.long()
    pos = local_pos.long()
    inside = slots < slot_table.shape[0]
    col = torch.clamp(pos - 1, min=0, max=slot_table.shape[1] - 1)
    keep = slot_table[torch.where(inside, slots, torch.zeros_like(slots)), col]
    keep = torch.where(inside & (pos >= 1), keep, torch.ones_like(keep))
    draw = torch.rand(draft_sampled.shape[0], device=draft_sampled.device, generator=generator)
    return torch.where(draw < keep, draft_sampled, torch.full_like(draft_sampled, -1))


class DeviceMask:
    """The step's per-slot keep table, set by the sampler's wrapper and read by the gather's wrapper."""

    def __init__(self) -> None:
        self.table = None
        self.generator = None


def wrap_sampler_v034(original: Callable, mask: Any, device_mask: DeviceMask) -> Callable:
    """``RejectionSampler.__call__``: the step's per-slot keep table on the device while the original runs."""
    from bench.gpu.accept_plugin import _capturing

    @functools.wraps(original)
    def __call__(self: Any, logits: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        table = None
        try:
            if not _capturing(input_batch.logits_indices.device):
                table = step_table(mask, self, input_batch)
        except Exception:  # a broken mask must not break the engine: run the stock sampler
            logger.warning("specctl-bench: acceptance mask failed; step left unmasked", exc_info=True)
        if table is not None:
            device = input_batch.logits_indices.device
            device_mask.table = table
            device_mask.generator = mask.generator(device)
        try:
            return original(self, logits, input_batch, *args, **kwargs)
        finally:
            device_mask.table = None

    return __call__


def step_table(mask: Any, sampler: Any, input_batch: Any):
    """Device tensor [slots, width] of keep probabilities for this step, or None (nothing drafted or masked)."""
    import torch

    if int(input_batch.cu_num_logits_np[-1]) <= len(input_batch.req_ids):
        return None  # one logit a request: a K = 0 step, answered in O(1)
    tables = mask.tables_for(sampler)
    if not tables:
        return None
    rows = [tables.get(mask.category(r)) if mask.category(r) else None for r in input_batch.req_ids]
    width = max(len(t) for t in tables.values())
    host = slot_keep_table(rows, [int(s) for s in input_batch.idx_mapping_np[: len(rows)]], width)
    if host is None:
        return None
    return torch.from_numpy(host).to(input_batch.logits_indices.device, non_blocking=True)


def wrap_gather(original: Callable, device_mask: DeviceMask) -> Callable:
    """``gather_draft_sampled``: the gathered drafts masked with the step's table (when one is set)."""

    @functools.wraps(original)
    def gather_draft_sampled(input_ids: Any, positions: Any, logits_indices: Any, expanded_idx_mapping: Any,
                             expanded_local_pos: Any, *args: Any, **kwargs: Any) -> Any:
        draft_sampled, pos = original(input_ids, positions, logits_indices, expanded_idx_mapping,
                                      expanded_local_pos, *args, **kwargs)
        table = device_mask.table
        if table is None:
            return draft_sampled, pos
        try:
            draft_sampled = mask_drafts(draft_sampled, expanded_idx_mapping, expanded_local_pos, table,
                                        device_mask.generator)
        except Exception:  # the mask is for the benchmark only: never break the step
            logger.warning("specctl-bench: device mask failed; step left unmasked", exc_info=True)
        return draft_sampled, pos

    return gather_draft_sampled


def install(betas: Mapping[str, Any], make_mask: Callable[[Mapping[str, Any]], Any],
            wrap_method: Callable[[tuple[str, str, str], Callable[[Callable], Callable]], bool]) -> bool:
    """Wrap 0.34's sampler and gather; False where this vLLM has no ``gather_draft_sampled`` (0.26: the host
    mask applies)."""
    import importlib

    module_name, name = GATHER
    try:
        module = importlib.import_module(module_name)
        original = getattr(module, name)
    except (ImportError, AttributeError):  # another vLLM: the host-side mask applies
        return False
    device_mask = getattr(original, "_specctl_device_mask", None)
    if device_mask is None:  # not wrapped yet (a second install reuses the first one's table holder)
        device_mask = DeviceMask()
        wrapped = wrap_gather(original, device_mask)
        wrapped._specctl_device_mask = device_mask  # type: ignore[attr-defined]
        setattr(module, name, wrapped)
    mask = make_mask(betas)
    return wrap_method((module_name, "RejectionSampler", "__call__"),
                       lambda orig: wrap_sampler_v034(orig, mask, device_mask))
