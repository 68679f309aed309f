"""The server's child processes (the metrics render process and multiprocessing's resource tracker) end
with it, also on ``kill -9``."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from bench.support.specctl_serve import SpecctlServe


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_render_process_and_resource_tracker_die_with_the_server(tmp_path, sig):
    serve = SpecctlServe(tmp_path / "children", env={"SPECCTL_RENDER_PROCESSES": "1"}).start()
    try:
        assert httpx.get(serve.url + "/metrics", timeout=30).status_code == 200  # starts the render process
        children = _children(serve.pid)
        assert len(children) >= 2, children  # the render process and the resource tracker
        serve.kill(sig)
        deadline = time.monotonic() + 10
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [c for c in children if _alive(c)]
    finally:
        serve.stop()
