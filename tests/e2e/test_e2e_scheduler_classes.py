"""The scheduler classes against the installed vLLM: one flag picks the right base for async scheduling."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.e2e

sched = pytest.importorskip("specctl_vllm.engine_patch.scheduler")
runtime = pytest.importorskip("specctl_vllm.engine_patch.runtime")


def config(async_scheduling: bool) -> SimpleNamespace:
    return SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))


def test_mro_puts_the_mixin_before_vllm() -> None:
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    mro = sched.SpecctlAsyncScheduler.__mro__
    assert mro.index(runtime.SpecctlMixin) < mro.index(AsyncScheduler) < mro.index(Scheduler)
    assert sched.SpecctlScheduler.__mro__[1:3] == (runtime.SpecctlMixin, Scheduler)


@pytest.mark.parametrize(
    ("cls_name", "async_scheduling", "expected"),
    [
        ("SpecctlScheduler", False, "SpecctlScheduler"),
        ("SpecctlScheduler", True, "SpecctlAsyncScheduler"),
        ("SpecctlAsyncScheduler", True, "SpecctlAsyncScheduler"),
        ("SpecctlAsyncScheduler", False, "SpecctlScheduler"),
    ],
)
def test_one_flag_fits_sync_and_async_engines(monkeypatch, cls_name: str, async_scheduling: bool,
                                              expected: str) -> None:
    inits = []
    monkeypatch.setattr(runtime.SpecctlMixin, "__init__", lambda self, *a, **k: inits.append(type(self).__name__))
    instance = getattr(sched, cls_name)(vllm_config=config(async_scheduling))
    assert type(instance).__name__ == expected
    assert inits == [expected]  # initialised exactly once, whichever way it was created
