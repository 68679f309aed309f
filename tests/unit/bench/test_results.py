"""bench/results/: what the benchmarks write stays out of git; tracked are only the summaries the documents quote."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RESULTS = "bench/results/"


def git(*args: str) -> str:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def documents() -> str:
    """README.md, docs/ and every README under bench/: where a curated summary is quoted or linked."""
    paths = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "bench").rglob("README.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in paths if p.exists())


def test_every_tracked_result_is_quoted_by_a_document() -> None:
    text = documents()
    unquoted = []
    for rel in git("ls-files", RESULTS).split():
        inside = rel[len(RESULTS):]
        # a file is quoted by its name, or by the folder under bench/results/ that holds it (a recording, plots)
        names = {Path(inside).name, f"{RESULTS}{inside.split('/')[0]}"} if "/" in inside else {inside}
        if not any(name in text for name in names):
            unquoted.append(rel)
    assert not unquoted, f"tracked but quoted by no document (git rm --cached them): {unquoted}"


def test_every_result_a_document_names_is_tracked() -> None:
    tracked = set(git("ls-files", RESULTS).split())
    named = {m.rstrip(".") for m in re.findall(r"bench/results/[A-Za-z0-9_./-]+", documents())}
    missing = [n for n in sorted(named) if n not in tracked and not any(t.startswith(n.rstrip("/") + "/") for t in tracked)]
    assert not missing, f"quoted by a document but not in git: {missing}"


def test_new_results_are_ignored() -> None:
    out = git("check-ignore", "--no-index", f"{RESULTS}a_new_benchmark.json", f"{RESULTS}tmp/run/x.jsonl")
    assert len(out.split()) == 2
