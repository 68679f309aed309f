"""A controller killed on a full disk starts again from its store: overrides served, writes refused one by one.

The "disk" is the process's ``RLIMIT_FSIZE``: 64 KiB, while the store's write-ahead log holds about 1 MB of
committed writes that the kill left unmerged. Reading works (the log's index fits), a write past the limit fails
with EFBIG, as on a full disk. Opening the store used to write its schema and
version again and failed (``specctl: cannot start: ...: disk I/O error``), which kept the controller down, and every
engine on its static config, until an operator freed space.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx

from bench.harness import wait_http
from bench.support.specctl_serve import SpecctlServe

# exec the controller with the file-size limit in place (Python ignores SIGXFSZ, so a write past it fails)
LIMITED = "import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); " \
          "os.execv(sys.argv[2], sys.argv[2:])"


class FullDiskServe(SpecctlServe):
    fsize: int | None = None

    def command(self) -> list[str]:
        cmd = super().command()
        return cmd if self.fsize is None else [sys.executable, "-c", LIMITED, str(self.fsize), *cmd]


def test_a_store_on_a_full_disk_still_starts_serves_its_overrides_and_refuses_writes(tmp_path: Path) -> None:
    srv = FullDiskServe(tmp_path / "ctl").start()
    try:
        admin = srv.headers("admin")
        put = httpx.put(f"{srv.url}/v1/overrides/chat", json={"k": 2, "reason": "pin", "actor": "op"},
                        headers=admin, timeout=10)
        assert put.status_code == 200, put.text
        with httpx.Client(base_url=srv.url, headers=admin, timeout=10) as client:
            for i in range(300):  # an operator's busy day: about 1 MB of audit rows in the log
                body = {"k": 1 + i % 4, "reason": f"rotation {i} " + "x" * 400, "actor": "op"}
                assert client.put("/v1/overrides/code", json=body).status_code == 200
                assert client.request("DELETE", "/v1/overrides/code", params={"reason": "done", "actor": "op"}
                                      ).status_code in (200, 204)
        srv.kill(signal.SIGKILL)
        wal = srv.db.with_name(srv.db.name + "-wal")
        assert wal.stat().st_size > 512 * 1024
        srv.fsize = 64 * 1024
        srv.log_path = tmp_path / "after.log"  # a fresh log under the limit
        srv.spawn()
        wait_http(srv.url + "/healthz", srv.proc, timeout_s=60, interval_s=0.1, what="specctl serve",
                  detail=lambda: srv.log_text()[-3000:])
        got = httpx.get(f"{srv.url}/v1/overrides", headers=admin, timeout=10)
        assert got.status_code == 200
        assert {o["category"]: o["k"] for o in got.json()} == {"chat": 2}
        refused = httpx.put(f"{srv.url}/v1/overrides/json", json={"k": 1, "reason": "pin", "actor": "op"},
                            headers=admin, timeout=30)
        assert refused.status_code == 503 and "disk" in refused.text.lower(), refused.text
        policy = httpx.get(f"{srv.url}/v1/policy", params={"model": "m", "k_max": 4, "method": "ngram"}, timeout=10)
        assert policy.status_code == 200 and policy.json()["categories"]["chat"]["k"] == 2
        assert httpx.get(f"{srv.url}/healthz", timeout=10).status_code == 200
    finally:
        srv.stop()
