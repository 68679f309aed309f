"""Overrides on a real server: set, TTL expiry by itself, clear, audit; and the CLI against it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from bench.support.specctl_serve import ADMIN_TOKEN
from tests.unit.service.batches import batch

pytestmark = pytest.mark.api

Q = {"model": "ov-model", "k_max": 4, "method": "ngram"}


def _policy(server, category):
    policy = httpx.get(server.url + "/v1/policy", params=Q).json()
    return policy["categories"].get(category, policy["default"])


def test_set_expire_clear_audit(server):
    httpx.post(server.url + "/v1/telemetry", json=batch(0, engine_id="ov-engine", model="ov-model"),
               headers=server.headers("ingest"))
    admin = server.headers("admin")
    put = httpx.put(server.url + "/v1/overrides/ov-ttl", json={"off": True, "ttl_s": 1.0, "reason": "short",
                                                               "actor": "alice"}, headers=admin)
    assert put.status_code == 200
    assert _policy(server, "ov-ttl")["source"] == "override"
    # nobody deletes it: the server's own sweep (every 0.2 s here) expires and audits it
    audit, deadline = [], time.monotonic() + 10
    while time.monotonic() < deadline:
        audit = httpx.get(server.url + "/v1/audit", params={"category": "ov-ttl"}).json()
        if any(e["action"] == "expire" for e in audit):
            break
        time.sleep(0.1)
    assert [(e["action"], e["actor"]) for e in audit] == [("set", "alice"), ("expire", "specctl")]
    assert httpx.get(server.url + "/v1/overrides/ov-ttl").status_code == 404
    assert _policy(server, "ov-ttl")["source"] != "override"

    httpx.put(server.url + "/v1/overrides/ov-pin", json={"k": 2, "reason": "pin", "actor": "bob"}, headers=admin)
    assert _policy(server, "ov-pin")["k"] == 2
    cleared = httpx.delete(server.url + "/v1/overrides/ov-pin", params={"actor": "carol", "reason": "done"},
                           headers=admin)
    assert cleared.status_code == 200
    audit = httpx.get(server.url + "/v1/audit", params={"category": "ov-pin"}).json()
    assert [(e["action"], e["actor"], e["reason"]) for e in audit] == [("set", "bob", "pin"),
                                                                        ("clear", "carol", "done")]
    assert audit[1]["before"]["k"] == 2 and audit[1]["after"] is None


def _cli(server, *args, token=ADMIN_TOKEN):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCTL_")}
    env["SPECCTL_CONTROLLER_URL"] = server.url
    if token:
        env["SPECCTL_ADMIN_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "specctl_vllm.controller", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_cli_against_real_server(server):
    done = _cli(server, "override", "set", "cli-cat", "--k", "1", "--reason", "from cli", "--actor", "ops")
    assert done.returncode == 0, done.stderr
    assert "override set for cli-cat: k=1" in done.stdout
    listed = _cli(server, "override", "list")
    assert listed.returncode == 0 and "cli-cat" in listed.stdout and "ops" in listed.stdout
    refused = _cli(server, "override", "set", "cli-cat", "--k", "1", "--reason", "x", token=None)
    assert refused.returncode == 1 and "HTTP 401" in refused.stderr
    status = _cli(server, "status")
    assert status.returncode == 0 and status.stdout.splitlines()[0].startswith("model")
    cleared = _cli(server, "override", "clear", "cli-cat", "--actor", "ops")
    assert cleared.returncode == 0 and "override cleared for cli-cat" in cleared.stdout
