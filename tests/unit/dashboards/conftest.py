import pytest

from dashboards.generate import build_all


@pytest.fixture(scope="session")
def boards():
    return build_all()
