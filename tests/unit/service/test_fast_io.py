"""uvicorn gets uvloop and httptools whenever they are installed, and still starts without them."""

import importlib.util

import pytest

from specctl_vllm.controller.service import server


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ({"uvloop", "httptools"}, {"loop": "uvloop", "http": "httptools"}),
        ({"httptools"}, {"loop": "asyncio", "http": "httptools"}),
        (set(), {"loop": "asyncio", "http": "h11"}),
    ],
)
def test_fast_io_prefers_the_c_implementations(monkeypatch, installed, expected):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in installed else None)
    assert server.fast_io() == expected


def test_this_install_has_both():
    assert server.fast_io() == {"loop": "uvloop", "http": "httptools"}  # uvicorn[standard] is a dependency
