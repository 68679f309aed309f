import numpy as np
import pytest

from specctl_vllm.controller.core.learn.mix import EXTRA_BIN, EXTRA_BINS, Mix


def test_batch_size_and_shares_are_per_busy_step():
    m = Mix()
    m.decay_to(0.0, 10.0)
    m.add(steps=4, requests=32, extra_tokens=400, per_category={"a": 24, "b": 8}, extra_values=[0, 0, 0, 400],
          committed={"a": 48, "b": 16})
    assert m.batch_size == 8 and m.extra_per_step == 100
    assert m.shares() == {"a": 6.0, "b": 2.0}
    assert m.extra_per_committed == pytest.approx(400 / 64)
    assert m.committed_shares() == {"a": 12.0, "b": 4.0}


def test_mix_follows_load_within_its_half_life():
    m = Mix()
    m.decay_to(0.0, 10.0)
    m.add(10, 10, 0, {"a": 10})  # batch 1
    m.decay_to(100.0, 10.0)  # ten half-lives later the engine runs at batch 64
    m.add(10, 640, 0, {"a": 640})
    assert m.batch_size == pytest.approx(64, rel=0.01)


@pytest.mark.parametrize("values", [[0] * 7 + [512], list(range(0, 800, 100)), [5000, 9000, 20_000]])
def test_extra_distribution_keeps_weight_and_mean(values):
    m = Mix()
    m.decay_to(0.0, 10.0)
    m.add(len(values), len(values), sum(values), {}, extra_values=values)
    dist = m.extra_distribution()
    assert 1 <= len(dist) <= 8
    assert sum(w for _, w in dist) == pytest.approx(1.0)
    assert sum(v * w for v, w in dist) == pytest.approx(sum(values) / len(values))


def test_bursty_prefill_is_kept_apart_from_steady():
    m = Mix()
    m.decay_to(0.0, 10.0)
    m.add(8, 8, 512, {}, extra_values=[0] * 7 + [512])
    values = sorted(v for v, _ in m.extra_distribution())
    assert values[0] == 0 and values[-1] >= 512 - EXTRA_BIN


def test_roundtrip_and_tolerant_load():
    m = Mix()
    m.decay_to(3.0, 10.0)
    m.add(3, 9, 30, {"a": 9}, extra_values=[10, 10, 10], committed={"a": 20})
    back = Mix.from_dict(m.to_dict())
    assert back.to_dict() == m.to_dict()
    old = {k: v for k, v in m.to_dict().items()
           if k not in ("extra_w", "extra_sum", "committed", "committed_per_category")}
    legacy = Mix.from_dict(old)  # a snapshot from before the histogram existed
    assert legacy.batch_size == 3 and legacy.extra_distribution() == ()


def test_a_book_without_prefill_dumps_no_bins_and_loads_back_whole():
    """An engine that reported no prefill writes empty bin lists (two lists of 129 zeros per engine were 36 MB
    of objects in a snapshot at the engine cap); what it writes loads back to the same 129 bins."""
    m = Mix()
    m.decay_to(1.0, 10.0)
    m.add(2, 4, 0, {"a": 4})
    d = m.to_dict()
    assert d["extra_w"] == [] and d["extra_sum"] == []
    back = Mix.from_dict(d)
    assert back.extra_w.shape == (EXTRA_BINS,) and not back.extra_w.any() and back.to_dict() == d


def test_bins_are_written_up_to_the_last_filled_one_and_read_as_before():
    m = Mix()
    m.decay_to(1.0, 10.0)
    m.add(3, 9, 30, {"a": 9}, extra_values=[10, 3 * EXTRA_BIN + 1])
    d = m.to_dict()
    assert len(d["extra_w"]) == 4 and d["extra_w"][-1] > 0
    back = Mix.from_dict(d)
    assert np.array_equal(back.extra_w, m.extra_w) and np.array_equal(back.extra_sum, m.extra_sum)
    full = {**d, "extra_w": m.extra_w.tolist(), "extra_sum": m.extra_sum.tolist()}  # as older versions wrote it
    assert Mix.from_dict(full).to_dict() == d


@pytest.mark.parametrize("bad", [[-1.0], [float("nan")], [[1.0]], ["x"], [0.0] * (EXTRA_BINS + 1), {"a": 1}])
def test_bins_that_do_not_fit_start_the_histogram_empty(bad):
    m = Mix()
    m.decay_to(1.0, 10.0)
    m.add(3, 9, 30, {"a": 9}, extra_values=[10])
    loaded = Mix.from_dict({**m.to_dict(), "extra_w": bad})
    assert loaded.extra_distribution() == () and loaded.batch_size == m.batch_size
