"""specctl report: the data from a recording or a live controller, the HTML page, the command's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specctl_vllm.controller import report, report_cli
from specctl_vllm.kernel.protocol import TelemetryBatch
from tests.unit.service.batches import batch, hist, step
from tests.unit.service.conftest import INGEST


def recording(n: int = 30) -> list[TelemetryBatch]:
    out = []
    for seq in range(n):
        steps = [step({"code": [hist(4, [1, 1, 2, 4, 12])], "chat": [hist(2, [9, 3, 1])]}, t=seq + i * 0.05)
                 for i in range(5)]
        out.append(TelemetryBatch.model_validate(batch(seq, steps, sent_at=1000.0 + seq * 0.5)))
    return out


def test_ran_per_batch_is_the_drafts_weighted_k() -> None:
    ran = report.ran_per_batch(recording(1)[0])
    assert ran == {"code": (4.0, "ngram"), "chat": (2.0, "ngram")}


def test_from_recording_and_the_page() -> None:
    data = report.from_recording(recording(), generated_at=5.0, source="r.jsonl")
    assert {v["category"] for v in data["categories"]} == {"code", "chat"}
    assert data["overrides"] is None and data["batches"] == 30
    assert {r["series"] for r in data["timeline"]} == {"ran", "policy"}
    page = report.render_html(data)
    assert page.count("<svg") >= 2 * 3 + 2 and "<script" not in page
    assert "Acceptance length: code" in page and "not known from a recording" in page
    json.dumps(data)  # JSON-able as --json writes it


def test_several_models_need_a_choice() -> None:
    other = TelemetryBatch.model_validate(batch(0, model="other", sent_at=2000.0))
    with pytest.raises(report.ReportError, match="--model"):
        report.from_recording([*recording(2), other])
    assert report.from_recording([*recording(2), other], model="other")["model"] == "other"


def test_svg_text_is_escaped() -> None:
    svg = report.bar_chart("<b>&", ["<x>"], [0.5], x_label="a", y_label="b")
    assert "<b>" not in svg and "&lt;b&gt;&amp;" in svg


def test_live_report_from_a_controller(client, monkeypatch, tmp_path: Path) -> None:
    for seq in range(5):
        steps = [step({"code": [hist(4, [1, 1, 2, 4, 12])]})]
        assert client.post("/v1/telemetry", json=batch(seq, steps), headers=INGEST).status_code == 200
    import httpx

    monkeypatch.setattr(httpx, "get", lambda url, timeout: client.get(url.replace("http://ctl", "")))
    out = tmp_path / "live.html"
    slept = []
    assert report_cli.main(["--url", "http://ctl", "--samples", "3", "--interval", "2", "--out", str(out)],
                           clock=iter([10.0, 12.0, 14.0, 15.0]).__next__, sleep=slept.append) == 0
    assert slept == [2, 2]
    page = out.read_text()
    assert "Acceptance length: code" in page and "none in force" in page and "k the policy chose" in page


@pytest.mark.parametrize(("argv", "code", "message"), [
    ([], 2, "either recording"),
    (["x.jsonl", "--url", "http://ctl"], 2, "not both"),
    (["--url", "http://127.0.0.1:9", "--samples", "0"], 2, "--samples"),
    (["--url", "http://127.0.0.1:9"], 3, "cannot reach"),
])
def test_bad_input_is_a_message_and_an_exit_code(argv, code, message, capsys) -> None:
    assert report_cli.main(argv) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_png_set(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rec = tmp_path / "r.jsonl"
    rec.write_text("\n".join(b.model_dump_json() for b in recording()) + "\n")
    assert report_cli.main([str(rec), "--out", str(tmp_path / "r.html"), "--png", str(tmp_path / "png")]) == 0
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == [
        "category_chat.png", "category_code.png", "k_over_time.png"]


def test_binary_recording_is_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "steps.bin"
    path.write_bytes(bytes(range(256)))
    assert report_cli.main([str(path), "--out", str(tmp_path / "r.html")]) == 2
    assert "not a recording" in capsys.readouterr().err
