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


def test_a_count_staged_with_decode_graphs_only_gets_the_next_piecewise_graph() -> None:
    """vLLM stages width 2 (3 tokens a request) at round_up(64, 3) = 66 with that decode graph only: a mixed batch
    of 65 or 66 tokens (prompt chunks beside decodes) found no piecewise graph there and ran eager, where a plain
    engine runs the piecewise graph of 80 tokens. The fix stages that graph behind the decode graphs; counts
    that had a piecewise graph keep their lists as they were, and the shared lists vLLM stages are not mutated."""
    pw64, pw80 = Desc("PIECEWISE", 64, None), Desc("PIECEWISE", 80, None)
    w1_64, w2_66 = full(64, 1), full(66, 3)
    shared = [w2_66]
    candidates = {(65, 0): shared, (66, 0): shared, (64, 0): [w1_64, pw64], (80, 0): [pw80]}
    capture = {"FULL": [w2_66, w1_64], "PIECEWISE": [pw80, pw64]}
    backports.full_graphs_first(candidates, capture)
    assert shared == [w2_66]  # vLLM's list, shared by 65 and 66, is left alone
    for count in (65, 66):
        assert candidates[(count, 0)] == [w2_66, pw80]
    assert candidates[(64, 0)] == [w1_64, full(66, 3), pw64]  # the width-2 graph holding 64, then piecewise
    assert candidates[(80, 0)] == [pw80]


def test_dispatch_of_a_mixed_batch_finds_a_graph_at_every_staged_count() -> None:
    """Every token count up to the largest capture size: after the fix a mixed batch (no uniform token count)
    finds a piecewise graph wherever the plain engine's staging would, for the width set {0, 1, 2, 4, 7}."""

    def compatible(d: Desc, num_tokens: int) -> bool:  # vLLM's _is_compatible for a mixed batch
        return d.uniform_token_count is None and (d.num_reqs is None or d.num_reqs >= 1) and d.num_tokens >= num_tokens

    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))  # the H200 engines' 51 capture sizes
    decode_lens = [1, 2, 3, 5, 8]
    by_count: dict[int, list] = {}
    full_descs, pw_descs = [], []
    for size in sizes:  # vLLM's staging, as in 0.26's _init_candidates (FULL_AND_PIECEWISE)
        for q in decode_lens:
            rounded = -(-size // q) * q
            if rounded > 512 or rounded // q > 256:
                continue
            d = full(rounded, q)
            if d not in full_descs:
                full_descs.append(d)
                by_count.setdefault(rounded, []).append(d)
        pw = Desc("PIECEWISE", size, None)
        pw_descs.append(pw)
        by_count.setdefault(size, []).append(pw)
    candidates: dict = {}
    start = 0
    for count in sorted(by_count):
        for i in range(start, count + 1):
            candidates[(i, 0)] = by_count[count]
        start = count + 1
    holes = [n for n in range(1, 513) if not any(compatible(d, n) for d in candidates[(n, 0)])]
    assert len(holes) == 111  # what 0.26 leaves: decode graphs only at the off-grid counts (as read from its code)
    backports.full_graphs_first(candidates, {"FULL": full_descs, "PIECEWISE": pw_descs})
    assert [n for n in range(1, 513) if not any(compatible(d, n) for d in candidates[(n, 0)])] == []
