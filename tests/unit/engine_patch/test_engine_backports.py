"""The model-runner backports' pure parts, on stand-in objects (vLLM 0.26's GPU runner does not exist here)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from specctl_vllm.engine_patch import backports, backports_v034


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


# -- vLLM 0.34.0 --------------------------------------------------------------------------------------------------


def _config(method="eagle3", table=None, adaptive=False, scheduler=backports.SPECCTL_SCHEDULER_PREFIX + ".SpecctlScheduler",
            k=7, cls=None):
    spec = SimpleNamespace(method=method, num_speculative_tokens_per_batch_size=table,
                           enable_adaptive_verification=adaptive)
    if cls is not None:  # 0.34's SpeculativeConfig.speculator_config names the drafter's class
        spec.speculator_config = SimpleNamespace(speculator_class=cls)
    return SimpleNamespace(speculative_config=spec, num_speculative_tokens=k,
                           scheduler_config=SimpleNamespace(scheduler_cls=scheduler))


@pytest.mark.parametrize(
    ("config", "widths"),
    [
        (_config(), (0, 1, 2, 4, 7)),
        (_config(method="mtp", k=3), (0, 1, 2, 3)),
        (_config(adaptive=True), None),  # vLLM trims each request on variable-length graphs: not graph-shaped
        (_config(table=[(1, 64, 4), (65, 256, 0)]), None),  # a user's batch-size table is vLLM's to apply
        (_config(method="dflash"), None),
        (_config(scheduler="vllm.v1.core.sched.scheduler.Scheduler"), None),
        (_config(k=0), None),
        (_config(method="mtp", k=3, cls="vllm.v1.worker.gpu.spec_decode.mtp.speculator.MTPSpeculator"),
         (0, 1, 2, 3)),
        # multi-module MTP is also method="mtp" on 0.34, with a graph manager of its own: not covered
        (_config(method="mtp", cls="vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator.X"), None),
    ],
)
def test_engine_widths(config, widths) -> None:
    assert backports.engine_widths(config) == widths


@pytest.mark.parametrize(
    ("lens", "widths", "sampled", "expected"),
    [
        ({8: 256}, (0, 1, 2, 4, 7), 1, {1: 256, 2: 256, 3: 256, 5: 256, 8: 256}),
        ({4: 64}, (0, 3), 1, {1: 64, 4: 64}),
        ({9: 128}, (0, 2, 7), 2, {2: 128, 4: 128, 9: 128}),  # two tokens sampled a step (e.g. a bonus pair)
    ],
)
def test_width_query_lens(lens, widths, sampled, expected) -> None:
    assert backports_v034.width_query_lens(lens, widths, sampled) == expected


def test_query_lens_wrapper_adds_the_width_set_only_where_vllm_gave_one_length() -> None:
    def original(self, decode_query_len):
        return self.lens

    wrapped = backports_v034.wrap_query_lens(original, lambda cfg: cfg.widths)
    cfg = SimpleNamespace(num_speculative_tokens=7, widths=(0, 2, 7), lens={8: 256})
    assert wrapped(cfg, 8) == {1: 256, 3: 256, 8: 256}
    cfg.lens = {2: 1, 5: 64, 8: 256}  # vLLM's own K table already spread the lengths: left as built
    assert wrapped(cfg, 8) == {2: 1, 5: 64, 8: 256}
    cfg.lens, cfg.widths = {8: 256}, None  # not an engine the width set serves
    assert wrapped(cfg, 8) == {8: 256}
    cfg.lens, cfg.widths = {1: 256}, (0, 2, 7)  # a one-token runner (the drafter's decode): nothing to add
    assert wrapped(cfg, 1) == {1: 256}


@dataclass(frozen=True)
class SpecDesc(Desc):  # vLLM 0.34's SpeculatorBatchDescriptor: a batch descriptor plus the draft width
    num_speculative_tokens: int = 0


def test_drafter_decode_graphs_are_specialised_per_width() -> None:
    d64, d8 = Desc("FULL", 64, 64, 1), Desc("FULL", 8, 8, 1)
    out = backports_v034.width_specialized({"FULL": [d64, d8]}, (0, 1, 2, 4, 7), SpecDesc)
    assert [(d.num_tokens, d.num_speculative_tokens) for d in out["FULL"]] == [
        (64, 7), (64, 4), (64, 2), (8, 7), (8, 4), (8, 2)]  # K <= 1 runs no decode pass: no graph


def _drafter_manager(decode_query_len=1):
    return SimpleNamespace(decode_query_len=decode_query_len, vllm_config=_config(),
                           _capture_descs={"FULL": [Desc("FULL", 8, 8, 1)]})


def _fused_multi_step_decode(*args):
    return None


def _decode(*args):
    return None


@pytest.mark.parametrize(
    ("manager", "forward_fn", "specialize", "specialised"),
    [
        (_drafter_manager(), _fused_multi_step_decode, False, True),
        (_drafter_manager(), _decode, False, False),  # one graph per pass: it already honours the width
        (_drafter_manager(), _fused_multi_step_decode, True, False),  # vLLM specialises for its own table
        (_drafter_manager(decode_query_len=8), _fused_multi_step_decode, False, False),  # the prefill manager
    ],
)
def test_speculator_capture_wrapper(manager, forward_fn, specialize, specialised) -> None:
    seen = []

    def original(self, fn, *args, specialize_spec_tokens=False, **kwargs):
        seen.append((specialize_spec_tokens, [getattr(d, "num_speculative_tokens", None)
                                              for d in self._capture_descs["FULL"]]))

    wrapped = backports_v034.wrap_speculator_capture(original, backports.engine_widths, SpecDesc)
    wrapped(manager, forward_fn, "state", specialize_spec_tokens=specialize)
    assert seen == [(specialize, [7, 4, 2] if specialised else [None])]


def test_status_on_034_applies_the_rewrites_and_names_what_is_upstream(monkeypatch) -> None:
    backports.status.cache_clear()
    monkeypatch.setattr(backports.versions, "installed_version", lambda: "0.34.0")
    monkeypatch.setattr(backports, "source_problem", lambda name, targets=None: None)
    try:
        st = backports.status()
        assert st.applied == ("graph_widths", "honour_width") and st.problem is None
        assert st.upstream == ("drafter_graphs", "full_graph_dispatch")
        assert st.provides("full_graph_dispatch") and not st.has("full_graph_dispatch")
    finally:
        backports.status.cache_clear()


def test_a_moved_034_line_turns_every_backport_off(monkeypatch) -> None:
    backports.status.cache_clear()
    monkeypatch.setattr(backports.versions, "installed_version", lambda: "0.34.0")
    try:
        st = backports.status()  # the vLLM here is the CPU build of 0.32: 0.34's functions are not there
        assert st.applied == () and st.problem
    finally:
        backports.status.cache_clear()


@pytest.mark.parametrize(("adaptive", "shaped"), [(False, True), (True, False)])
def test_graph_shaped_on_034_steps_aside_for_adaptive_verification(monkeypatch, adaptive, shaped) -> None:
    st = backports.BackportStatus(applied=("graph_widths", "honour_width"), release="0.34.0",
                                  upstream=("drafter_graphs", "full_graph_dispatch"))
    monkeypatch.setattr(backports, "apply", lambda: st)
    assert backports.graph_shaped(_config(adaptive=adaptive)) is shaped
