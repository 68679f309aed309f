"""``specctl replay`` command line: files in, report out, clean failures."""

import json
from pathlib import Path

import pytest

from specctl_vllm.controller import replay_cli
from tests.unit.core.offline.test_replay import _batches


def test_main_prints_the_report_and_writes_json(tmp_path: Path, capsys) -> None:
    tel = tmp_path / "telemetry.jsonl"
    tel.write_text("\n".join(b.model_dump_json() for b in _batches(5)) + "\n")
    req = tmp_path / "requests.jsonl"
    req.write_text(json.dumps({"category": "code", "prompt_token_ids": [1, 2, 3, 1, 2, 3],
                               "output_token_ids": [1, 2, 3, 1, 2, 3, 4]}) + "\n")
    out = tmp_path / "report.json"
    code = replay_cli.main([str(tel), "--requests", str(req), "--engine-ngram", "patch", "--policies", "off,static,oracle",
                        "--ks", "1,2", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "oracle" in printed and "k=2" in printed and "code" in printed
    data = json.loads(out.read_text())
    assert data["requests_scored"] == 1
    assert "trace" in data["profile_sources"]["code"]


@pytest.mark.parametrize(("setup", "expected"), [
    ("missing", 2),
    ("bad line", 2),
])
def test_main_fails_cleanly(tmp_path: Path, setup, expected, capsys) -> None:
    path = tmp_path / "t.jsonl"
    if setup == "bad line":
        path.write_text("{\"protocol\": 1}\n")
    assert replay_cli.main([str(path)]) == expected
    assert "specctl replay:" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "ok"), [("0", True), ("1", True), ("0.5", True), ("1.5", False), ("x", False)])
def test_category_floor_option_is_a_ratio(tmp_path: Path, value: str, ok: bool, capsys) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(b.model_dump_json() for b in _batches(3)))
    if ok:
        assert replay_cli.main([str(path), "--policies", "goodput", "--category-floor", value]) == 0
    else:
        assert replay_cli.main([str(path), "--category-floor", value]) == 2
        assert "--category-floor" in capsys.readouterr().err


@pytest.mark.parametrize(("values", "ok"), [(["60"], True), (["0.2", "60"], True), (["0"], False), (["-1"], False),
                                            (["x"], False), (["inf"], False)])
def test_first_s_prices_the_policy_along_the_recording(tmp_path: Path, values: list[str], ok: bool, capsys) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(b.model_dump_json() for b in _batches(6)))
    args = [str(path), "--policies", "off"] + [x for v in values for x in ("--first-s", v)]
    if ok:
        assert replay_cli.main(args) == 0
        printed = capsys.readouterr().out
        assert "along the recording from cold" in printed
        assert printed.count("policy / best static") + printed.count("no committed tokens") == len(values)
    else:
        assert replay_cli.main(args) == 2
        assert "--first-s" in capsys.readouterr().err
