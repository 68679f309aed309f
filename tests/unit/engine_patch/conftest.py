"""Fixtures for the engine-patch unit tests."""

from __future__ import annotations

import pytest
from engine_rig import Rig


@pytest.fixture
def rig() -> Rig:
    return Rig()
