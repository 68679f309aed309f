"""Seeding the oracle's results file with the newest static row of every engine and point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import seed_static


def row(engine: str, c: int, tok: float, kind: str = "row") -> str:
    return json.dumps({"kind": kind, "engine": engine, "profile": "high", "concurrency": c,
                       "tok_per_s_median": tok})


def test_the_newest_source_wins_and_only_static_rows_are_kept(tmp_path: Path, capsys) -> None:
    newest, older, out = tmp_path / "s7.jsonl", tmp_path / "s6.jsonl", tmp_path / "seed.jsonl"
    newest.write_text("\n".join([row("plain", 256, 10039.0), row("specctl", 256, 11182.0)]) + "\n\n")
    older.write_text("\n".join([row("plain", 256, 9513.0), row("k2", 256, 11339.0),
                                row("k7", 64, 0.0, kind="engine_error"), row("oracle", 64, 6420.0)]))
    assert seed_static.main([str(out), str(newest), str(older)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["engine"], r["tok_per_s_median"]) for r in rows] == [("plain", 10039.0), ("k2", 11339.0)]
    assert "2 static rows from 2 files" in capsys.readouterr().out


def test_a_missing_source_is_refused(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as refused:
        seed_static.main([str(tmp_path / "out.jsonl"), str(tmp_path / "none.jsonl")])
    assert refused.value.code == 2 and "no such file" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
