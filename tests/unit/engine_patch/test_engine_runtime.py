"""The guarded scheduler mixin on a stand-in parent: parent behaviour always, hook failures contained."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from specctl_vllm.engine_patch import runtime
from specctl_vllm.engine_patch.runtime import SpecctlMixin, build_runtime, engine_spec, full_cuda_graphs
from specctl_vllm.engine_patch.settings import EngineSettings


class Parent:
    """Records the calls a vLLM scheduler would receive."""

    def __init__(self, *args, **kwargs) -> None:
        self.calls: list[str] = []
        self.running: list = []
        self.requests: dict = {}
        self.num_spec_tokens = 4
        self.dynamic_sd_lookup = None
        self.structured_output_manager = SimpleNamespace(validate_tokens=lambda r, t: t)
        self.vllm_config = config()

    def schedule(self, *args, **kwargs):
        self.calls.append("schedule")
        return "scheduled"

    def _update_after_schedule(self, output):
        self.calls.append("after")

    def update_from_output(self, output, runner_output):
        self.calls.append("update")
        return {"out": 1}

    def shutdown(self):
        self.calls.append("shutdown")

    def make_spec_decoding_stats(self, spec_decoding_stats, num_draft_tokens, num_accepted_tokens,
                                 num_invalid_spec_tokens, request_id):
        self.calls.append(f"stats {request_id} {num_draft_tokens} {num_accepted_tokens}")
        return "stats"


def config(method: str | None = "ngram", k: int = 4, async_scheduling: bool = False):
    spec = SimpleNamespace(method=method, num_speculative_tokens=k) if method else None
    return SimpleNamespace(
        speculative_config=spec,
        scheduler_config=SimpleNamespace(async_scheduling=async_scheduling, max_num_seqs=8),
        model_config=SimpleNamespace(served_model_name="smol", model="/m"),
        parallel_config=SimpleNamespace(data_parallel_rank=0),
    )


class Patched(SpecctlMixin, Parent):
    pass


class Exploding:
    """A hook whose every section raises."""

    def __getattr__(self, name):
        def boom(*a, **k):
            raise RuntimeError(f"{name} broke")
        return boom


@pytest.fixture(autouse=True)
def no_reporting(monkeypatch) -> None:
    monkeypatch.setenv("SPECCTL_CONTROLLER_URL", "off")


def test_parent_behaviour_is_kept_and_the_padding_is_disabled() -> None:
    s = Patched()
    assert s._specctl is not None and s._specctl.reporter is None
    assert s.dynamic_sd_lookup == [4] * 9  # constant K table: no placeholder padding, same depth
    assert s.schedule() == "scheduled"
    assert s.update_from_output(SimpleNamespace(num_scheduled_tokens={}, total_num_scheduled_tokens=0,
                                                scheduled_spec_decode_tokens={}), None) == {"out": 1}
    assert s.calls == ["schedule", "update"]


def test_hook_failures_never_reach_the_engine_loop(caplog) -> None:
    s = Patched()
    s._specctl.hook = Exploding()
    s._specctl.error_limit = 6
    with caplog.at_level(logging.ERROR, logger="vllm.specctl.engine"):
        for _ in range(3):
            assert s.schedule() == "scheduled"
            s._update_after_schedule(object())
            assert s.update_from_output(object(), object()) == {"out": 1}
    assert s.calls == ["schedule", "after", "update"] * 3
    assert not s._specctl.enabled  # 6 failures: the patch switched itself off
    logged = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(logged) == 4  # once per hook, not once per failure
    assert sum(s._specctl.errors.values()) == 6


def test_a_patch_that_cannot_start_leaves_plain_vllm(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "build_runtime", lambda s: (_ for _ in ()).throw(ValueError("bad")))
    s = Patched()
    assert s._specctl is None
    assert s.schedule() == "scheduled" and s.update_from_output(1, 2) == {"out": 1}


def test_shutdown_stops_the_reporter() -> None:
    s = Patched()
    closed = []
    s._specctl.close = lambda: closed.append(True)
    s.shutdown()
    assert s.calls == ["shutdown"] and closed == [True]


@pytest.mark.parametrize(
    ("cfg", "k", "async_mode", "expected"),
    [
        (config("ngram", 4), 4, False, ("ngram", 4, ("suffix",))),
        (config("eagle3", 3), 3, False, ("eagle3", 3, ("ngram", "suffix"))),
        (config("eagle3", 3), 3, True, ("eagle3", 3, ())),
        (config(None, 0), 0, False, ("off", 0, ())),
        (config("ngram", 64), 64, False, ("ngram", 32, ("suffix",))),
    ],
)
def test_engine_spec(cfg, k, async_mode, expected) -> None:
    spec = engine_spec(cfg, k, async_mode)
    assert (spec.method, spec.k_max, spec.model_free_methods) == expected


def test_user_batch_size_table_is_kept() -> None:
    parent = Parent()
    parent.dynamic_sd_lookup = [0, 4, 2, 2]
    build_runtime(parent, EngineSettings.model_validate({"controller_url": "off"}))
    assert parent.dynamic_sd_lookup == [0, 4, 2, 2]


def _validate(r, t):
    return t[:1]


def _trim(r, t):
    return t[:2]


@pytest.mark.parametrize(
    ("manager", "expected"),
    [
        (SimpleNamespace(validate_tokens=_validate), _validate),  # 0.30-0.33
        (SimpleNamespace(trim_spec_tokens=_trim), _trim),  # 0.34
        (SimpleNamespace(), None),  # 0.26-0.29: model-free drafts go unvalidated
    ],
)
def test_model_free_drafts_are_validated_by_the_releases_own_method(manager, expected) -> None:
    parent = Parent()
    parent.structured_output_manager = manager
    rt = build_runtime(parent, EngineSettings.model_validate({"controller_url": "off"}))
    assert rt.hook.validate_drafts is expected


class _Mode:
    def __init__(self, full: bool) -> None:
        self.full = full

    def has_full_cudagraphs(self) -> bool:
        return self.full


def _graph_config(mode, eager: bool = False, device: str = "cuda", adaptive: bool | None = None):
    spec = None if adaptive is None else SimpleNamespace(method="eagle3", enable_adaptive_verification=adaptive)
    return SimpleNamespace(model_config=SimpleNamespace(enforce_eager=eager),
                           device_config=SimpleNamespace(device_type=device),
                           compilation_config=SimpleNamespace(cudagraph_mode=mode), speculative_config=spec)


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (_graph_config(_Mode(True)), True),
        (_graph_config(_Mode(False)), False),
        (_graph_config(_Mode(True), eager=True), False),
        (_graph_config(_Mode(True), device="cpu"), False),
        (_graph_config(None), False),
        (_graph_config("FULL_AND_PIECEWISE"), True),  # a layout without has_full_cudagraphs(): by name
        (_graph_config("PIECEWISE"), False),
        (SimpleNamespace(), False),  # an unknown layout never raises
        (_graph_config(_Mode(True), adaptive=False), True),
        # vLLM 0.34's adaptive verification replays variable-length decode graphs: mixed k is not penalised
        (_graph_config(_Mode(True), adaptive=True), False),
    ],
)
def test_full_cuda_graphs_detection(cfg, expected) -> None:
    assert full_cuda_graphs(cfg) is expected


def test_the_flag_travels_in_the_spec() -> None:
    cfg = config("eagle3", 3)
    cfg.model_config.enforce_eager = False
    cfg.device_config = SimpleNamespace(device_type="cuda")
    cfg.compilation_config = SimpleNamespace(cudagraph_mode=_Mode(True))
    assert engine_spec(cfg, 3, False).to_protocol().full_cuda_graphs is True


def test_vllms_own_update_loop_is_recognised_where_it_counts_drafts() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    assert runtime.engine_loop_counts_drafts(Scheduler) and runtime.engine_loop_counts_drafts(AsyncScheduler)

    def update_from_output(self, scheduler_output, model_runner_output):
        return {}  # counts its drafts some other way

    def stats(self, stats, num_draft_tokens, num_accepted_tokens, request_id):
        return stats

    elsewhere = type("Scheduler", (), {"__module__": "vllm.v1.core.sched.other",
                                       "update_from_output": update_from_output,
                                       "make_spec_decoding_stats": Scheduler.make_spec_decoding_stats})
    assert not runtime.engine_loop_counts_drafts(elsewhere)
    reshaped = type("Scheduler", (Scheduler,), {"__module__": "vllm.v1.core.sched.other",
                                                "update_from_output": Scheduler.update_from_output,
                                                "make_spec_decoding_stats": stats})
    assert not runtime.engine_loop_counts_drafts(reshaped)
    assert not runtime.engine_loop_counts_drafts(Patched)  # no vLLM class in its MRO


def test_drafts_reach_the_sink_from_vllms_loop_and_vllm_keeps_its_stats(caplog) -> None:
    from specctl_vllm.engine_patch.telemetry import CODE_BITS as _CODE_BITS

    s = Patched()
    rt = s._specctl
    assert "make_spec_decoding_stats" not in s.__dict__  # not a vLLM class: the start-up check left it alone
    runtime.install_counting_call(s, rt)
    assert rt.hook.spec_call_ns >= 0
    assert s.make_spec_decoding_stats(None, num_draft_tokens=4, num_accepted_tokens=2,
                                      num_invalid_spec_tokens=None, request_id="r1") == "stats"
    assert s.calls == ["stats r1 4 2"]  # no step open: vLLM's call only, nothing kept
    key = 3 << (2 * _CODE_BITS)
    rt.hook.keys.update(r1=key, r2=key)
    rt.hook.spec_sink = {}  # as observe opens it on an engine-loop step
    assert s.make_spec_decoding_stats(None, num_draft_tokens=4, num_accepted_tokens=2,
                                      num_invalid_spec_tokens={"r1": 1}, request_id="r1") == "stats"
    assert s.make_spec_decoding_stats(None, 5, 3, None, "r2") == "stats"  # positional: the same numbers
    assert s.make_spec_decoding_stats(None, 5, 3, None, "r9") == "stats"  # a request the table lacks
    assert s.make_spec_decoding_stats(None, 4, 9, None, "r2") == "stats"  # past the drafts: clamped
    assert rt.hook.spec_sink == {key + (3 << _CODE_BITS) + 2: 1, key + (5 << _CODE_BITS) + 3: 1,
                                 key + (4 << _CODE_BITS) + 4: 1}
    assert rt.hook.spec_unkeyed == [("r9", 5, 3)]
    assert s.calls == ["stats r1 4 2", "stats r1 4 2", "stats r2 5 3", "stats r9 5 3", "stats r2 4 9"]

    class Unwritable(dict):
        def __setitem__(self, key, value):
            raise RuntimeError("broken sink")

    rt.hook.spec_sink = Unwritable()
    with caplog.at_level(logging.ERROR, logger="vllm.specctl.engine"):
        assert s.make_spec_decoding_stats(None, 4, 2, None, "r1") == "stats"  # vLLM's call still made
    assert rt.errors == {"observe": 1} and s.calls[-1] == "stats r1 4 2"


def test_a_disabled_patch_hands_vllms_loop_nothing() -> None:
    s = Patched()
    rt = s._specctl
    runtime.install_counting_call(s, rt)
    rt.hook.spec_sink = {}
    rt.error_limit = 1
    rt.failed("observe")  # the limit: the patch turns itself off
    assert not rt.enabled and rt.hook.spec_sink is None
    assert s.make_spec_decoding_stats(None, 4, 2, None, "r1") == "stats" and rt.hook.spec_sink is None


def test_a_vllm_whose_call_differs_gets_no_wrapper() -> None:
    """On a vLLM whose ``make_spec_decoding_stats`` has other parameters the start-up check fails, nothing wraps
    the method, and vLLM's call reaches it as made."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from specctl_vllm.engine_patch.scheduler import SpecctlScheduler

    def stats(self, stats, drafts, accepted):
        return ("other", stats, drafts, accepted)

    reshaped = type("Scheduler", (Scheduler,), {"__module__": "vllm.v1.core.sched.other",
                                                "update_from_output": Scheduler.update_from_output,
                                                "make_spec_decoding_stats": stats})
    assert not runtime.engine_loop_counts_drafts(type("P", (SpecctlScheduler, reshaped), {}))
    assert runtime.engine_loop_counts_drafts(SpecctlScheduler)


