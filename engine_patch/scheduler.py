"""vLLM scheduler classes for ``--scheduler-cls``: per-request k, per-category method, per-step telemetry.

Use ``--scheduler-cls specctl_vllm.engine_patch.scheduler.SpecctlScheduler``. It becomes :class:`SpecctlAsyncScheduler`
by itself when vLLM runs with async scheduling (the GPU default), so one flag fits every engine; both share
:class:`SpecctlMixin`. Supported vLLM: see :mod:`specctl_vllm.engine_patch.versions` (outside the range the import fails
with a clear message, unless ``SPECCTL_ALLOW_UNSUPPORTED_VLLM=1``).

What the classes do each step is in :mod:`specctl_vllm.engine_patch.runtime` (the guarded mixin) and
:mod:`specctl_vllm.engine_patch.hook` (the per-step work); this module only binds them to vLLM's classes.
"""

from __future__ import annotations

import logging
from typing import Any

from specctl_vllm.engine_patch import versions

_problem = versions.support_problem(versions.installed_version())
if _problem and not versions.unsupported_allowed():
    raise ImportError(
        f"specctl engine patch: {_problem}. Install a supported vLLM or set {versions.ALLOW_ENV}=1 to try anyway."
    )

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from specctl_vllm.engine_patch.runtime import SpecctlMixin

# Under "vllm.": in a vLLM process the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.specctl.engine")
if _problem:
    logger.warning("specctl: %s; running anyway (%s=1)", _problem, versions.ALLOW_ENV)


class SpecctlScheduler(SpecctlMixin, Scheduler):
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
