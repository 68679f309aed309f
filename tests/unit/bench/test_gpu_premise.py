"""bench/gpu/premise.py starts over in an interpreter whose sys.path holds the plugins' dist-info from the start."""

from __future__ import annotations

import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

from bench.gpu import premise
from bench.gpu.plugin_dist import ENTRY_POINTS, GROUP


class Reexec(Exception):
    pass


def test_the_first_run_reexecs_itself_with_the_dist_info_on_pythonpath(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(premise.WORK_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    calls = []

    def execve(path, args, env):
        calls.append((path, args, env))
        raise Reexec

    monkeypatch.setattr(os, "execve", execve)
    argv = ["--engine", "plain", "--out", str(tmp_path / "p.jsonl")]
    with pytest.raises(Reexec):
        premise.main(argv)
    ((path, args, env),) = calls
    assert path == sys.executable and args == [sys.executable, "-m", "bench", "gpu.premise", *argv]
    work = Path(env[premise.WORK_ENV])
    dist, rest = env["PYTHONPATH"].split(":", 1)
    assert Path(dist) == work / "dist" and work.parent == tmp_path and rest == "/somewhere"
    # what vLLM's plugin loader reads in the rerun, whose sys.path starts with the PYTHONPATH entries
    eps = {ep.name: ep.value for d in metadata.distributions(path=[dist]) for ep in d.entry_points if ep.group == GROUP}
    assert eps == ENTRY_POINTS