@pytest.mark.parametrize(
    ("scheduler", "want"),
    [
        (SimpleNamespace(max_num_scheduled_tokens=2048), 2048),
        # no attribute of its own: the config's
        (SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=8192))),
         8192),
        # nonsense in either place: no budget, so the rule runs on its cells alone
        (SimpleNamespace(max_num_scheduled_tokens=0, vllm_config=SimpleNamespace(scheduler_config=None)), None),
        (SimpleNamespace(max_num_scheduled_tokens=True), None),
        (SimpleNamespace(max_num_scheduled_tokens="2048"), None),
        (object(), None),
    ],
)
def test_token_budget_is_read_from_the_scheduler_or_its_config(scheduler, want) -> None:
    from specctl_vllm.engine_patch.runtime import token_budget_of

    assert token_budget_of(scheduler) == want


@pytest.mark.parametrize(
    ("widths", "budget", "want"),
    [
        ((0, 1, 2, 4, 7), 2048, 2048),  # graph-shaped: the controller prices budget-bound steps as the engine does
        ((), 2048, None),  # per-request k: no width rule, nothing to price
        ((0, 1, 2, 4, 7), None, None),
        ((0, 1, 2, 4, 7), 2**24 + 1, None),  # beyond what the protocol takes: not sent, never a refused batch
    ],
)
def test_the_spec_carries_the_token_budget_of_graph_shaped_engines(widths, budget, want) -> None:
    from specctl_vllm.engine_patch.policy_table import EngineSpec

    spec = EngineSpec(method="eagle3", k_max=7, full_cuda_graphs=bool(widths), graph_widths=widths)
    assert spec.to_protocol(budget).token_budget == want


