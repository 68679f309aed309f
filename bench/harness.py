"""What the benchmarks and their launchers (``bench.support``) share: loopback ports, readiness polls, a
controller child, /proc.

A leaf module: the standard library and httpx only, no import from the project, so every module
of ``bench`` and ``bench.support`` imports it without an import cycle.

* :func:`free_port`: a free TCP port on a loopback address.
* :func:`wait_http`: poll a URL until it answers 200, failing early when the server's process has exited.
* :func:`controller_command` / :func:`start_controller`: ``python -m specctl_vllm.controller serve`` as a child process.
* :func:`proc_cpu_seconds`, :func:`proc_status_kb`, :class:`RssSampler`: a process's CPU time and memory.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import httpx


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it; another process may still take it before use)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen | None = None, *, timeout_s: float = 60.0, interval_s: float = 0.2,
              request_timeout_s: float = 1.0, client: httpx.Client | None = None, what: str = "server",
              detail: Callable[[], str] | None = None) -> None:
    """Return once ``GET url`` answers 200; raise RuntimeError if ``proc`` exits first or after ``timeout_s``.

    ``client`` (with its base URL) sends the request when given, ``url`` may then be a path; ``detail()`` is
    appended to the error message (e.g. the tail of the server's log).
    """
    def tail() -> str:
        return f":\n{detail()}" if detail is not None else ""

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} during start-up{tail()}")
        try:
            response = client.get(url) if client is not None else httpx.get(url, timeout=request_timeout_s)
            if response.status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(interval_s)
    raise RuntimeError(f"{what} at {url} not ready after {timeout_s:g} s{tail()}")


def controller_command(port: int, *args: str, host: str = "127.0.0.1") -> list[str]:
    """``specctl serve`` as this interpreter runs it (``python -m specctl_vllm.controller serve``)."""
    return [sys.executable, "-m", "specctl_vllm.controller", "serve", "--host", host, "--port", str(port), *args]


def start_controller(port: int, *args: str, env: Mapping[str, str] | None = None,
                     stdout: IO | Path | int | None = None, stderr: IO | int | None = subprocess.STDOUT,
                     cwd: str | Path | None = None, new_session: bool = True,
                     command: Sequence[str] | None = None) -> subprocess.Popen:
    """Start ``specctl serve`` on ``127.0.0.1:port`` (returns at once; :func:`wait_http` on ``/readyz`` next).

    ``stdout`` a Path: appended to that file (the child keeps its own copy of the descriptor). ``env`` defaults
    to this process's environment.
    """
    cmd = list(command) if command is not None else controller_command(port, *args)
    kwargs = {"env": dict(env) if env is not None else None, "cwd": cwd, "stdin": subprocess.DEVNULL,
              "stderr": stderr, "start_new_session": new_session}
    if isinstance(stdout, Path):
        with open(stdout, "ab") as log:
            return subprocess.Popen(cmd, stdout=log, **kwargs)
    return subprocess.Popen(cmd, stdout=stdout, **kwargs)


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process, seconds (Linux ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status_kb(pid: int, key: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``, ...); 0 when absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class RssSampler(threading.Thread):
    """``VmRSS`` of one process every ``every_s`` seconds until :meth:`stop` (or the process is gone)."""

    def __init__(self, pid: int, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.pid, self.every_s = pid, every_s
        self.samples_kb: list[int] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples_kb.append(proc_status_kb(self.pid, "VmRSS"))
            except OSError:
                return
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()
