"""The model-runner backports' pure parts, on stand-in objects (vLLM 0.26's GPU runner does not exist here)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from specctl_vllm.engine_patch import backports


@dataclass(frozen=True)
class Desc:  # the fields of vLLM's BatchExecutionDescriptor the backport reads
    cg_mode: str
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    num_active_loras: int = 0


def full(tokens: int, u: int) -> Desc:
    return Desc("FULL", tokens, tokens // u, u)


def test_full_graphs_first_closes_the_shadowed_widths() -> None:
    # vLLM stages token count 15 with the width-3 graph only (5 x 3): a width-5 batch of 3 requests falls back
    # to piecewise. The fix puts the smallest width-5 graph holding 15 tokens (20 = 4 x 5) ahead of piecewise.
    pw15 = Desc("PIECEWISE", 15, None)
    w3 = full(15, 3)
    w5_20, w5_10 = full(20, 5), full(10, 5)
    candidates = {(15, 0): [w3, pw15]}
    capture = {"FULL": [w5_20, w5_10, w3], "PIECEWISE": [pw15]}
    backports.full_graphs_first(candidates, capture)
    assert candidates[(15, 0)] == [w3, w5_20, pw15]


def test_full_graphs_first_without_full_graphs_changes_nothing() -> None:
    pw = Desc("PIECEWISE", 8, None)
    candidates = {(8, 0): [pw]}
    backports.full_graphs_first(candidates, {"PIECEWISE": [pw]})
    assert candidates == {(8, 0): [pw]}


@pytest.mark.parametrize(("k_max", "width", "passes"), [(7, None, 7), (7, 7, 7), (7, 4, 4), (7, 1, 1), (7, 0, 1)])
def test_decode_passes(k_max, width, passes) -> None:
    assert backports.decode_passes(k_max, width) == passes


def test_multi_step_decode_runs_the_scheduled_width_and_restores() -> None:
    seen = []

    def original(self, *args):
        seen.append(self.num_speculative_steps)

    wrapped = backports._wrap_multi_step_decode(original)
    speculator = SimpleNamespace(num_speculative_steps=7)
    setattr(speculator, backports.WIDTH_ATTR, 2)
    wrapped(speculator)
    setattr(speculator, backports.WIDTH_ATTR, None)
    wrapped(speculator)
    assert seen == [2, 7] and speculator.num_speculative_steps == 7


def test_execute_model_records_the_width_except_on_dummy_runs() -> None:
    wrapped = backports._wrap_execute_model(lambda self, so, *a, **k: so.num_spec_tokens_to_schedule)
    runner = SimpleNamespace(speculator=SimpleNamespace())
    assert wrapped(runner, SimpleNamespace(num_spec_tokens_to_schedule=3)) == 3
    assert getattr(runner.speculator, backports.WIDTH_ATTR) == 3
    wrapped(runner, SimpleNamespace(num_spec_tokens_to_schedule=5), dummy_run=True)
    assert getattr(runner.speculator, backports.WIDTH_ATTR) is None


def _manager(decode_query_len: int, table, scheduler="specctl_vllm.engine_patch.scheduler.SpecctlScheduler", method="eagle3"):
    spec = SimpleNamespace(num_speculative_tokens_per_batch_size=table, method=method)
    config = SimpleNamespace(speculative_config=spec, num_speculative_tokens=7,
                             scheduler_config=SimpleNamespace(scheduler_cls=scheduler))
    return SimpleNamespace(vllm_config=config, decode_query_len=decode_query_len, _candidates={}, _capture_descs={})


ALL = backports.BackportStatus(applied=backports.NAMES)


@pytest.mark.parametrize(
    ("manager", "swap", "lent"),
    [
        (_manager(1, [(1, 4, 4), (5, 256, 0)]), True, None),  # the drafter's decode manager ignores the table
        (_manager(1, None), False, None),
        (_manager(8, None), True, [(1, 1, w) for w in (0, 1, 2, 4, 7)]),  # the width set, patch scheduler
        (_manager(8, None, scheduler="vllm.v1.core.sched.scheduler.Scheduler"), False, None),
        (_manager(8, None, method="dflash"), False, None),
        (_manager(8, [(1, 4, 4)]), False, None),  # a user's table is vLLM's to apply
    ],
)
def test_table_lent_during_the_candidate_build(manager, swap, lent) -> None:
    assert backports._table_for(manager, ALL) == (swap, lent)


def test_init_candidates_wrapper_restores_the_users_config() -> None:
    manager = _manager(1, [(1, 4, 4), (5, 256, 0)])
    seen = []
    wrapped = backports._wrap_init_candidates(
        lambda self: seen.append(self.vllm_config.speculative_config.num_speculative_tokens_per_batch_size), ALL)
    wrapped(manager)
    assert seen == [None]
    assert manager.vllm_config.speculative_config.num_speculative_tokens_per_batch_size == [(1, 4, 4), (5, 256, 0)]


@pytest.mark.parametrize(("raw", "k_max", "widths"), [("", 7, (0, 1, 2, 4, 7)), ("", 3, (0, 1, 2, 3)),
                                                      ("0,3,7", 7, (0, 3, 7)), ("2", 4, (0, 2, 4)),
                                                      ("x", 7, (0, 1, 2, 4, 7)), ("9", 7, (0, 7))])
def test_graph_widths(raw, k_max, widths) -> None:
    assert backports.graph_widths(k_max, {backports.WIDTHS_ENV: raw}) == widths


@pytest.mark.parametrize(("raw", "names"), [("", backports.NAMES), ("auto", backports.NAMES), ("off", ()),
                                            ("drafter_graphs", ("drafter_graphs",)),
                                            ("honour_width, bogus", ("honour_width",))])
def test_requested(raw, names) -> None:
    assert backports.requested({backports.ENV: raw}) == names


def test_other_vllm_releases_get_no_backport(monkeypatch) -> None:
    backports.status.cache_clear()
    monkeypatch.setattr(backports.versions, "installed_version", lambda: "0.32.0")
    try:
        st = backports.status()
        assert st.applied == () and "0.32.0" in st.problem
    finally:
        backports.status.cache_clear()


def test_source_check_names_what_moved(monkeypatch) -> None:
    monkeypatch.setitem(backports._TARGETS, "honour_width",
                        (("json", "dumps", ("this line is not in json.dumps",)),))
    assert "no longer contains" in backports.source_problem("honour_width")
    monkeypatch.setitem(backports._TARGETS, "honour_width", (("no_such_module_here", "f", ()),))
    assert "ModuleNotFoundError" in backports.source_problem("honour_width")


def test_skip_at_zero_leaves_the_drafter_idle_only_on_zero_width_steps() -> None:
    calls = []
    wrapped = backports._wrap_propose(lambda self, batch, *a, **k: calls.append(batch.num_reqs) or "drafted")
    speculator = SimpleNamespace(draft_tokens=list(range(10)))
    batch = SimpleNamespace(num_reqs=3)
    setattr(speculator, backports.WIDTH_ATTR, 0)
    assert wrapped(speculator, batch) == [0, 1, 2] and calls == []
    assert wrapped(speculator, batch, dummy_run=True) == "drafted"
    setattr(speculator, backports.WIDTH_ATTR, 2)
    assert wrapped(speculator, batch) == "drafted" and calls == [3, 3]
    assert backports.skip_draft_at_zero({backports.DRAFT_AT_ZERO_ENV: "skip"})
    assert not backports.skip_draft_at_zero({})
