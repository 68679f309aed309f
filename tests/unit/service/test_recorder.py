"""The opt-in telemetry recorder: file names, rotation, the size cap, drops, and record -> replay -> report."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from specctl_vllm.controller import replay_cli, report_cli
from specctl_vllm.controller.service.app import create_app
from specctl_vllm.controller.service.recorder import (
    COMPRESS_LEVEL,
    FILE_RE,
    QueueBudget,
    Recorder,
    file_name,
    json_line,
    next_index,
    to_delete,
)
from specctl_vllm.controller.service.settings import RecordSettings, ServiceSettings
from specctl_vllm.kernel.protocol import TelemetryBatch
from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import INGEST, parked_sleep, settings_for


def record_settings(folder: Path, **extra) -> RecordSettings:
    values = {**RecordSettings.model_construct().model_dump(), "record_dir": folder, **extra}
    return RecordSettings.model_construct(**values)  # construct: below the minimum sizes, for small tests


def telemetry(seq: int, **kw) -> TelemetryBatch:
    return TelemetryBatch.model_validate(batch(seq, sent_at=1000.0 + seq, **kw))


def test_file_names_sort_by_time_and_index() -> None:
    a, b = file_name(1_700_000_000.0, 0), file_name(1_700_000_001.0, 1)
    assert FILE_RE.match(a) and a < b and a.endswith(".jsonl.gz")
    assert next_index([a, b, "other.txt"]) == 2 and next_index([]) == 0


def test_to_delete_keeps_the_newest_within_the_cap() -> None:
    files = [("c", 40), ("a", 40), ("b", 40)]
    assert to_delete(files, 100) == ["a"]
    assert to_delete(files, 40) == ["a", "b"]
    assert to_delete(files, 10, keep="c") == ["a", "b"]
    assert to_delete(files, 1000) == []


def test_settings_default_off_and_validate(monkeypatch) -> None:
    assert RecordSettings().record_dir is None
    monkeypatch.setenv("SPECCTL_RECORD_MAX_BYTES", "10")
    with pytest.raises(ValueError):
        RecordSettings()


def noisy(seq: int, rng: random.Random) -> TelemetryBatch:
    """A batch that compresses like real telemetry does (timings are noise), not like a repeated template."""
    steps = [step({"code": [hist(4, [rng.randrange(9) for _ in range(5)])]}, t=rng.random() * 1e3,
                  wall_s=rng.random() / 10) for _ in range(20)]
    return TelemetryBatch.model_validate(batch(seq, steps, sent_at=1000.0 + seq))


def test_rotation_cap_and_complete_gzip(tmp_path: Path) -> None:
    file_bytes, cap = 32 * 1024, 128 * 1024
    rec = Recorder(record_settings(tmp_path, record_file_bytes=file_bytes, record_max_bytes=cap), clock=lambda: 1e9)
    rec.start()
    rng = random.Random(7)
    for seq in range(600):
        rec.submit(noisy(seq, rng).model_dump_json().encode())
    rec.stop()
    files = sorted(p for p in tmp_path.iterdir() if FILE_RE.match(p.name))
    # it rotated (files opened); how many survive the cap depends on how far zlib's buffered blocks carried
    # each file past its size, which follows the timing of the flushes (one CI run kept 2 of 8)
    assert rec.stats.files > 2 and len(files) >= 2 and rec.stats.batches == 600 and rec.stats.dropped == 0
    # within the cap plus the file being written (zlib emits in blocks: a file ends up to one block past its size)
    assert sum(p.stat().st_size for p in files) <= cap + 2 * file_bytes
    assert rec.stats.bytes_on_disk == sum(p.stat().st_size for p in files)
    seqs = [json.loads(line)["seq"] for p in files for line in gzip.decompress(p.read_bytes()).splitlines()]
    assert seqs == list(range(seqs[0], 600)) and seqs[0] > 0  # the oldest were deleted, the newest kept, in order
    # a restart continues the numbering instead of overwriting
    again = Recorder(record_settings(tmp_path), clock=lambda: 1e9)
    again.start()
    again.submit(telemetry(0).model_dump_json().encode())
    again.stop()
    assert next_index([p.name for p in tmp_path.iterdir()]) == next_index([p.name for p in files]) + 1


def test_a_full_queue_drops_instead_of_blocking(tmp_path: Path) -> None:
    rec = Recorder(record_settings(tmp_path, record_queue_batches=3))
    for seq in range(5):  # not started: nothing drains the queue
        rec.submit(telemetry(seq).model_dump_json().encode())
    assert rec.stats.dropped == 2


def test_record_replay_report_end_to_end(tmp_path: Path, clock, capsys) -> None:
    """A controller with recording on ingests telemetry; replay and report read the recording folder."""
    folder = tmp_path / "recordings"
    base = settings_for(tmp_path / "specctl.db")
    settings = ServiceSettings(server=base.server, auth=base.auth, store=base.store,
                               record=record_settings(folder))
    client = TestClient(create_app(settings, clock, sleep=parked_sleep))
    with client:
        for seq in range(40):
            steps = [step({"code": [hist(4, [1, 1, 2, 4, 12])], "chat": [hist(4, [12, 5, 2, 1, 0])]},
                          t=seq + i * 0.05) for i in range(5)]
            clock.advance(0.5)
            answer = client.post("/v1/telemetry", json=batch(seq, steps, sent_at=clock.now()), headers=INGEST)
            assert answer.status_code == 200, answer.text
        # a re-sent batch (same boot and seq) is a duplicate: not recorded twice
        assert client.post("/v1/telemetry", json=batch(39, [], sent_at=clock.now()), headers=INGEST).json()[
            "outcome"] == "duplicate"
        recorder = client.app.state.runtime.recorder
        assert recorder is not None
        metrics = client.get("/metrics").text
        assert "specctl_recorder_batches_total" in metrics and "specctl_recorder_dropped_total 0.0" in metrics
    # the lifespan closed the file: a complete gzip with every accepted batch
    (path,) = folder.iterdir()
    lines = gzip.decompress(path.read_bytes()).splitlines()
    assert len(lines) == 40 and json.loads(lines[0])["seq"] == 0

    assert replay_cli.main([str(folder), "--policies", "recorded,off,static,goodput", "--ks", "1,2,4",
                            "--json", str(tmp_path / "replay.json")]) == 0
    replayed = json.loads((tmp_path / "replay.json").read_text())
    assert replayed["batches"] == 40 and set(replayed["committed_tokens"]) == {"code", "chat"}

    out = tmp_path / "report.html"
    assert report_cli.main([str(folder), "--out", str(out), "--json", str(tmp_path / "report.json")],
                           clock=lambda: 1.7e9) == 0
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "")
    for title in ("Acceptance length: code", "Acceptance length: chat", "Conditional acceptance by position: code",
                  "Estimated goodput vs k", "k that ran", "k the policy chose", "Overrides"):
        assert title in page, title
    data = json.loads((tmp_path / "report.json").read_text())
    code = next(v for v in data["categories"] if v["category"] == "code")
    # mean acceptance length: 1 + accepted per draft (vLLM's definition); code accepts more than chat
    chat = next(v for v in data["categories"] if v["category"] == "chat")
    assert code["mean_acceptance_length"] > chat["mean_acceptance_length"] >= 1.0
    capsys.readouterr()


def test_a_killed_controller_leaves_a_readable_file(tmp_path: Path) -> None:
    """The stream is flushed every record_flush_s: the file of a recorder that never closed reads up to there."""
    import time

    from specctl_vllm.controller.recording import read_recording

    rec = Recorder(record_settings(tmp_path, record_flush_s=0.05))
    rec.start()
    for seq in range(10):
        rec.submit(telemetry(seq).model_dump_json().encode())
    deadline = time.monotonic() + 10
    recording = None
    while time.monotonic() < deadline:
        time.sleep(0.1)
        recording = read_recording([tmp_path])
        if len(recording.lines) == 10:
            break
    assert recording is not None and len(recording.lines) == 10
    assert any("cut short" in note for note in recording.notes)  # no gzip trailer yet: as after kill -9
    rec.stop()
    assert read_recording([tmp_path]).notes == []


def test_a_full_disk_leaves_no_empty_files_and_counts_lost_batches_apart(tmp_path: Path, monkeypatch) -> None:
    from specctl_vllm.controller.service import recorder as recorder_module

    def full_disk_open(path, mode="r"):
        Path(path).touch()  # the file is created, as on a full disk; every write then fails with ENOSPC
        return open("/dev/full", mode)  # the recorder closes it

    monkeypatch.setattr(recorder_module, "open", full_disk_open, raising=False)
    rec = Recorder(record_settings(tmp_path, record_flush_s=0.05))
    rec.start()
    for seq in range(5):
        rec.submit(telemetry(seq, steps=[step({"code": [hist(2, [0, 1, 1])]})] * 200).model_dump_json().encode())
    rec.stop()
    assert rec.stats.batches == 0  # nothing was written
    assert rec.stats.lost == 5 and rec.stats.errors >= 1
    assert [p.name for p in tmp_path.iterdir()] == []  # no empty file left behind


@pytest.mark.parametrize(
    ("max_batches", "max_bytes", "sizes", "admitted"),
    [
        (10, 100, [40, 40, 40], [True, True, False]),  # bytes bound
        (2, 10_000, [1, 1, 1], [True, True, False]),  # batches bound
        (10, 100, [500, 1], [True, False]),  # one batch larger than the bytes is let in alone
        (10, 100, [60, 40, 1], [True, True, False]),  # exactly at the bound fits
    ],
)
def test_queue_budget_admits_within_batches_and_bytes(max_batches, max_bytes, sizes, admitted) -> None:
    budget = QueueBudget(max_batches, max_bytes)
    assert [budget.admit(size) for size in sizes] == admitted
    held = sum(size for size, ok in zip(sizes, admitted, strict=True) if ok)
    assert (budget.batches, budget.bytes) == (sum(admitted), held)


def test_queue_budget_room_comes_back_when_written() -> None:
    budget = QueueBudget(10, 100)
    assert budget.admit(80) and not budget.admit(80)
    budget.done(80)
    assert budget.admit(80) and (budget.batches, budget.bytes) == (1, 80)


def test_a_queue_full_in_bytes_drops_and_holds_no_more(tmp_path: Path) -> None:
    """Maximal bodies faster than the writer: what is queued stays within the bytes (the parsed batches the queue
    used to hold took ~14x their bodies)."""
    body = telemetry(0, steps=[step({"code": [hist(2, [0, 1, 1])]})] * 200).model_dump_json().encode()
    rec = Recorder(record_settings(tmp_path, record_queue_bytes=3 * len(body)))
    for _ in range(10):  # not started: nothing drains the queue
        rec.submit(body)
    assert (rec.stats.dropped, rec.budget.batches) == (7, 3) and rec.budget.bytes <= 3 * len(body)


def test_a_body_with_line_breaks_is_recorded_as_one_line_that_reads_back_the_same(tmp_path: Path) -> None:
    accepted = telemetry(3, steps=[step({"code": [hist(2, [0, 1, 1])]})] * 3)
    pretty = json.dumps(json.loads(accepted.model_dump_json()), indent=2).replace("\n", "\r\n").encode()
    line = json_line(pretty)
    assert line.count(b"\n") == 1 and line.endswith(b"\n") and b"\r" not in line
    assert TelemetryBatch.model_validate_json(line) == accepted
    rec = Recorder(record_settings(tmp_path))
    rec.start()
    rec.submit(pretty)
    rec.stop()
    (path,) = tmp_path.iterdir()
    assert [TelemetryBatch.model_validate_json(x) for x in gzip.decompress(path.read_bytes()).splitlines()] == [accepted]
    assert (rec.budget.batches, rec.budget.bytes) == (0, 0)  # written: its room is back


@pytest.mark.parametrize("batches", [1, 40])
def test_recordings_are_compressed_at_the_recorder_level(tmp_path: Path, batches: int) -> None:
    bodies = [telemetry(seq).model_dump_json().encode() for seq in range(batches)]
    rec = Recorder(record_settings(tmp_path), clock=lambda: 1e9)
    rec.start()
    for body in bodies:
        rec.submit(body)
    rec.stop()
    (path,) = [p for p in tmp_path.iterdir() if FILE_RE.match(p.name)]
    data = path.read_bytes()
    # the gzip header's XFL byte: 2 for level 9, 4 for level 1, 0 for the levels between
    assert COMPRESS_LEVEL == 6 and data[8] == 0
    assert gzip.decompress(data).splitlines() == bodies
