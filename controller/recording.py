"""Telemetry recordings on disk: what the controller's recorder writes and what ``specctl replay``/``report`` read.

A recording is JSON lines, one :class:`~specctl_vllm.kernel.protocol.TelemetryBatch` per line, either plain UTF-8 text
(``.jsonl``) or gzip (``.jsonl.gz``, what the recorder writes). A path may also be a folder: every
``*.jsonl``/``*.jsonl.gz`` file in it, in name order (the recorder's file names sort by time).

:func:`decode_recording` is pure (bytes in, lines out); :func:`read_recording` is the edge that reads files.
Anything that is neither gzip nor UTF-8 text is refused with a :class:`RecordingError` naming the file, never
a traceback. A gzip file cut short (the controller was killed while writing it) yields the lines that were
complete, with a note.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

GZIP_MAGIC = b"\x1f\x8b"
SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".gz")


class RecordingError(ValueError):
    """A file that is not a readable recording; the message names it and says why."""


@dataclass
class Recording:
    #: (file, its non-empty lines) in reading order
    parts: list[tuple[str, list[str]]] = field(default_factory=list)
    #: anything the reader had to work around (a truncated gzip), one line per file
    notes: list[str] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return [name for name, _ in self.parts]

    @property
    def lines(self) -> list[str]:
        return [line for _, lines in self.parts for line in lines]


def _gunzip(data: bytes, source: str) -> tuple[bytes, str | None]:
    """Every gzip member of ``data``; a truncated last member gives what it decompressed so far, with a note."""
    out = bytearray()
    rest = data
    while rest:
        if rest[:2] != GZIP_MAGIC:
            if out and not rest.strip(b"\x00"):
                break  # zero padding after the last member
            raise RecordingError(f"{source}: bytes after the gzip data are not gzip")
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out += inflater.decompress(rest)
        except zlib.error as exc:
            if not out:
                raise RecordingError(f"{source}: corrupt gzip data ({exc})") from None
            return bytes(out), f"{source}: corrupt gzip data after {len(out)} bytes ({exc}); kept what came before"
        if not inflater.eof:
            out += inflater.flush()
            return bytes(out), f"{source}: gzip stream cut short (recording interrupted?); kept the complete lines"
        rest = inflater.unused_data
    return bytes(out), None


def decode_recording(data: bytes, source: str = "recording") -> tuple[list[str], str | None]:
    """The non-empty lines of a plain or gzip recording, and a note when the file had to be cut."""
    note = None
    if data[:2] == GZIP_MAGIC:
        data, note = _gunzip(data, source)
        if note is not None and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]  # drop the incomplete last line
    if b"\x00" in data[:4096]:
        raise RecordingError(f"{source}: not a recording: binary data, neither gzip nor UTF-8 JSON lines")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordingError(f"{source}: not a recording: neither gzip nor UTF-8 text "
                             f"(invalid byte at offset {exc.start})") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and not lines[0].lstrip().startswith("{"):
        raise RecordingError(f"{source}: not a recording: the first line is not a JSON object")
    return lines, note


def recording_files(path: Path) -> list[Path]:
    """``path`` itself, or the recording files of a folder in name order."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(SUFFIXES))
        if not files:
            raise RecordingError(f"{path}: no *.jsonl or *.jsonl.gz files in this folder")
        return files
    return [path]


def read_recording(paths: Iterable[Path]) -> Recording:
    """Read every file (or folder) in order; raises :class:`RecordingError` (OS errors included)."""
    out = Recording()
    for given in paths:
        try:
            files = recording_files(given)
        except OSError as exc:
            raise RecordingError(f"{given}: {exc.strerror or exc}") from None
        for path in files:
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise RecordingError(f"{path}: {exc.strerror or exc}") from None
            lines, note = decode_recording(data, str(path))
            out.parts.append((str(path), lines))
            if note:
                out.notes.append(note)
    return out
