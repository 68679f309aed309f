"""The acceptance plugin's masking math on CPU tensors, against a reference of vLLM's synthetic kernel."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from bench.gpu.accept_plugin import (
    AcceptanceMask,
    drop_drafts,
    keep_table,
    logit_keep_probs,
    parse_betas,
    request_category,
    restore_drafts,
)

BETA_HIGH = 0.85
BETA_LOW = 0.45


def fake_batch(req_ids: list[str], drafts_per_req: list[int], seed: int = 0) -> SimpleNamespace:
    """The InputBatch fields the plugin reads: per row one logit for the last committed token, then its drafts;
    logits_indices point into input_ids (here with a gap per row, as with prefill tokens before the logits)."""
    counts = np.asarray([d + 1 for d in drafts_per_req], dtype=np.int32)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    total = int(cu[-1])
    logits_indices = torch.arange(total, dtype=torch.int64) * 2 + 1
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(100, 200, (2 * total + 2,), dtype=torch.int32, generator=gen)
    return SimpleNamespace(req_ids=req_ids, cu_num_logits_np=cu, logits_indices=logits_indices, input_ids=input_ids)


def synthetic_accepted(draft_sampled: torch.Tensor, cu: np.ndarray, rates: list[float], u: np.ndarray) -> list[int]:
    """Reference of vLLM 0.26's greedy synthetic branch (_rejection_kernel): the draft judged at logit start+i is
    draft_sampled[start + i + 1]; accepted while u < rate_i and the draft is >= 0; stop at the first rejection."""
    out = []
    for b in range(len(cu) - 1):
        start, end = int(cu[b]), int(cu[b + 1])
        accepted, ok = 0, True
        for i in range(end - start - 1):
            if ok:
                ok = bool(u[start + i] < rates[i]) and int(draft_sampled[start + i + 1]) >= 0
                accepted += ok
        out.append(accepted)
    return out


def test_keep_table_is_the_ratio_to_the_engine_rate_capped_at_one():
    table = keep_table([BETA_HIGH] * 3, {"high": BETA_HIGH, "low": BETA_LOW, "top": 0.95})
    assert table["high"].tolist() == [1.0, 1.0, 1.0]
    assert table["low"] == pytest.approx([BETA_LOW / BETA_HIGH] * 3)
    assert table["top"].tolist() == [1.0, 1.0, 1.0]


def test_first_logit_of_each_row_is_never_masked_and_drafts_use_their_position():
    low = keep_table([0.8, 0.5, 0.25], {"low": 0.2})["low"]  # q = 0.25, 0.4, 0.8
    keep = logit_keep_probs([None, low, low], np.array([0, 3, 7, 8]))
    assert keep[:3].tolist() == [1.0, 1.0, 1.0]           # row 0: no table
    assert keep[3:7] == pytest.approx([1.0, 0.25, 0.4, 0.8])  # row 1: last token, then drafts 0..2
    assert keep[7] == 1.0                                   # row 2: no draft scheduled


def test_nothing_to_mask_gives_none():
    assert logit_keep_probs([None, None], np.array([0, 5, 10])) is None
    high = keep_table([BETA_HIGH] * 4, {"high": BETA_HIGH})["high"]
    assert logit_keep_probs([high, high], np.array([0, 5, 10])) is None


def test_restore_puts_every_id_back():
    batch = fake_batch(["low-1", "low-2"], [4, 4])
    before = batch.input_ids.clone()
    keep = torch.full((batch.logits_indices.shape[0],), 0.3)
    saved = drop_drafts(batch.input_ids, batch.logits_indices, keep, torch.Generator().manual_seed(1))
    assert (batch.input_ids[batch.logits_indices] == -1).any()
    restore_drafts(batch.input_ids, batch.logits_indices, saved)
    assert torch.equal(batch.input_ids, before)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_mean_accepted_length_matches_each_category_beta(k):
    """Engine rates are the high profile's; after masking, each category's accepted drafts per request-step
    average sum_{i=1..k} beta_cat**i (accepted tokens 1 + that)."""
    draws = 6000
    req_ids = [f"{'high' if b % 2 == 0 else 'low'}-{b}-abcd1234" for b in range(draws)]
    batch = fake_batch(req_ids, [k] * draws)
    engine_rates = [BETA_HIGH] * k  # conditional rates of beta_high**(i+1)
    sampler = SimpleNamespace(synthetic_conditional_rates=torch.tensor(engine_rates))
    mask = AcceptanceMask({"high": BETA_HIGH, "low": BETA_LOW}, seed=3)
    keep = mask.keep_probs(sampler, batch)
    drop_drafts(batch.input_ids, batch.logits_indices, keep, mask.generator(keep.device))
    draft_sampled = batch.input_ids[batch.logits_indices]  # what RejectionSampler.__call__ reads
    u = np.random.default_rng(11).random(int(batch.cu_num_logits_np[-1]))
    accepted = np.asarray(synthetic_accepted(draft_sampled, batch.cu_num_logits_np, engine_rates, u))
    for cat, beta, rows in (("high", BETA_HIGH, accepted[0::2]), ("low", BETA_LOW, accepted[1::2])):
        expected = sum(beta ** i for i in range(1, k + 1))
        sd = rows.std() / np.sqrt(len(rows))
        assert abs(rows.mean() - expected) < 5 * sd + 1e-9, (cat, rows.mean(), expected)
        # per position: P(accepted length >= j) = beta**j
        for j in range(1, k + 1):
            assert (rows >= j).mean() == pytest.approx(beta ** j, abs=0.03)


def test_unknown_or_uncategorised_requests_are_left_alone():
    batch = fake_batch(["plain-1", "req_0_x"], [3, 3])
    sampler = SimpleNamespace(synthetic_conditional_rates=torch.tensor([BETA_HIGH] * 3))
    assert AcceptanceMask({"low": BETA_LOW}).keep_probs(sampler, batch) is None


def test_a_step_without_drafts_is_answered_before_any_per_request_work():
    """A K = 0 step of a speculative engine: one logit a request. The mask returns at once, without reading
    a request's category or building the batch's table (the stock sampler runs, as on a plain engine)."""
    batch = fake_batch(["low-1", "high-2", "low-3"], [0, 0, 0])
    mask = AcceptanceMask({"low": BETA_LOW, "high": BETA_HIGH})
    sampler = SimpleNamespace(synthetic_conditional_rates=torch.tensor([BETA_HIGH] * 3))
    assert mask.keep_probs(sampler, batch) is None
    assert mask.categories == {} and mask.tables == {}
    drafted = fake_batch(["low-1", "high-2", "low-3"], [2, 0, 0])
    assert mask.keep_probs(sampler, drafted) is not None  # one request drafted: the table is built
    assert set(mask.categories) == {"low-1", "high-2", "low-3"}


def test_non_synthetic_sampler_is_left_alone():
    batch = fake_batch(["low-1"], [3])
    assert AcceptanceMask({"low": BETA_LOW}).keep_probs(SimpleNamespace(synthetic_conditional_rates=None), batch) \
        is None


def test_request_category_reads_the_id_prefix():
    known = {"high": 1, "low": 1}
    assert request_category("low-17", known) == "low"
    assert request_category("high-3-1a2b3c4d", known) == "high"
    assert request_category("lower-3", known) is None


def test_parse_betas_keeps_only_valid_entries():
    assert parse_betas('{"high": 0.85, "low": 0.45, "bad": 2, "x": "y"}') == {"high": 0.85, "low": 0.45}
    assert parse_betas("not json") == {}
    assert parse_betas("[1, 2]") == {}


class FakeRejectionSampler:
    """Reads the drafts the way vLLM 0.26's RejectionSampler.__call__ does, then runs the kernel reference."""

    def __init__(self, rates: list[float], u_seed: int = 5) -> None:
        self.synthetic_conditional_rates = torch.tensor(rates)
        self.rates = rates
        self.rng = np.random.default_rng(u_seed)

    def __call__(self, logits, input_batch, draft_logits=None):
        draft_sampled = input_batch.input_ids[input_batch.logits_indices]
        u = self.rng.random(draft_sampled.shape[0])
        return synthetic_accepted(draft_sampled, input_batch.cu_num_logits_np, self.rates, u)


