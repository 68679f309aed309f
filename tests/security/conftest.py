"""Controller processes for the security tests: one with the shipped defaults, one hardened."""

from __future__ import annotations

import pytest

from bench.support.specctl_serve import SpecctlServe, free_port

#: Loopback alias (all of 127/8 is local on Linux): the admin API on another address than ingest.
ADMIN_HOST = "127.0.0.2"
ALLOWED_ORIGIN = "https://ops.example"
CATEGORY_CAP = 4


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    """Shipped defaults (CORS off, 4 MiB body cap), debug logs so that every log path is exercised."""
    with SpecctlServe(tmp_path_factory.mktemp("sec-default"), env={"SPECCTL_LOG_LEVEL": "debug"}) as proc:
        yield proc


@pytest.fixture(scope="module")
def hardened(tmp_path_factory):
    """Admin writes on their own address, CORS for one origin, a small category cap."""
    admin_port = free_port(ADMIN_HOST)
    env = {
        "SPECCTL_ADMIN_HOST": ADMIN_HOST,
        "SPECCTL_ADMIN_PORT": str(admin_port),
        "SPECCTL_CORS_ORIGINS": f'["{ALLOWED_ORIGIN}"]',
        "SPECCTL_LEARN_MAX_CATEGORIES_PER_MODEL": str(CATEGORY_CAP),
    }
    with SpecctlServe(tmp_path_factory.mktemp("sec-hardened"), env=env) as proc:
        proc.admin_url = f"http://{ADMIN_HOST}:{admin_port}"
        yield proc
