"""A JSON object decoded a piece at a time, one member of its steps array after another.

``json.loads`` is one C call: it holds the GIL until the whole document is decoded, ~100 ms for a 4 MiB telemetry
batch on a shared core, and the event loop that answers the engines' regular posts waits that long (a profile of
the soak's flood: the decode held the GIL for 29% of the samples, in one stretch per batch). Here the top-level
object's members are decoded with the same C scanner (``JSONDecoder.raw_decode``) one by one, and the array named
``pieces_key`` element by element, each handed to ``on_piece`` as soon as it is decoded (so a caller can build and
keep its own form of it and let the dicts go), with ``pause(0)`` every ``every`` elements.

Only well-formed JSON is accepted, with ``json.loads``'s meaning (the last of duplicate keys wins); anything else
raises ``ValueError``, and the caller reports the problem with its one-call parse.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_SPACE = " \t\n\r"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


class _Text:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.decoder = json.JSONDecoder(parse_constant=_no_constant)

    def skip(self) -> str:
        """Skip whitespace; the next character ('' at the end)."""
        text, at = self.text, self.at
        while at < len(text) and text[at] in _SPACE:
            at += 1
        self.at = at
        return text[at : at + 1]

    def expect(self, char: str) -> None:
        if self.skip() != char:
            raise ValueError(f"expected {char!r} at {self.at}")
        self.at += 1

    def value(self) -> Any:
        self.skip()
        value, self.at = self.decoder.raw_decode(self.text, self.at)
        return value

    def more(self, close: str) -> bool:
        """After a member: True if a comma follows (consumed), False at ``close`` (consumed)."""
        char = self.skip()
        self.at += 1
        if char == ",":
            return True
        if char == close:
            return False
        raise ValueError(f"expected ',' or {close!r} at {self.at - 1}")


def decode_object(text: str, pieces_key: str, on_piece: Callable[[Any], Any], pause: Callable[[float], None],
                  every: int) -> dict[str, Any]:
    """The JSON object in ``text``; its ``pieces_key`` member, if an array, becomes the list of what
    ``on_piece`` returned for each element."""
    src = _Text(text)
    doc: dict[str, Any] = {}
    src.expect("{")
    if src.skip() == "}":
        src.at += 1
    else:
        while True:
            if src.skip() != '"':
                raise ValueError(f"object key is not a string at {src.at}")
            key = src.value()
            src.expect(":")
            if key == pieces_key and src.skip() == "[":
                doc[key] = _array(src, on_piece, pause, every)
            else:
                doc[key] = src.value()
            if not src.more("}"):
                break
    if src.skip() != "":
        raise ValueError(f"extra data at {src.at}")
    return doc


def _array(src: _Text, on_piece: Callable[[Any], Any], pause: Callable[[float], None], every: int) -> list[Any]:
    src.expect("[")
    out: list[Any] = []
    if src.skip() == "]":
        src.at += 1
        return out
    while True:
        out.append(on_piece(src.value()))
        if len(out) % every == 0:
            pause(0)
        if not src.more("]"):
            return out