def test_wrapped_sampler_masks_only_during_the_call_and_lowers_low_acceptance():
    from bench.gpu.accept_plugin import wrap_rejection_sampler

    k, draws = 4, 4000
    mask = AcceptanceMask({"high": BETA_HIGH, "low": BETA_LOW}, seed=0)
    wrapped = wrap_rejection_sampler(FakeRejectionSampler.__call__, mask)
    sampler = FakeRejectionSampler([BETA_HIGH] * k)
    batch = fake_batch([f"{'low' if b % 2 else 'high'}-{b}" for b in range(draws)], [k] * draws)
    before = batch.input_ids.clone()
    accepted = np.asarray(wrapped(sampler, None, batch, None))
    assert torch.equal(batch.input_ids, before)  # restored for the drafter
    for rows, beta in ((accepted[0::2], BETA_HIGH), (accepted[1::2], BETA_LOW)):
        assert rows.mean() == pytest.approx(sum(beta ** i for i in range(1, k + 1)), rel=0.06)


def test_wrapped_sampler_falls_back_to_the_stock_call_when_the_mask_fails():
    from bench.gpu.accept_plugin import wrap_rejection_sampler

    mask = AcceptanceMask({"low": BETA_LOW})
    wrapped = wrap_rejection_sampler(lambda self, logits, batch, *a: "stock", mask)
    broken = SimpleNamespace(req_ids=["low-1"], cu_num_logits_np=None, logits_indices=torch.zeros(1, dtype=torch.long),
                             input_ids=torch.zeros(2, dtype=torch.int32))
    sampler = SimpleNamespace(synthetic_conditional_rates=torch.tensor([BETA_HIGH]))
    assert wrapped(sampler, None, broken) == "stock"


def test_wrap_installs_once_and_skips_missing_targets(monkeypatch):
    import sys
    import types

    from bench.gpu import accept_plugin

    module = types.ModuleType("fake_vllm_target")

    class Manager:
        def dispatch(self):
            return "desc"

    module.Manager = Manager
    monkeypatch.setitem(sys.modules, "fake_vllm_target", module)
    calls = []

    def make(original):
        calls.append(original)
        return lambda self: original(self)

    assert accept_plugin._wrap(("fake_vllm_target", "Manager", "dispatch"), make)
    assert accept_plugin._wrap(("fake_vllm_target", "Manager", "dispatch"), make)  # already wrapped: kept as is
    assert len(calls) == 1 and Manager().dispatch() == "desc"
    assert not accept_plugin._wrap(("no_such_module_here", "X", "y"), make)


def test_register_is_a_no_op_without_the_env(monkeypatch):
    from bench.gpu import accept_plugin

    monkeypatch.delenv(accept_plugin.ACCEPT_ENV, raising=False)
    accept_plugin._install_once.cache_clear()
    accept_plugin.register()
    accept_plugin.register()
    assert accept_plugin._install_once() == ()
    accept_plugin._install_once.cache_clear()
