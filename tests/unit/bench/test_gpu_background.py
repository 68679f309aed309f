"""bench/gpu/background.sh: a script started in a process session of its own outlives the call that started it,
runs from a copy of the checkout with the vLLM environment's PYTHONPATH pointed at that copy, and `wait` packs
what it wrote."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "gpu" / "background.sh"


@pytest.fixture()
def home(tmp_path: Path) -> Path:
    (tmp_path / "env.sh").write_text('export PYTHONPATH="/old/checkout:/site"\n')
    return tmp_path


def run(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", "SPECCTL_GPU_HOME": str(home)})


def test_start_then_wait_returns_what_the_script_wrote(home: Path, tmp_path: Path) -> None:
    job = "tests/unit/bench/data/background_job.sh"
    started = run(home, "start", job)
    assert started.returncode == 0, started.stderr
    dest = tmp_path / "dest"
    dest.mkdir()
    waited = run(home, "wait", "30", str(dest))
    assert waited.returncode == 0, waited.stderr
    assert "finished: exit 0" in waited.stdout
    with tarfile.open(dest / "results.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
        seen = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("seen.txt"))).read().decode()
    assert {"seen.txt", "background.log"} <= names
    checkout = home / "bg" / "checkout"
    assert f"pythonpath={checkout}:/site" in seen  # the copy, not the re-sent checkout
    assert f"cwd={checkout}" in seen
    assert not (checkout / ".venv").exists() and (checkout / "specctl_vllm" / "__init__.py").is_file()


def test_unknown_script_and_bad_usage_are_refused(home: Path) -> None:
    assert run(home, "start", "no/such/script.sh").returncode == 2
    assert run(home, "nonsense").returncode == 2


@pytest.mark.parametrize("session", sorted((REPO / "bench" / "gpu" / "sessions").glob("*.sh")), ids=lambda p: p.name)
def test_session_scripts_parse(session: Path) -> None:
    assert subprocess.run(["bash", "-n", str(session)], check=False, capture_output=True).returncode == 0


@pytest.mark.parametrize("session", sorted((REPO / "bench" / "gpu" / "sessions").glob("*.sh")), ids=lambda p: p.name)
def test_session_scripts_name_only_engines_the_sweep_knows(session: Path) -> None:
    """A misspelt engine costs a device session's slot: every --only name must be one the sweep starts."""
    import re

    from bench.gpu import steady_plan as plan

    known = {e.name for e in (*plan.engines(), *plan.optional_engines())} | {plan.ORACLE, plan.PREMISE}
    commands = "\n".join(ln for ln in session.read_text().splitlines() if not ln.lstrip().startswith("#"))
    named = {n for group in re.findall(r"--only (\S+)", commands) for n in group.split(",")}
    assert named <= known, sorted(named - known)


def test_a_wait_cut_off_still_leaves_what_the_script_had_written(home: Path, tmp_path: Path) -> None:
    """The device cuts a call short at the session's last seconds: the archive packed so far must be there."""
    assert run(home, "start", "tests/unit/bench/data/background_slow_job.sh").returncode == 0
    dest = tmp_path / "dest"
    dest.mkdir()
    try:
        for _ in range(50):  # the job's first row, then a wait that the caller cuts off long before its end
            if (home / "bg" / "out" / "rows.jsonl").exists():
                break
            subprocess.run(["sleep", "0.1"], check=True)
        with pytest.raises(subprocess.TimeoutExpired):
            run(home, "wait", "600", str(dest), timeout=3)
        with tarfile.open(dest / "results.tar.gz") as tar:
            rows = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("rows.jsonl"))).read()
        assert rows == b"row 1\n"
    finally:
        pid = int((home / "bg" / "pid").read_text())
        subprocess.run(["kill", "--", f"-{pid}"], check=False)


def test_the_session_prelude_skips_what_the_budget_cannot_hold_and_stops_its_copier(tmp_path: Path) -> None:
    """A session script sources the prelude: its `sweep` starts nothing once 60 s or less are left, and
    `session_done` ends the log copier (the script's background job), so the script exits."""
    script = tmp_path / "session.sh"
    script.write_text(f'set -uo pipefail\nsource "{REPO}/bench/gpu/sessions/prelude.sh"\n'
                      'sweep --results r.jsonl --only plain\nsession_done\n')
    env = {"PATH": "/usr/bin:/bin", "SWEEP_BUDGET_S": "30", "SPECCTL_BG_OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=20, check=False)
    assert done.returncode == 0, done.stderr
    assert "== no time left for: --results r.jsonl --only plain" in done.stdout
    assert done.stdout.rstrip().endswith("done")


def test_wait_packs_while_the_job_keeps_writing(home: Path, tmp_path: Path) -> None:
    """`tar: .: file changed as we read it` used to fail a pack (and the `wait` call) while the job wrote."""
    assert run(home, "start", "tests/unit/bench/data/background_churn_job.sh").returncode == 0
    dest = tmp_path / "dest"
    dest.mkdir()
    packs = 0
    while True:
        waited = run(home, "wait", "1", str(dest))  # packs at its start and at its end, the job writing
        assert waited.returncode == 0, waited.stderr
        packs += 2
        with tarfile.open(dest / "results.tar.gz") as tar:  # every archive whole and readable
            names = {Path(n).name for n in tar.getnames()}
        if "finished: exit 0" in waited.stdout:
            break
        assert "growing.bin" in names or packs <= 2
    assert packs >= 4, "the job finished before a pack overlapped it: nothing was tested"
    assert "seen.txt" in names
