"""The start-up decision: does this process run the patch, or vLLM's stock engine?

Taken from the installed vLLM's version alone (:mod:`specctl_vllm.engine_patch.versions`), before any vLLM code is
touched. A release outside the supported range gets the stock engine: ``--scheduler-cls
specctl_vllm.engine_patch.scheduler.SpecctlScheduler`` then names vLLM's own scheduler classes unchanged, the
model-runner backports stay off, and the process logs one line saying so. Never part of the patch: the hooks
and the backports are all on (where they apply) or all off. ``SPECCTL_ALLOW_UNSUPPORTED_VLLM=1`` loads the patch
anyway (the backports still apply only to the exact releases they were checked against).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

from specctl_vllm.engine_patch import versions

# Under "vllm.": in a vLLM process the line uses vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.specctl.startup")


@dataclass(frozen=True, kw_only=True)
class StartupMode:
    """Whether the patch loads, and the one line a process logs about it (None: nothing to say)."""

    patched: bool
    line: str | None = None


def decide(version: str | None, environ: dict[str, str] | None = None) -> StartupMode:
    """Pure: the start-up mode for an installed vLLM ``version`` (None: not installed) and the environment."""
    problem = versions.support_problem(version)
    if problem is None:
        return StartupMode(patched=True)
    if versions.unsupported_allowed(environ):
        return StartupMode(patched=True, line=f"specctl: {problem}; loading the engine patch anyway "
                                              f"({versions.ALLOW_ENV}=1), model-runner backports off")
    return StartupMode(patched=False, line=f"specctl: {problem}; this engine runs vLLM's stock scheduler and model "
                                           f"runner, without the specctl patch (set {versions.ALLOW_ENV}=1 to "
                                           f"load it anyway)")


@functools.cache
def mode() -> StartupMode:
    """This process's mode, logged once (the plugin and the scheduler module both ask; one line per process)."""
    result = decide(versions.installed_version())
    if result.line:
        logger.warning(result.line)
    return result
