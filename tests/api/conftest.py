"""API tests against a real ``specctl serve`` (uvicorn) process on loopback with a temp SQLite file."""

from __future__ import annotations

import pytest

from bench.support.specctl_serve import SpecctlServe

#: Short cadences so TTL expiry and periodic snapshots are observable within a test.
FAST = {"SPECCTL_MAINTENANCE_INTERVAL_S": "0.2", "SPECCTL_SNAPSHOT_INTERVAL_S": "1", "SPECCTL_POLICY_INTERVAL_S": "0.5"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with SpecctlServe(tmp_path_factory.mktemp("api"), env=FAST) as proc:
        yield proc


@pytest.fixture
def fresh_server(tmp_path):
    proc = SpecctlServe(tmp_path / "fresh", env=FAST)
    yield proc
    proc.stop()
