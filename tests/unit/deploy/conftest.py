import pytest
from deploy_support import OVERLAYS


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> str:
    return request.param
