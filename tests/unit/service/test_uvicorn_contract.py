"""What :mod:`specctl_vllm.controller.service.connections` relies on in uvicorn, checked against the installed
version: the ``http=`` setting takes a protocol class, ``uvicorn.config.HTTP_PROTOCOLS`` names the built-in ones,
and ``Server.startup`` builds the class with keyword arguments the guard passes through untouched. A uvicorn
outside the pinned range fails here, not at start-up in production."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import uvicorn
from packaging.specifiers import SpecifierSet
from uvicorn.config import HTTP_PROTOCOLS

from specctl_vllm.controller.service.server import http_protocol

ROOT = Path(__file__).resolve().parents[3]


def test_installed_uvicorn_is_within_the_pinned_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("uvicorn"))
    bounds = SpecifierSet(re.sub(r"^uvicorn(\[[^]]*\])?", "", spec))
    assert any(s.operator == "<" for s in bounds), "uvicorn needs an upper bound"
    assert uvicorn.__version__ in bounds


def test_protocol_names_resolve_to_asyncio_protocols():
    import asyncio

    for name in ("httptools", "h11"):
        assert name in HTTP_PROTOCOLS
        assert issubclass(http_protocol(name), asyncio.Protocol)


def test_server_builds_the_protocol_with_keyword_arguments_only():
    source = inspect.getsource(uvicorn.Server.startup)
    call = source[source.index("config.http_protocol_class("):]
    call = call[: call.index(")")]
    assert set(re.findall(r"(\w+)=", call)) == {"config", "server_state", "app_state", "_loop"}
    params = inspect.signature(http_protocol("httptools").__init__).parameters
    assert {"config", "server_state", "app_state", "_loop"} <= set(params)
