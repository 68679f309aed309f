"""Start-up: refuse without tokens (exit 2, says why), --insecure-dev, separate admin listener, port 0."""

from __future__ import annotations

import httpx
import pytest

from bench.support.specctl_serve import SpecctlServe, free_port

pytestmark = pytest.mark.api


@pytest.mark.parametrize(
    ("admin", "ingest", "mentions"),
    [(None, None, ["SPECCTL_ADMIN_TOKEN and SPECCTL_INGEST_TOKEN not set", "--insecure-dev"]),
     ("a" * 20, None, ["SPECCTL_INGEST_TOKEN not set", "--insecure-dev"]),
     ("short", "i" * 20, ["SPECCTL_ADMIN_TOKEN is shorter than 16 characters"])],
)
def test_refuses_without_tokens(tmp_path, admin, ingest, mentions):
    proc = SpecctlServe(tmp_path, admin_token=admin, ingest_token=ingest)
    assert proc.spawn().wait(60) == 2
    log = proc.log_text()
    assert all(m in log for m in mentions), log
    assert "short" not in log.replace("shorter", "")  # the token value itself is not echoed


def test_insecure_dev_starts_and_says_so(tmp_path):
    proc = SpecctlServe(tmp_path, admin_token=None, ingest_token=None, args=["--insecure-dev"])
    with proc:
        override = httpx.put(proc.url + "/v1/overrides/dev", json={"k": 1, "reason": "dev", "actor": "me"})
        assert override.status_code == 200
    assert "insecure dev mode" in proc.log_text()


def test_separate_admin_listener(tmp_path):
    admin_port = free_port()
    proc = SpecctlServe(tmp_path, env={"SPECCTL_ADMIN_PORT": str(admin_port)})
    with proc:
        body = {"k": 1, "reason": "r", "actor": "a"}
        main = httpx.put(proc.url + "/v1/overrides/x", json=body, headers=proc.headers("admin"))
        assert main.status_code == 403 and "admin listener" in main.json()["detail"]
        admin = httpx.put(f"http://127.0.0.1:{admin_port}/v1/overrides/x", json=body, headers=proc.headers("admin"))
        assert admin.status_code == 200
        assert httpx.get(proc.url + "/v1/overrides/x").status_code == 200  # reads stay open on the main one


def test_unusable_db_refused(tmp_path):
    bad = tmp_path / "junk.db"
    bad.write_bytes(b"not sqlite" * 1000)
    proc = SpecctlServe(tmp_path, db=bad)
    assert proc.spawn().wait(60) == 2
    assert "cannot start" in proc.log_text()


def test_port_in_use(server):
    proc = SpecctlServe(server.workdir / "second", port=server.port)
    assert proc.spawn().wait(60) == 3
    assert "cannot listen" in proc.log_text()
