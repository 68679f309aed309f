"""``vllm.general_plugins`` entry point (``specctl = "specctl_vllm.engine_patch.plugin:register"``).

vLLM calls :func:`register` in every process it starts (API server, EngineCore, workers), possibly more than
once. It logs this distribution's version once per process, takes the start-up decision of :mod:`specctl_vllm.engine_patch.startup` (a vLLM outside the supported range
runs stock, with one log line per process), and applies the model-runner backports of
:mod:`specctl_vllm.engine_patch.backports` where the installed vLLM is exactly a release they were checked against (their
sources are verified first; otherwise they stay off with one log line). It never raises, so installing the
package can never break a vLLM process. The patch itself is switched on with ``--scheduler-cls specctl_vllm.engine_patch.scheduler.SpecctlScheduler``
(and, for categories derived from tools/response_format, ``--middleware
specctl_vllm.engine_patch.middleware.CategoryMiddleware``).
"""

from __future__ import annotations

import functools
import logging

import specctl_vllm
from specctl_vllm.engine_patch import backports, startup

# Under "vllm.": in a vLLM process the lines use vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.specctl.plugin")


def register() -> None:
    """Idempotent, cheap, never raises."""
    try:
        _announce_once()
    except Exception:  # a plugin must never break the process that loads it
        logger.debug("specctl: start-up line failed", exc_info=True)
    try:
        patched = startup.mode().patched
    except Exception:  # a plugin must never break the process that loads it
        logger.debug("specctl: version check failed", exc_info=True)
        return
    if not patched:
        return  # the stock engine: no backport either (startup logged why)
    try:
        backports.apply()
    except Exception:  # a plugin must never break the process that loads it
        logger.debug("specctl: backports failed", exc_info=True)


@functools.cache
def _announce_once() -> None:
    """The line that says which specctl this process loaded (vLLM may call :func:`register` several times)."""
    logger.info("specctl: %s %s loaded", specctl_vllm.DISTRIBUTION, specctl_vllm.version())