def test_the_counting_call_wraps_vllms_own_method_on_a_real_scheduler_instance() -> None:
    """On vLLM's own scheduler class the wrapper binds the installed method, passes vLLM's call on position for
    position (vLLM's SpecDecodingStats count what they would count unwrapped), and tallies the request."""
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from specctl_vllm.engine_patch.scheduler import SpecctlScheduler
    from specctl_vllm.engine_patch.telemetry import CODE_BITS as _CODE_BITS

    scheduler = object.__new__(SpecctlScheduler)  # no engine: only what the stats call reads
    scheduler.log_stats = True
    scheduler.num_spec_tokens = 4
    donor = Patched()
    runtime.install_counting_call(scheduler, donor._specctl)
    hook = donor._specctl.hook
    hook.keys["r1"] = 2 << (2 * _CODE_BITS)
    hook.spec_sink = {}
    stats = scheduler.make_spec_decoding_stats(None, num_draft_tokens=4, num_accepted_tokens=3,
                                               num_invalid_spec_tokens={"r1": 1}, request_id="r1")
    assert isinstance(stats, SpecDecodingStats)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 3)
    assert hook.spec_sink == {(2 << (2 * _CODE_BITS)) + (3 << _CODE_BITS) + 3: 1}
    assert not any("make_spec_decoding_stats" in vars(cls) for cls in SpecctlScheduler.__mro__
                   if not cls.__module__.startswith("vllm."))  # the classes keep vLLM's method as it is
