"""vLLM 0.34's acceptance mask on the device layout (bench/gpu/accept_device.py), on CPU tensors: each draft row
is masked by its request's slot and local position, also when adaptive verification trimmed the batch."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from bench.gpu import accept_device
from bench.gpu.accept_plugin import AcceptanceMask, keep_table

ENGINE_RATES = [0.9] * 4
BETAS = {"high": 0.9, "low": 0.45}


def layout(drafts_per_req: list[int], slots: list[int]):
    """expanded_idx_mapping / expanded_local_pos of a batch whose row b holds drafts_per_req[b] drafts (after any
    trimming): one row for the committed token (local 0), then one per draft (local 1..d)."""
    idx, local = [], []
    for d, s in zip(drafts_per_req, slots, strict=True):
        idx += [s] * (d + 1)
        local += list(range(d + 1))
    return torch.tensor(idx, dtype=torch.int32), torch.tensor(local, dtype=torch.int32)


def accepted_lengths(masked: torch.Tensor, drafts_per_req: list[int], u: np.ndarray, rates: list[float]) -> list[int]:
    """vLLM 0.34's greedy synthetic branch: the draft judged at logit start+i is row start+i+1; accepted while
    u < rate_i and the draft id >= 0; stop at the first rejection."""
    out, start = [], 0
    for d in drafts_per_req:
        n, ok = 0, True
        for i in range(d):
            if ok:
                ok = bool(u[start + i] < rates[i]) and int(masked[start + i + 1]) >= 0
                n += ok
        out.append(n)
        start += d + 1
    return out


@pytest.mark.parametrize(("row_tables", "slots", "width", "expect_none"), [
    ([None, None], [0, 3], 4, True),
    ([[1.0, 1.0], None], [2, 0], 2, True),
    ([[0.5, 0.25], None], [2, 0], 3, False),
    ([], [], 4, True),
])
def test_slot_table_places_each_row_at_its_slot(row_tables, slots, width, expect_none):
    table = accept_device.slot_keep_table(row_tables, slots, width)
    assert (table is None) == expect_none
    if table is not None:
        assert table.shape == (max(slots) + 1, width)
        assert table[2].tolist() == [0.5, 0.25, 0.25]  # the last rate repeats past the table's end
        assert table[0].tolist() == [1.0, 1.0, 1.0] and table[1].tolist() == [1.0, 1.0, 1.0]


def test_committed_rows_and_unmasked_slots_are_never_changed():
    drafts = [3, 2, 0]
    idx, local = layout(drafts, [5, 1, 2])
    ids = torch.arange(100, 100 + len(idx), dtype=torch.int32)
    table = torch.ones((6, 4))
    table[5] = 0.0  # slot 5 keeps no draft
    out = accept_device.mask_drafts(ids, idx, local, table, torch.Generator().manual_seed(0))
    assert out[:4].tolist() == [100, -1, -1, -1]  # committed row kept, every draft of slot 5 dropped
    assert out[4:].tolist() == ids[4:].tolist()  # slot 1 and 2 untouched


def test_slots_beyond_the_table_are_left_alone():
    idx, local = layout([2], [9])
    ids = torch.tensor([7, 8, 9], dtype=torch.int32)
    out = accept_device.mask_drafts(ids, idx, local, torch.zeros((3, 2)), torch.Generator().manual_seed(0))
    assert out.tolist() == [7, 8, 9]


@pytest.mark.parametrize("trimmed", [False, True])
def test_mean_accepted_length_matches_each_category_beta_also_when_trimmed(trimmed):
    """Rows keep the mask of their own request when adaptive verification gives them fewer drafts (trimmed:
    the host's cu_num_logits_np still says 4 drafts a request; the device layout has 1-4)."""
    rng = np.random.default_rng(3)
    cats = ["high", "low"] * 64
    req_ids = [f"{c}-{i}" for i, c in enumerate(cats)]
    slots = list(rng.permutation(200)[: len(cats)])
    drafts = [int(d) for d in rng.integers(1, 5, len(cats))] if trimmed else [4] * len(cats)
    mask = AcceptanceMask(BETAS, seed=1)
    sampler = SimpleNamespace(synthetic_conditional_rates=torch.tensor(ENGINE_RATES))
    host_cu = np.arange(0, 5 * len(cats) + 1, 5, dtype=np.int32)  # pre-trim: 4 drafts + 1 a request
    batch = SimpleNamespace(req_ids=req_ids, idx_mapping_np=np.asarray(slots), cu_num_logits_np=host_cu,
                            logits_indices=torch.zeros(1))
    table = accept_device.step_table(mask, sampler, batch)
    idx, local = layout(drafts, slots)
    sums = {"high": [0.0, 0], "low": [0.0, 0]}
    gen = torch.Generator().manual_seed(2)
    for trial in range(60):
        ids = torch.randint(10, 1000, (len(idx),), dtype=torch.int32)
        out = accept_device.mask_drafts(ids, idx, local, table, gen)
        u = np.random.default_rng(100 + trial).random(len(idx))
        for c, d, n in zip(cats, drafts, accepted_lengths(out, drafts, u, ENGINE_RATES), strict=True):
            expected = sum(BETAS[c] ** j for j in range(1, d + 1))
            sums[c][0] += n - expected
            sums[c][1] += 1
    for c, (diff, count) in sums.items():
        assert abs(diff / count) < 0.12, (c, diff / count)


def test_a_step_without_drafts_builds_no_table():
    mask = AcceptanceMask(BETAS)
    batch = SimpleNamespace(req_ids=["low-1", "low-2"], idx_mapping_np=np.asarray([0, 1]),
                            cu_num_logits_np=np.asarray([0, 1, 2]), logits_indices=torch.zeros(1))
    sampler = SimpleNamespace(synthetic_conditional_rates=torch.tensor(ENGINE_RATES))
    assert accept_device.step_table(mask, sampler, batch) is None


def test_keep_table_the_device_mask_reads_is_the_plugins():
    assert keep_table(ENGINE_RATES, {"low": 0.45})["low"].tolist() == pytest.approx([0.5] * 4)


def test_install_wraps_gather_and_sampler_once_and_masks_only_during_the_call(monkeypatch):
    seen = {}

    def gather(input_ids, positions, logits_indices, idx, local, prefill_len):
        return input_ids[logits_indices].clone(), positions[logits_indices]

    class RejectionSampler:
        synthetic_conditional_rates = torch.tensor(ENGINE_RATES)

        def __call__(self, logits, input_batch):
            idx, local = layout([4, 4], [0, 1])
            ids, _ = module.gather_draft_sampled(input_batch.input_ids, input_batch.positions,
                                                 input_batch.logits_indices, idx, local, None)
            seen.setdefault("calls", []).append(ids.clone())
            return ids

    module = types.ModuleType(accept_device.GATHER[0])
    module.gather_draft_sampled = gather
    module.RejectionSampler = RejectionSampler
    monkeypatch.setitem(sys.modules, accept_device.GATHER[0], module)

    from bench.gpu import accept_plugin

    for _ in range(2):  # idempotent
        assert accept_device.install({"low": 0.0}, AcceptanceMask, accept_plugin._wrap)
    batch = SimpleNamespace(req_ids=["low-1", "high-2"], idx_mapping_np=np.asarray([0, 1]),
                            cu_num_logits_np=np.asarray([0, 5, 10]), logits_indices=torch.arange(10),
                            input_ids=torch.arange(100, 110, dtype=torch.int32), positions=torch.arange(10))
    out = RejectionSampler()(None, batch)
    assert out[1:5].tolist() == [-1] * 4  # low at 0: every draft dropped
    assert out[0].item() == 100 and out[5:].tolist() == list(range(105, 110))  # high (no table) untouched
    plain, _ = module.gather_draft_sampled(batch.input_ids, batch.positions, batch.logits_indices,
                                           *layout([4, 4], [0, 1]), None)
    assert plain.tolist() == list(range(100, 110))  # outside the sampler's call nothing is masked
    assert len(seen["calls"]) == 1


def test_install_reports_false_where_vllm_has_no_device_gather(monkeypatch):
    monkeypatch.setitem(sys.modules, accept_device.GATHER[0], types.ModuleType(accept_device.GATHER[0]))
    assert accept_device.install({"low": 0.5}, AcceptanceMask, lambda *a: True) is False
