"""Session fixtures for the e2e tier: ONE controller and ONE patched vLLM server shared by every test.

Everything is real: SmolLM2-135M-Instruct converted by ``scripts/prepare_model.py`` (float32), vLLM's OpenAI
server on CPU with n-gram drafting (k = 4) and the patch (``--scheduler-cls``, ``--middleware``), and
``specctl serve`` with a SQLite file. The controller runs with a 3 s policy TTL and a 0.5 s decision interval
(:data:`bench.support.stack.FAST_POLICY_ENV`) so expiry and override tests take seconds, and it decides per
category from 30 drafts of evidence on (default 200), so that the short e2e workloads already run under a
learned per-category policy, not only the engine's static config. Tests that change controller state
(overrides, restarts) restore it before they return.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.support import stack
from bench.support.specctl_serve import SpecctlServe
from bench.support.vllm_server import VllmServer


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The converted model (built once, then verified against its checksums)."""
    return stack.model_dir()


@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def controller(e2e_dir: Path) -> Iterator[SpecctlServe]:
    with stack.controller_process(e2e_dir / "controller", env={"SPECCTL_POLICY_MIN_EVIDENCE": "30"}) as server:
        yield server


@pytest.fixture(scope="session")
def engine(model_dir: Path, e2e_dir: Path, controller: SpecctlServe) -> Iterator[VllmServer]:
    started = time.monotonic()
    with stack.patched_engine(model_dir, e2e_dir / "engine", controller, engine_id=stack.ENGINE_ID) as server:
        print(f"\npatched vLLM ready and attached in {time.monotonic() - started:.1f} s at {server.url}")
        yield server


@pytest.fixture
def admin_token(controller: SpecctlServe) -> str:
    assert controller.admin_token
    return controller.admin_token
