"""Reading recordings (specctl_vllm.controller.recording) and the replay command's input: plain, gzip, folders, clear errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from specctl_vllm.controller import replay_cli
from specctl_vllm.controller.recording import RecordingError, decode_recording, read_recording
from tests.unit.service.batches import batch

ROOT = Path(__file__).resolve().parents[3]
LINES = [json.dumps(batch(seq, sent_at=1000.0 + seq)) for seq in range(5)]
TEXT = "\n".join(LINES) + "\n"


def test_plain_and_gzip_give_the_same_lines() -> None:
    assert decode_recording(TEXT.encode()) == (LINES, None)
    assert decode_recording(gzip.compress(TEXT.encode())) == (LINES, None)
    # several gzip members (files concatenated with cat) read as one
    both = gzip.compress(TEXT.encode()) + gzip.compress(TEXT.encode())
    assert decode_recording(both)[0] == LINES + LINES


def test_a_gzip_cut_short_keeps_the_complete_lines() -> None:
    data = gzip.compress(TEXT.encode())
    lines, note = decode_recording(data[: len(data) - 12], "rec.gz")  # trailer and some data missing
    assert note is not None and "cut short" in note
    assert lines == LINES[: len(lines)] and len(lines) >= 1


@pytest.mark.parametrize(("data", "message"), [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\x00", "binary data"),
    ("caf\xe9\n".encode("latin-1"), "neither gzip nor UTF-8"),
    (b"not json at all\n", "first line is not a JSON object"),
    (b"\x1f\x8b\x08\x00garbage-garbage", "corrupt gzip"),
])
def test_anything_else_is_a_clear_error(data: bytes, message: str) -> None:
    with pytest.raises(RecordingError, match=message):
        decode_recording(data, "x")


def test_folders_read_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress((LINES[1] + "\n").encode()))
    (tmp_path / "a.jsonl").write_text(LINES[0] + "\n")
    (tmp_path / "notes.txt").write_text("ignored")
    rec = read_recording([tmp_path])
    assert rec.lines == LINES[:2] and [Path(f).name for f in rec.files] == ["a.jsonl", "b.jsonl.gz"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordingError, match="no \\*.jsonl"):
        read_recording([tmp_path / "empty"])
    with pytest.raises(RecordingError, match="missing"):
        read_recording([tmp_path / "missing.jsonl"])


def test_replay_reads_gzip_and_refuses_binary_without_traceback(tmp_path: Path, capsys) -> None:
    rec = tmp_path / "t.jsonl.gz"
    rec.write_bytes(gzip.compress(TEXT.encode()))
    assert replay_cli.main([str(rec), "--policies", "recorded,static", "--ks", "1,2"]) == 0
    assert "estimated goodput" in capsys.readouterr().out
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    assert replay_cli.main([str(binary)]) == 2
    err = capsys.readouterr().err
    assert "not a recording" in err and "Traceback" not in err
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text(LINES[0] + "\n{\"protocol\": 1}\n")
    assert replay_cli.main([str(bad_line)]) == 2
    assert "bad.jsonl:2: not a TelemetryBatch" in capsys.readouterr().err


def test_the_recorded_h200_file_replays() -> None:
    path = ROOT / "bench" / "gpu" / "results" / "steps.jsonl.gz"
    if not path.is_file():
        pytest.skip("no recorded GPU steps in this checkout")
    assert replay_cli.main([str(path), "--policies", "recorded,goodput", "--ks", "2"]) == 0
