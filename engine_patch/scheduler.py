"""vLLM scheduler classes for ``--scheduler-cls``: per-request k, per-category method, per-step telemetry.

Use ``--scheduler-cls specctl_vllm.engine_patch.scheduler.SpecctlScheduler``. It becomes :class:`SpecctlAsyncScheduler`
by itself when vLLM runs with async scheduling (the GPU default), so one flag fits every engine; both share
:class:`SpecctlMixin`. Supported vLLM: see :mod:`specctl_vllm.engine_patch.versions`. Outside the range the two names
are vLLM's own scheduler classes without the mixin, and the process logs one line saying so
(:mod:`specctl_vllm.engine_patch.startup`; ``SPECCTL_ALLOW_UNSUPPORTED_VLLM=1`` loads the patch anyway).

What the classes do each step is in :mod:`specctl_vllm.engine_patch.runtime` (the guarded mixin) and
:mod:`specctl_vllm.engine_patch.hook` (the per-step work); this module only binds them to vLLM's classes.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from specctl_vllm.engine_patch import startup

#: Whether this process runs the patch; decided once from the installed vLLM version, before the patch's modules
#: (which name vLLM internals) are imported.
PATCHED = startup.mode().patched


class _StockEngine:
    """Stands in for the mixin on a vLLM the patch does not know: the scheduler is vLLM's, unchanged."""


if PATCHED:
    from specctl_vllm.engine_patch.runtime import SpecctlMixin as _Mixin
else:
    _Mixin = _StockEngine


class SpecctlScheduler(_Mixin, Scheduler):
    """The patched synchronous scheduler; instantiates :class:`SpecctlAsyncScheduler` under async scheduling."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls not in (SpecctlScheduler, SpecctlAsyncScheduler):
            return object.__new__(cls)  # a subclass chose its own base
        config = kwargs.get("vllm_config", args[0] if args else None)
        wants_async = bool(getattr(getattr(config, "scheduler_config", None), "async_scheduling", False))
        target = SpecctlAsyncScheduler if wants_async else SpecctlScheduler
        instance = object.__new__(target)
        if not isinstance(instance, cls):  # Python only calls __init__ itself for instances of cls
            instance.__init__(*args, **kwargs)
        return instance


class SpecctlAsyncScheduler(SpecctlScheduler, AsyncScheduler):
    """The patched async scheduler (GPU engines with async scheduling); MRO: mixin, then AsyncScheduler."""

    specctl_async = True
